// Package mpitest holds checks that the in-process tests (package mpi)
// and the multi-process conformance program (tests/progs/conform) share.
package mpitest

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"

	"github.com/gompi-org/gompi/mpi"
)

// Windows streams rounds windows of window nonblocking messages (sizes in
// turn) both ways between this rank and peer, on two lanes (goroutines)
// at once, while another goroutine Tests each window's receives: requests
// given back to the pools are reused at once. It checks every byte and the
// source, tag and count of every message. Tags are tagBase up to
// tagBase+2*rounds-1.
func Windows(w *mpi.Comm, peer, tagBase, rounds, window int, sizes []int) error {
	lane := func(l int) error {
		for round := range rounds {
			tag := tagBase + l*rounds + round
			recvs, sends := make([]*mpi.Request, window), make([]*mpi.Request, window)
			bufs := make([][]byte, window)
			for i := range window {
				bufs[i] = make([]byte, sizes[i%len(sizes)])
				var err error
				if recvs[i], err = w.Irecv(bufs[i], peer, tag); err != nil {
					return err
				}
			}
			for i := range window {
				var err error
				if sends[i], err = w.Isend(content(sizes[i%len(sizes)], w.Rank(), tag, i), peer, tag); err != nil {
					return err
				}
			}
			_, tested := TestEach(recvs)
			sts, err := mpi.Waitall(recvs)
			if err != nil {
				return err
			}
			if err := <-tested; err != nil {
				return err
			}
			if _, err := mpi.Waitall(sends); err != nil {
				return err
			}
			for i := range window {
				want := content(sizes[i%len(sizes)], peer, tag, i)
				if !bytes.Equal(bufs[i], want) || sts[i].Source != peer || sts[i].Tag != tag || sts[i].Count != len(want) {
					return fmt.Errorf("lane %d round %d message %d: wrong bytes or status %+v", l, round, i, sts[i])
				}
			}
		}
		return nil
	}
	errs := make(chan error, 2)
	for l := range 2 {
		go func() { errs <- lane(l) }()
	}
	return errors.Join(<-errs, <-errs)
}

// content is message i of tag from rank src: n bytes that differ between
// messages.
func content(n, src, tag, i int) []byte {
	b := make([]byte, n)
	seed := src*7919 + tag*131 + i
	for k := range b {
		b[k] = byte(k*31 + seed*7 + k>>8)
	}
	return b
}

// TestEach calls Test on each of reqs in turn, from another goroutine,
// until it reports done. The statuses it saw are valid once the channel
// gave nil; it gives the first error otherwise.
func TestEach(reqs []*mpi.Request) ([]mpi.Status, <-chan error) {
	sts := make([]mpi.Status, len(reqs))
	errc := make(chan error, 1)
	go func() {
		for i, r := range reqs {
			for {
				st, done, err := r.Test()
				if err != nil {
					errc <- err
					return
				}
				if done {
					sts[i] = st
					break
				}
				runtime.Gosched()
			}
		}
		errc <- nil
	}()
	return sts, errc
}
