package verbs

import (
	"github.com/gompi-org/gompi/internal/mpierr"
)

// Flow control of the control ring (one direction of a pair).
//
// The receiver owns a ring of ringSize bytes and accepts at most credits
// messages in flight. It acknowledges with a zero-length RDMA
// WRITE_WITH_IMM carrying immACK (TensorFlow's convention: no buffer, no
// count) at ack points that both sides compute from the stream of frames
// alone: after a message, if the messages since the last point reach
// ackMsgs or the ring bytes they took reach ackBytes. The sender keeps the
// points it crossed in a FIFO and each ACK releases the oldest one, so an
// ACK needs no payload and several messages share one ACK (coalescing).
//
// With ackMsgs = max(1, credits/2), ackBytes = ringSize/2 and frames of at
// most ringSize/4 bytes, a sender that is out of room always has a point
// outstanding, so it never waits for an ACK that will not come:
// unacknowledged messages past the last point number fewer than ackMsgs
// (< credits) and take fewer than ackBytes bytes, which leaves room for a
// frame and the pad before it. One credit gives TensorFlow's one message in
// flight with an ACK per message.

// ackRule returns the ack point thresholds for a ring.
func ackRule(ringSize, credits int) (msgs, bytes int) {
	return max(1, credits/2), ringSize / 2
}

// point is the messages and ring bytes between two ack points.
type point struct {
	msgs  int
	bytes uint64
}

// sendWindow is the sender's view of the peer's ring.
type sendWindow struct {
	ringSize uint64
	credits  int
	ackMsgs  int
	ackBytes uint64

	head      uint64  // ring bytes taken by sent frames (pads included)
	freed     uint64  // ring bytes the peer released (ACKs)
	localDone uint64  // ring bytes whose RDMA write completed here (the staging copy is free)
	inflight  int     // messages not acknowledged
	seq       uint32  // number of the next message
	cur       point   // since the last ack point
	points    []point // crossed, not yet acknowledged, oldest first
}

func newSendWindow(ringSize, credits int) sendWindow {
	m, b := ackRule(ringSize, credits)
	return sendWindow{ringSize: uint64(ringSize), credits: credits, ackMsgs: m, ackBytes: uint64(b)}
}

// maxFrame is the largest frame (header included) the window takes.
func (w *sendWindow) maxFrame() int { return int(w.ringSize / 4) }

// slot is where a message goes: the pad before it (0: none) and its ring
// offset.
type slot struct {
	padOff, pad int // pad frame at padOff of pad bytes, if pad > 0
	off, foot   int // the frame at off, taking foot bytes
}

// reserve finds room for a frame of n bytes (header included, at most
// maxFrame) or reports false when the peer's credits or ring, or the local
// staging copy, are exhausted. It does not change the window.
func (w *sendWindow) reserve(n int) (slot, bool) {
	var s slot
	s.foot = alignUp(n)
	pos := int(w.head % w.ringSize)
	if int(w.ringSize)-pos < s.foot {
		s.padOff, s.pad = pos, int(w.ringSize)-pos
		pos = 0
	}
	s.off = pos
	used := w.head - min(w.freed, w.localDone)
	if w.inflight >= w.credits || used+uint64(s.pad+s.foot) > w.ringSize {
		return s, false
	}
	return s, true
}

// commit takes the slot reserve returned, for message number w.seq.
func (w *sendWindow) commit(s slot) {
	take := uint64(s.pad + s.foot)
	w.head += take
	w.inflight++
	w.seq++
	w.cur.msgs++
	w.cur.bytes += take
	if w.cur.msgs >= w.ackMsgs || w.cur.bytes >= w.ackBytes {
		w.points = append(w.points, w.cur)
		w.cur = point{}
	}
}

// written records that the RDMA write of a message taking take ring bytes
// (its pad included) completed, in order.
func (w *sendWindow) written(take int) { w.localDone += uint64(take) }

// acked releases the oldest ack point. An ACK with no point outstanding is
// a protocol error.
func (w *sendWindow) acked() error {
	if len(w.points) == 0 {
		return mpierr.Errorf(mpierr.ErrProtocol, "verbs: ACK with no message awaiting one")
	}
	p := w.points[0]
	w.points = w.points[1:]
	if len(w.points) == 0 {
		w.points = w.points[:0:0] // let the backing array go once drained
	}
	w.freed += p.bytes
	w.inflight -= p.msgs
	return nil
}

// recvWindow is the receiver's side of its ring.
type recvWindow struct {
	ringSize uint64
	ackMsgs  int
	ackBytes uint64
	tail     uint64 // ring bytes consumed
	seq      uint32 // number of the next message
	cur      point
}

func newRecvWindow(ringSize, credits int) recvWindow {
	m, b := ackRule(ringSize, credits)
	return recvWindow{ringSize: uint64(ringSize), ackMsgs: m, ackBytes: uint64(b)}
}

// consumed records a message that took take ring bytes (its pad included)
// and was dispatched; it reports whether an ACK is due.
func (w *recvWindow) consumed(take int) bool {
	w.tail += uint64(take)
	w.seq++
	w.cur.msgs++
	w.cur.bytes += uint64(take)
	if w.cur.msgs >= w.ackMsgs || w.cur.bytes >= w.ackBytes {
		w.cur = point{}
		return true
	}
	return false
}
