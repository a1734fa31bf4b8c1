package self

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
)

// Hand-off to a spinning receiver.
//
// A direct delivery runs the receiver's matching on the sender's
// goroutine. That is the cheapest way when the receiver is parked: the
// wake-up puts it on the sender's processor, where those lines are. But a
// receiver that spins on another core would then have its engine's lines
// (lock, queues, requests) pulled to the sender's core and back for every
// message (spinning that way measured twice as slow as parking). So while
// a goroutine of the receiving rank spins (BeginSpin .. EndSpin), a small
// header-by-value send is written into a ring of the pair instead, and the
// spinner dispatches it on its own core: one slot's line crosses.
//
// No fragment is stranded: a sender that finds nobody spinning after it
// published dispatches the ring itself (drain), and EndSpin drains after
// it stopped counting itself, so one of the two sees the entry (sequential
// consistency of sync/atomic). One goroutine drains a rank's rings at a
// time (busy); a drain that finds it taken returns, and the holder looks
// again after it lets go. Nobody waits for the lock, so a handler that
// sends while a drain holds it cannot deadlock.
//
// Ordering: hand-offs of one pair are dispatched in the order they were
// published, but a send that goes directly (nobody spinning, a full ring,
// a payload too big for a slot) may overtake them. btl.HeaderSender allows
// that; the PML sends only sequenced match headers this way and orders
// them itself.

const (
	ringSlots = 64 // per ordered pair of ranks, made on the pair's first hand-off: a window of 64 small messages
	ringMask  = ringSlots - 1
	slotSize  = 256 // bytes per slot: 4 cache lines
	slotData  = slotSize - 16 - 16
)

// slot is one hand-off: seq is n+1 once the pair's n-th hand-off is in it.
type slot struct {
	seq  atomic.Uint64
	tag  uint8
	dlen uint16
	_    [5]byte
	hdr  [16]byte
	data [slotData]byte
}

// ring is one sender's hand-offs to one receiver. The producer's fields
// and the consumer's are on lines of their own.
type ring struct {
	slots [ringSlots]slot

	// producer (pmu held)
	pmu      sync.Mutex
	head     uint64 // hand-offs published
	tailSeen uint64 // the consumer's tail as last read
	_        [40]byte

	// consumer (the receiver's busy held)
	tail atomic.Uint64 // hand-offs dispatched
	back *endpoint     // the receiver's endpoint to the sender: the fragments' origin
	_    [48]byte
}

// inbox is a receiving module's side: its rings and its spinners. Senders
// read spinning after every hand-off; busy and rings are the receiver's
// (a sender touches them only when nobody spins), on a line of their own:
// sharing one, the receiver's CAS of busy waited for the line the sender
// had just read spinning from (7-13% of a ping-pong's profile).
type inbox struct {
	_        [64]byte     // off the lines of the module's read-mostly fields (closed)
	spinning atomic.Int32 // goroutines of this rank between BeginSpin and EndSpin
	_        [60]byte
	busy     atomic.Bool // a goroutine is dispatching the rings
	rings    atomic.Pointer[[]*ring]
	_        [48]byte
}

var _ btl.Spinner = (*Module)(nil)
var _ btl.HeaderSender = (*endpoint)(nil)

// BeginSpin counts a goroutine of this rank that polls while it waits for
// messages of at most size bytes: senders hand it their small fragments
// until EndSpin. It may poll for btl_self_spin. 0 (nothing counted) when
// size is more than a slot holds, when the world has more ranks than the
// process has processors (a spinner would take a processor a rank needs),
// or when btl_self_spin is 0.
//
// Larger messages are better served by parking: the sender's goroutine
// then copies and matches them on the processor the receiver is woken on,
// so a message the receiver reads next is in that core's cache. With
// both ranks spinning on their own cores every payload crossed between
// caches: in-process ping-pong (gompi-bench latency --inprocess) 512 B
// 0.26-0.45 -> 0.50-0.60 us, 16 KiB 1.9-2.1 -> 3.4-3.5, 256 KiB 7.7-8.0
// -> 32-33.
func (m *Module) BeginSpin(size int) time.Duration {
	if m.spin == 0 || size > slotData || m.w.size.Load() > m.w.procs || m.closed.Load() {
		return 0
	}
	m.spinning.Add(1)
	return m.spin
}

// EndSpin stops counting the spinner and dispatches what was handed over
// meanwhile.
func (m *Module) EndSpin() {
	m.spinning.Add(-1)
	m.drain()
}

// Poll dispatches what senders handed over; it returns how many fragments.
func (m *Module) Poll() int { return m.drain() }

