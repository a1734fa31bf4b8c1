package pml

import (
	"sync/atomic"

	"github.com/gompi-org/gompi/internal/atom"
	"github.com/gompi-org/gompi/pml/hdr"
)

// AnySource and AnyTag are the wildcards (same values as the mpi package).
const (
	AnySource = -1
	AnyTag    = -1
)

// reqList is an intrusive FIFO of posted receives (and probes).
type reqList struct{ head, tail *Request }

func (l *reqList) push(r *Request) {
	r.list, r.next, r.prev = l, nil, l.tail
	if l.tail != nil {
		l.tail.next = r
	} else {
		l.head = r
	}
	l.tail = r
}

func (l *reqList) remove(r *Request) {
	if r.prev != nil {
		r.prev.next = r.next
	} else {
		l.head = r.next
	}
	if r.next != nil {
		r.next.prev = r.prev
	} else {
		l.tail = r.prev
	}
	r.next, r.prev, r.list = nil, nil, nil
}

// frag is a matching header that could not be delivered yet: out of
// sequence, or unexpected (no receive posted). The payload is copied.
type frag struct {
	typ    hdr.Type
	m      hdr.Match
	msgLen int
	srcReq uint64
	handle []byte
	data   []byte
	peer   *peer // the transport peer it came from

	// unexpected-queue links (guarded by Engine.mu)
	allNext, allPrev *frag // per communicator, arrival order
	srcNext, srcPrev *frag // per source
	keyNext, keyPrev *frag // per (source, tag)
	keyList          *fragList
	oooNext          *frag // out-of-order list
}

type fragList struct{ head, tail *frag }

func (l *reqList) isEmpty() bool  { return l.head == nil }
func (l *fragList) isEmpty() bool { return l.head == nil }

// listFreeMax bounds matchState.listFree.
const listFreeMax = 16

// key is a (source, tag) pair packed into one word, the source in the high
// half: built as a struct of two int32 fields, by two 32-bit stores that
// the map's 64-bit hash read back as one load, it stalled every lookup on
// the failed store forwarding (perf record and annotate of bench/ring
// -mode sr over sm: 70% of pushSpecific's samples on the load after those
// stores).
type key uint64

func mkKey(src, tag int32) key { return key(uint64(uint32(src))<<32 | uint64(uint32(tag))) }

func (k key) src() int32 { return int32(k >> 32) }
func (k key) tag() int32 { return int32(uint32(k)) }

// matchState is a communicator's posted and unexpected queues (guarded by
// Engine.mu). Posted receives for a specific (source, tag) are found by
// hash in O(1); wildcard receives keep post order and compete with them by
// post sequence, so the earliest-posted compatible receive always wins.
type matchState struct {
	recvSeq uint64
	spec    keyed[*reqList] // posted receives and probes: source >= 0 and tag != AnyTag
	srcAny  []reqList       // per source: tag == AnyTag
	wild    reqList         // source == AnySource

	uAll fragList
	uSrc []fragList
	uKey keyed[*fragList] // unexpected messages per (source, tag)
	// queued counts the messages addUnexpected queued: a spinning Probe
	// searches the queue again only when it moved. Written under
	// Engine.mu by a release store (a plain store on amd64), read without.
	queued atomic.Uint64
	nWild  int
	// listFree: uKey lists swept, for the next key that needs one (at
	// most listFreeMax).
	listFree []*fragList
}

// keyed is one queue's lists per (source, tag), posted receives' or
// unexpected messages': found by hash, or, for the two lists found last
// (hot and warm: a program that receives from one peer on one tag, or on
// two), without. A list
// emptied stays in the map for the next use of its key, the common case
// (a map insert and delete per message cost 250 instructions of a
// Probe-then-Recv ping-pong's, and a map left empty draws a new hash
// seed); a sweep drops the empty ones when they are more than minSweep
// and than half the map, so its cost is amortized O(1) and the map stays
// within twice the live lists plus minSweep. A sweep is the only place a
// list leaves the map.
type keyed[L interface {
	comparable
	isEmpty() bool
}] struct {
	m      map[key]L
	empty  int // lists in m that are empty
	hotKey key
	hot    L // the list of hotKey, or none (after a sweep)
	// warm is the hot list before it (none after a sweep): a neighbour
	// exchange's two directions, with a tag each, find theirs among the
	// two without a map lookup.
	warmKey key
	warm    L
}

