package soft

import (
	"bytes"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// TestReadsWithDuplicateRequests keeps as many READs outstanding as the
// QP allows (max_rd_atomic 2) while the responder's device duplicates a
// tenth of the packets it receives. A duplicate READ request makes the
// responder send that READ's responses again; those repeats are not new
// READs, so they must not take the responder's resources for
// max_dest_rd_atomic: every new READ the requester sends within its limit
// executes, and every READ completes with its bytes (a responder that
// counted the repeats refused new READs with an invalid request NAK).
func TestReadsWithDuplicateRequests(t *testing.T) {
	const slot = 3 * 4096
	n := 3000
	if testing.Short() {
		n = 1000
	}
	o := defaultOpts()
	o.bufSize = 64 * slot
	o.rdAtomic = 2
	a, b := newPair(t, Config{Reorder: 0.1, Seed: 3}, Config{Dup: 0.1, Seed: 4}, o)
	pattern(b.buf, 5)
	post := func(i int) {
		off := (i % 64) * slot
		size := 4096 + (i*2654435761)%(2*4096)
		clear(a.buf[off : off+size])
		_, err := a.qp.PostSend([]ibv.SendWR{{ID: uint64(i), Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled,
			SGList: []ibv.SGEntry{ibv.SGE(a.mr, off, size)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()}})
		require.NoError(t, err)
	}
	const depth = 4 // beyond max_rd_atomic: the requester queues the rest
	for i := range depth {
		post(i)
	}
	for i := range n {
		wc := poll(t, a.scq, 1, 10*time.Second)[0]
		require.Equal(t, ibv.WCSuccess, wc.Status, "READ %d: %v", i, wc.Status)
		require.Equal(t, uint64(i), wc.ID)
		off := (i % 64) * slot
		size := 4096 + (i*2654435761)%(2*4096)
		require.True(t, bytes.Equal(a.buf[off:off+size], b.buf[off:off+size]), "READ %d: bytes differ", i)
		if i+depth < n {
			post(i + depth)
		}
	}
	c := b.ctx.(*devContext).Counters()
	require.NotZero(t, c.Duplicates, "no READ request was duplicated: the test did not test")
}
