package mpi_test

import (
	"os"
	"strconv"
	"testing"

	"github.com/gompi-org/gompi/mpi"
)

// TestCGRate runs CG_WINDOWS windows of gompi-bench rate 8 B between two
// in-process ranks, each rank's calls of a window in one function (cgPost:
// the Isends or Irecvs, cgWait: the Waitall), for an instruction counter:
// bench/instr.sh counts the receiver's cgPost, whose work is the mpi and
// pml layers' alone (posting touches no transport).
func TestCGRate(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CG_WINDOWS"))
	if n == 0 {
		t.Skip("CG_WINDOWS not set")
	}
	mustRun(t, 2, func(w *mpi.Comm) error {
		reqs := make([]*mpi.Request, 64)
		var b, ack any = make([]byte, 8), make([]int32, 1)
		for range n {
			post := cgRecvs
			if w.Rank() == 0 {
				post = cgSends
			}
			if err := post(w, reqs, b); err != nil {
				return err
			}
			if err := cgWait(reqs); err != nil {
				return err
			}
			var err error
			if w.Rank() == 0 {
				_, err = w.Recv(ack, 1, 2)
			} else {
				err = w.Send(ack, 0, 2)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

//go:noinline
func cgSends(w *mpi.Comm, reqs []*mpi.Request, b any) error {
	var err error
	for i := range reqs {
		if reqs[i], err = w.Isend(b, 1, 1); err != nil {
			return err
		}
	}
	return nil
}

//go:noinline
func cgRecvs(w *mpi.Comm, reqs []*mpi.Request, b any) error {
	var err error
	for i := range reqs {
		if reqs[i], err = w.Irecv(b, 0, 1); err != nil {
			return err
		}
	}
	return nil
}

//go:noinline
func cgWait(reqs []*mpi.Request) error { return mpi.WaitallInto(reqs, nil) }
