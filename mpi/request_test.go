package mpi_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/mpi/mpitest"
)

// Every nonblocking send mode pairs with Irecv; Waitall returns the
// statuses in order, with the bytes sent as a send's count.
func TestNonblockingModes(t *testing.T) {
	sizes := []int{0, 100, 5000, 300000}
	modes := []string{"Isend", "Issend", "Irsend"}
	j := newJob()
	posted := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		n := len(sizes) * len(modes)
		if w.Rank() == 0 {
			if err := j.wait(posted); err != nil {
				return err
			}
			reqs := make([]*mpi.Request, 0, n)
			for mi, mode := range modes {
				for si, size := range sizes {
					tag := mi*len(sizes) + si
					buf := pattern(size, uint64(tag))
					var r *mpi.Request
					var err error
					switch mode {
					case "Isend":
						r, err = w.Isend(buf, 1, tag)
					case "Issend":
						r, err = w.Issend(buf, 1, tag)
					case "Irsend":
						r, err = w.Irsend(buf, 1, tag)
					}
					if err != nil {
						return fmt.Errorf("%s: %v", mode, err)
					}
					reqs = append(reqs, r)
				}
			}
			sts, err := mpi.Waitall(reqs)
			if err != nil {
				return err
			}
			for i, st := range sts {
				// A send's status names the destination and the tag, whether
				// the message left at once (no request behind it) or not.
				if want := sizes[i%len(sizes)]; st.Count != want || st.Cancelled || st.Source != 1 || st.Tag != i {
					return fmt.Errorf("send %d (%s): status %+v, want count %d", i, modes[i/len(sizes)], st, want)
				}
			}
			return nil
		}
		reqs := make([]*mpi.Request, n)
		bufs := make([][]byte, n)
		for tag := range n {
			bufs[tag] = make([]byte, sizes[tag%len(sizes)])
			var err error
			if reqs[tag], err = w.Irecv(bufs[tag], 0, tag); err != nil {
				return err
			}
		}
		close(posted)
		sts, err := mpi.Waitall(reqs)
		if err != nil {
			return err
		}
		for tag, st := range sts {
			size := sizes[tag%len(sizes)]
			if st.Source != 0 || st.Tag != tag || st.Count != size || st.Cancelled {
				return fmt.Errorf("receive %d: status %+v", tag, st)
			}
			if err := checkBytes(fmt.Sprintf("receive %d", tag), bufs[tag], expected(size, uint64(tag))); err != nil {
				return err
			}
		}
		return nil
	})
}

// RecvContext gives up at its deadline and leaves a later message to the
// next receive; a message already there is received even with a context
// that is done; argument errors come first.
func TestRecvContext(t *testing.T) {
	j := newJob()
	maySend := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := j.wait(maySend); err != nil {
				return err
			}
			if err := w.Send(pattern(300, 1), 1, 4); err != nil {
				return err
			}
			return w.Send(pattern(200000, 2), 1, 5)
		}
		got := make([]byte, 200000)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
		_, err := w.RecvContext(ctx, got, mpi.AnySource, 4)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("RecvContext with nothing sent = %v, want context.DeadlineExceeded", err)
		}
		close(maySend)
		// The message sent after the deadline goes to the next receive.
		st, err := w.RecvContext(context.Background(), got[:300], 0, 4)
		if err != nil || st.Count != 300 {
			return fmt.Errorf("RecvContext after the deadline: %+v, %v", st, err)
		}
		if err := checkBytes("RecvContext", got[:300], expected(300, 1)); err != nil {
			return err
		}
		// Once the rendezvous message is here, a done context still receives it.
		if _, err := w.Probe(0, 5); err != nil {
			return err
		}
		done, cancel := context.WithCancel(context.Background())
		cancel()
		st, err = w.RecvContext(done, got, 0, 5)
		if err != nil || st.Cancelled || st.Count != 200000 {
			return fmt.Errorf("RecvContext of a message already here with a done context: %+v, %v", st, err)
		}
		if err := checkBytes("RecvContext rendezvous", got, expected(200000, 2)); err != nil {
			return err
		}
		_, err = w.RecvContext(context.Background(), got, 9, 0)
		return wantErr("RecvContext from a bad rank", err, mpi.ErrRank)
	})
}