// get returns the list of k, the zero L if there is none. Inlined: its
// callers are on every message's path.
func (q *keyed[L]) get(k key) L {
	var none L
	if q.hot != none && q.hotKey == k {
		return q.hot
	}
	if q.warm != none && q.warmKey == k {
		return q.warm
	}
	if len(q.m) == 0 { // no list yet (the posted ones of a program that probes first)
		return none
	}
	l := q.m[k]
	if l != none {
		q.warmKey, q.warm, q.hotKey, q.hot = q.hotKey, q.hot, k, l
	}
	return l
}

// add enters l, a new list, for k.
func (q *keyed[L]) add(k key, l L) {
	q.m[k] = l
	q.warmKey, q.warm, q.hotKey, q.hot = q.hotKey, q.hot, k, l
}

// emptied counts a list that became empty and reports whether the empty
// ones are now many enough to sweep.
func (q *keyed[L]) emptied() bool {
	q.empty++
	return q.empty > minSweep && q.empty > len(q.m)/2
}

// sweep drops the empty lists (to drop, if not nil).
func (q *keyed[L]) sweep(drop func(L)) {
	for k, l := range q.m {
		if l.isEmpty() {
			delete(q.m, k)
			if drop != nil {
				drop(l)
			}
		}
	}
	q.empty = 0
	var none L
	q.hot, q.warm = none, none
}

// minSweep is how many empty lists a keyed may keep before a sweep.
const minSweep = 64

func newMatchState(size int) *matchState {
	return &matchState{
		spec:   keyed[*reqList]{m: map[key]*reqList{}},
		srcAny: make([]reqList, size),
		uSrc:   make([]fragList, size),
		uKey:   keyed[*fragList]{m: map[key]*fragList{}},
	}
}

func tagMatches(want, got int) bool { return want == got || (want == AnyTag && got >= 0) }

// post queues r (a receive or a probe) after the unexpected queue had no match.
func (m *matchState) post(r *Request) {
	r.postSeq = m.recvSeq
	m.recvSeq++
	switch {
	case r.peer == AnySource:
		m.wild.push(r)
	case r.tag == AnyTag:
		m.srcAny[r.peer].push(r)
	default:
		m.pushSpecific(r)
	}
}

// postSpecific is post for a receive with a specific source and tag.
func (m *matchState) postSpecific(r *Request) {
	r.postSeq = m.recvSeq
	m.recvSeq++
	m.pushSpecific(r)
}

func (m *matchState) pushSpecific(r *Request) {
	k := mkKey(int32(r.peer), int32(r.tag))
	l := m.spec.get(k)
	if l == nil {
		l = &reqList{}
		m.spec.add(k, l)
	} else if l.head == nil {
		m.spec.empty--
	}
	l.push(r)
}

// unpost removes a posted request; false if it is not posted. Empty
// specific (source, tag) lists are swept from the map from time to time,
// so programs that use a new tag per message do not grow it.
func (m *matchState) unpost(r *Request) bool {
	l := r.list
	if l == nil {
		return false
	}
	l.remove(r)
	if l.head == nil && r.peer != AnySource && r.tag != AnyTag {
		if m.spec.emptied() {
			m.spec.sweep(nil)
		}
	}
	return true
}

// takeFirst removes and returns the earliest-posted receive (not a probe)
// matching (src, tag), or returns nil and changes nothing when there is
// none or a probe comes first. Its common case, the head of the list used
// last with no wildcard receive posted from src or from anyone, is
// handled in place: 51 instructions a message against findPosted's and
// unpost's 76 (bench/instr.sh).
func (m *matchState) takeFirst(src, tag int) *Request {
	k := mkKey(int32(src), int32(tag))
	l := m.spec.hot
	if m.spec.hotKey != k {
		l = nil
		if m.spec.warmKey == k {
			l = m.spec.warm
		}
	}
	if l != nil && m.wild.head == nil && m.srcAny[src].head == nil {
		r := l.head
		if r == nil || r.kind != kindRecv {
			return nil
		}
		next := r.next
		l.head = next
		if next != nil {
			next.prev = nil
			r.next = nil
		} else {
			l.tail = nil
			if m.spec.emptied() {
				m.spec.sweep(nil)
			}
		}
		r.list = nil
		return r
	}
	r := m.findPosted(src, tag)
	if r == nil || r.kind != kindRecv {
		return nil
	}
	m.unpost(r)
	return r
}

