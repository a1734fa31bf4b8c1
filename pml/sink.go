package pml

import (
	"math"
	"sync/atomic"
)

// sink is where a nonblocking receive's result goes: a Handle's (an
// mpi.Request's), or one a test of the engine gives irecvSink. The engine writes
// the result there at completion and, when no call holds the PML request
// then, gives the request back to its free list under the lock it holds
// anyway (one completed elsewhere than at the receive's common ending, by
// a peer's failure say, with no holder, is left to the collector). The
// owner reads the result without touching the PML request and with no
// locked instruction, and gives nothing back itself.
//
// State holds the number of calls holding the PML request (sinkUsers)
// and the flags below: the engine writes it (gone), and handle.go for the
// owner's side, which takes a hold with State.Add(1) and drops it with
// release. The engine sets
// sinkGone once the fields hold the result; when calls held the request
// at that moment it also sets sinkRecycle, and the call whose release
// finds no holder left and takes that flag gives the request back.
type sink struct {
	State       sinkState
	Source, Tag int32
	Count       uint32     // valid when Extra is nil
	Extra       *sinkExtra // an error or a count beyond 32 bits (rare)
}

// sinkState is a sink's state word, an atomic uint32 with the methods the
// engine and Handle use.
type sinkState struct{ v uint32 }

// set sets the state with an ordinary store, for a sink nobody else sees
// yet (the engine sees it once it is posted, under the engine's lock):
// the atomic store it replaces is a locked instruction, one per Irecv.
func (s *sinkState) set(v uint32) { s.v = v }

func (s *sinkState) Load() uint32        { return atomic.LoadUint32(&s.v) }
func (s *sinkState) Add(d uint32) uint32 { return atomic.AddUint32(&s.v, d) }
func (s *sinkState) store(v uint32)      { atomic.StoreUint32(&s.v, v) }
func (s *sinkState) or(m uint32) uint32  { return atomic.OrUint32(&s.v, m) }
func (s *sinkState) and(m uint32) uint32 { return atomic.AndUint32(&s.v, m) }
func (s *sinkState) compareAndSwap(old, nw uint32) bool {
	return atomic.CompareAndSwapUint32(&s.v, old, nw)
}

// sinkExtra is the rare part of a result.
type sinkExtra struct {
	Err   error
	Count int
}

// Bits of sink.State.
const (
	sinkGone      = 1 << 31 // the result is in the sink
	sinkTaken     = 1 << 30 // a call takes the result (a Handle without a sink: sends, say)
	sinkCancelled = 1 << 29 // the result's Status.Cancelled
	sinkRecycle   = 1 << 28 // gone while held: the last holder gives the PML request back
	sinkMode      = 1 << 27 // the engine writes the result (a receive's)
	sinkReusable  = 1 << 26 // a Handle of newHandleLocked, which KeepHandles may take back
	sinkSmall     = 1 << 25 // a receive of at most bulkMax bytes (Handle.spinSink)
	sinkUsers     = sinkSmall - 1
)

// store writes st and err into s (a Handle's finishTakenKeep for calls
// without a sink; the engine's is complete).
func (s *sink) store(st Status, err error) {
	s.Source, s.Tag = int32(st.Source), int32(st.Tag)
	if err != nil || uint64(st.Count) > math.MaxUint32 {
		s.Extra = &sinkExtra{Err: err, Count: st.Count}
		return
	}
	s.Count = uint32(st.Count)
}

// Result returns the result stored in s (valid once sinkGone was seen).
func (s *sink) Result() (Status, error) {
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
func (s *sink) gone(cancelled bool) bool {
	add := uint32(sinkGone)
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
func (s *sink) release(r *Request) {
	if back := s.releaseKeep(r); back != nil {
		recycle(back)
	}
}

// releaseKeep is release that returns r instead of giving it back when
// this was the last hold after completion (nil otherwise), for the caller
// to give back with others (Engine.RecycleAll: the engine's free list,
// which its Irecvs take from, rather than the sync.Pool).
func (s *sink) releaseKeep(r *Request) *Request {
	if v := s.State.Add(^uint32(0)); v&sinkUsers == 0 && v&sinkRecycle != 0 {
		if s.State.and(^uint32(sinkRecycle))&sinkRecycle != 0 {
			return r
		}
	}
	return nil
}
