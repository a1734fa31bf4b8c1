package mpi_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gompi-org/gompi/mpi"
)

var errDie = errors.New("test: this rank dies here")

// recovery runs body on n in-process ranks with enable_recovery, where a
// rank that returns errDie counts as a dead process for the others. It
// fails the test unless the only errors Run returns are those of the
// ranks in dead.
func recovery(t *testing.T, n int, dead []int, body func(w *mpi.Comm) error, opts ...mpi.Option) {
	t.Helper()
	var err error
	within(t, "mpi.Run with enable_recovery", func() {
		err = mpi.Run(n, body, append(opts, mpi.WithParam("enable_recovery", "true"))...)
	})
	for r := range n {
		mention := strings.Contains(fmt.Sprint(err), fmt.Sprintf("rank %d: ", r))
		if want := slices.Contains(dead, r); mention != want {
			t.Fatalf("Run returned %v; want errors of ranks %v only", err, dead)
		}
	}
	if len(dead) > 0 && !errors.Is(err, errDie) {
		t.Fatalf("Run returned %v, want it to wrap errDie", err)
	}
}

// A dead rank's pending and later operations fail on the survivors, an
// eager message it sent before it died stays deliverable, AnySource
// receives fail until FailureAck, collectives fail instead of waiting,
// and everything between the survivors keeps working, in every protocol.
func TestRecoverySurvivors(t *testing.T) {
	for _, force := range forces {
		t.Run(forceName(force), func(t *testing.T) {
			t.Parallel()
			survivors(t, force == "" || force == "eager", protocolOpts(force, true))
		})
	}
}

// survivors is TestRecoverySurvivors with one protocol setting; eager:
// rank 2's 8-byte message travels eagerly (arrives before its death).
func survivors(t *testing.T, eager bool, opts []mpi.Option) {
	{
		posted := make(chan struct{})
		acked := make(chan struct{})
		const big = 1 << 20
		recovery(t, 3, []int{2}, func(w *mpi.Comm) error {
			switch w.Rank() {
			case 2:
				if _, err := recvFrom(newJob(), posted); err != nil {
					return err
				}
				// Eager: arrives before the death. Else only the RNDV
				// does, which the survivor drops.
				if _, err := w.Isend(pattern(8, 5), 0, 5); err != nil {
					return err
				}
				return errDie
			case 1:
				// Learn of the death the way a program would: a receive
				// from the dead rank fails.
				if _, err := w.Recv(make([]byte, 8), 2, 0); !errors.Is(err, mpi.ErrProcFailed) {
					return fmt.Errorf("Recv from the dead rank: %v, want ErrProcFailed", err)
				}
				if err := wantErr("Barrier", w.Barrier(), mpi.ErrProcFailed); err != nil {
					return err
				}
				if _, err := w.Dup(); !errors.Is(err, mpi.ErrProcFailed) {
					return fmt.Errorf("Dup: %v, want ErrProcFailed", err)
				}
				<-acked
				for i := range 20 {
					n := []int{0, 8, 4 << 10, 64 << 10, big}[i%5]
					if err := w.Send(pattern(n, uint64(i)), 0, 1); err != nil {
						return fmt.Errorf("survivor send %d: %w", i, err)
					}
					buf := make([]byte, n)
					if _, err := w.Recv(buf, 0, 2); err != nil {
						return fmt.Errorf("survivor receive %d: %w", i, err)
					}
					if err := checkBytes(fmt.Sprintf("message %d from rank 0", i), buf, pattern(n, uint64(100+i))); err != nil {
						return err
					}
				}
				return nil
			}
			// Rank 0.
			rAny, err := w.Irecv(make([]byte, 8), mpi.AnySource, 9)
			if err != nil {
				return err
			}
			rDead, err := w.Irecv(make([]byte, 8), 2, 7)
			if err != nil {
				return err
			}
			sBig, err := w.Isend(pattern(big, 1), 2, 8)
			if err != nil {
				return err
			}
			close(posted)
			for what, r := range map[string]*mpi.Request{"pending AnySource receive": rAny, "pending receive from the dead": rDead, "pending 1 MiB send to the dead": sBig} {
				if _, err := r.Wait(); !errors.Is(err, mpi.ErrProcFailed) {
					return fmt.Errorf("%s: %v, want ErrProcFailed", what, err)
				}
			}
			// Sent eagerly before the death: still there.
			got := make([]byte, 8)
			if eager {
				if st, err := w.Recv(got, 2, 5); err != nil || st.Source != 2 || st.Count != 8 {
					return fmt.Errorf("receive of the message the dead rank sent before it died: %+v %v", st, err)
				}
				if err := checkBytes("message of the dead rank", got, pattern(8, 5)); err != nil {
					return err
				}
			}
			if _, err := w.Recv(got, 2, 5); !errors.Is(err, mpi.ErrProcFailed) {
				return fmt.Errorf("second Recv from the dead rank: %v, want ErrProcFailed", err)
			}
			for what, err := range map[string]error{
				"Send":        w.Send(pattern(8, 1), 2, 1),
				"Ssend":       w.Ssend(pattern(8, 1), 2, 1),
				"large Send":  w.Send(pattern(big, 1), 2, 1),
				"Barrier":     w.Barrier(),
				"Dup":         func() error { _, err := w.Dup(); return err }(),
				"Probe":       func() error { _, err := w.Probe(2, mpi.AnyTag); return err }(),
				"Iprobe":      func() error { _, _, err := w.Iprobe(2, mpi.AnyTag); return err }(),
				"AnySource":   func() error { _, err := w.Recv(got, mpi.AnySource, 1); return err }(),
				"AnySrcProbe": func() error { _, _, err := w.Iprobe(mpi.AnySource, mpi.AnyTag); return err }(),
			} {
				if !errors.Is(err, mpi.ErrProcFailed) {
					return fmt.Errorf("%s naming the dead rank: %v, want ErrProcFailed", what, err)
				}
			}
			if f := w.FailedRanks(); len(f) != 0 {
				return fmt.Errorf("FailedRanks before FailureAck = %v, want none", f)
			}
			if err := w.FailureAck(); err != nil {
				return err
			}
			if f := w.FailedRanks(); !slices.Equal(f, []int{2}) {
				return fmt.Errorf("FailedRanks = %v, want [2]", f)
			}
			close(acked)
			for i := range 20 {
				n := []int{0, 8, 4 << 10, 64 << 10, big}[i%5]
				buf := make([]byte, n)
				st, err := w.Recv(buf, mpi.AnySource, 1)
				if err != nil {
					return fmt.Errorf("AnySource receive %d after FailureAck: %w", i, err)
				}
				if st.Source != 1 || st.Count != n {
					return fmt.Errorf("AnySource receive %d: status %+v", i, st)
				}
				if err := checkBytes(fmt.Sprintf("message %d from rank 1", i), buf, pattern(n, uint64(i))); err != nil {
					return err
				}
				if err := w.Send(pattern(n, uint64(100+i)), 1, 2); err != nil {
					return err
				}
			}
			return nil
		}, opts...)
	}
}