// ProbeContext and MprobeContext give up at their deadline, taking
// nothing; the message sent later is probed and received normally.
func TestProbeContext(t *testing.T) {
	j := newJob()
	maySend := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := j.wait(maySend); err != nil {
				return err
			}
			return w.Send(pattern(100, 6), 1, 6)
		}
		for _, probe := range []struct {
			name string
			call func(ctx context.Context) error
		}{
			{"ProbeContext", func(ctx context.Context) error { _, err := w.ProbeContext(ctx, 0, 6); return err }},
			{"MprobeContext", func(ctx context.Context) error { _, _, err := w.MprobeContext(ctx, mpi.AnySource, 6); return err }},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			err := probe.call(ctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("%s with nothing sent = %v, want context.DeadlineExceeded", probe.name, err)
			}
		}
		close(maySend)
		st, err := w.ProbeContext(context.Background(), 0, 6)
		if err != nil || st.Count != 100 {
			return fmt.Errorf("ProbeContext: %+v, %v", st, err)
		}
		m, st, err := w.MprobeContext(context.Background(), 0, 6)
		if err != nil || st.Count != 100 {
			return fmt.Errorf("MprobeContext: %+v, %v", st, err)
		}
		got := make([]byte, 100)
		if _, err := m.Recv(got); err != nil {
			return err
		}
		return checkBytes("MprobeContext", got, expected(100, 6))
	})
}

// WaitContext gives up when its context is done and leaves the request
// valid: it completes later with the right data.
func TestWaitContext(t *testing.T) {
	j := newJob()
	maySend := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := j.wait(maySend); err != nil {
				return err
			}
			return w.Send(pattern(5000, 3), 1, 0)
		}
		got := make([]byte, 5000)
		r, err := w.Irecv(got, 0, 0)
		if err != nil {
			return err
		}
		// A context that is already cancelled.
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := r.WaitContext(ctx); !errors.Is(err, context.Canceled) {
			return fmt.Errorf("WaitContext(cancelled) = %v, want context.Canceled", err)
		}
		// Cancelled while waiting.
		ctx, cancel = context.WithCancel(context.Background())
		res := make(chan error, 1)
		go func() {
			_, err := r.WaitContext(ctx)
			res <- err
		}()
		cancel()
		if err := <-res; !errors.Is(err, context.Canceled) {
			return fmt.Errorf("WaitContext cancelled while waiting = %v, want context.Canceled", err)
		}
		// A deadline.
		ctx, cancel = context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		if _, err := r.WaitContext(ctx); !errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("WaitContext(deadline) = %v, want context.DeadlineExceeded", err)
		}
		if _, done, err := r.Test(); done || err != nil {
			return fmt.Errorf("request complete (err %v) without a message", err)
		}
		close(maySend)
		st, err := r.WaitContext(context.Background())
		if err != nil {
			return err
		}
		if st.Count != 5000 || st.Source != 0 {
			return fmt.Errorf("status %+v", st)
		}
		return checkBytes("after WaitContext gave up", got, expected(5000, 3))
	})
}

// Test does not block; it reports completion once the message arrived.
func TestRequestTest(t *testing.T) {
	j := newJob()
	maySend := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := j.wait(maySend); err != nil {
				return err
			}
			return w.Send(pattern(300000, 4), 1, 2)
		}
		got := make([]byte, 300000)
		r, err := w.Irecv(got, 0, 2)
		if err != nil {
			return err
		}
		for range 100 {
			if _, done, err := r.Test(); done || err != nil {
				return fmt.Errorf("Test: done=%v err=%v before anything was sent", done, err)
			}
		}
		close(maySend)
		for {
			st, done, err := r.Test()
			if err != nil {
				return err
			}
			if done {
				if st.Count != 300000 || st.Tag != 2 {
					return fmt.Errorf("status %+v", st)
				}
				break
			}
			runtime.Gosched()
		}
		return checkBytes("tested receive", got, expected(300000, 4))
	})
}

