package mpi_test

// The attached buffer is process-wide, so these tests never run in
// parallel with each other (none calls t.Parallel) and leave nothing
// attached behind them.

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

// attach attaches size bytes for the test and detaches at its end.
func attach(t *testing.T, size int) {
	t.Helper()
	if err := mpi.BufferAttach(size); err != nil {
		t.Fatalf("BufferAttach(%d): %v", size, err)
	}
	detachAtEnd(t)
}

// detachAtEnd detaches whatever is attached when the test ends.
func detachAtEnd(t *testing.T) {
	t.Cleanup(func() {
		done := make(chan struct{})
		go func() {
			defer close(done)
			mpi.BufferDetach()
		}()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("BufferDetach at the end of the test did not return: messages were never delivered")
		}
	})
}

func TestBufferAttachDetachErrors(t *testing.T) {
	if _, err := mpi.BufferDetach(); !errors.Is(err, mpi.ErrBuffer) {
		t.Errorf("BufferDetach with nothing attached = %v, want ErrBuffer", err)
	}
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() != 0 {
			return nil
		}
		if err := w.Bsend([]byte{1}, 1, 0); !errors.Is(err, mpi.ErrBuffer) {
			return fmt.Errorf("Bsend with nothing attached = %v, want ErrBuffer", err)
		}
		if _, err := w.Ibsend([]byte{1}, 1, 0); !errors.Is(err, mpi.ErrBuffer) {
			return fmt.Errorf("Ibsend with nothing attached = %v, want ErrBuffer", err)
		}
		return nil
	})
	if err := mpi.BufferAttach(-1); err == nil {
		mpi.BufferDetach()
		t.Error("BufferAttach(-1) succeeded")
	}
	attach(t, 1000)
	if err := mpi.BufferAttach(1000); !errors.Is(err, mpi.ErrBuffer) {
		t.Errorf("second BufferAttach = %v, want ErrBuffer", err)
	}
	if n, err := mpi.BufferDetach(); err != nil || n != 1000 {
		t.Errorf("BufferDetach = %d, %v; want 1000", n, err)
	}
	if _, err := mpi.BufferDetach(); !errors.Is(err, mpi.ErrBuffer) {
		t.Errorf("second BufferDetach = %v, want ErrBuffer", err)
	}
	// Attach again after a detach.
	attach(t, 10)
}

// Bsend copies the message and returns before any receive is posted, at
// any size, under every forced protocol; the receiver then gets every
// message intact.
func TestBsend(t *testing.T) {
	sizes := []int{0, 10, 1000, 5000, 300000}
	total := 0
	for _, n := range sizes {
		total += n + mpi.BsendOverhead
	}
	attach(t, 2*total)
	colType := mustType(convertor.Vector(1000, 1, 3, convertor.Float64))
	for _, f := range forces {
		t.Run(forceName(f), func(t *testing.T) {
			j := newJob()
			sent := make(chan struct{})
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					for i, n := range sizes {
						buf := pattern(n, uint64(i))
						if i%2 == 0 {
							if err := w.Bsend(buf, 1, i); err != nil {
								return fmt.Errorf("Bsend of %d bytes: %v", n, err)
							}
						} else {
							r, err := w.Ibsend(buf, 1, i)
							if err != nil {
								return fmt.Errorf("Ibsend of %d bytes: %v", n, err)
							}
							if _, done, err := r.Test(); !done || err != nil {
								return fmt.Errorf("Ibsend of %d bytes: request not complete at once (err %v)", n, err)
							}
						}
						// The buffer may be reused at once.
						fill(buf, 999)
					}
					// A non-contiguous buffer (a column).
					mat := make([]float64, 3000)
					for i := range mat {
						mat[i] = float64(i)
					}
					if err := w.Bsend(mpi.Typed(mat[1:], 1, colType), 1, 99); err != nil {
						return err
					}
					clear(mat)
					close(sent)
					return nil
				}
				if err := j.wait(sent); err != nil {
					return err
				}
				for i, n := range sizes {
					got := make([]byte, n)
					st, err := w.Recv(got, 0, i)
					if err != nil {
						return err
					}
					if st.Count != n {
						return fmt.Errorf("buffered message %d: status %+v", i, st)
					}
					if err := checkBytes(fmt.Sprintf("buffered message of %d bytes", n), got, expected(n, uint64(i))); err != nil {
						return err
					}
				}
				col := make([]float64, 1000)
				if _, err := w.Recv(col, 0, 99); err != nil {
					return err
				}
				for i, v := range col {
					if v != float64(3*i+1) {
						return fmt.Errorf("buffered column: element %d = %v, want %v", i, v, float64(3*i+1))
					}
				}
				return nil
			}, mpi.WithParam("pml_force_protocol", f))
		})
	}
}

