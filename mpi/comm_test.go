package mpi_test

import (
	"cmp"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gompi-org/gompi/mpi"
)

// A message sent on a duplicate never matches a receive on the original
// (and the other way round), even a wildcard one posted first.
func TestDupSeparateContext(t *testing.T) {
	j := newJob()
	posted := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		d, err := w.Dup()
		if err != nil {
			return err
		}
		if d.Rank() != w.Rank() || d.Size() != w.Size() {
			return fmt.Errorf("Dup: rank %d size %d, want %d %d", d.Rank(), d.Size(), w.Rank(), w.Size())
		}
		d2, err := d.Dup()
		if err != nil {
			return err
		}
		if w.Rank() == 0 {
			if err := j.wait(posted); err != nil {
				return err
			}
			// Sent first, on the duplicates: must not match the world's
			// posted wildcard receive.
			if err := d.Send([]byte("dup"), 1, 5); err != nil {
				return err
			}
			if err := d2.Send([]byte("dup2"), 1, 5); err != nil {
				return err
			}
			return w.Send([]byte("world"), 1, 6)
		}
		buf := make([]byte, 16)
		r, err := w.Irecv(buf, mpi.AnySource, mpi.AnyTag)
		if err != nil {
			return err
		}
		close(posted)
		st, err := r.Wait()
		if err != nil {
			return err
		}
		if got := string(buf[:st.Count]); got != "world" || st.Tag != 6 {
			return fmt.Errorf("world receive got %q tag %d, want \"world\" tag 6", got, st.Tag)
		}
		if _, ok, err := w.Iprobe(mpi.AnySource, mpi.AnyTag); err != nil || ok {
			return fmt.Errorf("world Iprobe sees a duplicate's message (ok=%v, err=%v)", ok, err)
		}
		for _, c := range []struct {
			comm *mpi.Comm
			want string
		}{{d2, "dup2"}, {d, "dup"}} {
			st, err := c.comm.Recv(buf, mpi.AnySource, mpi.AnyTag)
			if err != nil {
				return err
			}
			if got := string(buf[:st.Count]); got != c.want || st.Tag != 5 || st.Source != 0 {
				return fmt.Errorf("duplicate receive got %q tag %d source %d, want %q tag 5 source 0", got, st.Tag, st.Source, c.want)
			}
		}
		return nil
	})
}

func TestSplit(t *testing.T) {
	const n = 9
	// color, key per world rank: color 0 in reverse rank order, color 1
	// with equal keys (then world order), color 2 by key, two ranks with
	// Undefined / a negative color get no communicator.
	colors := []int{0, 1, 2, 0, 1, 2, mpi.Undefined, 0, -7}
	keys := []int{-0, 5, 3, -3, 5, 1, 0, -7, 0}
	group := func(color int) []int {
		var g []int
		for r := range n {
			if colors[r] == color {
				g = append(g, r)
			}
		}
		slices.SortStableFunc(g, func(a, b int) int { return cmp.Compare(keys[a], keys[b]) })
		return g
	}
	mustRun(t, n, func(w *mpi.Comm) error {
		me := w.Rank()
		sub, err := w.Split(colors[me], keys[me])
		if err != nil {
			return err
		}
		if colors[me] < 0 {
			if sub != nil {
				return fmt.Errorf("rank %d: Split with color %d returned a communicator", me, colors[me])
			}
			return w.Barrier()
		}
		g := group(colors[me])
		if sub.Size() != len(g) || sub.Rank() != slices.Index(g, me) {
			return fmt.Errorf("rank %d: sub rank %d size %d, want %d of %v", me, sub.Rank(), sub.Size(), slices.Index(g, me), g)
		}
		// A ring in the new communicator: every rank learns the world
		// rank of its left neighbour, which must follow the key order.
		k := sub.Size()
		left := g[(sub.Rank()+k-1)%k]
		got := []int64{-1}
		st, err := sub.Sendrecv([]int64{int64(me)}, (sub.Rank()+1)%k, 1, got, mpi.AnySource, 1)
		if err != nil {
			return err
		}
		if got[0] != int64(left) || st.Source != (sub.Rank()+k-1)%k {
			return fmt.Errorf("rank %d: left neighbour in sub is world rank %d (source %d), want %d", me, got[0], st.Source, left)
		}
		if err := sub.Barrier(); err != nil {
			return err
		}
		return w.Barrier()
	})
}

