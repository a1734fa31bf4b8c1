package pml

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/pml/hdr"
)

// A run of MATCH fragments (btl.RunHandler) is matched as the same
// fragments one by one would be: posted receives get their data in
// sequence order, an unexpected message waits for its receive, an early
// fragment waits for the ones before it, and a malformed one fails the
// peer without touching what came before it.
func TestMatchingRun(t *testing.T) {
	cs := selfComms(t, 2)
	c := cs[0]
	e := c.e
	ep := e.peers[1].Load().ep // dispatched as from rank 1
	frag := func(seq uint16, tag int32, data string) ([]byte, []byte) {
		h := make([]byte, hdr.MatchLen)
		m := hdr.Match{Seq: seq, Ctx: c.ctx, Src: 1, Tag: tag}
		m.Encode(h)
		return h, []byte(data)
	}
	post := func(tag int) (*Request, []byte) {
		b := make([]byte, 8)
		r, err := c.irecv(Buffer{Bytes: b}, 1, tag)
		require.NoError(t, err)
		return r, b
	}
	r5a, b5a := post(5)
	r5b, b5b := post(5)
	r7, b7 := post(7)

	var hs, ds [][]byte
	add := func(h, d []byte) { hs, ds = append(hs, h), append(ds, d) }
	add(frag(0, 5, "zero"))  // posted: delivered at once
	add(frag(1, 6, "one"))   // no receive: unexpected
	add(frag(3, 7, "three")) // early: waits for 2
	add(frag(2, 5, "two"))   // posted; lets 3 through
	e.onMatchingRun(ep, hs, ds)

	for _, x := range []struct {
		r    *Request
		b    []byte
		want string
	}{{r5a, b5a, "zero"}, {r5b, b5b, "two"}, {r7, b7, "three"}} {
		require.True(t, x.r.Done(), "receive for %q not done", x.want)
		st, err := x.r.Result()
		require.NoError(t, err)
		require.Equal(t, x.want, string(x.b[:st.Count]))
		require.Equal(t, 1, st.Source)
	}
	r6, b6 := post(6)
	require.True(t, r6.Done(), "the unexpected message did not match a later receive")
	st, err := r6.Result()
	require.NoError(t, err)
	require.Equal(t, "one", string(b6[:st.Count]))

	// A run whose second fragment is not a matching header: the first is
	// delivered, the peer fails with a protocol error, the third is dropped.
	r9, b9 := post(9)
	r10, _ := post(10)
	h4, d4 := frag(4, 9, "four")
	bad := []byte{0xEE, 0, 0, 0}
	h5, d5 := frag(5, 10, "five")
	e.onMatchingRun(ep, [][]byte{h4, bad, h5}, [][]byte{d4, nil, d5})
	require.True(t, r9.Done())
	st, err = r9.Result()
	require.NoError(t, err)
	require.Equal(t, "four", string(b9[:st.Count]))
	require.True(t, r10.Done(), "a receive from the failed peer still pending")
	_, err = r10.Result()
	require.Error(t, err)
}

// RecycleAll keeps at most freeMax requests for Irecv, only done ones of
// its own engine, and Irecv takes them back.
func TestRecycleAllFreeList(t *testing.T) {
	cs := selfComms(t, 2)
	c0, c1 := cs[0], cs[1]
	const n = freeMax + 40
	reqs := make([]*Request, n)
	buf := make([]byte, 8)
	for i := range reqs {
		r, err := c0.irecv(Buffer{Bytes: buf}, 1, 3)
		require.NoError(t, err)
		reqs[i] = r
	}
	pending, err := c0.irecv(Buffer{Bytes: buf}, 1, 4) // never sent: not done
	require.NoError(t, err)
	for range n {
		require.NoError(t, c1.Send(Buffer{Bytes: buf}, 0, 3, Standard))
	}
	for _, r := range reqs {
		require.True(t, r.Done())
	}
	c0.e.RecycleAll(append([]*Request{pending}, reqs...))
	require.Len(t, c0.e.free, freeMax)
	require.NotContains(t, c0.e.free, pending, "a pending request was recycled")
	last := c0.e.free[len(c0.e.free)-1]
	r, err := c0.irecv(Buffer{Bytes: buf}, 1, 5)
	require.NoError(t, err)
	require.Same(t, last, r, "Irecv did not take from the free list")
	require.Len(t, c0.e.free, freeMax-1)
	require.False(t, r.Done())
	require.False(t, pending.Done())
}

// Nonblocking calls give the processor up once per yieldEvery (Irecvs that
// were posted, isendNow's eager sends); blocking eager calls never do.
func TestYieldEvery(t *testing.T) {
	calls := 0
	yield = func() { calls++ }
	t.Cleanup(func() { yield = runtime.Gosched })
	// One goroutine sends all before anything is received: without flow
	// control, or the sends beyond the window would wait for receives.
	cs := selfComms(t, 2, [2]string{"pml_unexpected_window", "0"})
	const n = 2 * yieldEvery
	b := make([]byte, 8)
	// Blocking sends to rank 1 land in its unexpected queue; blocking
	// receives on rank 0 of rank 1's sends take them from there.
	for range n {
		require.NoError(t, cs[0].Send(Buffer{Bytes: b}, 1, 3, Standard))
	}
	require.Equal(t, 0, calls, "blocking sends")
	reqs := make([]*Request, 0, 2*n)
	for range n {
		r, err := cs[1].irecv(Buffer{Bytes: b}, 0, 3) // matched at once: not posted, not counted
		require.NoError(t, err)
		reqs = append(reqs, r)
	}
	require.Equal(t, 0, calls, "Irecvs that matched at once")
	for range n {
		r, err := cs[1].irecv(Buffer{Bytes: b}, 0, 4) // posted
		require.NoError(t, err)
		reqs = append(reqs, r)
	}
	require.Equal(t, 2, calls, "posted Irecvs")
	for range n {
		r, err := cs[0].isendNow(Buffer{Bytes: b}, 1, 4, Standard)
		require.NoError(t, err)
		require.Nil(t, r)
	}
	require.Equal(t, 4, calls, "eager isendNows")
	for _, r := range reqs {
		require.True(t, r.Done())
	}
}