// Cancel takes effect on a receive that has not matched (the message then
// goes to a later receive), and has no effect on one that has.
func TestCancelRecv(t *testing.T) {
	j := newJob()
	cancelled, sent := make(chan struct{}), make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := j.wait(cancelled); err != nil {
				return err
			}
			if err := w.Send([]byte("seven"), 1, 7); err != nil {
				return err
			}
			if err := w.Send([]byte("eight"), 1, 8); err != nil {
				return err
			}
			r, err := w.Isend(pattern(300000, 9), 1, 9)
			if err != nil {
				return err
			}
			close(sent)
			_, err = r.Wait()
			return err
		}
		buf := make([]byte, 16)
		r, err := w.Irecv(buf, 0, 7)
		if err != nil {
			return err
		}
		if err := r.Cancel(); err != nil {
			return err
		}
		st, err := r.Wait()
		if err != nil || !st.Cancelled {
			return fmt.Errorf("cancelled unmatched receive: status %+v, error %v; want Cancelled", st, err)
		}
		close(cancelled)
		// The tag-7 message goes to the next receive.
		if st, err := w.Recv(buf, 0, 7); err != nil || string(buf[:st.Count]) != "seven" {
			return fmt.Errorf("receive after a cancelled one: %q %v", buf[:st.Count], err)
		}
		if err := j.wait(sent); err != nil {
			return err
		}
		// Matched at once (the message is waiting): Cancel has no effect.
		if _, err := w.Probe(0, 8); err != nil {
			return err
		}
		r, err = w.Irecv(buf, 0, 8)
		if err != nil {
			return err
		}
		if err := r.Cancel(); err != nil {
			return err
		}
		if st, err = r.Wait(); err != nil || st.Cancelled || string(buf[:st.Count]) != "eight" {
			return fmt.Errorf("cancel after match: status %+v %q, error %v; want the message", st, buf[:st.Count], err)
		}
		// A matched rendezvous receive.
		big := make([]byte, 300000)
		if _, err := w.Probe(0, 9); err != nil {
			return err
		}
		r, err = w.Irecv(big, 0, 9)
		if err != nil {
			return err
		}
		if err := r.Cancel(); err != nil {
			return err
		}
		if st, err = r.Wait(); err != nil || st.Cancelled || st.Count != 300000 {
			return fmt.Errorf("cancel of a matched rendezvous receive: status %+v, error %v", st, err)
		}
		if err := checkBytes("rendezvous after Cancel", big, expected(300000, 9)); err != nil {
			return err
		}
		// Cancel on completed and ProcNull requests is harmless.
		if err := r.Cancel(); err != nil {
			return err
		}
		if st2, err := r.Wait(); err != nil || st2 != st {
			return fmt.Errorf("Wait after Cancel of a completed request: %+v %v, want %+v", st2, err, st)
		}
		rn, err := w.Irecv(buf, mpi.ProcNull, 0)
		if err != nil {
			return err
		}
		if err := rn.Cancel(); err != nil {
			return err
		}
		if st, err := rn.Wait(); err != nil || st.Source != mpi.ProcNull {
			return fmt.Errorf("ProcNull receive after Cancel: %+v %v", st, err)
		}
		return nil
	})
}

// Cancel on a send: if Status.Cancelled says it took effect the message
// is never delivered, otherwise it is delivered normally.
func TestCancelSend(t *testing.T) {
	for _, size := range []int{10, 300000} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			j := newJob()
			cancelled := make(chan bool, 1)
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					r, err := w.Isend(pattern(size, 5), 1, 1)
					if err != nil {
						return err
					}
					if err := r.Cancel(); err != nil {
						return err
					}
					if err := w.Send([]byte("marker"), 1, 2); err != nil {
						return err
					}
					st, err := r.Wait()
					if err != nil {
						return err
					}
					cancelled <- st.Cancelled
					return nil
				}
				if _, err := w.Recv(make([]byte, 6), 0, 2); err != nil {
					return err
				}
				got := make([]byte, size)
				r, err := w.Irecv(got, 0, 1)
				if err != nil {
					return err
				}
				c, err := recvFrom(j, cancelled)
				if err != nil {
					return err
				}
				if c {
					// The message must never match.
					if err := r.Cancel(); err != nil {
						return err
					}
					if st, err := r.Wait(); err != nil || !st.Cancelled {
						return fmt.Errorf("a send reported Cancelled was delivered: %+v %v", st, err)
					}
					return nil
				}
				if st, err := r.Wait(); err != nil || st.Cancelled || st.Count != size {
					return fmt.Errorf("a send whose Cancel had no effect: receive %+v %v", st, err)
				}
				return checkBytes("uncancelled send", got, expected(size, 5))
			})
		})
	}
}

// Waitall skips nil entries and joins the errors (a truncated receive)
// while completing the other requests.
func TestWaitall(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for tag := range 3 {
				if err := w.Send(pattern(100, uint64(tag)), 1, tag); err != nil {
					return err
				}
			}
			return nil
		}
		bufs := [][]byte{make([]byte, 100), make([]byte, 10), make([]byte, 100)}
		reqs := make([]*mpi.Request, 5)
		for tag := range 3 {
			var err error
			if reqs[tag*2], err = w.Irecv(bufs[tag], 0, tag); err != nil {
				return err
			}
		}
		sts, err := mpi.Waitall(reqs)
		if !errors.Is(err, mpi.ErrTruncate) {
			return fmt.Errorf("Waitall with a truncated receive: %v, want ErrTruncate", err)
		}
		if len(sts) != 5 {
			return fmt.Errorf("Waitall returned %d statuses for 5 entries", len(sts))
		}
		for i, want := range []int{100, 0, 10, 0, 100} {
			if sts[i].Count != want {
				return fmt.Errorf("status %d: %+v, want count %d", i, sts[i], want)
			}
		}
		if err := checkBytes("first", bufs[0], expected(100, 0)); err != nil {
			return err
		}
		if err := checkBytes("third", bufs[2], expected(100, 2)); err != nil {
			return err
		}
		if sts, err := mpi.Waitall(nil); err != nil || len(sts) != 0 {
			return fmt.Errorf("Waitall(nil) = %v, %v", sts, err)
		}
		return nil
	})
}

