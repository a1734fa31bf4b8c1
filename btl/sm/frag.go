package sm

import (
	"fmt"
	"sync"
	"sync/atomic"
)

// Fragments: buffers in the sender's segment that carry one fragment each
// (header + payload) when it does not go inline in a fast box. A fragment's
// 64-byte header:
//
//	 0 u64 state: 1 while posted, set to 0 by the receiver when done with it
//	 8 u64 meta: tag | flags<<8 | hdrLen<<16 | len<<32
//	16 u32 destination local rank, u32 fast box index (flag setupFbox)
//
// The sender writes payload, meta and state before it publishes the
// fragment's index (FIFO slot or fast-box entry, both releases). The
// receiver reads meta once, checks it against the capacity it computed
// from the validated layout, dispatches, then stores state 0 (release: it
// no longer reads the fragment). The sender reuses the fragment only after
// it loads state 0.
const (
	fragState = 0
	fragMeta  = 8
	fragDest  = 16

	flagSetupFbox = 1 // the receiver should start polling fast box (index in fragDest+4)
)

type fragInfo struct {
	tag    uint8
	flags  uint8
	hdrLen int
	n      int
	fbox   int
}

func packFragMeta(tag, flags uint8, hdrLen, n int) uint64 {
	return uint64(tag) | uint64(flags)<<8 | uint64(hdrLen)<<16 | uint64(n)<<32
}

// decodeFrag validates the meta and destination words of a fragment of
// payload capacity capacity addressed to local rank me. It never panics.
func decodeFrag(meta, dest uint64, capacity, me int) (fragInfo, error) {
	f := fragInfo{tag: uint8(meta), flags: uint8(meta >> 8), hdrLen: int(uint16(meta >> 16)), n: int(uint32(meta >> 32)), fbox: int(uint32(dest >> 32))}
	if d := int(uint32(dest)); d != me {
		return f, fmt.Errorf("fragment addressed to local rank %d, not %d", d, me)
	}
	if f.n > capacity || f.hdrLen > f.n {
		return f, fmt.Errorf("fragment of %d bytes (header %d) in a %d-byte buffer", f.n, f.hdrLen, capacity)
	}
	if f.flags&^flagSetupFbox != 0 {
		return f, fmt.Errorf("fragment flags %#x", f.flags)
	}
	return f, nil
}

// Fragment ownership as the sender sees it (fragPool.owner).
const (
	ownFree  = -1 // in the free stack
	ownAlloc = -2 // handed out by Alloc or being filled; not posted
)

// fragPool hands out this process's fragments. Reuse prefers the oldest
// posted fragment once its receiver is done with it, so the working set
// stays as small as the number of fragments in flight (cache-warm).
type fragPool struct {
	seg []byte
	lay *layout

	mu       sync.Mutex
	free     [2][]int32 // guarded by mu: stacks per class (0 eager, 1 max-size)
	inflight [2]queue   // guarded by mu: posted fragments, oldest first
	owner    []int32    // guarded by mu: ownFree, ownAlloc or the destination local rank
}

func newFragPool(seg []byte, l *layout) *fragPool {
	p := &fragPool{seg: seg, lay: l, owner: make([]int32, l.nfrags())}
	for c, n := range []int{l.smallCount, l.largeCount} {
		p.free[c] = make([]int32, 0, n)
		p.inflight[c] = queue{buf: make([]int32, n)}
	}
	for i := l.nfrags() - 1; i >= 0; i-- {
		c := p.class(i)
		p.free[c] = append(p.free[c], int32(i))
		p.owner[i] = ownFree
	}
	return p
}

func (p *fragPool) class(i int) int {
	if i < p.lay.smallCount {
		return 0
	}
	return 1
}

func (p *fragPool) state(i int) *atomic.Uint64 {
	off, _ := p.lay.frag(i)
	return word64(p.seg, off+fragState)
}

// get returns a fragment with room for n payload bytes, owned by the
// caller (ownAlloc), and its payload buffer (full capacity), or ok false.
func (p *fragPool) get(n int) (idx int, payload []byte, ok bool) {
	p.mu.Lock()
	idx = -1
	if n <= p.lay.smallCap {
		idx = p.getClass(0)
	}
	if idx < 0 && n <= p.lay.largeCap {
		idx = p.getClass(1)
	}
	if idx >= 0 {
		p.owner[idx] = ownAlloc
	}
	p.mu.Unlock()
	if idx < 0 {
		return -1, nil, false
	}
	off, c := p.lay.frag(idx)
	return idx, p.seg[off+fragHdr : off+fragHdr+c : off+fragHdr+c], true
}

func (p *fragPool) getClass(c int) int {
	q := &p.inflight[c]
	if q.n > 0 {
		if i := int(q.front()); p.state(i).Load() == 0 {
			q.pop()
			return i
		}
	}
	if f := p.free[c]; len(f) > 0 {
		p.free[c] = f[:len(f)-1]
		return int(f[len(f)-1])
	}
	// Receivers finish out of order (different peers): collect every
	// fragment that is done.
	for k := q.n; k > 0; k-- {
		i := q.pop()
		if p.state(int(i)).Load() == 0 {
			p.free[c] = append(p.free[c], i)
			p.owner[i] = ownFree
		} else {
			q.push(i)
		}
	}
	if f := p.free[c]; len(f) > 0 {
		p.free[c] = f[:len(f)-1]
		return int(f[len(f)-1])
	}
	return -1
}

// posting marks fragment idx posted to local rank dest: its state word
// becomes 1 before the caller publishes it.
func (p *fragPool) posting(idx, dest int) {
	off, _ := p.lay.frag(idx)
	le.PutUint64(p.seg[off+fragState:], 1) // published with the fragment
	p.mu.Lock()
	p.owner[idx] = int32(dest)
	p.inflight[p.class(idx)].push(int32(idx))
	p.mu.Unlock()
}

// unpost undoes posting when publishing failed; the fragment stays the
// caller's.
func (p *fragPool) unpost(idx int) {
	p.mu.Lock()
	q := &p.inflight[p.class(idx)]
	for k := q.n; k > 0; k-- {
		if i := q.pop(); int(i) != idx {
			q.push(i)
		}
	}
	p.owner[idx] = ownAlloc
	p.mu.Unlock()
	p.state(idx).Store(0)
}

// put returns a fragment the caller owns (never posted, or unposted).
func (p *fragPool) put(idx int) {
	p.mu.Lock()
	if p.owner[idx] == ownAlloc {
		p.owner[idx] = ownFree
		c := p.class(idx)
		p.free[c] = append(p.free[c], int32(idx))
	}
	p.mu.Unlock()
}

// owned reports whether idx is a fragment handed out and not yet posted.
func (p *fragPool) owned(idx int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return idx >= 0 && idx < len(p.owner) && p.owner[idx] == ownAlloc
}

// reclaim takes back every fragment posted to local rank dest, which
// failed: it will never finish with them.
func (p *fragPool) reclaim(dest int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, o := range p.owner {
		if int(o) == dest {
			p.state(i).Store(0)
		}
	}
}

// queue is a fixed-capacity ring of fragment indexes.
type queue struct {
	buf     []int32
	head, n int
}

func (q *queue) front() int32 { return q.buf[q.head] }

func (q *queue) pop() int32 {
	v := q.buf[q.head]
	q.head = (q.head + 1) % len(q.buf)
	q.n--
	return v
}

func (q *queue) push(v int32) {
	q.buf[(q.head+q.n)%len(q.buf)] = v
	q.n++
}