// findPosted returns the earliest-posted request matching (src, tag), without removing it.
func (m *matchState) findPosted(src, tag int) *Request {
	var best *Request
	if l := m.spec.get(mkKey(int32(src), int32(tag))); l != nil {
		best = l.head
	}
	if tag >= 0 {
		if r := m.srcAny[src].head; r != nil && (best == nil || r.postSeq < best.postSeq) {
			best = r
		}
	}
	for r := m.wild.head; r != nil; r = r.next {
		if best != nil && r.postSeq > best.postSeq {
			break
		}
		if tagMatches(r.tag, tag) {
			best = r
			break
		}
	}
	return best
}

// addUnexpected appends f to the unexpected queues.
func (m *matchState) addUnexpected(f *frag) {
	atom.StoreRel64(&m.queued, m.queued.Load()+1)
	src := int(f.m.Src)
	f.allPrev, f.allNext = m.uAll.tail, nil
	if m.uAll.tail != nil {
		m.uAll.tail.allNext = f
	} else {
		m.uAll.head = f
	}
	m.uAll.tail = f
	s := &m.uSrc[src]
	f.srcPrev, f.srcNext = s.tail, nil
	if s.tail != nil {
		s.tail.srcNext = f
	} else {
		s.head = f
	}
	s.tail = f
	k := mkKey(f.m.Src, f.m.Tag)
	l := m.uKey.get(k)
	if l == nil {
		if l = popLast(&m.listFree); l == nil {
			l = &fragList{}
		}
		m.uKey.add(k, l)
	} else if l.head == nil {
		m.uKey.empty--
	}
	f.keyList = l
	f.keyPrev, f.keyNext = l.tail, nil
	if l.tail != nil {
		l.tail.keyNext = f
	} else {
		l.head = f
	}
	l.tail = f
}

func (m *matchState) removeUnexpected(f *frag) {
	if f.allPrev != nil {
		f.allPrev.allNext = f.allNext
	} else {
		m.uAll.head = f.allNext
	}
	if f.allNext != nil {
		f.allNext.allPrev = f.allPrev
	} else {
		m.uAll.tail = f.allPrev
	}
	s := &m.uSrc[f.m.Src]
	if f.srcPrev != nil {
		f.srcPrev.srcNext = f.srcNext
	} else {
		s.head = f.srcNext
	}
	if f.srcNext != nil {
		f.srcNext.srcPrev = f.srcPrev
	} else {
		s.tail = f.srcPrev
	}
	l := f.keyList
	if f.keyPrev != nil {
		f.keyPrev.keyNext = f.keyNext
	} else {
		l.head = f.keyNext
	}
	if f.keyNext != nil {
		f.keyNext.keyPrev = f.keyPrev
	} else {
		l.tail = f.keyPrev
	}
	if l.head == nil {
		if m.uKey.emptied() {
			m.uKey.sweep(m.freeList)
		}
	}
	f.allNext, f.allPrev, f.srcNext, f.srcPrev, f.keyNext, f.keyPrev, f.keyList = nil, nil, nil, nil, nil, nil, nil
}

// freeList keeps a swept unexpected list for addUnexpected's next new key.
func (m *matchState) freeList(l *fragList) {
	if len(m.listFree) < listFreeMax {
		m.listFree = append(m.listFree, l)
	}
}

// findUnexpected returns the earliest unexpected message matching (src, tag).
// With nothing unexpected, the common case of a receive posted before its
// message, it is a test inlined into the caller; the search is
// searchUnexpected's.
func (m *matchState) findUnexpected(src, tag int) *frag {
	if m.uAll.head == nil {
		return nil
	}
	return m.searchUnexpected(src, tag)
}

func (m *matchState) searchUnexpected(src, tag int) *frag {
	switch {
	case src != AnySource && tag != AnyTag:
		if l := m.uKey.get(mkKey(int32(src), int32(tag))); l != nil {
			return l.head
		}
	case src != AnySource:
		for f := m.uSrc[src].head; f != nil; f = f.srcNext {
			if f.m.Tag >= 0 {
				return f
			}
		}
	default:
		for f := m.uAll.head; f != nil; f = f.allNext {
			if tagMatches(tag, int(f.m.Tag)) {
				return f
			}
		}
	}
	return nil
}