func TestFree(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		d, err := w.Dup()
		if err != nil {
			return err
		}
		s, err := w.Split(0, 0)
		if err != nil {
			return err
		}
		for name, c := range map[string]*mpi.Comm{"dup": d, "split": s} {
			if err := c.Free(); err != nil {
				return fmt.Errorf("Free of a %s communicator: %v", name, err)
			}
			if err := allFail(c, mpi.ErrComm); err != nil {
				return fmt.Errorf("freed %s communicator: %v", name, err)
			}
		}
		if err := w.Free(); err == nil {
			return errors.New("freeing the world communicator succeeded")
		}
		// The world is still usable.
		in := []byte{0xff}
		if _, err := w.Sendrecv([]byte{byte(w.Rank())}, 1-w.Rank(), 0, in, 1-w.Rank(), 0); err != nil {
			return fmt.Errorf("world after a refused Free: %v", err)
		}
		if in[0] != byte(1-w.Rank()) {
			return fmt.Errorf("world after a refused Free: got %d", in[0])
		}
		return w.Barrier()
	})
}

// A nil communicator (and a zero Comm) fails every call with ErrComm.
func TestNilComm(t *testing.T) {
	for name, c := range map[string]*mpi.Comm{"nil": nil, "zero": {}} {
		within(t, name+" communicator", func() {
			if err := allFail(c, mpi.ErrComm); err != nil {
				t.Errorf("%s communicator: %v", name, err)
			}
		})
	}
}

// allFail calls every method of c with otherwise valid arguments and
// checks that each fails with class.
func allFail(c *mpi.Comm, class error) error {
	buf := make([]byte, 8)
	var errs []error
	check := func(what string, err error) {
		if err := wantErr(what, err, class); err != nil {
			errs = append(errs, err)
		}
	}
	check("Send", c.Send(buf, 0, 0))
	check("Ssend", c.Ssend(buf, 0, 0))
	check("Rsend", c.Rsend(buf, 0, 0))
	check("Bsend", c.Bsend(buf, 0, 0))
	_, err := c.Recv(buf, 0, 0)
	check("Recv", err)
	_, err = c.Sendrecv(buf, 0, 0, buf, 0, 0)
	check("Sendrecv", err)
	_, err = c.Probe(0, 0)
	check("Probe", err)
	_, _, err = c.Iprobe(0, 0)
	check("Iprobe", err)
	_, _, err = c.Mprobe(0, 0)
	check("Mprobe", err)
	_, _, _, err = c.Improbe(0, 0)
	check("Improbe", err)
	_, err = c.Isend(buf, 0, 0)
	check("Isend", err)
	_, err = c.Issend(buf, 0, 0)
	check("Issend", err)
	_, err = c.Ibsend(buf, 0, 0)
	check("Ibsend", err)
	_, err = c.Irsend(buf, 0, 0)
	check("Irsend", err)
	_, err = c.Irecv(buf, 0, 0)
	check("Irecv", err)
	_, err = c.Dup()
	check("Dup", err)
	_, err = c.Split(0, 0)
	check("Split", err)
	check("Barrier", c.Barrier())
	check("Free", c.Free())
	check("Abort", c.Abort(1))
	return errors.Join(errs...)
}

// No rank leaves a barrier before every rank entered it.
func TestBarrier(t *testing.T) {
	const rounds = 30
	for _, n := range []int{1, 2, 3, 5, 8} {
		t.Run(fmt.Sprintf("n=%d", n), func(t *testing.T) {
			t.Parallel()
			var entered [rounds]atomic.Int32
			mustRun(t, n, func(w *mpi.Comm) error {
				d, err := w.Dup()
				if err != nil {
					return err
				}
				for k := range rounds {
					c := w
					if k%3 == 2 {
						c = d // barriers on a duplicate too
					}
					entered[k].Add(1)
					if err := c.Barrier(); err != nil {
						return err
					}
					if got := entered[k].Load(); got != int32(n) {
						return fmt.Errorf("rank %d left barrier %d when only %d of %d ranks had entered it", w.Rank(), k, got, n)
					}
				}
				return nil
			})
		})
	}
}

