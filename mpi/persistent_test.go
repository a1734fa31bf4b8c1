package mpi_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

// A ring of persistent sends and receives started every iteration, as a
// halo exchange is written: every round carries what the buffer held at
// Start, eager and rendezvous, waited for through Request with Waitall
// and through the Persistent's own Wait.
func TestPersistentRing(t *testing.T) {
	const n, rounds = 3, 40
	for _, count := range []int{4, 30000} {
		t.Run(fmt.Sprintf("count=%d", count), func(t *testing.T) {
			t.Parallel()
			mustRun(t, n, func(w *mpi.Comm) error {
				me := w.Rank()
				right, left := (me+1)%n, (me+n-1)%n
				out, in := make([]float64, count), make([]float64, count)
				val := func(rank, round, i int) float64 { return float64(rank*1e9 + round*1e5 + i) }
				send, err := w.SendInit(out, right, 5)
				if err != nil {
					return err
				}
				recv, err := w.RecvInit(in, left, 5)
				if err != nil {
					return err
				}
				ps := []*mpi.Persistent{recv, send}
				for round := range rounds {
					for i := range out {
						out[i] = val(me, round, i)
					}
					if err := mpi.Startall(ps); err != nil {
						return fmt.Errorf("round %d: %w", round, err)
					}
					var st mpi.Status
					if round%2 == 0 {
						sts, err := mpi.Waitall([]*mpi.Request{recv.Request(), send.Request()})
						if err != nil {
							return fmt.Errorf("round %d: %w", round, err)
						}
						st = sts[0]
					} else {
						if st, err = recv.Wait(); err != nil {
							return fmt.Errorf("round %d: %w", round, err)
						}
						if _, err := send.Wait(); err != nil {
							return fmt.Errorf("round %d: %w", round, err)
						}
					}
					if st.Source != left || st.Tag != 5 || st.Count != 8*count {
						return fmt.Errorf("round %d: status %+v", round, st)
					}
					for i, v := range in {
						if v != val(left, round, i) {
							return fmt.Errorf("round %d: in[%d] = %v, want %v", round, i, v, val(left, round, i))
						}
					}
				}
				return nil
			})
		})
	}
}

// Start during a round is ErrArg and starts nothing: the round's receive
// takes one message and the second stays for a plain Recv. Before the
// first Start, Wait and Test return MPI's empty status at once.
func TestPersistentActiveStart(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 1 {
			if _, err := w.Recv(nil, 0, 1); err != nil { // rank 0's receive is started
				return err
			}
			if err := w.Send([]byte{1}, 0, 2); err != nil {
				return err
			}
			return w.Send([]byte{2}, 0, 2)
		}
		b := make([]byte, 1)
		p, err := w.RecvInit(b, 1, 2)
		if err != nil {
			return err
		}
		st, err := p.Wait()
		if err != nil || st.Source != mpi.AnySource || st.Tag != mpi.AnyTag || st.Count != 0 {
			return fmt.Errorf("Wait before Start: %+v, %v", st, err)
		}
		if _, done, err := p.Test(); !done || err != nil {
			return fmt.Errorf("Test before Start: done %v, %v", done, err)
		}
		if p.Request() != nil {
			return errors.New("Request before Start is not nil")
		}
		if err := p.Start(); err != nil {
			return err
		}
		if err := wantErr("Start during a round", p.Start(), mpi.ErrArg); err != nil {
			return err
		}
		// Rank 1 sends nothing before rank 0's go-ahead: the round waits.
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		_, err = p.WaitContext(ctx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("WaitContext on a round with no message: %v", err)
		}
		if err := w.Send(nil, 1, 1); err != nil {
			return err
		}
		if _, err := p.Wait(); err != nil {
			return err
		}
		if b[0] != 1 {
			return fmt.Errorf("the round received %d, want 1", b[0])
		}
		if _, err := w.Recv(b, 1, 2); err != nil || b[0] != 2 {
			return fmt.Errorf("the second message: %d, %v (a refused Start took it?)", b[0], err)
		}
		return nil
	})
}

// A cancelled round completes with Cancelled set and the next round
// receives normally; a strided datatype is packed afresh every round.
func TestPersistentCancelAndTyped(t *testing.T) {
	col, err := convertor.Vector(4, 1, 4, convertor.Float64)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := col.Commit(); err != nil {
		t.Fatal(err)
	}
	mustRun(t, 2, func(w *mpi.Comm) error {
		m := make([]float64, 16)
		if w.Rank() == 0 {
			p, err := w.SendInit(mpi.Typed(m, 1, col), 1, 3)
			if err != nil {
				return err
			}
			if _, err := w.Recv(nil, 1, 9); err != nil { // rank 1 cancelled its first round
				return err
			}
			for round := range 3 {
				for r := range 4 {
					m[4*r] = float64(10*round + r)
				}
				if err := p.Start(); err != nil {
					return err
				}
				if _, err := p.Wait(); err != nil {
					return err
				}
			}
			return nil
		}
		got := make([]float64, 4)
		p, err := w.RecvInit(got, 0, 3)
		if err != nil {
			return err
		}
		if err := p.Start(); err != nil {
			return err
		}
		if err := p.Cancel(); err != nil {
			return err
		}
		if st, err := p.Wait(); err != nil || !st.Cancelled {
			return fmt.Errorf("cancelled round: %+v, %v", st, err)
		}
		if err := w.Send(nil, 0, 9); err != nil {
			return err
		}
		for round := range 3 {
			if err := p.Start(); err != nil {
				return err
			}
			st, err := p.Wait()
			if err != nil || st.Cancelled || st.Count != 32 {
				return fmt.Errorf("round %d: %+v, %v", round, st, err)
			}
			for r, v := range got {
				if v != float64(10*round+r) {
					return fmt.Errorf("round %d: element %d = %v", round, r, v)
				}
			}
		}
		return nil
	})
}

