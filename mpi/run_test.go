package mpi_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

func TestConstants(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want int
	}{
		{"AnySource", mpi.AnySource, -1},
		{"AnyTag", mpi.AnyTag, -1},
		{"ProcNull", mpi.ProcNull, -2},
		{"TagUB", mpi.TagUB, 1<<30 - 1},
		{"Undefined", mpi.Undefined, -32766},
		{"convertor.Undefined", convertor.Undefined, mpi.Undefined},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// Every rank gets its own number 0..n-1 and sees the same size.
func TestRunRanksAndSize(t *testing.T) {
	for _, n := range []int{1, 2, 3, 8, 33} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			seen := map[int]int{}
			mustRun(t, n, func(w *mpi.Comm) error {
				if w.Size() != n {
					return fmt.Errorf("Size() = %d, want %d", w.Size(), n)
				}
				mu.Lock()
				seen[w.Rank()]++
				mu.Unlock()
				return nil
			})
			if len(seen) != n {
				t.Fatalf("ranks seen: %v, want each of 0..%d once", seen, n-1)
			}
			for r := range n {
				if seen[r] != 1 {
					t.Fatalf("rank %d ran %d times (ranks seen: %v)", r, seen[r], seen)
				}
			}
		})
	}
}

// Run joins the ranks' errors, naming the rank.
func TestRunJoinsRankErrors(t *testing.T) {
	errOdd := errors.New("odd rank says no")
	err := run(t, 4, func(w *mpi.Comm) error {
		if w.Rank()%2 == 1 {
			return errOdd
		}
		return nil
	})
	if !errors.Is(err, errOdd) {
		t.Fatalf("Run returned %v, want it to wrap the ranks' error", err)
	}
	for _, r := range []string{"rank 1", "rank 3"} {
		if !strings.Contains(err.Error(), r) {
			t.Errorf("Run's error %q does not name %s", err, r)
		}
	}
}

// Many jobs run at once in one process without seeing each other's messages.
func TestRunConcurrentJobs(t *testing.T) {
	const jobs, n = 16, 4
	within(t, "concurrent Runs", func() {
		err := goroutines(jobs, func(id int) error {
			return mpi.Run(n, func(w *mpi.Comm) error {
				right, left := (w.Rank()+1)%n, (w.Rank()+n-1)%n
				for round := range 20 {
					out := []int64{int64(id), int64(w.Rank()), int64(round)}
					in := make([]int64, 3)
					st, err := w.Sendrecv(out, right, round, in, mpi.AnySource, mpi.AnyTag)
					if err != nil {
						return err
					}
					want := []int64{int64(id), int64(left), int64(round)}
					if st.Source != left || st.Tag != round || fmt.Sprint(in) != fmt.Sprint(want) {
						return fmt.Errorf("job %d rank %d round %d: got %v from %d tag %d, want %v from %d", id, w.Rank(), round, in, st.Source, st.Tag, want, left)
					}
				}
				return w.Barrier()
			})
		})
		if err != nil {
			t.Error(err)
		}
	})
}

func TestRunBadArguments(t *testing.T) {
	var called atomic.Bool
	body := func(*mpi.Comm) error { called.Store(true); return nil }
	for _, n := range []int{0, -1} {
		if err := run(t, n, body); !errors.Is(err, mpi.ErrArg) {
			t.Errorf("Run(%d) = %v, want ErrArg", n, err)
		}
	}
	within(t, "Run(2, nil)", func() {
		if err := mpi.Run(2, nil); !errors.Is(err, mpi.ErrArg) {
			t.Errorf("Run(2, nil) = %v, want ErrArg", err)
		}
	})
	if called.Load() {
		t.Error("a body ran although Run rejected its arguments")
	}
}

