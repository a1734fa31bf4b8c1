package pmi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Keys of the job's own wire-up, before the transports'.
const (
	keyJob  = "gompi.job"   // rank 0: job id (16 hex) and job secret (64 hex)
	keyHost = "gompi.host." // + rank: the host name, when the launcher gives no mapping
)

// Hydra's environment for the ranks on one host.
const (
	envLocalRank = "MPI_LOCALRANKID"
	envLocalSize = "MPI_LOCALNRANKS"
)

// Job is this process's membership of a job started by a PMI process
// manager (hydra's mpiexec, srun --mpi=pmi2).
//
// Usage (mpi.Init):
//
//	j, err := pmi.Join(ctx, os.Getenv)   // rank, size, local rank, job id, secret
//	... open the transports with j.Store as their btl.Store ...
//	j.Fence(ctx, "wireup")              // now every Set is visible: Gets may start
//	... run ...
//	j.Fence(ctx, "finalize"); j.Finalize()
//
// The job secret (for tcp's HMAC) is made by rank 0 and handed to the
// others through the process manager's key-value space, so it is exactly
// as confidential as that space: anyone who can read the launcher's
// key-value store (the job's user, the launcher's daemons) can join the
// job's connections. That is the trust the launcher already has: it
// starts the processes.
type Job struct {
	Rank, Size           int
	LocalRank, LocalSize int    // among the job's ranks on this host
	Local                string // where LocalRank came from: "mapping", "hydra env" or "hostnames"
	JobID                string // 16 hex digits, the same on every rank
	Secret               []byte // 32 bytes, the same on every rank
	Store                *Store // the btl.Store of the transports

	c        *Client
	server   interface{ Close() error } // rank 0's store (live.go); nil elsewhere
	closeOne sync.Once
}

// Join connects to the process manager named by the environment,
// learns this process's place in the job, and makes one fence over which
// rank 0 hands out the job id and secret (and every rank its host name,
// when the launcher gives no process mapping). ctx bounds all of it.
func Join(ctx context.Context, getenv func(string) string) (*Job, error) {
	c, err := Dial(ctx, getenv)
	if err != nil {
		return nil, err
	}
	j, err := join(ctx, c, getenv, os.Hostname)
	if err != nil {
		c.Close()
		return nil, err
	}
	return j, nil
}

// NewJob is Join over an already initialized Client.
func NewJob(ctx context.Context, c *Client, getenv func(string) string, hostname func() (string, error)) (*Job, error) {
	return join(ctx, c, getenv, hostname)
}

func join(ctx context.Context, c *Client, getenv func(string) string, hostname func() (string, error)) (*Job, error) {
	j := &Job{Rank: c.Rank(), Size: c.Size(), c: c, Store: newStore(c)}
	st := j.Store
	if j.Rank == 0 {
		var b [8 + 32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return nil, err
		}
		srv, addrs, err := startLive(b[8:], j.Size)
		if err != nil {
			return nil, err
		}
		j.server = srv
		if err := st.put(ctx, keyJob, b[:]); err != nil {
			srv.Close()
			return nil, err
		}
		if err := st.put(ctx, keyLive, []byte(strings.Join(addrs, ","))); err != nil {
			srv.Close()
			return nil, err
		}
	}
	// Where the ranks run: the launcher's mapping, else hydra's variables,
	// else every rank's host name read after the fence.
	var nodes []int
	if m, ok, err := c.JobAttr(ctx, "PMI_process_mapping"); err != nil {
		return nil, err
	} else if ok {
		blocks, err := parseMapping(m)
		if err != nil {
			return nil, err
		}
		nodes = nodeOf(blocks, j.Size)
		j.LocalRank, j.LocalSize = localOf(nodes, j.Rank)
		j.Local = "mapping " + m
	} else if lr, err1 := strconv.Atoi(getenv(envLocalRank)); err1 == nil {
		ls, err2 := strconv.Atoi(getenv(envLocalSize))
		if err2 != nil || lr < 0 || lr >= ls || ls > j.Size {
			return nil, fmt.Errorf("pmi: %s=%q %s=%q", envLocalRank, getenv(envLocalRank), envLocalSize, getenv(envLocalSize))
		}
		j.LocalRank, j.LocalSize, j.Local = lr, ls, "hydra env"
	}
	var host string
	if j.Local == "" {
		h, err := hostname()
		if err != nil {
			return nil, err
		}
		host = h
		if err := st.put(ctx, keyHost+strconv.Itoa(j.Rank), []byte(host)); err != nil {
			return nil, err
		}
	}
	if err := c.Fence(ctx); err != nil {
		return nil, err
	}
	b, err := st.get(ctx, keyJob)
	if err != nil {
		return nil, fmt.Errorf("job id and secret from rank 0: %w", err)
	}
	if len(b) != 8+32 {
		return nil, fmt.Errorf("%w: job id and secret of %d bytes", ErrProtocol, len(b))
	}
	j.JobID, j.Secret = hex.EncodeToString(b[:8]), b[8:]
	if la, err := st.get(ctx, keyLive); err == nil {
		st.live = &live{addrs: strings.Split(string(la), ","), secret: j.Secret, rank: j.Rank}
	}
	if j.Local == "" {
		j.Local = "hostnames"
		for r := range j.Size {
			h, err := st.get(ctx, keyHost+strconv.Itoa(r))
			if err != nil {
				return nil, fmt.Errorf("host of rank %d: %w", r, err)
			}
			if string(h) == host {
				if r < j.Rank {
					j.LocalRank++
				}
				j.LocalSize++
			}
		}
	}
	return j, nil
}

// Client returns the PMI connection.
func (j *Job) Client() *Client { return j.c }

// Fence waits until every rank called Fence. The first call is the
// wire-up fence: after it Store.Get answers, and Store.Set is refused.
// name only documents the call site.
func (j *Job) Fence(ctx context.Context, name string) error {
	if err := j.c.Fence(ctx); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	j.Store.fenceDone()
	return nil
}

// Finalize tells the process manager that this rank ends cleanly and
// closes the connection.
func (j *Job) Finalize() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := j.c.Finalize(ctx)
	j.Close()
	return err
}

// Abort asks the process manager to end the whole job; the caller then
// exits with code. msg is sent with bytes PMI cannot carry replaced.
func (j *Job) Abort(code int, msg string) error {
	return j.c.Abort(code, msg)
}

// Close closes the connection (without Finalize the process manager takes
// this rank as failed when it exits).
func (j *Job) Close() error {
	var err error
	j.closeOne.Do(func() {
		if j.Store.live != nil {
			j.Store.live.close()
		}
		err = j.c.Close()
		if j.server != nil {
			j.server.Close()
		}
	})
	return err
}