// Waitany returns the request that completed, sets its entry to nil,
// skips nil entries, and returns -1 when none is left.
func TestWaitany(t *testing.T) {
	order := []int{3, 1, 4, 0, 2}
	j := newJob()
	next := make(chan int)
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for range order {
				tag, err := recvFrom(j, next)
				if err != nil {
					return err
				}
				if err := w.Send(pattern(2000, uint64(tag)), 1, tag); err != nil {
					return err
				}
			}
			return nil
		}
		if i, _, err := mpi.Waitany(nil); i != -1 || err != nil {
			return fmt.Errorf("Waitany(nil) = %d, %v; want -1", i, err)
		}
		// Requests at positions 0, 2, 3, 5, 6 for tags 0..4; nil between.
		pos := []int{0, 2, 3, 5, 6}
		reqs := make([]*mpi.Request, 7)
		bufs := make([][]byte, 5)
		for tag := range 5 {
			bufs[tag] = make([]byte, 2000)
			var err error
			if reqs[pos[tag]], err = w.Irecv(bufs[tag], 0, tag); err != nil {
				return err
			}
		}
		for _, tag := range order {
			select {
			case next <- tag:
			case <-j.dead:
				return errPeerFailed
			}
			i, st, err := mpi.Waitany(reqs)
			if err != nil {
				return err
			}
			if i != pos[tag] || st.Tag != tag || st.Count != 2000 {
				return fmt.Errorf("Waitany = %d, %+v; want index %d tag %d", i, st, pos[tag], tag)
			}
			if reqs[i] != nil {
				return fmt.Errorf("Waitany left entry %d set", i)
			}
			if err := checkBytes("Waitany data", bufs[tag], expected(2000, uint64(tag))); err != nil {
				return err
			}
		}
		if i, _, err := mpi.Waitany(reqs); i != -1 || err != nil {
			return fmt.Errorf("Waitany with only nil entries = %d, %v; want -1", i, err)
		}
		return nil
	})
}

// Testsome returns the requests complete now (none before anything was
// sent), sets their entries to nil and leaves the others; with no live
// request it returns nil slices.
func TestTestsome(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if _, err := w.Recv(nil, 1, 9); err != nil {
				return err
			}
			for _, tag := range []int{1, 3} {
				if err := w.Send(pattern(500, uint64(tag)), 1, tag); err != nil {
					return err
				}
			}
			return nil
		}
		reqs, bufs, err := recvByTag(w, 4, 500)
		if err != nil {
			return err
		}
		idx, sts, err := mpi.Testsome(reqs)
		if err != nil || idx == nil || len(idx) != 0 || len(sts) != 0 {
			return fmt.Errorf("Testsome before any send: %v %v %v", idx, sts, err)
		}
		if err := w.Send(nil, 0, 9); err != nil {
			return err
		}
		var got []int
		for len(got) < 2 {
			idx, sts, err := mpi.Testsome(reqs)
			if err != nil {
				return err
			}
			for k, i := range idx {
				if (i != 1 && i != 3) || slices.Contains(got, i) || reqs[i] != nil || sts[k].Tag != i || sts[k].Count != 500 {
					return fmt.Errorf("Testsome returned index %d status %+v (seen %v)", i, sts[k], got)
				}
				if err := checkBytes("Testsome data", bufs[i], expected(500, uint64(i))); err != nil {
					return err
				}
				got = append(got, i)
			}
		}
		if reqs[0] == nil || reqs[2] == nil {
			return errors.New("Testsome cleared an entry that had not completed")
		}
		reqs[0].Cancel()
		reqs[2].Cancel()
		for reqs[0] != nil || reqs[2] != nil {
			idx, sts, err := mpi.Testsome(reqs)
			if err != nil {
				return err
			}
			for k := range idx {
				if !sts[k].Cancelled {
					return fmt.Errorf("index %d completed with %+v, want cancelled", idx[k], sts[k])
				}
			}
		}
		if idx, sts, err := mpi.Testsome(reqs); idx != nil || sts != nil || err != nil {
			return fmt.Errorf("Testsome with no live request: %v %v %v", idx, sts, err)
		}
		return nil
	})
}

