package self

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
)

// Hand-off to a polling receiver.
//
// A direct delivery runs the receiver's matching on the sender's
// goroutine. That is the cheapest way when the receiver is parked: the
// wake-up puts it on the sender's processor, where those lines are. But
// ranks that spin run on cores of their own, and a sender matching in a
// receiver that spins or works on another core pulls the receiver's
// engine lines (lock, queues, requests) to its core and back for every
// message (spinning that way measured twice as slow as parking). So in a
// world whose ranks spin (the rank's engine enabled hand-offs,
// btl_self_spin > 0, no more ranks than GOMAXPROCS), a small
// header-by-value send is written into a ring of the pair instead, and
// the receiving rank dispatches it on its own core when it next polls:
// one slot's line crosses.
//
// A rank polls whenever it is inside a call that can observe a message:
// waits poll (Poll: spinning as long as SpinFor allows, else once before
// they park), and Test, Iprobe and the like poll once.
// What it must not do is block without polling: a goroutine about to park
// says so first (Park, until Unpark) and drains the rings after saying
// it; a sender that finds a parked goroutine once its entry is published
// dispatches the rings itself, as a direct delivery would. One of the two
// sees the entry (sequential consistency of sync/atomic), so no entry
// waits for a rank that is blocked. An entry may wait while the receiving
// rank computes outside gompi: only eager messages go into rings, they
// complete at the sender at once, and the rank finds them at its next
// call. A rendezvous send must not wait behind them (its sequence number
// follows theirs), so a direct delivery first dispatches what its sender
// left in the pair's ring (flush).
//
// One goroutine drains a rank's rings at a time (busy); a drain that
// finds it taken returns, and the holder looks again after it lets go.
// Nobody waits for the lock, so a handler that sends while a drain holds
// it cannot deadlock.
//
// Ordering: hand-offs of one pair are dispatched in the order they were
// published, but a send that goes directly (a parked receiver, a payload
// too big for a slot) may overtake them. btl.HeaderSender allows that;
// the PML sends only sequenced match headers this way and orders them
// itself.

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

// inbox is a receiving module's side: its rings and its parked
// goroutines. Senders read enabled and parked for every hand-off (lines
// written only when the rank starts or parks); busy and rings are the
// receiver's (a sender touches them when it drains), on a line of their
// own: sharing one with a count senders read, the receiver's CAS of busy
// waited for the line a sender had just read (7-13% of a ping-pong's
// profile).
type inbox struct {
	_       [64]byte     // off the lines of the module's read-mostly fields (closed)
	enabled atomic.Bool  // the rank's engine polls (Enable)
	parked  atomic.Int32 // goroutines of this rank blocked without polling (Park .. Unpark)
	_       [56]byte
	busy    atomic.Bool // a goroutine is dispatching the rings
	rings   atomic.Pointer[[]*ring]
	_       [48]byte
}

var _ btl.Spinner = (*Module)(nil)
var _ btl.HeaderSender = (*endpoint)(nil)

// handsOff reports whether senders to m use rings: m's engine polls them
// (Enable) and m's world spins (btl_self_spin, no more ranks than
// processors).
func (m *Module) handsOff() bool {
	return m.enabled.Load() && m.spin != 0 && m.w.size.Load() <= m.w.procs
}

// Enable starts hand-offs to this rank: its engine polls from now on.
func (m *Module) Enable() { m.enabled.Store(true) }

// SpinFor is how long a waiter of this rank for messages of at most size
// bytes may poll: btl_self_spin, or 0 when the world has more ranks than
// the process has processors (a spinner would take a processor a rank
// needs), when m does not hand off, or for sizes between a slot's and
// spinLarge.
//
// Such messages measured better served by parking. Spinning for them,
// in-process ping-pong (gompi-bench latency --inprocess) went 512 B
// 0.26-0.45 -> 0.50-0.60 us, 16 KiB 1.9-2.1 -> 3.4-3.5, 256 KiB 7.7-8.0
// -> 32-33. Our reading (not measured apart): parked, the receiver is
// woken on the processor where the sender's goroutine just copied and
// matched the message, so the payload stays in that core's cache; with
// both ranks spinning on their own cores every payload crosses between
// caches.
// From spinLarge on, a message outgrows a core's cache anyway and its copy
// takes longer than the wake-up a parked receiver pays on another
// processor: spinning, 1 MiB 72 -> 53 us, 4 MiB 233 -> 209, and the 4 MiB
// in-process benchmark (go test -bench SelfBandwidth ./mpi) rdma_get
// 91-99 -> 78-80 us.
func (m *Module) SpinFor(size int) time.Duration {
	if size > slotData && size < spinLarge || !m.handsOff() || m.closed.Load() {
		return 0
	}
	return m.spin
}