// ready reports whether a ring holds an undispatched hand-off.
func (m *Module) ready() bool {
	rs := m.rings.Load()
	if rs == nil {
		return false
	}
	for _, r := range *rs {
		t := r.tail.Load()
		if r.slots[t&ringMask].seq.Load() == t+1 {
			return true
		}
	}
	return false
}

// drain dispatches every hand-off in m's rings, unless another goroutine
// is at it (which looks again once it lets go).
func (m *Module) drain() int {
	n := 0
	for m.ready() {
		if !m.busy.CompareAndSwap(false, true) {
			return n
		}
		for _, r := range *m.rings.Load() {
			for {
				t := r.tail.Load()
				s := &r.slots[t&ringMask]
				if s.seq.Load() != t+1 {
					break
				}
				m.disp.Dispatch(r.back, btl.Tag(s.tag), s.hdr[:], s.data[:s.dlen])
				r.tail.Store(t + 1)
				n++
			}
		}
		m.busy.Store(false)
	}
	return n
}

// ringTo returns the endpoint's ring, making it and adding it to the
// receiver's list on first use; nil if the receiver cannot reach back.
func (e *endpoint) ringTo() *ring {
	if r := e.ring.Load(); r != nil {
		return r
	}
	back, err := e.reverse()
	if err != nil {
		return nil
	}
	to := e.to
	to.mu.Lock()
	defer to.mu.Unlock()
	if r := e.ring.Load(); r != nil {
		return r
	}
	r := &ring{back: back}
	var list []*ring
	if old := to.rings.Load(); old != nil {
		list = append(list, *old...)
	}
	list = append(list, r)
	to.rings.Store(&list)
	e.ring.Store(r)
	return r
}

var hdrPool = sync.Pool{New: func() any { return new([16]byte) }}

// SendImmediateHeader is SendImmediate with the header as two words. A
// payload of up to slotData bytes to another rank goes through the pair's
// ring once the pair has one (made when the receiver was first found
// spinning); if nobody spins at the receiver when it is in, the sender
// dispatches it itself, as a direct delivery would. The ring is written
// before the receiver's spinning count is read, so the message is on its
// way while that line comes over. Anything else is delivered at once.
func (e *endpoint) SendImmediateHeader(tag btl.Tag, h0, h1 uint64, data []byte) error {
	to := e.to
	if len(data) <= slotData && to != e.from {
		r := e.ring.Load()
		if r == nil && to.spinning.Load() > 0 {
			r = e.ringTo()
		}
		if r != nil {
			if e.from.closed.Load() || to.closed.Load() {
				return btl.ErrClosed
			}
			if r.handOff(tag, h0, h1, data) || r.drainFull(to) && r.handOff(tag, h0, h1, data) {
				if e.from.stats {
					e.from.sent.Add(1)
					e.from.sentBytes.Add(int64(16 + len(data)))
				}
				// Nobody spinning: dispatch it here (an EndSpin may
				// have drained before it was published).
				if to.spinning.Load() == 0 {
					to.drain()
				}
				return nil
			}
		}
	}
	hb := hdrPool.Get().(*[16]byte)
	binary.LittleEndian.PutUint64(hb[:8], h0)
	binary.LittleEndian.PutUint64(hb[8:], h1)
	err := e.deliver(tag, hb[:], data)
	hdrPool.Put(hb)
	return err
}

// drainFull, for a sender whose hand-off did not go in (r full, or
// another goroutine of the sender publishing), dispatches the receiver's
// hand-offs on this goroutine so that a retry goes after them, in the
// ring, and not before them directly (which would put every later message
// of a full window through the PML's out-of-order list). A drain already
// running elsewhere empties r instead. It reports true, for the retry.
func (r *ring) drainFull(to *Module) bool {
	to.drain()
	return true
}

// handOff publishes one fragment in the ring; false when the ring is full,
// or another goroutine of the sender is publishing (rather than wait, the
// caller delivers directly).
func (r *ring) handOff(tag btl.Tag, h0, h1 uint64, data []byte) bool {
	if !r.pmu.TryLock() {
		return false
	}
	h := r.head
	if h-r.tailSeen >= ringSlots {
		r.tailSeen = r.tail.Load()
		if h-r.tailSeen >= ringSlots {
			r.pmu.Unlock()
			return false
		}
	}
	s := &r.slots[h&ringMask]
	s.tag, s.dlen = uint8(tag), uint16(len(data))
	binary.LittleEndian.PutUint64(s.hdr[:8], h0)
	binary.LittleEndian.PutUint64(s.hdr[8:], h1)
	copy(s.data[:], data)
	r.head = h + 1
	s.seq.Store(h + 1)
	r.pmu.Unlock()
	return true
}