// Waitsome returns at least one completed request, every returned entry
// set to nil, and nothing when no request is left.
func TestWaitsome(t *testing.T) {
	j := newJob()
	sendTags := make(chan []int)
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for range 2 {
				tags, err := recvFrom(j, sendTags)
				if err != nil {
					return err
				}
				for _, tag := range tags {
					if err := w.Send(pattern(3000, uint64(tag)), 1, tag); err != nil {
						return err
					}
				}
			}
			return nil
		}
		reqs, bufs, err := recvByTag(w, 6, 3000)
		if err != nil {
			return err
		}
		collect := func(want []int) error {
			var got []int
			for len(got) < len(want) {
				idx, sts, err := mpi.Waitsome(reqs)
				if err != nil {
					return err
				}
				if len(idx) == 0 || len(idx) != len(sts) {
					return fmt.Errorf("Waitsome returned %v and %d statuses", idx, len(sts))
				}
				for k, i := range idx {
					if !slices.Contains(want, i) || slices.Contains(got, i) {
						return fmt.Errorf("Waitsome returned index %d; want one of %v not seen yet (seen %v)", i, want, got)
					}
					if reqs[i] != nil {
						return fmt.Errorf("Waitsome left entry %d set", i)
					}
					if sts[k].Tag != i || sts[k].Count != 3000 {
						return fmt.Errorf("Waitsome status %+v for index %d", sts[k], i)
					}
					if err := checkBytes("Waitsome data", bufs[i], expected(3000, uint64(i))); err != nil {
						return err
					}
					got = append(got, i)
				}
			}
			return nil
		}
		for _, tags := range [][]int{{4, 0, 2}, {1, 5, 3}} {
			select {
			case sendTags <- tags:
			case <-j.dead:
				return errPeerFailed
			}
			if err := collect(tags); err != nil {
				return err
			}
		}
		if idx, sts, err := mpi.Waitsome(reqs); len(idx) != 0 || len(sts) != 0 || err != nil {
			return fmt.Errorf("Waitsome with only nil entries = %v, %v, %v", idx, sts, err)
		}
		return nil
	})
}

// Testall is false while any request is pending and then returns every
// status; Testany reports one completed request at a time.
func TestTestallTestany(t *testing.T) {
	j := newJob()
	maySend := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for round := range 2 {
				if err := j.wait(maySend); err != nil {
					return err
				}
				for tag := range 3 {
					if err := w.Send(pattern(5000, uint64(10*round+tag)), 1, tag); err != nil {
						return err
					}
				}
			}
			return nil
		}
		post := func() ([]*mpi.Request, [][]byte, error) {
			reqs := make([]*mpi.Request, 4) // entry 1 stays nil
			bufs := make([][]byte, 3)
			for tag := range 3 {
				bufs[tag] = make([]byte, 5000)
				var err error
				if reqs[[]int{0, 2, 3}[tag]], err = w.Irecv(bufs[tag], 0, tag); err != nil {
					return nil, nil, err
				}
			}
			return reqs, bufs, nil
		}
		// Testall.
		reqs, bufs, err := post()
		if err != nil {
			return err
		}
		for range 50 {
			if _, ok, err := mpi.Testall(reqs); ok || err != nil {
				return fmt.Errorf("Testall = %v, %v before anything was sent", ok, err)
			}
		}
		if i, _, ok, err := mpi.Testany(reqs); ok || err != nil {
			return fmt.Errorf("Testany = %d, %v, %v before anything was sent", i, ok, err)
		}
		if err := j.signal(maySend); err != nil {
			return err
		}
		var sts []mpi.Status
		for {
			var ok bool
			if sts, ok, err = mpi.Testall(reqs); err != nil {
				return err
			}
			if ok {
				break
			}
			runtime.Gosched()
		}
		for k, i := range []int{0, 2, 3} {
			if sts[i].Tag != k || sts[i].Count != 5000 {
				return fmt.Errorf("Testall status %d: %+v", i, sts[i])
			}
			if err := checkBytes("Testall data", bufs[k], expected(5000, uint64(k))); err != nil {
				return err
			}
		}
		// Testany.
		if reqs, bufs, err = post(); err != nil {
			return err
		}
		if err := j.signal(maySend); err != nil {
			return err
		}
		seen := map[int]bool{}
		for len(seen) < 3 {
			i, st, ok, err := mpi.Testany(reqs)
			if err != nil {
				return err
			}
			if !ok {
				runtime.Gosched()
				continue
			}
			k := slices.Index([]int{0, 2, 3}, i)
			if k < 0 || seen[i] || st.Tag != k || reqs[i] != nil {
				return fmt.Errorf("Testany = %d, %+v (seen %v, entry now %v)", i, st, seen, reqs[i])
			}
			if err := checkBytes("Testany data", bufs[k], expected(5000, uint64(10+k))); err != nil {
				return err
			}
			seen[i] = true
		}
		if i, _, ok, err := mpi.Testany(reqs); i != -1 || !ok || err != nil {
			return fmt.Errorf("Testany with only nil entries = %d, %v, %v; want -1, true", i, ok, err)
		}
		return nil
	})
}

