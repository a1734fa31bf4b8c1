// Command probe times a blocking ping-pong whose receiver does not know
// the message's size: Probe, then Recv of the probed count (-mode probe),
// Mprobe, then Message.Recv (-mode mprobe), or, for comparison, a Recv
// from AnySource with AnyTag into a buffer large enough (-mode any). Rank
// 0 prints half the round trip. bench/probe.c is the same program in C
// for an MPI library; bench/probe.sh runs both side by side.
//
//	go run ./cmd/gorun -np 2 ./bench/probe -mode probe
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	iters := flag.Int("iters", 200000, "round trips timed (after 20000 not timed)")
	size := flag.Int("size", 8, "bytes per message")
	mode := flag.String("mode", "probe", "probe (Probe, Recv), mprobe (Mprobe, Message.Recv) or any (Recv from AnySource, AnyTag)")
	flag.Parse()
	if err := run(*iters, *size, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "probe:", err)
		os.Exit(1)
	}
}

func run(iters, size int, mode string) error {
	if mode != "probe" && mode != "mprobe" && mode != "any" {
		return fmt.Errorf("-mode %q: want probe, mprobe or any", mode)
	}
	w, err := mpi.Init()
	if err != nil {
		return err
	}
	if w.Size() != 2 {
		return fmt.Errorf("needs 2 ranks, not %d", w.Size())
	}
	rank := w.Rank()
	peer := 1 - rank
	out, in := make([]byte, size), make([]byte, size)
	recv := func() error {
		switch mode {
		case "probe":
			st, err := w.Probe(peer, 1)
			if err != nil {
				return err
			}
			_, err = w.Recv(in[:st.Count], st.Source, st.Tag)
			return err
		case "mprobe":
			m, st, err := w.Mprobe(peer, 1)
			if err != nil {
				return err
			}
			_, err = m.Recv(in[:st.Count])
			return err
		}
		_, err := w.Recv(in, mpi.AnySource, mpi.AnyTag)
		return err
	}
	var start time.Time
	for i := -20000; i < iters; i++ {
		if i == 0 {
			start = time.Now()
		}
		if rank == 0 {
			if err := w.Send(out, peer, 1); err != nil {
				return err
			}
			if err := recv(); err != nil {
				return err
			}
			continue
		}
		if err := recv(); err != nil {
			return err
		}
		if err := w.Send(out, peer, 1); err != nil {
			return err
		}
	}
	if rank == 0 {
		fmt.Printf("%s %d B: %.3f us\n", mode, size, time.Since(start).Seconds()/float64(iters)/2*1e6)
	}
	return mpi.Finalize()
}
