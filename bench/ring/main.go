// Command ring times the neighbour exchange of a 1-D decomposition, the
// shape halo codes write: every rank swaps a message with its right and
// its left neighbour each step, by two Sendrecv calls (-mode sr), by two
// Irecv, two Isend and a Waitall (-mode nb), or by Irecv, Send and Wait
// twice (-mode isr). Rank 0 prints the time per
// step. bench/ring.c is the same program in C for an MPI library; bench/ring.sh
// runs both side by side, also with more ranks than cores.
//
//	go run ./cmd/gorun -np 4 ./bench/ring -size 8 -mode sr
package main

import (
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	steps := flag.Int("steps", 20000, "exchanges timed (after at least 100 ms of exchanges not timed)")
	size := flag.Int("size", 8, "bytes per message")
	mode := flag.String("mode", "sr", "sr (two Sendrecv), nb (Irecv, Irecv, Isend, Isend, Waitall) or isr (Irecv, Send, Wait, twice)")
	flag.Parse()
	if err := run(*steps, *size, *mode); err != nil {
		fmt.Fprintln(os.Stderr, "ring:", err)
		os.Exit(1)
	}
}

func run(steps, size int, mode string) error {
	if mode != "sr" && mode != "nb" && mode != "isr" {
		return fmt.Errorf("-mode %q: want sr, nb or isr", mode)
	}
	w, err := mpi.Init()
	if err != nil {
		return err
	}
	rank, n := w.Rank(), w.Size()
	right, left := (rank+1)%n, (rank+n-1)%n
	toR, toL, fromL, fromR := make([]byte, size), make([]byte, size), make([]byte, size), make([]byte, size)
	reqs := make([]*mpi.Request, 4)
	step := func() error {
		if mode == "isr" {
			for _, x := range [2]struct {
				to, from, tag int
				out, in       []byte
			}{{right, left, 1, toR, fromL}, {left, right, 2, toL, fromR}} {
				q, err := w.Irecv(x.in, x.from, x.tag)
				if err != nil {
					return err
				}
				if err := w.Send(x.out, x.to, x.tag); err != nil {
					return err
				}
				if _, err := q.Wait(); err != nil {
					return err
				}
			}
			return nil
		}
		if mode == "sr" {
			if _, err := w.Sendrecv(toR, right, 1, fromL, left, 1); err != nil {
				return err
			}
			_, err := w.Sendrecv(toL, left, 2, fromR, right, 2)
			return err
		}
		var err error
		if reqs[0], err = w.Irecv(fromL, left, 1); err != nil {
			return err
		}
		if reqs[1], err = w.Irecv(fromR, right, 2); err != nil {
			return err
		}
		if reqs[2], err = w.Isend(toR, right, 1); err != nil {
			return err
		}
		if reqs[3], err = w.Isend(toL, left, 2); err != nil {
			return err
		}
		_, err = mpi.Waitall(reqs)
		return err
	}
	// Warm-up: rounds of 1000 steps until rank 0 has seen 100 ms go by
	// (a new process's first 10-20 ms run slower, which a short run
	// would measure), rank 0 telling the others after each round whether
	// to go on. bench/ring.c does the same.
	goOn := make([]byte, 1)
	for t0 := time.Now(); ; {
		for range 1000 {
			if err := step(); err != nil {
				return err
			}
		}
		if rank == 0 {
			goOn[0] = 0
			if time.Since(t0) < 100*time.Millisecond {
				goOn[0] = 1
			}
			for r := 1; r < n; r++ {
				if err := w.Send(goOn, r, 9); err != nil {
					return err
				}
			}
		} else if _, err := w.Recv(goOn, 0, 9); err != nil {
			return err
		}
		if goOn[0] == 0 {
			break
		}
	}
	if err := w.Barrier(); err != nil {
		return err
	}
	start := time.Now()
	for range steps {
		if err := step(); err != nil {
			return err
		}
	}
	d := time.Since(start)
	if rank == 0 {
		fmt.Printf("%s %d ranks %d B: %.2f us/step\n", mode, n, size, d.Seconds()/float64(steps)*1e6)
	}
	return mpi.Finalize()
}
