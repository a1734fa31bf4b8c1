package sm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl/btltest"
)

// TestHeldPoll: a goroutine holding the poll lock (BeginPoll) receives
// with PollHeld while other callers' Progress returns 0 at once; once it
// calls EndPoll, Progress polls again. The fragments arrive whole and in
// order whichever call took them.
func TestHeldPoll(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2)
	in := newInbox(ranks[1].env.Dispatch, tagData)
	ep, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)
	_, err = ranks[1].m.AddProc(0)
	require.NoError(t, err)
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
