// Command shapes times blocking calls in shapes a plain ping-pong leaves
// out, between 2 ranks: a ping-pong whose receiver learns the size from
// a probe (-mode probe: Probe, then Recv of the probed count; -mode
// mprobe: Mprobe, then Message.Recv), one that receives from AnySource
// with AnyTag (-mode any), one that polls its receive with Test (-mode
// test: Irecv, then Test until done) or waits with Waitany (-mode
// waitany), one whose sends are synchronous (-mode ssend: Ssend, Recv),
// and a loop of Barrier (-mode barrier). Rank 0 prints
// half the round trip (the whole call for barrier). bench/shapes.c is the
// same program in C for an MPI library; bench/shapes.sh runs both side by
// side.
//
//	go run ./cmd/gorun -np 2 ./bench/shapes -mode probe
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	iters := flag.Int("iters", 200000, "round trips (or barriers) timed, after 20000 not timed")
	size := flag.Int("size", 8, "bytes per message")
	mode := flag.String("mode", "probe", "probe, mprobe, any, test, waitany, ssend or barrier")
	flag.Parse()
	if err := run(*iters, *size, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "shapes:", err)
		os.Exit(1)
	}
}

func run(iters, size int, mode string) error {
	switch mode {
	case "probe", "mprobe", "any", "test", "waitany", "ssend", "barrier":
	default:
		return fmt.Errorf("-mode %q: want probe, mprobe, any, test, waitany, ssend or barrier", mode)
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
	reqs := make([]*mpi.Request, 1)
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
		case "any":
			_, err := w.Recv(in, mpi.AnySource, mpi.AnyTag)
			return err
		case "test":
			r, err := w.Irecv(in, peer, 1)
			for err == nil {
				var done bool
				if _, done, err = r.Test(); done {
					break
				}
			}
			return err
		case "waitany":
			var err error
			if reqs[0], err = w.Irecv(in, peer, 1); err != nil {
				return err
			}
			_, _, err = mpi.Waitany(reqs)
			return err
		}
		_, err := w.Recv(in, peer, 1)
		return err
	}
	send := func() error {
		if mode == "ssend" {
			return w.Ssend(out, peer, 1)
		}
		return w.Send(out, peer, 1)
	}
	step := func() error {
		if mode == "barrier" {
			return w.Barrier()
		}
		if rank == 0 {
			if err := send(); err != nil {
				return err
			}
			return recv()
		}
		if err := recv(); err != nil {
			return err
		}
		return send()
	}
	var start time.Time
	for i := -20000; i < iters; i++ {
		if i == 0 {
			start = time.Now()
		}
		if err := step(); err != nil {
			return err
		}
	}
	if rank == 0 {
		d := time.Since(start).Seconds() / float64(iters) * 1e6
		if mode != "barrier" {
			d /= 2
		}
		fmt.Printf("%s %d B: %.3f us\n", mode, size, d)
	}
	return mpi.Finalize()
}
