package sm

import (
	"errors"
	"sync/atomic"
)

// The FIFO of a receiving process: a bounded multi-producer single-consumer
// queue of slot words in the receiver's segment, plus a tail position that
// producers advance. A slot word is
//
//	bits 32-63 position (mod 2^32) the slot is for
//	bit  31    full
//	bits 16-30 sender's local rank
//	bits  0-15 fragment index in the sender's segment
//
// Slot i starts empty for position i. A producer claims position t and
// publishes its fragment reference in one compare-and-swap of slot
// t%slots from "empty for t" to "full for t", then helps advance the tail.
// Nothing is ever half-written, so a producer that dies at any point leaves
// the queue consistent: no slot is held, nobody waits for it. (vader's
// linked-list FIFO swaps the tail and then links the previous element; a
// producer dying between the two cuts the list.) The consumer takes slot
// h%slots when it holds "full for h" and stores "empty for h+slots".
//
// Ordering: the compare-and-swap is a release of the fragment's header and
// payload (written before it); the consumer's load of the slot acquires
// them.

const fifoFull = 1 << 31

// errFifoFull: every slot holds an unconsumed fragment (or the tail is
// hopelessly contended or corrupted); retry later.
var errFifoFull = errors.New("FIFO full")

func slotEmpty(pos uint64) uint64 { return uint64(uint32(pos)) << 32 }

func slotFull(pos uint64, local, frag int) uint64 {
	return uint64(uint32(pos))<<32 | fifoFull | uint64(local)<<16 | uint64(frag)
}

// fifo is a view of one segment's FIFO.
type fifo struct {
	slots []byte // fifoSlots words
	tail  *atomic.Uint64
	mask  uint64
}

func newFifo(seg []byte, l *layout) fifo {
	return fifo{slots: seg[l.fifoOff : l.fifoOff+8*l.fifoSlots], tail: word64(seg, offTail), mask: uint64(l.fifoSlots - 1)}
}

func (f *fifo) slot(pos uint64) *atomic.Uint64 { return word64(f.slots, int(pos&f.mask)*8) }

// init makes every slot empty for its first position (owner, before
// publishing the segment).
func (f *fifo) init() {
	for i := uint64(0); i <= f.mask; i++ {
		f.slot(i).Store(slotEmpty(i))
	}
	f.tail.Store(0)
}

// push enqueues a reference to fragment frag of local rank local. It does
// not block: errFifoFull when the queue has no free slot.
func (f *fifo) push(local, frag int) error {
	for range 4096 {
		t := f.tail.Load()
		s := f.slot(t)
		w := s.Load()
		wp := uint32(w >> 32)
		switch d := int32(wp - uint32(t)); {
		case d == 0 && w&fifoFull == 0:
			if s.CompareAndSwap(w, slotFull(t, local, frag)) {
				f.tail.CompareAndSwap(t, t+1)
				return nil
			}
		case d > 0 || (d == 0 && w&fifoFull != 0):
			// Position t is taken (and maybe consumed): the tail lags.
			f.tail.CompareAndSwap(t, t+1)
		case d == -int32(f.mask+1) && w&fifoFull != 0:
			return errFifoFull // the slot still holds the previous lap
		}
		// Otherwise the tail we read is stale: retry.
	}
	return errFifoFull
}

// peekFull reports whether position h holds a fragment (a racy look).
func (f *fifo) peekFull(h uint64) bool {
	w := f.slot(h).Load()
	return w&fifoFull != 0 && uint32(w>>32) == uint32(h)
}

// pop takes position h if it is full: the sender's local rank and
// fragment index. The caller owns h (single consumer) and advances it.
func (f *fifo) pop(h uint64) (local, frag int, ok bool) {
	s := f.slot(h)
	w := s.Load()
	if w&fifoFull == 0 || uint32(w>>32) != uint32(h) {
		return 0, 0, false
	}
	s.Store(slotEmpty(h + f.mask + 1))
	return int(w>>16) & (maxLocal - 1), int(uint16(w)), true
}
