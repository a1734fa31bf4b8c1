package mpi_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml"
)

// TestSmallMessageAllocations: once warmed up, a blocking Send/Recv of a
// small message allocates nothing, and so does a nonblocking one on
// average: the PML's request is pooled, an Isend done at once returns the
// communicator's shared done request, and the Irecv's Request comes from
// a slab of 64 (AllocsPerRun's average is a whole number).
func TestSmallMessageAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const stop = 9
	var blocking, nonblocking float64
	err := mpi.Run(2, func(w *mpi.Comm) error {
		var buf any = make([]byte, 8)
		if w.Rank() == 1 { // echo with blocking calls until tag stop
			for {
				st, err := w.Recv(buf, 0, mpi.AnyTag)
				if err != nil || st.Tag == stop {
					return err
				}
				if err := w.Send(buf, 0, st.Tag); err != nil {
					return err
				}
			}
		}
		var failed error
		blocking = testing.AllocsPerRun(200, func() {
			if err := w.Send(buf, 1, 1); err != nil {
				failed = err
			}
			if _, err := w.Recv(buf, 1, 1); err != nil {
				failed = err
			}
		})
		nonblocking = testing.AllocsPerRun(200, func() {
			rr, err := w.Irecv(buf, 1, 2)
			if err != nil {
				failed = err
				return
			}
			sr, err := w.Isend(buf, 1, 2)
			if err != nil {
				failed = err
				return
			}
			if _, err := sr.Wait(); err != nil {
				failed = err
			}
			if _, err := rr.Wait(); err != nil {
				failed = err
			}
		})
		// (No require here: a failed assertion would end this rank's
		// goroutine and leave rank 1 waiting.)
		if err := w.Send(buf, 1, stop); err != nil {
			return err
		}
		return failed
	})
	require.NoError(t, err)
	require.Zero(t, blocking, "allocations per blocking round trip")
	require.Zero(t, nonblocking, "allocations per nonblocking round trip")
}

// A loop of windows of Irecvs ended by WaitallRelease allocates nothing:
// the requests are reused.
func TestWindowReleaseAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	// A window of 64: a slab of 64 Requests a window would count as one
	// allocation a run (AllocsPerRun rounds down).
	const window, stop = 64, 9
	var allocs float64
	pml.SetResetCheck(false) // the check itself allocates (reflect)
	defer pml.SetResetCheck(true)
	err := mpi.Run(2, func(w *mpi.Comm) error {
		var buf, none any = make([]byte, 8), []byte{}
		if w.Rank() == 1 { // on each go message, send a window
			for {
				st, err := w.Recv(none, 0, mpi.AnyTag)
				if err != nil || st.Tag == stop {
					return err
				}
				for range window {
					if err := w.Send(buf, 0, 1); err != nil {
						return err
					}
				}
			}
		}
		var failed error
		reqs := make([]*mpi.Request, window)
		bufs := make([]any, window)
		for i := range bufs {
			bufs[i] = make([]byte, 8)
		}
		allocs = testing.AllocsPerRun(200, func() {
			for i := range reqs {
				var err error
				if reqs[i], err = w.Irecv(bufs[i], 1, 1); err != nil {
					failed = err
					return
				}
			}
			if err := w.Send(none, 1, 2); err != nil {
				failed = err
				return
			}
			if err := w.WaitallRelease(reqs, nil); err != nil {
				failed = err
			}
		})
		if err := w.Send(none, 1, stop); err != nil {
			return err
		}
		return failed
	})
	require.NoError(t, err)
	require.Zero(t, allocs, "allocations per window of receives")
}

// Buffers passed straight into the calls, as users write them (a []byte
// or []float64 variable, a Typed buffer of a contiguous datatype), cost
// no allocation either: the calls keep only the buffer's memory, not the
// interface value, so the compiler leaves the caller's conversion on the
// stack.
func TestNaturalArgumentAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const stop = 9
	f64x2, err := convertor.Contiguous(2, convertor.Float64)
	require.NoError(t, err)
	f64x2, err = f64x2.Commit()
	require.NoError(t, err)
	kinds := []string{"[]byte", "[]float64", "Typed"}
	allocs := make([]float64, len(kinds))
	err = mpi.Run(2, func(w *mpi.Comm) error {
		b := make([]byte, 8)
		f := make([]float64, 4)
		if w.Rank() == 1 { // echo each kind back with blocking calls until tag stop
			for {
				st, err := w.Recv(f, 0, mpi.AnyTag)
				if err != nil || st.Tag == stop {
					return err
				}
				if err := w.Send(f[:st.Count/8], 0, st.Tag); err != nil {
					return err
				}
			}
		}
		var failed error
		check := func(err error) {
			if err != nil && failed == nil {
				failed = err
			}
		}
		allocs[0] = testing.AllocsPerRun(200, func() {
			check(w.Send(b, 1, 1))
			_, err := w.Recv(b, 1, 1)
			check(err)
		})
		allocs[1] = testing.AllocsPerRun(200, func() {
			r, err := w.Irecv(f, 1, 2)
			check(err)
			check(w.Send(f, 1, 2))
			if r != nil {
				_, err = r.Wait()
				check(err)
			}
		})
		allocs[2] = testing.AllocsPerRun(200, func() {
			check(w.Send(mpi.Typed(f, 2, f64x2), 1, 3))
			_, err := w.Recv(mpi.Typed(f, 2, f64x2), 1, 3)
			check(err)
		})
		check(w.Send(nil, 1, stop))
		return failed
	})
	require.NoError(t, err)
	for i, k := range kinds {
		require.Zero(t, allocs[i], "allocations per round trip with %s arguments", k)
	}
}

