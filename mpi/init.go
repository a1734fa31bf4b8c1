package mpi

import (
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/self"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/launcher/pmi"
	"github.com/gompi-org/gompi/launcher/store"
	"github.com/gompi-org/gompi/pml"
)

// The process's job membership (Init .. Finalize).
var proc struct {
	mu        sync.Mutex
	in        *instance
	store     jobControl // gorun's store client or the PMI job; nil for a singleton
	finalized bool
}

// jobControl is what Init and Finalize need of the launcher: gorun's
// store client or a PMI job (hydra, Slurm).
type jobControl interface {
	Fence(ctx context.Context, name string) error
	Finalize() error
	Abort(code int, msg string) error
	Close() error
}

// Init joins the job: under gorun (GOMPI_STORE set) it connects to gorun's
// wire-up store; started by a PMI process manager (PMI_FD or PMI_PORT set:
// MPICH's mpiexec, srun --mpi=pmi2) it joins through PMI (package
// launcher/pmi); then it opens the transports. Started any other way the
// process is a singleton job of size 1. It returns the world communicator. Calling
// Init twice, or after Finalize, is an error (ErrNotInit after Finalize).
func Init(opts ...Option) (*Comm, error) {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if proc.finalized {
		return nil, mpierr.Errorf(mpierr.ErrNotInit, "Init after Finalize")
	}
	if proc.in != nil {
		return nil, mpierr.Errorf(mpierr.ErrArg, "Init called twice")
	}
	o := newOptions(opts)
	ps, err := params.NewSet(o.params)
	if err != nil {
		return nil, err
	}
	rank, size := envInt("GOMPI_RANK", 0), envInt("GOMPI_SIZE", 1)
	if rank < 0 || size < 1 || rank >= size {
		return nil, mpierr.Errorf(mpierr.ErrArg, "GOMPI_RANK=%d GOMPI_SIZE=%d", rank, size)
	}
	verbose := ps.Bool("verbose") || os.Getenv("GOMPI_VERBOSE") == "1"
	logf := func(string, ...any) {}
	if verbose {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "gompi[%d]: "+f+"\n", append([]any{rank}, a...)...) }
	}
	var client jobControl
	var secret []byte
	var pj *pmi.Job
	if os.Getenv("GOMPI_STORE") == "" && pmi.Detect(os.Getenv) {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		pj, err = pmi.Join(ctx, os.Getenv)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("join the job through PMI: %w", err)
		}
		client, secret, rank, size = pj, pj.Secret, pj.Rank, pj.Size
		// What gorun sets for its ranks, the process manager does not:
		// a share of the CPUs (unless GOMAXPROCS is set), and waiting
		// without spinning when the host has more ranks than CPUs.
		if os.Getenv("GOMAXPROCS") == "" {
			runtime.GOMAXPROCS(max(1, runtime.NumCPU()/pj.LocalSize))
		}
		if pj.LocalSize > runtime.NumCPU() {
			os.Setenv("GOMPI_OVERSUBSCRIBED", "1")
		}
		logf("PMI-%d job %s: rank %d of %d, local %d of %d (%s)", pj.Client().Version(), pj.JobID, rank, size, pj.LocalRank, pj.LocalSize, pj.Local)
	} else if addr := os.Getenv("GOMPI_STORE"); addr != "" {
		secret, err = hex.DecodeString(os.Getenv("GOMPI_SECRET"))
		if err != nil || len(secret) == 0 {
			return nil, mpierr.Errorf(mpierr.ErrArg, "GOMPI_SECRET is missing or not hex")
		}
		os.Unsetenv("GOMPI_SECRET") // keep it out of child processes
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		sc, err := store.Dial(ctx, addr, secret, rank)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("connect to gorun's store at %s: %w", addr, err)
		}
		client = sc
	} else if size != 1 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "GOMPI_SIZE=%d without GOMPI_STORE: start the job with gorun", size)
	}
	in, err := newInstance(rank, size, ps, logf)
	if err != nil {
		closeClient(client)
		return nil, err
	}
	in.abort = func(code int, err error) {
		in.engine.Abort(err)
		if pj != nil {
			// hydra does not print an abort's message: say it here.
			fmt.Fprintf(os.Stderr, "gompi: rank %d: %v\n", rank, err)
		}
		if client != nil {
			client.Abort(code, err.Error())
		}
		os.Exit(code)
	}
	env := in.env()
	env.LocalRank, env.LocalSize = envInt("GOMPI_LOCAL_RANK", rank), envInt("GOMPI_LOCAL_SIZE", size)
	env.JobID = os.Getenv("GOMPI_JOB_ID")
	env.Secret = secret
	if sc, ok := client.(*store.Client); ok {
		env.Store = sc
	} else if pj != nil {
		env.Store = pj.Store
		env.LocalRank, env.LocalSize, env.JobID = pj.LocalRank, pj.LocalSize, pj.JobID
	}
	w := self.NewWorld()
	m, err := w.Attach(env)
	if err != nil {
		closeClient(client)
		return nil, err
	}
	mods, unused, err := btl.Open(env, ps.String("btl"))
	in.modules = append([]btl.Module{m}, mods...)
	in.unused = unused
	if err != nil {
		in.close(err)
		closeClient(client)
		return nil, err
	}
	if pj != nil {
		// PMI makes puts visible only at a fence: every transport has
		// published its address (in Open), none has read a peer's yet.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		err := pj.Fence(ctx, "gompi.wireup")
		cancel()
		if err != nil {
			in.close(err)
			closeClient(client)
			return nil, err
		}
	}
	if err := in.connect(); err != nil {
		in.close(err)
		closeClient(client)
		return nil, err
	}
	for p := 0; p < size; p++ {
		logf("rank %d via %s", p, in.engine.PeerTransport(p))
	}
	if sc, ok := client.(*store.Client); ok {
		go watchFailures(in, sc)
	}
	proc.in, proc.store = in, client
	return in.world, nil
}