// Without enable_recovery a failing rank still aborts the others.
func TestNoRecoveryAborts(t *testing.T) {
	err := run(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 1 {
			return errDie
		}
		_, err := w.Recv(make([]byte, 8), 1, 0)
		return err
	})
	if !errors.Is(err, mpi.ErrAborted) || !errors.Is(err, errDie) {
		t.Fatalf("Run returned %v, want errDie and ErrAborted", err)
	}
}

// A failure that becomes known after FailureAck needs a new one: the
// acknowledged set only grows at FailureAck, ascending.
func TestFailureAckIsASnapshot(t *testing.T) {
	first := make(chan struct{})
	recovery(t, 4, []int{1, 3}, func(w *mpi.Comm) error {
		switch w.Rank() {
		case 3:
			return errDie
		case 1:
			<-first
			return errDie
		case 2:
			// Wait for both deaths, then take part in nothing.
			for _, r := range []int{3, 1} {
				if _, err := w.Recv(nil, r, 0); !errors.Is(err, mpi.ErrProcFailed) {
					return fmt.Errorf("Recv from rank %d: %v", r, err)
				}
			}
			return nil
		}
		if _, err := w.Recv(nil, 3, 0); !errors.Is(err, mpi.ErrProcFailed) {
			return fmt.Errorf("Recv from rank 3: %v", err)
		}
		if err := w.FailureAck(); err != nil {
			return err
		}
		if f := w.FailedRanks(); !slices.Equal(f, []int{3}) {
			return fmt.Errorf("FailedRanks = %v, want [3]", f)
		}
		close(first)
		if _, err := w.Recv(nil, 1, 0); !errors.Is(err, mpi.ErrProcFailed) {
			return fmt.Errorf("Recv from rank 1: %v", err)
		}
		if _, _, err := w.Iprobe(mpi.AnySource, 0); !errors.Is(err, mpi.ErrProcFailed) {
			return fmt.Errorf("AnySource Iprobe with rank 1's failure unacknowledged: %v", err)
		}
		if f := w.FailedRanks(); !slices.Equal(f, []int{3}) {
			return fmt.Errorf("FailedRanks before the second FailureAck = %v, want [3]", f)
		}
		w.FailureAck()
		if f := w.FailedRanks(); !slices.Equal(f, []int{1, 3}) {
			return fmt.Errorf("FailedRanks = %v, want [1 3]", f)
		}
		if _, ok, err := w.Iprobe(mpi.AnySource, 0); ok || err != nil {
			return fmt.Errorf("AnySource Iprobe after FailureAck: %v %v, want nothing and no error", ok, err)
		}
		return nil
	})
}
