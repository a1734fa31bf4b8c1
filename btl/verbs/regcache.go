package verbs

import (
	"fmt"
	"runtime"
	"sort"
	"sync"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// regCache keeps memory registered after its users let go of it (Open
// MPI's leave_pinned with a registration cache): a buffer used again, or
// a part of one, costs a lookup instead of a registration. Entries are
// keyed by the address range of the slice they registered; an entry in
// use is never evicted, an unused one goes when the cache holds more than
// maxBytes or maxEntries (least recently used first). An entry keeps its
// slice reachable and pinned (runtime.Pinner), so the range cannot be
// reused by another Go object while cached: a hit always names the same
// memory.
type regCache struct {
	reg        func(buf []byte) (ibv.MR, error)
	maxBytes   int
	maxEntries int

	mu     sync.Mutex  // guards the fields below and every entry's refs and links
	sorted []*regEntry // by start address
	lru    regEntry    // sentinel of the circular list of entries: next is the most recent
	bytes  int
	hits   int64
	misses int64
	evicts int64
}

// regEntry is one registration of the cache.
type regEntry struct {
	start, end uintptr // [start, end) of the registered slice
	buf        []byte
	mr         ibv.MR
	pin        runtime.Pinner
	refs       int
	prev, next *regEntry
}

// iova returns the I/O virtual address of addr, which the entry covers.
func (e *regEntry) iova(addr uintptr) uint64 { return e.mr.Addr() + uint64(addr-e.start) }

func newRegCache(reg func([]byte) (ibv.MR, error), maxBytes, maxEntries int) *regCache {
	c := &regCache{reg: reg, maxBytes: maxBytes, maxEntries: maxEntries}
	c.lru.next, c.lru.prev = &c.lru, &c.lru
	return c
}

// scanBack bounds how many entries starting at or before an address a
// lookup examines; a miss past it only costs a second registration.
const scanBack = 8

// get returns a registration covering buf (len(buf) > 0), registering buf
// if no cached one covers it. The caller holds a reference until put.
func (c *regCache) get(buf []byte) (*regEntry, error) {
	start := sliceAddr(buf)
	end := start + uintptr(len(buf))
	c.mu.Lock()
	defer c.mu.Unlock()
	i := sort.Search(len(c.sorted), func(i int) bool { return c.sorted[i].start > start })
	for j := i - 1; j >= 0 && j >= i-scanBack; j-- {
		if e := c.sorted[j]; e.end >= end {
			c.hits++
			e.refs++
			c.unlink(e)
			c.pushFront(e)
			return e, nil
		}
	}
	c.misses++
	mr, err := c.reg(buf)
	if err != nil {
		// Make room and try once more: the device may be out of MRs.
		if c.evict(0, 0) == 0 {
			return nil, err
		}
		if mr, err = c.reg(buf); err != nil {
			return nil, err
		}
	}
	e := &regEntry{start: start, end: end, buf: buf, mr: mr, refs: 1}
	e.pin.Pin(&buf[0])
	// An eviction may have moved the entries: find the place again.
	i = sort.Search(len(c.sorted), func(i int) bool { return c.sorted[i].start > start })
	c.sorted = append(c.sorted, nil)
	copy(c.sorted[i+1:], c.sorted[i:])
	c.sorted[i] = e
	c.bytes += len(buf)
	c.pushFront(e)
	c.evict(c.maxBytes, c.maxEntries)
	return e, nil
}

// put drops a reference taken by get.
func (c *regCache) put(e *regEntry) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e.refs <= 0 {
		panic(fmt.Sprintf("verbs: registration cache entry %#x+%d released more often than taken", e.start, e.end-e.start))
	}
	e.refs--
	c.evict(c.maxBytes, c.maxEntries)
}

// evict deregisters unused entries, least recently used first, until the
// cache holds at most maxBytes and maxEntries (0, 0: every unused entry).
// It returns how many it removed.
func (c *regCache) evict(maxBytes, maxEntries int) int {
	n := 0
	for e := c.lru.prev; e != &c.lru && (c.bytes > maxBytes || len(c.sorted) > maxEntries); {
		prev := e.prev
		if e.refs == 0 {
			c.remove(e)
			n++
		}
		e = prev
	}
	return n
}

func (c *regCache) remove(e *regEntry) {
	c.unlink(e)
	i := sort.Search(len(c.sorted), func(i int) bool { return c.sorted[i].start >= e.start })
	for ; i < len(c.sorted); i++ {
		if c.sorted[i] == e {
			c.sorted = append(c.sorted[:i], c.sorted[i+1:]...)
			break
		}
	}
	c.bytes -= len(e.buf)
	c.evicts++
	e.mr.Dereg() // an MR that fails to go is leaked with the device, which Close releases
	e.pin.Unpin()
	e.buf = nil
}

// clear deregisters every entry, used or not (module Close).
func (c *regCache) clear() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for c.lru.next != &c.lru {
		c.remove(c.lru.next)
	}
}

func (c *regCache) stats() (entries, bytes int, hits, misses, evicts int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.sorted), c.bytes, c.hits, c.misses, c.evicts
}

func (c *regCache) unlink(e *regEntry) {
	if e.prev != nil {
		e.prev.next, e.next.prev = e.next, e.prev
		e.prev, e.next = nil, nil
	}
}

func (c *regCache) pushFront(e *regEntry) {
	e.prev, e.next = &c.lru, c.lru.next
	c.lru.next.prev = e
	c.lru.next = e
}