// A persistent receive's request given to WaitallRelease is not reused by
// a later Irecv: the next Start still sees its round complete. Rank 0
// sends each message only once rank 1's receive is posted, so that the
// receive takes the common path, whose Handles WaitallRelease recycles
// (a Waitall of Irecvs first fills the free list that path takes from).
func TestPersistentAfterWaitallRelease(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		var err error
		b := make([]byte, 8)
		if w.Rank() == 0 {
			for range 4 {
				if err := w.Send(b, 1, 3); err != nil {
					return err
				}
			}
			for range 2 {
				if _, err := w.Recv(nil, 1, 7); err != nil {
					return err
				}
				if err := w.Send(b, 1, 4); err != nil {
					return err
				}
			}
			_, err := w.Recv(nil, 1, 6) // rank 1 is done
			return err
		}
		warm := make([]*mpi.Request, 4)
		for i := range warm {
			if warm[i], err = w.Irecv(make([]byte, 8), 0, 3); err != nil {
				return err
			}
		}
		if _, err := mpi.Waitall(warm); err != nil {
			return err
		}
		p, err := w.RecvInit(b, 0, 4)
		if err != nil {
			return err
		}
		if err := p.Start(); err != nil {
			return err
		}
		if err := w.Send(nil, 0, 7); err != nil {
			return err
		}
		if err := w.WaitallRelease([]*mpi.Request{p.Request()}, nil); err != nil {
			return err
		}
		// Irecvs that could take a released Handle; none completes yet.
		var pending []*mpi.Request
		for range 4 {
			r, err := w.Irecv(make([]byte, 1), 0, 5)
			if err != nil {
				return err
			}
			pending = append(pending, r)
		}
		if err := p.Start(); err != nil {
			return fmt.Errorf("Start after WaitallRelease: %w", err)
		}
		if err := w.Send(nil, 0, 7); err != nil {
			return err
		}
		if _, err := p.Wait(); err != nil {
			return err
		}
		for _, r := range pending {
			r.Cancel()
		}
		if _, err := mpi.Waitall(pending); err != nil {
			return err
		}
		return w.Send(nil, 0, 6)
	})
}

// Arguments are checked when the request is made; a freed communicator
// fails the next Start.
func TestPersistentErrors(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		for _, c := range []struct {
			name  string
			err   error
			class error
		}{
			{"dest out of range", second(w.SendInit([]byte{1}, 2, 0)), mpi.ErrRank},
			{"bad tag", second(w.SsendInit([]byte{1}, 1, -4)), mpi.ErrTag},
			{"bad buffer", second(w.RecvInit("text", 1, 0)), mpi.ErrBuffer},
			{"bad source", second(w.RecvInit([]byte{1}, 7, 0)), mpi.ErrRank},
			{"nil Start", (*mpi.Persistent)(nil).Start(), mpi.ErrArg},
		} {
			if err := wantErr(c.name, c.err, c.class); err != nil {
				return err
			}
		}
		d, err := w.Dup()
		if err != nil {
			return err
		}
		p, err := d.SendInit([]byte{1}, 1-w.Rank(), 0)
		if err != nil {
			return err
		}
		if err := d.Free(); err != nil {
			return err
		}
		return wantErr("Start on a freed communicator", p.Start(), mpi.ErrComm)
	})
}

// second returns the error of a (value, error) pair.
func second[T any](_ T, err error) error { return err }

// Each round of a persistent buffered send copies the buffer as it is at
// Start, so the caller may change it at once.
func TestPersistentBsend(t *testing.T) {
	attach(t, 4*(64+mpi.BsendOverhead))
	mustRun(t, 2, func(w *mpi.Comm) error {
		b := make([]byte, 64)
		if w.Rank() == 0 {
			p, err := w.BsendInit(b, 1, 8)
			if err != nil {
				return err
			}
			for round := range 6 {
				for i := range b {
					b[i] = byte(round)
				}
				if err := p.Start(); err != nil {
					return err
				}
				if _, done, err := p.Test(); !done || err != nil {
					return fmt.Errorf("round %d: a buffered round is complete at Start (done %v, %v)", round, done, err)
				}
			}
			return nil
		}
		for round := range 6 {
			if _, err := w.Recv(b, 0, 8); err != nil {
				return err
			}
			for i, v := range b {
				if v != byte(round) {
					return fmt.Errorf("round %d: byte %d = %d", round, i, v)
				}
			}
		}
		return nil
	})
}
