package verbs

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// pairSim runs a sender's window against a receiver's: messages of random
// sizes go into a FIFO "network", the receiver consumes them and sends an
// ACK when due, and the sender takes the ACKs. It checks that the sender
// only ever stalls with an ACK on its way (no deadlock), that a frame never
// overlaps bytes the receiver has not consumed, and that both sides agree
// on every message's offset.
func pairSim(t *testing.T, ringSize, credits, maxFrame int, seed uint64, n int) (stalls int) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 1))
	sw := newSendWindow(ringSize, credits)
	rw := newRecvWindow(ringSize, credits)
	type msg struct {
		s    slot
		size int
	}
	var wire []msg // sent, not consumed
	acks := 0      // ACKs in flight
	sent, got := 0, 0
	for got < n {
		progress := false
		if sent < n {
			size := frameHdrLen + r.IntN(maxFrame-frameHdrLen+1)
			if s, ok := sw.reserve(size); ok {
				// The frame's bytes are free at the receiver: beyond its tail.
				end := sw.head + uint64(s.pad+s.foot)
				require.LessOrEqual(t, end-rw.tail, uint64(ringSize), "frame overwrites unconsumed bytes")
				sw.commit(s)
				sw.written(s.pad + s.foot)
				wire = append(wire, msg{s, size})
				sent++
				progress = true
			} else if len(wire) == 0 && acks == 0 {
				t.Fatalf("sender stalled with nothing in flight (sent %d, inflight %d, head %d freed %d)", sent, sw.inflight, sw.head, sw.freed)
			} else {
				stalls++
			}
		}
		// Deliver some.
		for k := r.IntN(3); k >= 0 && len(wire) > 0; k-- {
			m := wire[0]
			wire = wire[1:]
			pos := int(rw.tail % uint64(ringSize))
			take := 0
			if m.s.pad > 0 {
				require.Equal(t, m.s.padOff, pos)
				take, pos = m.s.pad, 0
			}
			require.Equal(t, m.s.off, pos, "message %d offset", got)
			require.LessOrEqual(t, pos+m.size, ringSize)
			if rw.consumed(take + alignUp(m.size)) {
				acks++
			}
			got++
			progress = true
		}
		for k := r.IntN(2); k >= 0 && acks > 0; k-- {
			require.NoError(t, sw.acked())
			acks--
			progress = true
		}
		require.True(t, progress || sent < n, "no progress")
	}
	return stalls
}

func TestCreditWindow(t *testing.T) {
	for _, c := range []struct{ ring, credits, frame int }{
		{256 << 10, 64, 64<<10 + 16}, {256 << 10, 1, 64<<10 + 16}, {4096, 2, 1024}, {4096, 3, 1024}, {1 << 20, 1024, 4096}, {256, 1, 64},
	} {
		for seed := range uint64(5) {
			pairSim(t, c.ring, c.credits, c.frame, seed, 3000)
		}
	}
}

func TestOneCreditIsOneInFlight(t *testing.T) {
	w := newSendWindow(1<<20, 1)
	s, ok := w.reserve(100)
	require.True(t, ok)
	w.commit(s)
	w.written(s.pad + s.foot)
	_, ok = w.reserve(100)
	require.False(t, ok, "a second message before the ACK")
	require.NoError(t, w.acked())
	_, ok = w.reserve(100)
	require.True(t, ok)
	require.Error(t, w.acked(), "an ACK with nothing outstanding")
}

func TestStagingHoldsUntilWritten(t *testing.T) {
	w := newSendWindow(1024, 64)
	for range 4 {
		s, ok := w.reserve(256)
		require.True(t, ok)
		w.commit(s)
	}
	require.Len(t, w.points, 2)   // a point every ringSize/2 bytes
	require.NoError(t, w.acked()) // the peer consumed, but our writes did not complete
	require.NoError(t, w.acked())
	_, ok := w.reserve(64)
	require.False(t, ok, "staging reused before its write completed")
	w.written(1024)
	_, ok = w.reserve(64)
	require.True(t, ok)
}
