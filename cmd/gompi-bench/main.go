// Command gompi-bench measures point-to-point performance between ranks 0
// and 1, OSU style, with the definitions of shared/anchor/pingpong.c so
// its figures compare with Open MPI's directly.
//
//	gorun -np 2 gompi-bench latency
//	gompi-bench bw --inprocess --sizes 4k,4m
//
// Modes: latency (half round trip of blocking Send/Recv, median over
// batches of the batch average), bw (a window of Isend + Waitall answered
// by a 4-byte ack), bibw (both directions at once), rate (messages per
// second with a window of small messages), idle (CPU used by rank 0 while
// it is blocked in Recv and rank 1 sleeps --idle-time before sending),
// tensor (the tensor rendezvous against plain messages: tensor.go).
// 1 MB = 1e6 bytes. Rank 0 prints.
package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/mpi"
	"github.com/spf13/pflag"
)

const (
	tagData = 1
	tagAck  = 2
	tagWarm = 3
)

type config struct {
	mode       string
	sizes      []int
	iterations int // round trips (latency) or windows (bw) per batch; 0 = automatic
	warmup     int
	warmupTime time.Duration
	batches    int
	window     int
	csv        bool
	idle       time.Duration
	tensors    int // tensor mode: small tensors per step
	plot       string
	overlay    string
	label      string
	inprocess  bool // two goroutine ranks: latency prints a channel's and copy()'s figures beside gompi's
	out        io.Writer
	batchLog   io.Writer // rank 0: every measured batch's figure, in order (--batch-log); nil: none
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("gompi-bench", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	sizes := fs.String("sizes", "0,8,64,512,4k,16k,64k,256k,1m,4m", "message sizes (suffixes k, m = powers of 1024)")
	iters := fs.Int("iterations", 0, "round trips (latency) or windows (bw, bibw, rate) per batch; 0 = as the anchor (about 64 MiB per batch)")
	warmup := fs.Int("warmup", 1, "unmeasured batches before measuring")
	warmupTime := fs.Duration("warmup-time", 50*time.Millisecond, "unmeasured 8-byte ping-pong before the first size (a Go process runs slower for its first 10-20 ms)")
	batches := fs.Int("batches", 21, "measured batches per size (the median is reported)")
	window := fs.Int("window", 64, "messages in flight per window (bw, bibw, rate)")
	protocol := fs.String("protocol", "", "force a protocol: eager, rdma_put, rdma_get, send_pipeline, rdma_pipeline")
	var ps []string
	fs.StringArrayVar(&ps, "param", nil, "set a parameter name=value (repeatable)")
	csv := fs.Bool("csv", false, "print a header line then size,value lines")
	plot := fs.String("plot", "", "draw value against size into this SVG file")
	overlay := fs.String("plot-overlay", "", "CSV (size,value) of another run to draw on the same plot, e.g. Open MPI's")
	label := fs.String("plot-label", "other", "legend of the overlay curve")
	idle := fs.Duration("idle-time", 2*time.Second, "idle mode: how long rank 1 sleeps before it sends")
	tensors := fs.Int("tensors", 500, "tensor mode: 64-byte tensors per step in the many-small-tensors test")
	inproc := fs.Bool("inprocess", false, "run two goroutine ranks over the self transport instead of under gorun")
	cpuprof := fs.String("cpuprofile", "", "write a CPU profile of this process to FILE.rank<N> (N = GOMPI_RANK, 0 outside gorun)")
	memprof := fs.String("memprofile", "", "write an allocation profile (every allocation sampled) to FILE.rank<N>")
	batchLog := fs.String("batch-log", "", "rank 0 writes every measured batch's figure to FILE, one \"size batch value\" line each, in the order measured (how a figure moves during a run)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: gompi-bench latency|bw|bibw|rate|idle|tensor [flags]   (under gorun -np 2, or with --inprocess)")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "gompi-bench: %v\n", err)
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	cfg := config{mode: fs.Arg(0), iterations: *iters, warmup: *warmup, warmupTime: *warmupTime, batches: max(1, *batches), window: max(1, *window),
		csv: *csv, idle: *idle, tensors: max(1, *tensors), plot: *plot, overlay: *overlay, label: *label, inprocess: *inproc, out: stdout}
	switch cfg.mode {
	case "latency", "bw", "bibw", "rate", "idle", "tensor":
	default:
		fmt.Fprintf(stderr, "gompi-bench: unknown mode %q (want latency, bw, bibw, rate, idle or tensor)\n", cfg.mode)
		return 2
	}
	if cfg.mode == "tensor" && !fs.Changed("sizes") {
		*sizes = "64k,4m" // the tensor mode's own default
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := params.ParseSize(s)
		if err != nil {
			fmt.Fprintf(stderr, "gompi-bench: --sizes: %v\n", err)
			return 2
		}
		cfg.sizes = append(cfg.sizes, n)
	}
	var opts []mpi.Option
	if *protocol != "" {
		opts = append(opts, mpi.WithParam("pml_force_protocol", *protocol))
	}
	for _, p := range ps {
		name, val, ok := strings.Cut(p, "=")
		if !ok {
			fmt.Fprintf(stderr, "gompi-bench: --param %q: want name=value\n", p)
			return 2
		}
		opts = append(opts, mpi.WithParam(name, val))
	}
	// Profiles go to FILE.rank<N>: the ranks of one job share the flag.
	profFile := func(name string) string {
		rank := os.Getenv("GOMPI_RANK")
		if rank == "" {
			rank = "0"
		}
		return name + ".rank" + rank
	}
	if *cpuprof != "" {
		f, err := os.Create(profFile(*cpuprof))
		if err != nil {
			fmt.Fprintf(stderr, "gompi-bench: --cpuprofile: %v\n", err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			fmt.Fprintf(stderr, "gompi-bench: --cpuprofile: %v\n", err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	if r := os.Getenv("GOMPI_RANK"); *batchLog != "" && (r == "" || r == "0") { // under gorun, rank 0's process only
		f, err := os.Create(*batchLog)
		if err != nil {
			fmt.Fprintf(stderr, "gompi-bench: --batch-log: %v\n", err)
			return 2
		}
		defer f.Close()
		cfg.batchLog = f
	}
	if *memprof != "" {
		runtime.MemProfileRate = 1
		defer func() {
			f, err := os.Create(profFile(*memprof))
			if err == nil {
				err = pprof.Lookup("allocs").WriteTo(f, 0)
				f.Close()
			}
			if err != nil {
				fmt.Fprintf(stderr, "gompi-bench: --memprofile: %v\n", err)
			}
		}()
	}
	var err error
	if *inproc {
		err = mpi.Run(2, func(w *mpi.Comm) error { return bench(w, &cfg) }, opts...)
	} else {
		var w *mpi.Comm
		if w, err = mpi.Init(opts...); err == nil {
			err = bench(w, &cfg)
			if ferr := mpi.Finalize(); err == nil {
				err = ferr
			}
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "gompi-bench:", err)
		return 1
	}
	return 0
}

// bench runs the mode on ranks 0 and 1; other ranks only wait.
func bench(w *mpi.Comm, cfg *config) error {
	if w.Size() < 2 {
		return errors.New("needs 2 ranks: run it under gorun -np 2, or with --inprocess")
	}
	if cfg.mode == "idle" {
		return idleCPU(w, cfg)
	}
	if cfg.mode == "tensor" {
		return tensorBench(w, cfg)
	}
	rank := w.Rank()
	if rank <= 1 {
		if err := warmUp(w, cfg.warmupTime); err != nil {
			return err
		}
	}
	unit := map[string]string{"latency": "latency_us", "bw": "bw_MBps", "bibw": "bibw_MBps", "rate": "msgs_per_s"}[cfg.mode]
	var xs []int
	var ys []float64
	// In-process latency is printed beside its yardsticks: a Go channel
	// ping-pong (half round trip), copy() of the message's bytes, and a
	// ping-pong of copies between two goroutines (each copies back what the
	// other just wrote, as the two ranks' transfers do).
	yard := cfg.inprocess && cfg.mode == "latency"
	var chanUS float64
	if rank == 0 {
		if yard {
			chanUS = channelPingPong(cfg.batches)
		}
		switch {
		case cfg.csv && yard:
			fmt.Fprintf(cfg.out, "size,%s,chan_us,copy_us,copy_pingpong_us\n", unit)
		case cfg.csv:
			fmt.Fprintf(cfg.out, "size,%s\n", unit)
		case yard:
			fmt.Fprintf(cfg.out, "# gompi-bench %s: median of %d batches; yardsticks: a Go channel ping-pong (half round trip), copy() of size bytes in one goroutine, and a copy ping-pong (two goroutines each copying back what the other wrote; half round trip)\n%10s %14s %10s %8s %10s %9s %10s %9s\n",
				cfg.mode, cfg.batches, "size", unit, "chan_us", "x_chan", "copy_us", "of_copy", "copypp_us", "of_copypp")
		default:
			fmt.Fprintf(cfg.out, "# gompi-bench %s: median of %d batches; window %d; 1 MB = 1e6 B\n%10s %14s\n", cfg.mode, cfg.batches, cfg.window, "size", unit)
		}
	}
	for _, size := range cfg.sizes {
		if rank > 1 {
			continue
		}
		v, err := measure(w, cfg, size)
		if err != nil {
			return fmt.Errorf("size %d: %w", size, err)
		}
		if rank == 0 {
			xs, ys = append(xs, size), append(ys, v)
			var copyUS, copyPP float64
			if yard {
				copyUS = copyTime(size, cfg.batches)
				copyPP = copyPingPong(size, cfg.batches)
			}
			switch {
			case cfg.csv && yard:
				fmt.Fprintf(cfg.out, "%d,%.3f,%.3f,%.3f,%.3f\n", size, v, chanUS, copyUS, copyPP)
			case cfg.csv:
				fmt.Fprintf(cfg.out, "%d,%.3f\n", size, v)
			case yard:
				fmt.Fprintf(cfg.out, "%10d %14.3f %10.3f %7.2fx %10.3f %8.0f%% %10.3f %8.0f%%\n", size, v, chanUS, v/chanUS, copyUS, 100*copyUS/v, copyPP, 100*copyPP/v)
			default:
				fmt.Fprintf(cfg.out, "%10d %14.3f\n", size, v)
			}
		}
	}
	if rank == 0 && cfg.plot != "" {
		if err := plotSVG(cfg, unit, xs, ys); err != nil {
			return err
		}
	}
	return w.Barrier()
}

func latIters(size int) int   { return min(200, max(4, (64<<20)/(size+1))) }
func bwLoops(size, w int) int { return min(1000, max(2, (64<<20)/max(1, w*size))) }

func measure(w *mpi.Comm, cfg *config, size int) (float64, error) {
	sbuf, rbuf := make([]byte, size), make([]byte, size)
	for i := range sbuf {
		sbuf[i] = 'a'
	}
	var batch func() (float64, error)
	switch cfg.mode {
	case "latency":
		n := cfg.iterations
		if n == 0 {
			n = latIters(size)
		}
		batch = func() (float64, error) {
			d, err := pingpong(w, sbuf, n)
			return d.Seconds() / float64(n) / 2 * 1e6, err
		}
	default:
		n := cfg.iterations
		if n == 0 {
			n = bwLoops(size, cfg.window)
			if cfg.mode == "rate" {
				n = min(1000, max(10, n))
			}
		}
		bytes := float64(size) * float64(cfg.window) * float64(n)
		batch = func() (float64, error) {
			var d time.Duration
			var err error
			if cfg.mode == "bibw" {
				d, err = bibwBatch(w, sbuf, rbuf, cfg.window, n)
				return 2 * bytes / d.Seconds() / 1e6, err
			}
			d, err = bwBatch(w, sbuf, cfg.window, n)
			if cfg.mode == "rate" {
				return float64(cfg.window*n) / d.Seconds(), err
			}
			return bytes / d.Seconds() / 1e6, err
		}
	}
	for i := 0; i < cfg.warmup; i++ {
		if _, err := batch(); err != nil {
			return 0, err
		}
	}
	vals := make([]float64, cfg.batches)
	for i := range vals {
		v, err := batch()
		if err != nil {
			return 0, err
		}
		vals[i] = v
	}
	if cfg.batchLog != nil && w.Rank() == 0 {
		for i, v := range vals {
			fmt.Fprintf(cfg.batchLog, "%d %d %.4f\n", size, i, v)
		}
	}
	sort.Float64s(vals)
	return vals[len(vals)/2], nil
}

// warmUp runs an unmeasured 8-byte ping-pong between ranks 0 and 1 for d:
// rank 0 decides when to stop and says so in the message. A new Go process
// runs its first 10-20 ms measurably slower (sm 8 B latency 0.45 instead of
// 0.32 us in the first one or two sizes of most runs, docs/PERFORMANCE.md),
// which one warm-up batch per size does not cover.
func warmUp(w *mpi.Comm, d time.Duration) error {
	msg := make([]byte, 8)
	var b any = msg
	peer := 1 - w.Rank()
	start := time.Now()
	for {
		if w.Rank() == 0 {
			msg[0] = 0
			if time.Since(start) < d {
				msg[0] = 1
			}
			if err := w.Send(b, peer, tagWarm); err != nil {
				return err
			}
			if _, err := w.Recv(b, peer, tagWarm); err != nil {
				return err
			}
		} else {
			if _, err := w.Recv(b, peer, tagWarm); err != nil {
				return err
			}
			if err := w.Send(b, peer, tagWarm); err != nil {
				return err
			}
		}
		if msg[0] == 0 {
			return nil
		}
	}
}

func peerBarrier(w *mpi.Comm) error {
	// Ranks 0 and 1 only: a zero-byte exchange.
	peer := 1 - w.Rank()
	_, err := w.Sendrecv(nil, peer, tagAck, nil, peer, tagAck)
	return err
}

func pingpong(w *mpi.Comm, buf []byte, n int) (time.Duration, error) {
	if err := peerBarrier(w); err != nil {
		return 0, err
	}
	// The buffer goes straight into the calls, as users write them.
	start := time.Now()
	for i := 0; i < n; i++ {
		if w.Rank() == 0 {
			if err := w.Send(buf, 1, tagData); err != nil {
				return 0, err
			}
			if _, err := w.Recv(buf, 1, tagData); err != nil {
				return 0, err
			}
		} else {
			if _, err := w.Recv(buf, 0, tagData); err != nil {
				return 0, err
			}
			if err := w.Send(buf, 0, tagData); err != nil {
				return 0, err
			}
		}
	}
	return time.Since(start), nil
}

func bwBatch(w *mpi.Comm, buf []byte, window, loops int) (time.Duration, error) {
	if err := peerBarrier(w); err != nil {
		return 0, err
	}
	reqs := make([]*mpi.Request, window)
	ack := make([]int32, 1)
	start := time.Now()
	for l := 0; l < loops; l++ {
		var err error
		for i := range reqs {
			if w.Rank() == 0 {
				reqs[i], err = w.Isend(buf, 1, tagData)
			} else {
				reqs[i], err = w.Irecv(buf, 0, tagData)
			}
			if err != nil {
				return 0, err
			}
		}
		// Statuses ignored and the requests freed, as the C anchor's
		// MPI_Waitall(..., MPI_STATUSES_IGNORE) does.
		if err := w.WaitallRelease(reqs, nil); err != nil {
			return 0, err
		}
		if w.Rank() == 0 {
			_, err = w.Recv(ack, 1, tagAck)
		} else {
			err = w.Send(ack, 0, tagAck)
		}
		if err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

func bibwBatch(w *mpi.Comm, sbuf, rbuf []byte, window, loops int) (time.Duration, error) {
	if err := peerBarrier(w); err != nil {
		return 0, err
	}
	peer := 1 - w.Rank()
	reqs := make([]*mpi.Request, 2*window)
	start := time.Now()
	for l := 0; l < loops; l++ {
		var err error
		for i := 0; i < window; i++ {
			if reqs[i], err = w.Irecv(rbuf, peer, tagData); err != nil {
				return 0, err
			}
		}
		for i := 0; i < window; i++ {
			if reqs[window+i], err = w.Isend(sbuf, peer, tagData); err != nil {
				return 0, err
			}
		}
		if err := w.WaitallRelease(reqs, nil); err != nil { // as in bwBatch
			return 0, err
		}
	}
	return time.Since(start), nil
}

// idleCPU: rank 1 sleeps cfg.idle and then sends 8 bytes; rank 0 is blocked
// in Recv meanwhile and reports the processor time its process used
// (user + system, all threads, from getrusage) against the wall time.
func idleCPU(w *mpi.Comm, cfg *config) error {
	if err := peerBarrier(w); err != nil {
		return err
	}
	buf := make([]byte, 8)
	switch w.Rank() {
	case 0:
		c0, t0 := cpuTime(), time.Now()
		if _, err := w.Recv(buf, 1, tagData); err != nil {
			return err
		}
		c, t := cpuTime()-c0, time.Since(t0)
		pct := 100 * c.Seconds() / t.Seconds()
		if cfg.csv {
			fmt.Fprintf(cfg.out, "wall_s,cpu_s,cpu_percent\n%.3f,%.4f,%.2f\n", t.Seconds(), c.Seconds(), pct)
		} else {
			fmt.Fprintf(cfg.out, "# gompi-bench idle: rank 0 blocked in Recv for %.3f s used %.1f ms of CPU (%.2f%% of a core)\n",
				t.Seconds(), float64(c.Microseconds())/1000, pct)
		}
	case 1:
		time.Sleep(cfg.idle)
		if err := w.Send(buf, 0, tagData); err != nil {
			return err
		}
	}
	return w.Barrier()
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// copyPingPong returns the median half round trip, in microseconds, of a
// ping-pong of copies between two goroutines: one copies a into b and
// hands over, the other copies b back into a and hands back. Each copy
// reads what the other goroutine has just written, as a transfer between
// two ranks does; copy() in one goroutine (copyTime) reads the same
// source again and again, which stays in the cache. Go's copy() writes
// past the cache from 1 MiB up (non-temporal stores), so from there the
// two yardsticks part.
func copyPingPong(size, batches int) float64 {
	a, b := make([]byte, size), make([]byte, size)
	n := max(4, min(20000, (256<<20)/max(1, size)))
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		for range ping {
			copy(a, b)
			pong <- struct{}{}
		}
	}()
	defer close(ping)
	vals := make([]float64, max(1, batches))
	for k := -1; k < len(vals); k++ { // one unmeasured batch
		start := time.Now()
		for range n {
			copy(b, a)
			ping <- struct{}{}
			<-pong
		}
		if k >= 0 {
			vals[k] = time.Since(start).Seconds() / float64(n) / 2 * 1e6
		}
	}
	sort.Float64s(vals)
	return vals[len(vals)/2]
}

// channelPingPong returns the median half round trip, in microseconds, of
// an 8-byte array passed back and forth between two goroutines over
// unbuffered channels: the in-process latency yardstick.
func channelPingPong(batches int) float64 {
	const n = 20000
	ping, pong := make(chan [8]byte), make(chan [8]byte)
	go func() {
		for v := range ping {
			pong <- v
		}
	}()
	defer close(ping)
	var v [8]byte
	vals := make([]float64, max(1, batches))
	for b := -1; b < len(vals); b++ { // one unmeasured batch
		start := time.Now()
		for range n {
			ping <- v
			v = <-pong
		}
		if b >= 0 {
			vals[b] = time.Since(start).Seconds() / n / 2 * 1e6
		}
	}
	sort.Float64s(vals)
	return vals[len(vals)/2]
}

// copyTime returns the median time, in microseconds, of copy() of size
// bytes between two buffers in one goroutine: the in-process bandwidth
// yardstick.
func copyTime(size, batches int) float64 {
	src, dst := make([]byte, size), make([]byte, size)
	n := max(4, min(20000, (256<<20)/max(1, size)))
	vals := make([]float64, max(1, batches))
	for b := -1; b < len(vals); b++ {
		start := time.Now()
		for range n {
			copy(dst, src)
		}
		if b >= 0 {
			vals[b] = time.Since(start).Seconds() / float64(n) * 1e6
		}
	}
	sort.Float64s(vals)
	return vals[len(vals)/2]
}
