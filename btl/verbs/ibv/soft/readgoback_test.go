package soft

import (
	"bytes"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// TestReadCompletesAfterGoBack: READs of 2-11 packets, one outstanding at
// a time, with a tenth of the packets reordered. A response that overtakes
// another sends the requester back to the missing one (go-back-N into the
// READ); the missing responses then often arrive before the READ is asked
// again, and the READ must complete all the same, with its bytes, though
// no answer to the repeated request will come.
func TestReadCompletesAfterGoBack(t *testing.T) {
	const slot = 11 * 4096
	n := 4000
	if testing.Short() {
		n = 1000
	}
	faults := Config{Reorder: 0.1, Seed: 1}
	fb := faults
	fb.Seed = 2
	o := defaultOpts()
	o.bufSize = 64 * slot
	a, b := newPair(t, faults, fb, o)
	pattern(b.buf, 2)
	for i := range n {
		size := 2*4096 + (i*2654435761)%(9*4096)
		off := (i % 64) * slot
		clear(a.buf[off : off+size])
		_, err := a.qp.PostSend([]ibv.SendWR{{ID: uint64(i), Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled,
			SGList: []ibv.SGEntry{ibv.SGE(a.mr, off, size)}, RemoteAddr: b.mr.Addr() + uint64(off), RKey: b.mr.RKey()}})
		require.NoError(t, err)
		wc := poll(t, a.scq, 1, 10*time.Second)[0]
		require.Equal(t, ibv.WCSuccess, wc.Status, "READ %d: %v", i, wc.Status)
		require.Equal(t, uint64(i), wc.ID)
		require.True(t, bytes.Equal(a.buf[off:off+size], b.buf[off:off+size]), "READ %d: bytes differ", i)
	}
	c := a.ctx.(*devContext).Counters()
	require.NotZero(t, c.Retransmits, "no READ was asked again: the test did not test")
}