// Status.Elements counts whole elements of a datatype, or Undefined.
func TestStatusElements(t *testing.T) {
	pair := mustType(convertor.Contiguous(2, convertor.Int32))
	for _, c := range []struct {
		count int
		dt    convertor.Datatype
		want  int
	}{
		{0, convertor.Float64, 0},
		{24, convertor.Float64, 3},
		{24, convertor.Byte, 24},
		{24, convertor.Complex128, mpi.Undefined},
		{24, pair, 3},
		{12, pair, mpi.Undefined},
		{13, convertor.Int32, mpi.Undefined},
		{8, convertor.Datatype{}, mpi.Undefined},
	} {
		if got := (mpi.Status{Count: c.count}).Elements(c.dt); got != c.want {
			t.Errorf("Status{Count: %d}.Elements(%v) = %d, want %d", c.count, c.dt, got, c.want)
		}
	}
	// On a real receive.
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			return w.Send(make([]int16, 7), 1, 0)
		}
		st, err := w.Recv(make([]byte, 64), 0, 0)
		if err != nil {
			return err
		}
		if st.Elements(convertor.Int16) != 7 || st.Elements(convertor.Int32) != mpi.Undefined {
			return fmt.Errorf("14 bytes: Elements(Int16) = %d, Elements(Int32) = %d", st.Elements(convertor.Int16), st.Elements(convertor.Int32))
		}
		return nil
	})
}

// Methods on a nil *Request report an error instead of panicking.
func TestNilRequest(t *testing.T) {
	within(t, "nil request methods", func() { nilRequest(t) })
}

func nilRequest(t *testing.T) {
	var r *mpi.Request
	if _, err := r.Wait(); err == nil {
		t.Error("Wait on a nil request succeeded")
	}
	if _, err := r.WaitContext(context.Background()); err == nil {
		t.Error("WaitContext on a nil request succeeded")
	}
	if _, _, err := r.Test(); err == nil {
		t.Error("Test on a nil request succeeded")
	}
	if err := r.Cancel(); err == nil {
		t.Error("Cancel on a nil request succeeded")
	}
}

// TestRequestSharedByGoroutines: the PML request behind a Request is
// recycled once its result is taken; goroutines that wait on, test and
// cancel one Request at the same time must all see its own status, and the
// requests posted afterwards (reusing the recycled ones) their own data.
func TestRequestSharedByGoroutines(t *testing.T) {
	const rounds = 300
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for i := range rounds {
				if err := w.Send([]int64{int64(i)}, 1, i%7); err != nil {
					return err
				}
			}
			return nil
		}
		for i := range rounds {
			got := make([]int64, 1)
			r, err := w.Irecv(got, 0, i%7)
			if err != nil {
				return err
			}
			sts := make([]mpi.Status, 3)
			errs := make([]error, 3)
			var wg sync.WaitGroup
			wg.Add(3)
			go func() { defer wg.Done(); sts[0], errs[0] = r.Wait() }()
			go func() {
				defer wg.Done()
				for {
					st, done, err := r.Test()
					if done || err != nil {
						sts[1], errs[1] = st, err
						return
					}
					runtime.Gosched()
				}
			}()
			go func() {
				defer wg.Done()
				_ = r.Cancel() // matched or about to: no effect on the status
				sts[2], errs[2] = r.Wait()
			}()
			wg.Wait()
			for k := range 3 {
				if errs[k] != nil {
					return fmt.Errorf("round %d caller %d: %v", i, k, errs[k])
				}
				if sts[k] != sts[0] {
					return fmt.Errorf("round %d: caller %d saw %+v, caller 0 %+v", i, k, sts[k], sts[0])
				}
			}
			if sts[0].Cancelled {
				// Cancel won the race against the match: the message is
				// still there for a new receive.
				if _, err := w.Recv(got, 0, i%7); err != nil {
					return err
				}
			} else if sts[0].Tag != i%7 || sts[0].Count != 8 {
				return fmt.Errorf("round %d: status %+v", i, sts[0])
			}
			if got[0] != int64(i) {
				return fmt.Errorf("round %d: received %d", i, got[0])
			}
		}
		return nil
	})
}

// TestRequestParkedWaiters: several goroutines parked in Wait or
// WaitContext on one receive that matches only later all return with its
// status (one wake-up must reach every waiter).
func TestRequestParkedWaiters(t *testing.T) {
	const rounds = 50
	j := newJob()
	maySend := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for i := range rounds {
				if err := j.wait(maySend); err != nil {
					return err
				}
				if err := w.Send([]int64{int64(i)}, 1, 3); err != nil {
					return err
				}
			}
			return nil
		}
		for i := range rounds {
			got := make([]int64, 1)
			r, err := w.Irecv(got, 0, 3)
			if err != nil {
				return err
			}
			const waiters = 3
			sts := make([]mpi.Status, waiters)
			errs := make([]error, waiters)
			var started, wg sync.WaitGroup
			started.Add(waiters)
			wg.Add(waiters)
			for k := range waiters {
				go func() {
					defer wg.Done()
					started.Done()
					if k == 2 {
						sts[k], errs[k] = r.WaitContext(context.Background())
						return
					}
					sts[k], errs[k] = r.Wait()
				}()
			}
			started.Wait()
			for range 100 { // let them reach Wait and park (not needed for correctness)
				runtime.Gosched()
			}
			if err := j.signal(maySend); err != nil {
				return err
			}
			wg.Wait()
			for k := range waiters {
				if errs[k] != nil || sts[k].Count != 8 || sts[k].Tag != 3 {
					return fmt.Errorf("round %d waiter %d: %+v %v", i, k, sts[k], errs[k])
				}
			}
			if got[0] != int64(i) {
				return fmt.Errorf("round %d: received %d", i, got[0])
			}
		}
		return nil
	})
}