// The messages of Barrier, Dup and Split never match a user's wildcard
// receive or probe.
func TestCollectivesInvisibleToWildcards(t *testing.T) {
	mustRun(t, 3, func(w *mpi.Comm) error {
		buf := make([]byte, 64)
		var r *mpi.Request
		if w.Rank() == 1 {
			var err error
			if r, err = w.Irecv(buf, mpi.AnySource, mpi.AnyTag); err != nil {
				return err
			}
		}
		if err := w.Barrier(); err != nil {
			return err
		}
		d, err := w.Dup()
		if err != nil {
			return err
		}
		s, err := w.Split(w.Rank()%2, 0)
		if err != nil {
			return err
		}
		if err := d.Barrier(); err != nil {
			return err
		}
		if err := s.Barrier(); err != nil {
			return err
		}
		if err := w.Barrier(); err != nil {
			return err
		}
		switch w.Rank() {
		case 1:
			// Every collective message addressed to rank 1 has arrived
			// (its barriers completed), and none of them matched.
			if _, done, err := r.Test(); err != nil || done {
				return fmt.Errorf("the wildcard receive completed during collectives (err %v)", err)
			}
			if _, ok, err := w.Iprobe(mpi.AnySource, mpi.AnyTag); err != nil || ok {
				return fmt.Errorf("Iprobe(AnySource, AnyTag) sees a collective's message (ok=%v, err=%v)", ok, err)
			}
			if err := w.Barrier(); err != nil {
				return err
			}
			st, err := r.Wait()
			if err != nil {
				return err
			}
			if st.Source != 2 || st.Tag != 0 || string(buf[:st.Count]) != "user" {
				return fmt.Errorf("wildcard receive got %q from %d tag %d, want \"user\" from 2 tag 0", buf[:st.Count], st.Source, st.Tag)
			}
			return nil
		case 2:
			if err := w.Barrier(); err != nil {
				return err
			}
			return w.Send([]byte("user"), 1, 0)
		}
		return w.Barrier()
	})
}

// Goroutines of one rank create communicators from different parent
// communicators at the same time (allowed: collectives on different
// communicators are independent), in a different order on every rank.
// Each new communicator gets its own context: a ring on it sees only its
// own messages.
func TestConcurrentCommCreation(t *testing.T) {
	const n, parents, rounds = 3, 3, 8
	mustRun(t, n, func(w *mpi.Comm) error {
		me := w.Rank()
		bases := make([]*mpi.Comm, parents)
		for i := range bases {
			var err error
			if bases[i], err = w.Dup(); err != nil {
				return err
			}
		}
		return goroutines(parents, func(b int) error {
			// Stagger the goroutines differently on every rank.
			for range ((b + me) % parents) * 300 {
				runtime.Gosched()
			}
			for round := range rounds {
				var c *mpi.Comm
				var err error
				if round%2 == 0 {
					c, err = bases[b].Dup()
				} else {
					c, err = bases[b].Split(0, -me) // reversed order
				}
				if err != nil {
					return fmt.Errorf("parent %d round %d: %v", b, round, err)
				}
				k, cr := c.Size(), c.Rank()
				out := []int64{int64(b), int64(round), int64(me)}
				in := make([]int64, 3)
				st, err := c.Sendrecv(out, (cr+1)%k, 0, in, mpi.AnySource, mpi.AnyTag)
				if err != nil {
					return fmt.Errorf("parent %d round %d: %v", b, round, err)
				}
				if in[0] != int64(b) || in[1] != int64(round) || st.Source != (cr+k-1)%k {
					return fmt.Errorf("parent %d round %d: received %v from %d: a message crossed communicators", b, round, in, st.Source)
				}
				if err := c.Free(); err != nil {
					return err
				}
			}
			return nil
		})
	})
}