// eagerlyComplete reports whether an Isend of size bytes completes before
// the receiver posts its receive (an eager message), using the options.
func eagerlyComplete(t *testing.T, size int, opts ...mpi.Option) bool {
	t.Helper()
	j := newJob()
	sent := make(chan struct{})
	var early atomic.Bool
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		buf := make([]byte, size)
		if w.Rank() == 0 {
			r, err := w.Isend(buf, 1, 0)
			if err != nil {
				return err
			}
			_, done, err := r.Test()
			if err != nil {
				return err
			}
			early.Store(done)
			close(sent)
			_, err = r.Wait()
			return err
		}
		if err := j.wait(sent); err != nil {
			return err
		}
		_, err := w.Recv(buf, 0, 0)
		return err
	}, opts...)
	return early.Load()
}

func TestWithParam(t *testing.T) {
	t.Run("valid value takes effect", func(t *testing.T) {
		// 3000 bytes is above the self transport's default 1k eager
		// limit: the send waits for the receiver. With a 4k limit it is
		// sent eagerly and completes at once.
		if eagerlyComplete(t, 3000) {
			t.Error("with the default eager limit a 3000-byte Isend completed before the receive was posted")
		}
		if !eagerlyComplete(t, 3000, mpi.WithParam("btl_self_eager_limit", "4k")) {
			t.Error("with btl_self_eager_limit=4k a 3000-byte Isend did not complete before the receive was posted")
		}
	})
	t.Run("later option wins", func(t *testing.T) {
		if eagerlyComplete(t, 3000, mpi.WithParam("btl_self_eager_limit", "4k"), mpi.WithParam("btl_self_eager_limit", "1k")) {
			t.Error("the second WithParam did not override the first")
		}
	})
	t.Run("errors", func(t *testing.T) {
		for _, p := range [][2]string{
			{"no_such_parameter", "1"},
			{"", "1"},
			{"btl_self_eager_limit", "lots"},
			{"btl_self_eager_limit", "-4k"},
			{"pml_send_pipeline_depth", "three"},
			{"pml_force_protocol", "teleport"},
			{"btl_self_flags", "send,warp"},
			{"verbose", "maybe"},
		} {
			var called atomic.Bool
			err := run(t, 2, func(*mpi.Comm) error { called.Store(true); return nil }, mpi.WithParam(p[0], p[1]))
			if !errors.Is(err, mpi.ErrArg) {
				t.Errorf("WithParam(%q, %q): Run = %v, want ErrArg", p[0], p[1], err)
			}
			if called.Load() {
				t.Errorf("WithParam(%q, %q): the body ran", p[0], p[1])
			}
		}
	})
}

// Parameters come from GOMPI_<NAME> too; WithParam overrides them.
func TestParamEnvironment(t *testing.T) {
	t.Setenv("GOMPI_BTL_SELF_EAGER_LIMIT", "4k")
	if !eagerlyComplete(t, 3000) {
		t.Error("GOMPI_BTL_SELF_EAGER_LIMIT=4k had no effect")
	}
	if eagerlyComplete(t, 3000, mpi.WithParam("btl_self_eager_limit", "1k")) {
		t.Error("WithParam did not override the environment")
	}
	t.Setenv("GOMPI_BTL_SELF_EAGER_LIMIT", "huge")
	if err := run(t, 1, func(*mpi.Comm) error { return nil }); !errors.Is(err, mpi.ErrArg) {
		t.Errorf("bad GOMPI_BTL_SELF_EAGER_LIMIT: Run = %v, want ErrArg", err)
	}
}

// Abort ends the job: every blocked or later call of every rank fails
// with ErrAborted, and Run returns.
func TestAbort(t *testing.T) {
	const n = 4
	j := newJob()
	aborted := make(chan struct{})
	var mu sync.Mutex
	rankErr := map[int]error{}
	note := func(r int, err error) error {
		mu.Lock()
		rankErr[r] = err
		mu.Unlock()
		return err
	}
	err := runJob(t, j, n, func(w *mpi.Comm) error {
		buf := make([]byte, 4)
		switch w.Rank() {
		case 0:
			defer close(aborted)
			if err := w.Abort(3); err != nil {
				return fmt.Errorf("Abort: %v", err)
			}
			// Later calls fail.
			return note(0, w.Send(buf, 1, 0))
		case 1: // blocked in a receive
			_, err := w.Recv(buf, 0, 0)
			return note(1, err)
		case 2: // blocked in a barrier rank 0 never enters
			return note(2, w.Barrier())
		default: // calls after the abort
			<-aborted // (not j.wait: rank 0 returns ErrAborted at once)
			r, err := w.Irecv(buf, mpi.AnySource, mpi.AnyTag)
			if err == nil {
				_, err = r.Wait()
			}
			return note(3, err)
		}
	})
	if !errors.Is(err, mpi.ErrAborted) {
		t.Fatalf("Run = %v, want an error wrapping ErrAborted", err)
	}
	for r := range n {
		if !errors.Is(rankErr[r], mpi.ErrAborted) {
			t.Errorf("rank %d: got %v, want an error wrapping ErrAborted", r, rankErr[r])
		}
	}
}