// spinLarge is the smallest receive that spins again (SpinFor).
const spinLarge = 1 << 20

// Poll dispatches what senders handed over; it returns how many
// fragments. When there were none, it takes chunks of the world's shared
// copy, if one is posted (split.go).
func (m *Module) Poll() int {
	n := m.drain()
	if n == 0 {
		m.help()
	}
	return n
}

// Park announces a goroutine of this rank that is about to block without
// polling, and dispatches what was handed over so far; until Unpark,
// senders dispatch their hand-offs themselves.
func (m *Module) Park() {
	m.parked.Add(1)
	m.drain()
}

// Unpark ends a Park.
func (m *Module) Unpark() { m.parked.Add(-1) }

// ready reports whether one of m's rings holds an undispatched hand-off.
func (m *Module) ready() bool {
	rs := m.rings.Load()
	if rs == nil {
		return false
	}
	for _, r := range *rs {
		if r.ready() {
			return true
		}
	}
	return false
}

// ready reports whether r holds an undispatched hand-off.
func (r *ring) ready() bool {
	t := r.tail.Load()
	return r.slots[t&ringMask].seq.Load() == t+1
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
// payload of up to slotData bytes to another rank that hands off goes
// through the pair's ring, unless a goroutine of the receiver is parked;
// if one parked meanwhile, the sender dispatches the rings itself.
// Anything else is delivered at once.
func (e *endpoint) SendImmediateHeader(tag btl.Tag, h0, h1 uint64, data []byte) error {
	to := e.to
	if len(data) <= slotData && to != e.from && to.parked.Load() == 0 && to.handsOff() {
		if e.from.closed.Load() || to.closed.Load() {
			return btl.ErrClosed
		}
		if r := e.ringTo(); r != nil && e.handOff(r, tag, h0, h1, data) {
			if e.from.stats {
				e.from.sent.Add(1)
				e.from.sentBytes.Add(int64(16 + len(data)))
			}
			if to.parked.Load() != 0 {
				to.drain()
			}
			return nil
		}
	}
	hb := hdrPool.Get().(*[16]byte)
	binary.LittleEndian.PutUint64(hb[:8], h0)
	binary.LittleEndian.PutUint64(hb[8:], h1)
	err := e.deliver(tag, hb[:], data)
	hdrPool.Put(hb)
	return err
}

// flush dispatches what this endpoint left in the pair's ring, before a
// direct delivery that may depend on it (see the top of this file).
func (e *endpoint) flush() {
	if r := e.ring.Load(); r != nil && r.ready() {
		e.to.drain()
	}
}

// handOff puts one fragment in r. When r is full (or another goroutine
// of the sender is publishing), it dispatches the receiver's rings on this
// goroutine and tries once more, so that the fragment goes in after them
// rather than directly before them, which would put every later message
// of a full window through the PML's out-of-order list. A drain already
// running elsewhere empties r instead. False: the caller delivers
// directly.
func (e *endpoint) handOff(r *ring, tag btl.Tag, h0, h1 uint64, data []byte) bool {
	if r.publish(tag, h0, h1, data) {
		return true
	}
	e.to.drain()
	return r.publish(tag, h0, h1, data)
}

// publish writes one fragment into the ring; false when the ring is full,
// or another goroutine of the sender is publishing (rather than wait for
// it).
func (r *ring) publish(tag btl.Tag, h0, h1 uint64, data []byte) bool {
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
