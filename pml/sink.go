package pml

import (
	"math"
	"sync/atomic"
)

// Sink is where a nonblocking receive's result goes when its owner gives
// one (an mpi.Request holds one): the engine writes the result there at
// completion and, when no call of the owner holds the PML request then,
// gives the request back to its free list under the lock it holds anyway
// (one completed elsewhere than at the receive's common ending, by a
// peer's failure say, with no holder, is left to the collector). The owner
// reads the result without touching the PML request and with no locked
// instruction, and gives nothing back itself (Waitall's batch, a
// compare-and-swap and an add per request before).
//
// State is shared with the owner: the number of its calls holding the PML
// request (SinkUsers), and the flags below. The engine sets SinkGone once
// the fields hold the result; when calls held the request at that moment
// it also sets SinkRecycle, and the call whose release finds no holder
// left and takes that flag gives the request back (Release).
type Sink struct {
	State       SinkState
	Source, Tag int32
	Count       uint32     // valid when Extra is nil
	Extra       *SinkExtra // an error or a count beyond 32 bits (rare)
}

// SinkState is a Sink's state word: atomic.Uint32's methods, and Init.
type SinkState struct{ v uint32 }

// Init sets the state with an ordinary store, for a Sink nobody else sees
// yet (the engine sees it once IrecvSink posts it, under the engine's
// lock): the atomic store it replaces is a locked instruction, one per
// Irecv.
func (s *SinkState) Init(v uint32) { s.v = v }

func (s *SinkState) Load() uint32        { return atomic.LoadUint32(&s.v) }
func (s *SinkState) Store(v uint32)      { atomic.StoreUint32(&s.v, v) }
func (s *SinkState) Add(d uint32) uint32 { return atomic.AddUint32(&s.v, d) }
func (s *SinkState) Or(m uint32) uint32  { return atomic.OrUint32(&s.v, m) }
func (s *SinkState) And(m uint32) uint32 { return atomic.AndUint32(&s.v, m) }
func (s *SinkState) CompareAndSwap(old, nw uint32) bool {
	return atomic.CompareAndSwapUint32(&s.v, old, nw)
}

// SinkExtra is the rare part of a result.
type SinkExtra struct {
	Err   error
	Count int
}

// Bits of Sink.State.
const (
	SinkGone      = 1 << 31 // the result is in the sink
	SinkTaken     = 1 << 30 // the owner's: a call takes the result (requests without a sink)
	SinkCancelled = 1 << 29 // the result's Status.Cancelled
	SinkRecycle   = 1 << 28 // gone while held: the last holder gives the PML request back
	SinkMode      = 1 << 27 // the owner's: the request was made with a sink
	SinkOwner     = 1 << 26 // the owner's to use as it likes: the engine neither sets nor reads it
	SinkUsers     = SinkOwner - 1
)

// Store writes st and err into s (the owner's side uses it for requests
// without a sink; the engine's is complete).
func (s *Sink) Store(st Status, err error) {
	s.Source, s.Tag = int32(st.Source), int32(st.Tag)
	if err != nil || uint64(st.Count) > math.MaxUint32 {
		s.Extra = &SinkExtra{Err: err, Count: st.Count}
		return
	}
	s.Count = uint32(st.Count)
}

// Result returns the result stored in s (valid once SinkGone was seen).
func (s *Sink) Result() (Status, error) {
	st := Status{Source: int(s.Source), Tag: int(s.Tag), Count: int(s.Count), Cancelled: s.State.Load()&SinkCancelled != 0}
	if x := s.Extra; x != nil {
		st.Count = x.Count
		return st, x.Err
	}
	return st, nil
}

// gone marks s gone (and cancelled); it reports whether no call held the
// PML request, which the engine may then give back itself. Otherwise the
// last holder will (SinkRecycle).
func (s *Sink) gone(cancelled bool) bool {
	add := uint32(SinkGone)
	if cancelled {
		add |= SinkCancelled
	}
	for {
		old := s.State.Load()
		nw := old | add
		if old&SinkUsers != 0 {
			nw |= SinkRecycle
		}
		if s.State.CompareAndSwap(old, nw) {
			return old&SinkUsers == 0
		}
	}
}

// Release drops a call's hold on r, the PML request behind s, taken by an
// atomic add of one to s.State; the last holder after completion gives r
// back.
func (s *Sink) Release(r *Request) {
	if back := s.ReleaseKeep(r); back != nil {
		recycle(back)
	}
}

// ReleaseKeep is Release that returns r instead of giving it back when
// this was the last hold after completion (nil otherwise), for the caller
// to give back with others (Engine.RecycleAll: the engine's free list,
// which its Irecvs take from, rather than the sync.Pool).
func (s *Sink) ReleaseKeep(r *Request) *Request {
	if v := s.State.Add(^uint32(0)); v&SinkUsers == 0 && v&SinkRecycle != 0 {
		if s.State.And(^uint32(SinkRecycle))&SinkRecycle != 0 {
			return r
		}
	}
	return nil
}

// IrecvSink is Irecv whose result goes into s (see Sink); s.State must
// hold SinkMode and nothing else but SinkOwner. The request returned must
// not be used once s is gone: it may be back in the free list.
func (c *Comm) IrecvSink(buf Buffer, src, tag int, s *Sink) (*Request, error) {
	if buf.Conv == nil {
		if r, _ := c.postPlain(nil, buf.Bytes, src, tag, s, nil); r != nil {
			return r, nil
		}
	}
	return c.postRecv(nil, buf.Bytes, buf.Conv, src, tag, kindRecv, s)
}

// IrecvAlloc is IrecvSink's common case (a receive of contiguous bytes
// from a specific source and tag with nothing in the way) for an owner
// whose sinks come from alloc: the engine calls alloc with its lock held,
// once the receive is sure to be posted, so that calls for one
// communicator never overlap and alloc needs no atomic of its own
// (LockAlloc holds the same lock). The sink returned must hold
// SinkMode and nothing else but SinkOwner. It returns the request and its
// sink, or nil, nil with nothing done when the case does not apply
// (IrecvSink then takes it).
func (c *Comm) IrecvAlloc(b []byte, src, tag int, alloc func() *Sink) (*Request, *Sink) {
	return c.postPlain(nil, b, src, tag, nil, alloc)
}

// LockAlloc and UnlockAlloc hold the engine's lock, under which IrecvAlloc
// calls its allocator: an owner changes the allocator's state between
// them without a lock of its own. Nothing may call into the engine while
// it is held.
func (c *Comm) LockAlloc()   { c.e.mu.Lock() }
func (c *Comm) UnlockAlloc() { c.e.mu.Unlock() }