// A receive made with a sink (irecvSink; mpi's Irecv's Handle holds one) gets its result
// written there at completion. With no call of the owner holding the
// request, the engine gives it back to its free list at once; with one
// holding it, the sink says so (sinkRecycle) and the holder's Release gives
// it back, once.
func TestSinkCompletion(t *testing.T) {
	cs := selfComms(t, 2)
	e := cs[1].e
	b := make([]byte, 8)
	send := func(tag int, v byte) {
		require.NoError(t, cs[0].Send(Buffer{Bytes: []byte{v, 2, 3, 4, 5, 6, 7, 8}}, 1, tag, Standard))
	}

	var s1 sink
	s1.State.store(sinkMode)
	r1, err := cs[1].irecvSink(Buffer{Bytes: b}, 0, 5, &s1)
	require.NoError(t, err)
	e.mu.Lock()
	free := len(e.free)
	e.mu.Unlock()
	send(5, 42)
	require.Equal(t, uint32(sinkMode|sinkGone), s1.State.Load(), "gone, nothing to recycle by the owner")
	st, err := s1.Result()
	require.NoError(t, err)
	require.Equal(t, Status{Source: 0, Tag: 5, Count: 8}, st)
	require.Equal(t, byte(42), b[0])
	e.mu.Lock()
	require.Equal(t, free+1, len(e.free), "the engine gave the request back")
	require.Same(t, r1, e.free[len(e.free)-1])
	e.mu.Unlock()

	var s2 sink
	s2.State.store(sinkMode)
	r2, err := cs[1].irecvSink(Buffer{Bytes: b}, 0, 6, &s2)
	require.NoError(t, err)
	require.Same(t, r1, r2, "taken from the free list")
	s2.State.Add(1) // a call holds it
	send(6, 43)
	require.Equal(t, uint32(sinkMode|sinkGone|sinkRecycle|1), s2.State.Load())
	require.True(t, r2.Done())
	gen := r2.gen
	s2.release(r2) // the last holder gives it back
	require.Equal(t, uint32(sinkMode|sinkGone), s2.State.Load())
	require.Equal(t, gen+1, r2.gen, "recycled once")
	s2.State.Add(1) // a late call that sees gone and lets go
	s2.release(r2)
	require.Equal(t, gen+1, r2.gen, "not recycled again")
	st, err = s2.Result()
	require.NoError(t, err)
	require.Equal(t, Status{Source: 0, Tag: 6, Count: 8}, st)
}

// Requests back in the free list are clean, whatever they carried: eager,
// rendezvous (RDMA get over self), truncated and cancelled receives,
// reused window after window, every byte checked.
func TestFreeListRequestsClean(t *testing.T) {
	cs := selfComms(t, 2)
	c0, c1 := cs[0], cs[1]
	sizes := []int{0, 8, 900, 4096, 70000}
	for round := range 4 {
		var reqs []*Request
		var bufs [][]byte
		for i, n := range sizes {
			b := make([]byte, n)
			r, err := c0.irecv(Buffer{Bytes: b}, 1, i)
			require.NoError(t, err)
			reqs, bufs = append(reqs, r), append(bufs, b)
		}
		short := make([]byte, 4) // truncated: 4 of 900 bytes stored
		rs, err := c0.irecv(Buffer{Bytes: short}, 1, 100)
		require.NoError(t, err)
		rc, err := c0.irecv(Buffer{Bytes: make([]byte, 8)}, 1, 101) // cancelled
		require.NoError(t, err)
		require.True(t, c0.Cancel(rc))
		for i, n := range sizes {
			require.NoError(t, c1.Send(Buffer{Bytes: pattern(n, byte(round+i))}, 0, i, Standard))
		}
		require.NoError(t, c1.Send(Buffer{Bytes: pattern(900, 7)}, 0, 100, Standard))
		for i, r := range reqs {
			require.NoError(t, c0.e.Wait(nil, r))
			st, err := r.Result()
			require.NoError(t, err)
			require.Equal(t, sizes[i], st.Count)
			require.Equal(t, pattern(sizes[i], byte(round+i)), bufs[i], "size %d, round %d", sizes[i], round)
		}
		require.NoError(t, c0.e.Wait(nil, rs))
		_, err = rs.Result()
		require.Error(t, err)
		require.Equal(t, pattern(900, 7)[:4], short)
		require.True(t, rc.Done())
		c0.e.RecycleAll(append(reqs, rs, rc))
		require.NotEmpty(t, c0.e.free)
		for _, r := range c0.e.free {
			require.Empty(t, r.ranges)
			require.Equal(t, reqState{ranges: r.ranges}, r.reqState, "round %d", round)
		}
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}
