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
// list of messages with sizes from 0 B to --max-size, tags, and send
// modes (standard, synchronous, buffered, ready), and for every
// destination one way of receiving them (by source and tag, by source with
// AnyTag, AnySource with AnyTag, Probe then Recv, Mprobe then
// Message.Recv), with now and then a receive that is cancelled. Sizes
// follow the shape of real traffic (most messages small, a fixed small
// share large): see sizeClasses, and the help text, which prints them.
// Each message's content is cut from a pseudo-random table keyed by the
// seed at an offset keyed by its round, source, destination and sequence
// number; the receiver compares every byte, checks the bytes after the
// message in its buffer are untouched, and checks that each source's
// messages arrive in send order where MPI's non-overtaking rule says they
// must. A round that has not completed within --round-deadline names its
// missing messages as lost. After the last round no message may be left.
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
	"runtime/pprof"
	"strings"
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
	seed := fs.Uint64("seed", 1, "schedule and content seed (the same messages for the same seed and job size)")
	first := fs.Int("first-round", 0, "start at this round (a round's messages depend only on the seed and its number: replays a failed round)")
	maxSize := fs.String("max-size", "16m", "largest message (suffixes k, m); sizes of a class above it are drawn from 0..max-size")
	perPair := fs.Int("per-pair", 64, "at most this many messages from one rank to another per round (half that to itself)")
	deadline := fs.Duration("round-deadline", 2*time.Minute, "a round not finished by then has lost messages")
	bsendMax := fs.String("bsend-max", "1m", "largest message sent in buffered mode")
	inproc := fs.Int("inprocess", 0, "run this many goroutine ranks in this process instead of under gorun")
	progress := fs.Duration("progress", 0, "rank 0 prints the messages and bytes so far this often (0: never)")
	cpuprof := fs.String("cpuprofile", "", "write a CPU profile of this process to FILE.rank<N> (N = GOMPI_RANK, 0 outside gorun)")
	var ps []string
	fs.StringArrayVar(&ps, "param", nil, "set a parameter name=value (repeatable)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gompi-soak --count N | --time D [flags]   (under gorun, or with --inprocess N)")
		fs.PrintDefaults()
		fmt.Fprintln(stderr, sizeHelp())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "gompi-soak: %v\n", err)
		return 2
	}
	if fs.NArg() != 0 || (*count > 0) == (*dur > 0) || *perPair < 1 || *deadline <= 0 || *first < 0 {
		fmt.Fprintln(stderr, "gompi-soak: give exactly one of --count N (N > 0) or --time D (D > 0); --per-pair and --round-deadline must be positive, --first-round not negative")
		fs.Usage()
		return 2
	}
	cfg := &config{seed: *seed, first: *first, count: *count, duration: *dur, perPair: *perPair, deadline: *deadline, progress: *progress,
		logf: func(format string, a ...any) { fmt.Fprintf(stdout, format+"\n", a...) }}
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
	if *cpuprof != "" {
		rank := os.Getenv("GOMPI_RANK")
		if rank == "" {
			rank = "0"
		}
		f, err := os.Create(*cpuprof + ".rank" + rank)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(stderr, "gompi-soak: --cpuprofile: %v\n", err)
			return 2
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	// Buffered sends need an attached buffer: room for every rank's
	// buffered messages of a round, with headroom.
	if err := mpi.BufferAttach(64 << 20); err != nil {
		fmt.Fprintf(stderr, "gompi-soak: %v\n", err)
		return 1
	}
	start := time.Now()
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
		if err == nil {
			// The attached buffer is the process's, not the job's: give
			// it back (every buffered message has been delivered), so that
			// a later job in this process can attach its own.
			_, err = mpi.BufferDetach()
		}
		return finish(stdout, stderr, *inproc, total, time.Since(start), err)
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
		pprof.StopCPUProfile()
		world.Abort(1)
		return 1
	}
	sum, err := gather(world, rep)
	code := 0
	if world.Rank() == 0 {
		code = finish(stdout, stderr, world.Size(), sum, time.Since(start), err)
	} else if err != nil || rep.failures() > 0 {
		code = 1
	}
	pprof.StopCPUProfile() // before Finalize, which may end the process
	if ferr := mpi.Finalize(); ferr != nil && code == 0 {
		fmt.Fprintf(stderr, "gompi-soak: %v\n", ferr)
		code = 1
	}
	return code
}

// sizeHelp describes the size distribution for the help text.
func sizeHelp() string {
	var b strings.Builder
	b.WriteString("\nMessage sizes (each message draws a class, then a size in it; log-uniform except 0-256 B):\n")
	for c, sc := range sizeClasses {
		if c == classLarge {
			fmt.Fprintf(&b, "  %-14s one message in every %dth round (rounds 0, %d, ...): 1 in %d messages with 4 ranks and --per-pair 64\n",
				sc.name, largeEvery, largeEvery, largeEvery*typicalRound())
			continue
		}
		fmt.Fprintf(&b, "  %-14s %4.1f%%\n", sc.name, float64(sc.weight)/10)
	}
	b.WriteString("A message is about 10.4 KB on average (10M messages move about 103 GB).\n" +
		"Send modes: synchronous 15%, buffered 10% (up to --bsend-max), ready 10% (to destinations that\n" +
		"receive by source), else standard. Every byte of every message is compared with what was sent.")
	return b.String()
}

// typicalRound is the mean number of messages of a round of 4 ranks with
// the default --per-pair.
func typicalRound() int {
	const ranks, perPair = 4, 64
	return ranks*(ranks-1)*perPair/2 + ranks*perPair/4
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
func finish(stdout, stderr io.Writer, ranks int, t report, wall time.Duration, err error) int {
	fmt.Fprintf(stdout, "gompi-soak: %d ranks, %d rounds, %d messages, %d bytes, %d cancelled receives, %v\n",
		ranks, t.Rounds, t.Messages, t.Bytes, t.Cancels, wall.Round(time.Millisecond))
	var b strings.Builder
	for c, sc := range sizeClasses {
		fmt.Fprintf(&b, "%s %d, ", sc.name, t.ByClass[c])
	}
	fmt.Fprintf(stdout, "gompi-soak: sizes %slargest %d B\n", b.String(), t.Largest)
	b.Reset()
	for m, name := range modeNames {
		fmt.Fprintf(&b, " %s %d,", name, t.ByMode[m])
	}
	fmt.Fprintf(stdout, "gompi-soak: send modes%s", strings.TrimSuffix(b.String(), ","))
	b.Reset()
	for st, name := range styleNames {
		fmt.Fprintf(&b, " %s %d,", name, t.ByStyle[st])
	}
	fmt.Fprintf(stdout, "; receives%s\n", strings.TrimSuffix(b.String(), ","))
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