// WaitallInto fills the caller's statuses, or ignores them with nil sts,
// and refuses a short sts without waiting for anything.
func TestWaitallInto(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for tag := 1; tag <= 6; tag++ {
				if err := w.Send(make([]byte, tag), 1, tag); err != nil {
					return err
				}
			}
			return nil
		}
		post := func(from int) ([]*mpi.Request, error) {
			var reqs []*mpi.Request
			for tag := from; tag < from+3; tag++ {
				r, err := w.Irecv(make([]byte, 8), 0, tag)
				if err != nil {
					return nil, err
				}
				reqs = append(reqs, r)
			}
			return reqs, nil
		}
		reqs, err := post(1)
		if err != nil {
			return err
		}
		if err := mpi.WaitallInto(reqs, make([]mpi.Status, 2)); !errors.Is(err, mpi.ErrArg) {
			return fmt.Errorf("short statuses: %v, want ErrArg", err)
		}
		sts := make([]mpi.Status, 4)
		sts[3].Tag = 99 // beyond the requests: untouched
		if err := mpi.WaitallInto(reqs, sts); err != nil {
			return err
		}
		for i, st := range sts[:3] {
			if st.Tag != i+1 || st.Count != i+1 || st.Source != 0 {
				return fmt.Errorf("status %d: %+v", i, st)
			}
		}
		if sts[3].Tag != 99 {
			return fmt.Errorf("status beyond the requests changed: %+v", sts[3])
		}
		if reqs, err = post(4); err != nil {
			return err
		}
		return mpi.WaitallInto(reqs, nil) // statuses ignored
	})
}

// Waitall gives its requests back to the engine in batches; another
// goroutine testing and waiting on the same requests meanwhile must see
// the same results, and the requests reused by later windows must carry
// their own messages, byte for byte.
func TestWaitallSharedWindow(t *testing.T) {
	const windows, window = 40, 16
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for k := range windows * window {
				if err := w.Send([]int64{int64(k)}, 1, k%3); err != nil {
					return err
				}
			}
			return nil
		}
		for win := range windows {
			reqs := make([]*mpi.Request, window)
			bufs := make([][]int64, window)
			for i := range reqs {
				bufs[i] = make([]int64, 1)
				var err error
				if reqs[i], err = w.Irecv(bufs[i], 0, (win*window+i)%3); err != nil {
					return err
				}
			}
			other, otherErr := mpitest.TestEach(reqs)
			sts, err := mpi.Waitall(reqs)
			if err != nil {
				return err
			}
			if err := <-otherErr; err != nil {
				return err
			}
			for i := range reqs {
				k := win*window + i
				if bufs[i][0] != int64(k) || sts[i].Tag != k%3 || sts[i].Count != 8 {
					return fmt.Errorf("window %d request %d: got %d, status %+v; want message %d", win, i, bufs[i][0], sts[i], k)
				}
				if other[i] != sts[i] {
					return fmt.Errorf("window %d request %d: Test saw %+v, Waitall %+v", win, i, other[i], sts[i])
				}
			}
		}
		return nil
	})
}

// TestRendezvousRequestsReused: RDMA direct get requests that finish
// within their GET (in-process, as over sm) go back to the pools and are
// reused at once. Two goroutines per rank stream windows of such messages
// both ways with another goroutine testing the same requests; every byte,
// source and tag must be the message's own, which a request reused while
// the engine still used it would break.
func TestRendezvousRequestsReused(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		return mpitest.Windows(w, 1-w.Rank(), 0, 30, 8, []int{20 << 10, 70 << 10, 1})
	}, mpi.WithParam("pml_force_protocol", "rdma_get"))
}

