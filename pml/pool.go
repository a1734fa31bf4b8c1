// Recycling: where requests come from (the engine's free list of receive
// requests, then a sync.Pool) and when a finished one may go back, and
// the pool of header buffers the send and rendezvous paths encode into.

package pml

import (
	"sync"

	"github.com/gompi-org/gompi/pml/hdr"
)

var reqPool = sync.Pool{New: func() any { return allocReq() }}

// allocReq makes a request with its waiter channel (which every Wait on it
// shares; reset keeps it).
func allocReq() *Request { return &Request{own: waiter{ch: make(chan struct{}, 1)}} }

func newReq(owned bool) *Request {
	if !owned {
		return allocReq()
	}
	r := reqPool.Get().(*Request)
	r.owned = true
	return r
}

// freeMax bounds an engine's free list of receive requests (~0.5 KiB each).
const freeMax = 256

// RecycleAll gives completed requests back, many at once (a Waitall's):
// the poolable ones of this engine go to its free list, which Irecv takes
// from, under one hold of the lock; the others to the sync.Pool. It
// reorders rs (scratch space for it); the caller must have seen them done
// and must not touch them again.
func (e *Engine) RecycleAll(rs []*Request) {
	n := 0
	for _, r := range rs {
		if r.Done() && r.poolable() && r.comm != nil && r.comm.e == e {
			r.reset()
			rs[n] = r
			n++
		} else {
			recycle(r)
		}
	}
	if n == 0 {
		return
	}
	e.mu.Lock()
	k := min(n, freeMax-len(e.free))
	e.free = append(e.free, rs[:k]...)
	e.mu.Unlock()
	for _, r := range rs[k:n] {
		reqPool.Put(r)
	}
}

// takeFreeLocked returns a clean receive request: from the free list, or
// the pool. Called with e.mu held.
func (e *Engine) takeFreeLocked() *Request {
	if r := e.popFreeLocked(); r != nil {
		return r
	}
	return newReq(true)
}

// popFreeLocked takes a request from the free list, nil when it is empty.
// Written out rather than popLast, which cost the Irecv posting 7 more
// instructions here (bench/instr.sh).
func (e *Engine) popFreeLocked() *Request {
	n := len(e.free)
	if n == 0 {
		return nil
	}
	r := e.free[n-1]
	e.free[n-1] = nil
	e.free = e.free[:n-1]
	return r
}

// recycle gives r back to the pool once it is done.
func recycle(r *Request) {
	if r.Done() {
		recycleUnstarted(r)
	}
}

// recycleUnstarted gives back a pooled request that the engine no longer
// references: done, or never started. Requests the engine may still
// reference after completion are left to the garbage collector: one that
// went through a rendezvous (a scheduler loop or a transport callback on
// another goroutine may still hold it) and a buffered send (it completes
// before its fragment has left).
func recycleUnstarted(r *Request) {
	if r.poolable() {
		r.reset()
		reqPool.Put(r)
	}
}

// poolable: r came from the pool and the engine keeps no reference to it
// once it is done: no rendezvous id, or a quiet one (RDMA direct get over
// a transport whose GETs finish within their call, without a fallback to
// copies), and no buffered-send release.
func (r *Request) poolable() bool { return r.owned && (r.id == 0 || r.quiet) && r.release == nil }

var hdrPool = sync.Pool{New: func() any { return new([hdr.MaxLen]byte) }}

// headerSpace returns where to write a header that r sends: r's own
// scratch bytes, or, with pooled (a header with a registration handle,
// or scratch bytes that hold an RGET's handle), a pooled buffer, returned
// too for the caller to give back with putHeaderSpace. The transports
// copy a header before the send call returns. The scratch bytes save the
// pool's Get and Put, 140 instructions of a rendezvous (bench/shapes
// -mode ssend under callgrind: sync.Pool's pin, Get and Put).
func (r *Request) headerSpace(pooled bool) ([]byte, *[hdr.MaxLen]byte) {
	if pooled {
		p := hdrPool.Get().(*[hdr.MaxLen]byte)
		return p[:], p
	}
	return r.hbuf[:], nil
}

// putHeaderSpace gives back what headerSpace took from the pool, if
// anything.
func putHeaderSpace(p *[hdr.MaxLen]byte) {
	if p != nil {
		hdrPool.Put(p)
	}
}

// The headers written in the scratch bytes (RNDV, ACK, MATCH) fit them.
var _ [len(reqState{}.hbuf) - max(hdr.RndvLen, hdr.AckLen, hdr.MatchLen)]struct{}

// popLast removes the last element of *s and returns it, clearing its
// slot (nil when *s is empty): the free lists of fragments, their queue
// lists and kept Handles.
func popLast[T any](s *[]*T) *T {
	n := len(*s)
	if n == 0 {
		return nil
	}
	x := (*s)[n-1]
	(*s)[n-1] = nil
	*s = (*s)[:n-1]
	return x
}