// A message that does not fit in the free part of the attached buffer
// fails with ErrBuffer; space held by undelivered messages counts.
func TestBsendNoRoom(t *testing.T) {
	const size = 6000
	attach(t, 2*(size+mpi.BsendOverhead))
	j := newJob()
	sent := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := w.Bsend(make([]byte, 3*size), 1, 0); !errors.Is(err, mpi.ErrBuffer) {
				return fmt.Errorf("Bsend larger than the buffer = %v, want ErrBuffer", err)
			}
			for i := range 2 {
				if err := w.Bsend(pattern(size, uint64(i)), 1, 1); err != nil {
					return fmt.Errorf("Bsend %d of 2 that fit: %v", i, err)
				}
			}
			// Both are undelivered (no receive posted): no room left.
			if err := w.Bsend([]byte{1}, 1, 2); !errors.Is(err, mpi.ErrBuffer) {
				return fmt.Errorf("Bsend into a full buffer = %v, want ErrBuffer", err)
			}
			if _, err := w.Ibsend([]byte{1}, 1, 2); !errors.Is(err, mpi.ErrBuffer) {
				return fmt.Errorf("Ibsend into a full buffer = %v, want ErrBuffer", err)
			}
			close(sent)
			return nil
		}
		if err := j.wait(sent); err != nil {
			return err
		}
		for i := range 2 {
			got := make([]byte, size)
			if _, err := w.Recv(got, 0, 1); err != nil {
				return err
			}
			if err := checkBytes("buffered message", got, expected(size, uint64(i))); err != nil {
				return err
			}
		}
		if _, ok, err := w.Iprobe(mpi.AnySource, mpi.AnyTag); err != nil || ok {
			return fmt.Errorf("a failed Bsend delivered a message (ok=%v, err=%v)", ok, err)
		}
		return nil
	})
}

// BufferDetach waits until the buffered messages were delivered and
// returns the buffer's size.
func TestBufferDetachWaitsForDelivery(t *testing.T) {
	const size = 300000
	if err := mpi.BufferAttach(size + mpi.BsendOverhead + 100); err != nil {
		t.Fatal(err)
	}
	detachAtEnd(t)
	j := newJob()
	detaching, detached := make(chan struct{}), make(chan struct{})
	var posted atomic.Bool
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := w.Bsend(pattern(size, 7), 1, 0); err != nil {
				return err
			}
			close(detaching)
			n, err := mpi.BufferDetach()
			close(detached)
			if err != nil || n != size+mpi.BsendOverhead+100 {
				return fmt.Errorf("BufferDetach = %d, %v; want %d", n, err, size+mpi.BsendOverhead+100)
			}
			if !posted.Load() {
				return errors.New("BufferDetach returned before the message's receive was posted")
			}
			return nil
		}
		if err := j.wait(detaching); err != nil {
			return err
		}
		select {
		case <-detached:
			return errors.New("BufferDetach returned while a buffered message was undelivered")
		default:
		}
		posted.Store(true)
		got := make([]byte, size)
		if _, err := w.Recv(got, 0, 0); err != nil {
			return err
		}
		return checkBytes("message delivered during BufferDetach", got, expected(size, 7))
	})
}