func closeClient(c jobControl) {
	if c != nil {
		c.Close()
	}
}

// watchFailures turns gorun's failure notices into failed peers.
func watchFailures(in *instance, c *store.Client) {
	for f := range c.Failures() {
		err := mpierr.Errorf(mpierr.ErrProcFailed, "rank %d: %s", f.Rank, f.Cause)
		if f.Rank < 0 {
			for r := 0; r < in.size; r++ {
				if r != in.rank {
					in.engine.PeerFailed(r, err)
				}
			}
			continue
		}
		in.engine.PeerFailed(f.Rank, err)
	}
}

func envInt(name string, def int) int {
	v, err := strconv.Atoi(os.Getenv(name))
	if err != nil {
		return def
	}
	return v
}

// Finalize completes this rank's part of the job: it waits for its pending
// sends, waits until every rank reached Finalize (so no peer still needs
// this rank's transports), prints the counters when gorun --stats asked
// for them, and closes the transports. Init after Finalize is an error.
func Finalize() error {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	in := proc.in
	if in == nil {
		return mpierr.Errorf(mpierr.ErrNotInit, "Finalize without Init")
	}
	for in.engine.Pending() > 0 {
		if in.engine.Progress() == 0 {
			time.Sleep(50 * time.Microsecond)
		}
	}
	if in.stats() {
		printStats(in)
	}
	var err error
	if proc.store != nil {
		err = proc.store.Fence(context.Background(), "gompi.finalize")
	}
	in.close(nil)
	if proc.store != nil {
		if ferr := proc.store.Finalize(); err == nil {
			err = ferr
		}
	}
	proc.in, proc.store, proc.finalized = nil, nil, true
	return err
}

func printStats(in *instance) {
	var b strings.Builder
	fmt.Fprintf(&b, "gompi stats rank %d:\n", in.rank)
	for _, m := range in.modules {
		if c, ok := m.(btl.Counted); ok {
			s := c.Counters()
			fmt.Fprintf(&b, "  transport %-5s sent %d frags %d B, received %d frags %d B, put %d ops %d B, get %d ops %d B\n",
				m.Name(), s.FragsSent, s.BytesSent, s.FragsRecv, s.BytesRecv, s.Puts, s.PutBytes, s.Gets, s.GetBytes)
			if s.HelpBytes > 0 {
				fmt.Fprintf(&b, "  transport %-5s copied %d B of peers' gets\n", m.Name(), s.HelpBytes)
			}
		}
	}
	st := &in.engine.Stats
	for p := pml.EagerImmediate; p <= pml.BufferedPipeline; p++ {
		if n := st.Sent[p].Load(); n > 0 {
			fmt.Fprintf(&b, "  protocol %-17s %d messages %d B\n", p, n, st.Bytes[p].Load())
		}
	}
	fmt.Fprintf(&b, "  received %d messages\n", st.Recvd.Load())
	os.Stderr.WriteString(b.String())
}

func init() {
	params.Register(params.Def{Name: "stats", Kind: params.Bool, Default: "false",
		Help: "print per-transport and per-protocol counters at Finalize (gorun --stats)"})
}