// A job whose only rank calls Abort must not look successful: Run's
// error carries ErrAborted even when every body returned nil afterwards.
func TestAbortMakesRunFail(t *testing.T) {
	err := run(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			return w.Abort(5)
		}
		return nil
	})
	if !errors.Is(err, mpi.ErrAborted) {
		t.Fatalf("Run after Abort(5) = %v, want an error wrapping ErrAborted", err)
	}
}

// A rank whose body returns an error (or panics) makes its blocked peers
// fail instead of hanging.
func TestFailingRankReleasesPeers(t *testing.T) {
	boom := errors.New("boom")
	for _, how := range []string{"error", "panic"} {
		t.Run(how, func(t *testing.T) {
			var mu sync.Mutex
			rankErr := map[int]error{}
			note := func(r int, err error) error {
				mu.Lock()
				rankErr[r] = err
				mu.Unlock()
				return err
			}
			err := run(t, 4, func(w *mpi.Comm) error {
				buf := make([]byte, 1<<20)
				switch w.Rank() {
				case 0:
					if how == "panic" {
						panic("kaboom")
					}
					return boom
				case 1: // waits for a message rank 0 never sends
					_, err := w.Recv(buf, 0, 0)
					return note(1, err)
				case 2: // waits for a large send to rank 0 to be received
					return note(2, w.Send(buf, 0, 0))
				default: // waits in a probe and a Waitany
					r, err := w.Irecv(buf, mpi.AnySource, 5)
					if err == nil {
						_, _, err = mpi.Waitany([]*mpi.Request{r})
					}
					if err == nil {
						_, err = w.Probe(mpi.AnySource, mpi.AnyTag)
					}
					return note(3, err)
				}
			})
			if how == "error" && !errors.Is(err, boom) {
				t.Errorf("Run = %v, want it to wrap rank 0's error", err)
			}
			if how == "panic" && !strings.Contains(fmt.Sprint(err), "kaboom") {
				t.Errorf("Run = %v, want it to report rank 0's panic", err)
			}
			for r := 1; r < 4; r++ {
				if !errors.Is(rankErr[r], mpi.ErrAborted) {
					t.Errorf("rank %d: got %v, want an error wrapping ErrAborted", r, rankErr[r])
				}
			}
		})
	}
}

// Ranks that keep sending while another rank aborts see their next call
// fail with ErrAborted (and, under -race, nothing races with the abort).
func TestAbortWhileSending(t *testing.T) {
	const n = 4
	var mu sync.Mutex
	rankErr := map[int]error{}
	run(t, n, func(w *mpi.Comm) error {
		me := w.Rank()
		if me == 0 {
			for src := 1; src < n; src++ {
				if _, err := w.Probe(src, mpi.AnyTag); err != nil {
					return err
				}
			}
			return w.Abort(9)
		}
		buf := []byte{byte(me)}
		for i := 0; ; i++ {
			err := w.Send(buf, i%n, 0)
			if err == nil && i%n == me {
				_, err = w.Recv(buf, me, 0)
			}
			if err != nil {
				mu.Lock()
				rankErr[me] = err
				mu.Unlock()
				return err
			}
		}
	})
	for r := 1; r < n; r++ {
		if !errors.Is(rankErr[r], mpi.ErrAborted) {
			t.Errorf("rank %d: got %v, want an error wrapping ErrAborted", r, rankErr[r])
		}
	}
}
