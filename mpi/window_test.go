package mpi_test

import (
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/mpi"
)

// Windows of Irecvs completed while Waitall waits on them (the sender
// sends each window only once the receiver is about to wait), many times
// over: the requests Waitall gives back are reused by the next window's
// Irecvs, and every receive still gets its own message, in order, with
// its own status.
func TestWaitallWindowsReuseRequests(t *testing.T) {
	const windows, window = 50, 16
	mustRun(t, 2, func(w *mpi.Comm) error {
		go1 := []byte{0}
		if w.Rank() == 0 {
			for k := range windows {
				if _, err := w.Recv(go1, 1, 99); err != nil {
					return err
				}
				for i := range window {
					n := 1 + (k*window+i)%300
					if err := w.Send(expected(n, uint64(k*window+i)), 1, i); err != nil {
						return err
					}
				}
			}
			return nil
		}
		bufs := make([][]byte, window)
		for i := range bufs {
			bufs[i] = make([]byte, 300)
		}
		reqs := make([]*mpi.Request, window)
		for k := range windows {
			for i := range reqs {
				var err error
				if reqs[i], err = w.Irecv(bufs[i], 0, i); err != nil {
					return err
				}
			}
			if err := w.Send(go1, 0, 99); err != nil {
				return err
			}
			sts, err := mpi.Waitall(reqs)
			if err != nil {
				return err
			}
			for i, st := range sts {
				n := 1 + (k*window+i)%300
				if st.Source != 0 || st.Tag != i || st.Count != n {
					return fmt.Errorf("window %d receive %d: status %+v, want tag %d count %d", k, i, st, i, n)
				}
				if err := checkBytes(fmt.Sprintf("window %d receive %d", k, i), bufs[i][:n], expected(n, uint64(k*window+i))); err != nil {
					return err
				}
			}
		}
		return nil
	})
}