// Sends that complete within Isend may share one done request: each still
// reports its own destination, tag and count, however often it is waited
// for or tested, also when goroutines send with different tags at once.
func TestIsendDoneRequestStatus(t *testing.T) {
	type send struct{ size, tag int }
	seq := []send{{8, 1}, {8, 1}, {16, 1}, {8, 2}, {8, 1}, {0, 1}, {8, 1}}
	const goroutines, each = 4, 200
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 1 {
			for i, s := range seq {
				buf := make([]byte, 32)
				st, err := w.Recv(buf, 0, s.tag)
				if err != nil {
					return err
				}
				if st.Count != s.size {
					return fmt.Errorf("receive %d: %d bytes, want %d", i, st.Count, s.size)
				}
			}
			for range goroutines * each {
				if _, err := w.Recv(make([]byte, 32), 0, mpi.AnyTag); err != nil {
					return err
				}
			}
			return nil
		}
		reqs := make([]*mpi.Request, len(seq))
		for i, s := range seq {
			var err error
			if reqs[i], err = w.Isend(make([]byte, s.size), 1, s.tag); err != nil {
				return err
			}
		}
		for round := range 2 {
			sts, err := mpi.Waitall(reqs)
			if err != nil {
				return err
			}
			for i, s := range seq {
				if want := (mpi.Status{Source: 1, Tag: s.tag, Count: s.size}); sts[i] != want {
					return fmt.Errorf("round %d, send %d: Waitall status %+v, want %+v", round, i, sts[i], want)
				}
				st, done, err := reqs[i].Test()
				if err != nil || !done || st.Tag != s.tag || st.Count != s.size {
					return fmt.Errorf("round %d, send %d: Test %+v %v %v", round, i, st, done, err)
				}
			}
		}
		errs := make(chan error, goroutines)
		for g := range goroutines {
			go func() {
				for i := range each {
					size := 1 + (g+i)%24
					r, err := w.Isend(make([]byte, size), 1, 10+g)
					if err == nil {
						var st mpi.Status
						st, err = r.Wait()
						if err == nil && (st.Source != 1 || st.Tag != 10+g || st.Count != size) {
							err = fmt.Errorf("goroutine %d send %d: status %+v, want tag %d count %d", g, i, st, 10+g, size)
						}
					}
					if err != nil {
						errs <- err
						return
					}
				}
				errs <- nil
			}()
		}
		var all error
		for range goroutines {
			all = errors.Join(all, <-errs)
		}
		return all
	})
}

// WaitallRelease sets the handles to nil and hands the Irecvs' requests
// to later Irecvs: every window still gets its own messages byte for byte
// with the right statuses, requests are reused (the receives are posted
// before their messages are sent, so they take Irecv's common path), and a
// send's request done at once (shared by such sends) stays valid.
func TestWaitallRelease(t *testing.T) {
	const windows, window = 30, 8
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			for win := range windows {
				if _, err := w.Recv([]byte{}, 1, 9); err != nil { // posted
					return err
				}
				for i := range window {
					k := win*window + i
					if err := w.Send(binary.LittleEndian.AppendUint64(nil, uint64(k)), 1, k%3); err != nil {
						return err
					}
				}
			}
			return nil
		}
		seen := map[*mpi.Request]bool{}
		reused := 0
		reqs := make([]*mpi.Request, window+1)
		sts := make([]mpi.Status, window+1)
		for win := range windows {
			bufs := make([][]byte, window)
			for i := range window {
				bufs[i] = make([]byte, 8)
				var err error
				if reqs[i], err = w.Irecv(bufs[i], 0, (win*window+i)%3); err != nil {
					return err
				}
				if seen[reqs[i]] {
					reused++
				}
				seen[reqs[i]] = true
			}
			// A send of no bytes, done at once: its request must not be
			// handed out again.
			sr, err := w.Isend([]byte{}, 0, 9)
			if err != nil {
				return err
			}
			reqs[window] = sr
			if err := w.WaitallRelease(reqs, sts); err != nil {
				return err
			}
			for i, r := range reqs {
				if r != nil {
					return fmt.Errorf("window %d: handle %d not set to nil", win, i)
				}
			}
			for i := range window {
				k := win*window + i
				if got := binary.LittleEndian.Uint64(bufs[i]); got != uint64(k) || sts[i].Tag != k%3 || sts[i].Count != 8 || sts[i].Source != 0 {
					return fmt.Errorf("window %d, receive %d: %d with %+v, want %d with tag %d", win, i, got, sts[i], k, k%3)
				}
			}
			if st, err := sr.Wait(); err != nil || st.Count != 0 || st.Tag != 9 {
				return fmt.Errorf("window %d: the send's request after release: %+v, %v", win, st, err)
			}
		}
		if reused < (windows-1)*window/2 {
			return fmt.Errorf("%d of %d receives reused a request", reused, windows*window)
		}
		return nil
	})
}

// recvByTag posts n receives from rank 0 of size bytes each, receive i
// with tag i, and returns their requests and buffers.
func recvByTag(w *mpi.Comm, n, size int) ([]*mpi.Request, [][]byte, error) {
	reqs, bufs := make([]*mpi.Request, n), make([][]byte, n)
	for tag := range reqs {
		bufs[tag] = make([]byte, size)
		var err error
		if reqs[tag], err = w.Irecv(bufs[tag], 0, tag); err != nil {
			return nil, nil, err
		}
	}
	return reqs, bufs, nil
}
