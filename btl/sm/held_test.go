package sm

import (
	"bytes"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
)

// connected opens a job of two ranks with the overrides, rank 1 taking
// tags with a test inbox, and returns the ranks and rank 0's endpoint to
// rank 1 (each rank has added the other).
func connected(t *testing.T, tags []btl.Tag, overrides ...[2]string) ([]*testRank, *inbox, btl.Endpoint) {
	t.Helper()
	ranks := openJob(t, btltest.NewStore(), 2, overrides...)
	in := newInbox(ranks[1].env.Dispatch, tags...)
	ep, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)
	_, err = ranks[1].m.AddProc(0)
	require.NoError(t, err)
	return ranks, in, ep
}

// TestHeldPoll: a goroutine holding the poll lock (BeginPoll) receives
// with PollHeld while other callers' Progress returns 0 at once; once it
// calls EndPoll, Progress polls again. The fragments arrive whole and in
// order whichever call took them.
func TestHeldPoll(t *testing.T) {
	ranks, in, ep := connected(t, []btl.Tag{tagData})
	m := ranks[1].m

	const count = 200 // past the fast-box threshold: FIFO first, then the box
	// Each fragment is taken before the next is sent: the box and the
	// FIFO never fill, so SendImmediate must take every one.
	send := func(seq int) {
		t.Helper()
		require.NoError(t, ep.SendImmediate(tagData, seqHdr(0, seq, 8), fill(0, seq, 8)))
	}
	seq := 0
	require.True(t, m.BeginPoll())
	held := true
	for ; seq < count/2; seq++ {
		send(seq)
		require.Zero(t, m.Progress(), "Progress polled while another call holds the poll lock")
		for {
			got, _ := in.count()
			if got > seq {
				break
			}
			if !held {
				held = m.BeginPoll()
				continue
			}
			_, held = m.PollHeld()
		}
	}
	if held {
		m.EndPoll()
	}
	for ; seq < count; seq++ {
		send(seq)
		for {
			if got, _ := in.count(); got > seq {
				break
			}
			m.Progress()
		}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	require.Len(t, in.frags, count)
	for i, f := range in.frags {
		require.Equal(t, seqHdr(0, i, 8), f.hdr, "fragment %d", i)
		require.Equal(t, fill(0, i, 8), f.data, "fragment %d", i)
	}
}

// TestRuns: small fragments that pile up in a fast box reach a tag's
// RunHandler in runs, in order with the fragments around them (another
// tag, a large one through the FIFO), each whole.
func TestRuns(t *testing.T) {
	ranks, in, ep := connected(t, []btl.Tag{tagData, tagPing}, [2]string{paramFboxThreshold, "1"})
	var runs []int
	ranks[1].env.Dispatch.RegisterRun(tagData, func(ep btl.Endpoint, hdrs, datas [][]byte) {
		runs = append(runs, len(hdrs))
		in.mu.Lock()
		for i := range hdrs {
			in.frags = append(in.frags, rcvd{from: ep.Peer(), tag: tagData, hdr: append([]byte(nil), hdrs[i]...), data: append([]byte(nil), datas[i]...)})
		}
		in.mu.Unlock()
	})
	m := ranks[1].m
	// Set the fast box up: the first fragment announces it.
	require.NoError(t, ep.SendImmediate(tagData, seqHdr(0, 0, 8), fill(0, 0, 8)))
	for got, _ := in.count(); got < 1; got, _ = in.count() {
		m.Progress()
	}
	type sent struct {
		tag  btl.Tag
		seq  int
		size int
	}
	var want []sent
	large := m.lay.inlineLimit + 100 // through the FIFO, referenced from the box
	for seq := 1; seq <= 40; seq++ {
		tag, size := tagData, 8
		switch seq {
		case 13:
			tag = tagPing
		case 27:
			size = large
		}
		if size > 8 {
			done, err := ep.Send(tag, seqHdr(0, seq, size), fill(0, seq, size), func(error) {})
			require.NoError(t, err)
			require.True(t, done)
		} else {
			require.NoError(t, ep.SendImmediate(tag, seqHdr(0, seq, size), fill(0, seq, size)))
		}
		want = append(want, sent{tag, seq, size})
	}
	for got, _ := in.count(); got < 41; got, _ = in.count() {
		m.Progress()
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	require.Len(t, in.frags, 41)
	for i, w := range want {
		f := in.frags[i+1]
		require.Equal(t, w.tag, f.tag, "fragment %d", w.seq)
		require.Equal(t, seqHdr(0, w.seq, w.size), f.hdr, "fragment %d", w.seq)
		require.Equal(t, fill(0, w.seq, w.size), f.data, "fragment %d", w.seq)
	}
	require.Greater(t, slices.Max(runs), 1, "no run of more than one fragment: %v", runs)
}

// TestInlineLayouts: inline fast-box entries of every header and payload
// length up to a few lines, at every position in the ring's lines (the
// first line of an entry is written last), arrive byte for byte.
func TestInlineLayouts(t *testing.T) {
	ranks, in, ep := connected(t, []btl.Tag{tagData}, [2]string{paramFboxThreshold, "1"}, [2]string{paramFboxSize, "1k"})
	m := ranks[1].m
	mk := func(n, seed int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(seed*131 + i*7 + 1)
		}
		return b
	}
	count := 0
	for hn := 0; hn <= 40; hn += 3 {
		for dn := 0; dn <= 180; dn += 7 {
			h, d := mk(hn, count), mk(dn, count+1000)
			for ep.SendImmediate(tagData, h, d) != nil {
				m.Progress()
			}
			count++
			for got, _ := in.count(); got < count; got, _ = in.count() {
				m.Progress()
			}
			in.mu.Lock()
			f := in.frags[count-1]
			in.mu.Unlock()
			require.True(t, bytes.Equal(h, f.hdr), "header %d bytes, payload %d: header %x", hn, dn, f.hdr)
			require.True(t, bytes.Equal(d, f.data), "header %d bytes, payload %d: payload %x", hn, dn, f.data)
		}
	}
	e := ep.(*endpoint)
	e.mu.Lock()
	defer e.mu.Unlock()
	require.NotNil(t, e.tx, "no fast box was set up: the entries went through the FIFO")
}