// TestExchangeAllocations: the neighbour exchange of halo codes allocates
// nothing once warmed up, in both shapes: two Sendrecv with two tags (the
// peer's message often arrives before the receive is posted and is
// stored as unexpected), and Irecv, Irecv, Isend, Isend, WaitallInto
// with two tags (sends done at once share a done request per destination
// and tag), and the same with Waitall, whose statuses the caller reads
// and drops (they stay on its stack).
func TestExchangeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	pml.SetResetCheck(false) // the check itself allocates (reflect)
	defer pml.SetResetCheck(true)
	const runs = 200 // AllocsPerRun runs the function runs+1 times
	var allocs [3]float64
	err := mpi.Run(2, func(w *mpi.Comm) error {
		peer := 1 - w.Rank()
		a, b, c, d := make([]byte, 8), make([]byte, 8), make([]byte, 8), make([]byte, 8)
		var failed error
		sendrecv := func() {
			if _, err := w.Sendrecv(a, peer, 1, b, peer, 1); err != nil {
				failed = err
			}
			if _, err := w.Sendrecv(c, peer, 2, d, peer, 2); err != nil {
				failed = err
			}
		}
		reqs := make([]*mpi.Request, 4)
		sts := make([]mpi.Status, 4)
		start := func() bool { // Irecv, Irecv, Isend, Isend
			var err [4]error
			reqs[0], err[0] = w.Irecv(b, peer, 1)
			reqs[1], err[1] = w.Irecv(d, peer, 2)
			reqs[2], err[2] = w.Isend(a, peer, 1)
			reqs[3], err[3] = w.Isend(c, peer, 2)
			for _, e := range err {
				if e != nil {
					failed = e
					return false
				}
			}
			return true
		}
		nonblocking := func() {
			if !start() {
				return
			}
			if e := mpi.WaitallInto(reqs, sts); e != nil {
				failed = e
			}
		}
		waitall := func() {
			if !start() {
				return
			}
			st, e := mpi.Waitall(reqs)
			if e == nil && (st[0].Tag != 1 || st[1].Tag != 2 || st[1].Count != len(d)) {
				e = fmt.Errorf("Waitall's statuses: tags %d and %d, count %d", st[0].Tag, st[1].Tag, st[1].Count)
			}
			if e != nil {
				failed = e
			}
		}
		lockstep(w, runs, allocs[:], sendrecv, nonblocking, waitall)
		return failed
	})
	require.NoError(t, err)
	require.Zero(t, allocs[0], "allocations per exchange of two Sendrecv")
	require.Zero(t, allocs[1], "allocations per exchange of Irecv, Irecv, Isend, Isend, WaitallInto")
	require.Zero(t, allocs[2], "allocations per exchange of Irecv, Irecv, Isend, Isend, Waitall")
}

// A ping-pong whose receiver learns the size from a probe allocates
// nothing with Probe and Recv, nor with Mprobe but the Messages it
// returns, 32 to an allocation (AllocsPerRun's average, rounded down, is
// 0): the matched probe takes the message without a request of its own,
// and an eager message gets a done Handle shared as an eager send's is.
func TestProbeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	pml.SetResetCheck(false)
	defer pml.SetResetCheck(true)
	const runs = 200
	var allocs [2]float64
	err := mpi.Run(2, func(w *mpi.Comm) error {
		rank := w.Rank()
		peer := 1 - rank
		out, in := make([]byte, 8), make([]byte, 8)
		var failed error
		recvProbe := func() {
			st, err := w.Probe(peer, 1)
			if err == nil {
				_, err = w.Recv(in[:st.Count], st.Source, st.Tag)
			}
			if err != nil {
				failed = err
			}
		}
		recvMprobe := func() {
			m, st, err := w.Mprobe(peer, 1)
			if err == nil {
				_, err = m.Recv(in[:st.Count])
			}
			if err != nil {
				failed = err
			}
		}
		round := func(recv func()) func() {
			return func() {
				if rank == 0 {
					if err := w.Send(out, peer, 1); err != nil {
						failed = err
					}
					recv()
					return
				}
				recv()
				if err := w.Send(out, peer, 1); err != nil {
					failed = err
				}
			}
		}
		lockstep(w, runs, allocs[:], round(recvProbe), round(recvMprobe))
		return failed
	})
	require.NoError(t, err)
	require.Zero(t, allocs[0], "allocations per round trip of Send and Probe, Recv")
	require.Zero(t, allocs[1], "allocations per round trip of Send and Mprobe, Message.Recv")
}

// lockstep runs fs in turn 300 times on every rank of w (a warm-up: the
// pools fill), then each of them runs+1 times, as rank 0's
// testing.AllocsPerRun does, and stores rank 0's averages in allocs (the
// process's allocations, both ranks' in an in-process job).
func lockstep(w *mpi.Comm, runs int, allocs []float64, fs ...func()) {
	for range 300 {
		for _, f := range fs {
			f()
		}
	}
	for i, f := range fs {
		if w.Rank() == 0 {
			allocs[i] = testing.AllocsPerRun(runs, f)
			continue
		}
		for range runs + 1 {
			f()
		}
	}
}
