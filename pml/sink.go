package pml

import (
	"math"
	"sync/atomic"
)

// Sink is where a nonblocking receive's result goes: a Handle's (an
// mpi.Request's), or one a caller of IrecvSink gives. The engine writes
// the result there at completion and, when no call holds the PML request
// then, gives the request back to its free list under the lock it holds
// anyway (one completed elsewhere than at the receive's common ending, by
// a peer's failure say, with no holder, is left to the collector). The
// owner reads the result without touching the PML request and with no
// locked instruction, and gives nothing back itself.
//
// State holds the number of calls holding the PML request (sinkUsers)
// and the flags below; only this package writes it (handle.go for the
// owner's side), but for a caller of IrecvSink, which takes a hold with
// State.Add(1) and drops it with ReleaseKeep. The engine sets
// SinkGone once the fields hold the result; when calls held the request
// at that moment it also sets sinkRecycle, and the call whose release
// finds no holder left and takes that flag gives the request back.
type Sink struct {
	State       SinkState
	Source, Tag int32
	Count       uint32     // valid when Extra is nil
	Extra       *SinkExtra // an error or a count beyond 32 bits (rare)
}

// SinkState is a Sink's state word. Outside this package it is only
// initialized (Init), read (Load) and, by a caller of IrecvSink taking a
// hold, added to (Add); the rest of atomic.Uint32's methods are the
// engine's and Handle's.
type SinkState struct{ v uint32 }

// Init sets the state with an ordinary store, for a Sink nobody else sees
// yet (the engine sees it once it is posted, under the engine's lock): the atomic store it replaces is a locked instruction, one per
// Irecv.
func (s *SinkState) Init(v uint32) { s.v = v }

func (s *SinkState) Load() uint32        { return atomic.LoadUint32(&s.v) }
func (s *SinkState) Add(d uint32) uint32 { return atomic.AddUint32(&s.v, d) }
func (s *SinkState) store(v uint32)      { atomic.StoreUint32(&s.v, v) }
func (s *SinkState) or(m uint32) uint32  { return atomic.OrUint32(&s.v, m) }
func (s *SinkState) and(m uint32) uint32 { return atomic.AndUint32(&s.v, m) }
func (s *SinkState) compareAndSwap(old, nw uint32) bool {
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
	sinkTaken     = 1 << 30 // a call takes the result (a Handle without a sink: sends, say)
	sinkCancelled = 1 << 29 // the result's Status.Cancelled
	sinkRecycle   = 1 << 28 // gone while held: the last holder gives the PML request back
	SinkMode      = 1 << 27 // the engine writes the result (a receive's)
	sinkReusable  = 1 << 26 // a Handle of newHandleLocked, which KeepHandles may take back
	sinkUsers     = sinkReusable - 1
)

// store writes st and err into s (a Handle's finishTakenKeep for calls
// without a sink; the engine's is complete).
func (s *Sink) store(st Status, err error) {
	s.Source, s.Tag = int32(st.Source), int32(st.Tag)
	if err != nil || uint64(st.Count) > math.MaxUint32 {
		s.Extra = &SinkExtra{Err: err, Count: st.Count}
		return
	}
	s.Count = uint32(st.Count)
}

// Result returns the result stored in s (valid once SinkGone was seen).
func (s *Sink) Result() (Status, error) {
	st := Status{Source: int(s.Source), Tag: int(s.Tag), Count: int(s.Count), Cancelled: s.State.Load()&sinkCancelled != 0}
	if x := s.Extra; x != nil {
		st.Count = x.Count
		return st, x.Err
	}
	return st, nil
}

// gone marks s gone (and cancelled); it reports whether no call held the
// PML request, which the engine may then give back itself. Otherwise the
// last holder will (sinkRecycle).
func (s *Sink) gone(cancelled bool) bool {
	add := uint32(SinkGone)
	if cancelled {
		add |= sinkCancelled
	}
	for {
		old := s.State.Load()
		nw := old | add
		if old&sinkUsers != 0 {
			nw |= sinkRecycle
		}
		if s.State.compareAndSwap(old, nw) {
			return old&sinkUsers == 0
		}
	}
}

// release drops a call's hold on r, the PML request behind s, taken by an
// atomic add of one to s.State; the last holder after completion gives r
// back.
func (s *Sink) release(r *Request) {
	if back := s.ReleaseKeep(r); back != nil {
		recycle(back)
	}
}

// ReleaseKeep is release that returns r instead of giving it back when
// this was the last hold after completion (nil otherwise), for the caller
// to give back with others (Engine.RecycleAll: the engine's free list,
// which its Irecvs take from, rather than the sync.Pool).
func (s *Sink) ReleaseKeep(r *Request) *Request {
	if v := s.State.Add(^uint32(0)); v&sinkUsers == 0 && v&sinkRecycle != 0 {
		if s.State.and(^uint32(sinkRecycle))&sinkRecycle != 0 {
			return r
		}
	}
	return nil
}
