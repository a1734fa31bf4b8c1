// Command gompi-soak sends a checked random mix of messages between all
// ranks of a job until a message count or a time is reached, and reports
// every message that was lost, duplicated, corrupted or reordered.
//
//	gorun -np 4 gompi-soak --count 100000
//	gorun -np 4 --btl self,tcp gompi-soak --time 10m
//	gompi-soak --inprocess 4 --count 20000
//
// The job runs in rounds. Every rank computes each round's schedule from
// the shared seed: for every pair of ranks (a rank to itself included) a
// list of messages with sizes from 0 B to --max-size (mostly small), tags,
// and send modes (standard, synchronous, buffered, ready), and for every
// destination one way of receiving them (by source and tag, by source with
// AnyTag, AnySource with AnyTag, Probe then Recv, Mprobe then
// Message.Recv), with now and then a receive that is cancelled. Each
// message's content is a pseudo-random stream keyed by the seed, round,
// source, destination and sequence number; the receiver regenerates it
// and compares every byte, and checks that each source's messages arrive
// in send order where MPI's non-overtaking rule says they must. A round
// that has not completed within --round-deadline counts its missing
// messages as lost. After the last round no message may be left.
//
// Rank 0 prints the totals. The exit status is 0 only when every message
// checked out on every rank.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/mpi"
	"github.com/spf13/pflag"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("gompi-soak", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	count := fs.Int64("count", 0, "stop after about this many messages in the whole job (rounds are whole)")
	dur := fs.Duration("time", 0, "stop after this long (checked at the end of each round)")
	seed := fs.Uint64("seed", 1, "schedule seed (the same schedule for the same seed and job size)")
	maxSize := fs.String("max-size", "16m", "largest message (suffixes k, m)")
	perPair := fs.Int("per-pair", 8, "at most this many messages from one rank to another per round")
	deadline := fs.Duration("round-deadline", 2*time.Minute, "a round not finished by then has lost messages")
	bsendMax := fs.String("bsend-max", "64k", "largest message sent in buffered mode")
	inproc := fs.Int("inprocess", 0, "run this many goroutine ranks in this process instead of under gorun")
	var ps []string
	fs.StringArrayVar(&ps, "param", nil, "set a parameter name=value (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gompi-soak --count N | --time D [flags]   (under gorun, or with --inprocess N)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "gompi-soak: %v\n", err)
		return 2
	}
	if fs.NArg() != 0 || (*count > 0) == (*dur > 0) || *perPair < 1 || *deadline <= 0 {
		fmt.Fprintln(stderr, "gompi-soak: give exactly one of --count N (N > 0) or --time D (D > 0); --per-pair and --round-deadline must be positive")
		fs.Usage()
		return 2
	}
	cfg := &config{seed: *seed, count: *count, duration: *dur, perPair: *perPair, deadline: *deadline}
	var err error
	if cfg.maxSize, err = params.ParseSize(*maxSize); err != nil || cfg.maxSize < 0 {
		fmt.Fprintf(stderr, "gompi-soak: --max-size %q: want a size\n", *maxSize)
		return 2
	}
	if cfg.bsendMax, err = params.ParseSize(*bsendMax); err != nil || cfg.bsendMax < 0 {
		fmt.Fprintf(stderr, "gompi-soak: --bsend-max %q: want a size\n", *bsendMax)
		return 2
	}
	var opts []mpi.Option
	for _, p := range ps {
		name, val, ok := splitParam(p)
		if !ok {
			fmt.Fprintf(stderr, "gompi-soak: --param %q: want name=value\n", p)
			return 2
		}
		opts = append(opts, mpi.WithParam(name, val))
	}
	// Buffered sends need an attached buffer: room for every rank's
	// buffered messages of a round, with headroom.
	if err := mpi.BufferAttach(64 << 20); err != nil {
		fmt.Fprintf(stderr, "gompi-soak: %v\n", err)
		return 1
	}
	if *inproc > 0 {
		var total report
		err := mpi.Run(*inproc, func(world *mpi.Comm) error {
			rep, err := soak(context.Background(), world, cfg)
			sum, gerr := gather(world, rep)
			if world.Rank() == 0 && gerr == nil {
				total = sum
			}
			return errors.Join(err, gerr)
		}, opts...)
		return finish(stdout, stderr, *inproc, total, err)
	}
	world, err := mpi.Init(opts...)
	if err != nil {
		fmt.Fprintf(stderr, "gompi-soak: %v\n", err)
		return 1
	}
	rep, err := soak(context.Background(), world, cfg)
	if err != nil {
		// Other ranks may be stuck waiting for this one: end the job.
		fmt.Fprintf(stderr, "gompi-soak: rank %d: %v\n", world.Rank(), err)
		for _, e := range rep.Errors {
			fmt.Fprintf(stderr, "gompi-soak: rank %d: %s\n", world.Rank(), e)
		}
		world.Abort(1)
		return 1
	}
	sum, err := gather(world, rep)
	code := 0
	if world.Rank() == 0 {
		code = finish(stdout, stderr, world.Size(), sum, err)
	} else if err != nil || rep.failures() > 0 {
		code = 1
	}
	if ferr := mpi.Finalize(); ferr != nil && code == 0 {
		fmt.Fprintf(stderr, "gompi-soak: %v\n", ferr)
		code = 1
	}
	return code
}

func splitParam(p string) (string, string, bool) {
	for i := 0; i < len(p); i++ {
		if p[i] == '=' {
			return p[:i], p[i+1:], i > 0
		}
	}
	return "", "", false
}

// gather sums every rank's report at rank 0.
func gather(world *mpi.Comm, rep report) (report, error) {
	b, err := json.Marshal(rep)
	if err != nil {
		return rep, err
	}
	if world.Rank() != 0 {
		return rep, world.Send(b, 0, tagCtl+1)
	}
	total := rep
	for r := 1; r < world.Size(); r++ {
		st, err := world.Probe(r, tagCtl+1)
		if err != nil {
			return total, err
		}
		buf := make([]byte, st.Count)
		if _, err := world.Recv(buf, r, tagCtl+1); err != nil {
			return total, err
		}
		var o report
		if err := json.Unmarshal(buf, &o); err != nil {
			return total, fmt.Errorf("report of rank %d: %w", r, err)
		}
		total.add(o)
	}
	return total, nil
}

// finish prints the totals and returns the exit status.
func finish(stdout, stderr io.Writer, ranks int, t report, err error) int {
	fmt.Fprintf(stdout, "gompi-soak: %d ranks, %d rounds, %d messages, %d bytes, %d cancelled receives\n",
		ranks, t.Rounds, t.Messages, t.Bytes, t.Cancels)
	fmt.Fprintf(stdout, "gompi-soak: lost %d, duplicated %d, corrupted %d, reordered %d, unexpected %d, other %d\n",
		t.Lost, t.Duplicates, t.Corrupted, t.Reordered, t.Unknown, t.Other)
	for _, e := range t.Errors {
		fmt.Fprintf(stderr, "gompi-soak: %s\n", e)
	}
	if err != nil {
		fmt.Fprintf(stderr, "gompi-soak: %v\n", err)
		return 1
	}
	if t.failures() > 0 {
		return 1
	}
	fmt.Fprintln(stdout, "gompi-soak: every message checked out")
	return 0
}
