// Communicators: the PML state of one (Comm, with its per-peer sequence
// numbers in procSeq), the agreement on a new context id
// (ProposeContext, ReserveContext, ReleaseContext), and NewComm, which
// also matches the fragments that arrived for the context before it.

package pml

import (
	"sync/atomic"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// Comm is a communicator's PML state: its context id, group and queues.
type Comm struct {
	e      *Engine
	ctx    uint32
	rank   int
	group  []int // communicator rank -> world rank
	toComm map[int]int
	seqs   []procSeq
	m      *matchState // guarded by e.mu
	freed  atomic.Bool
	// failed lists the ranks of c whose process failed, in the order the
	// failures became known; the first nacked of them are acknowledged
	// (FailureAck). Both guarded by e.mu (ft.go).
	failed []int
	nacked int

	// The Handles of nonblocking calls (handle.go): hslab for any call;
	// rslab, rnext and kept (given back by KeepHandles) for the Irecvs
	// postPlain posts, guarded by e.mu; sent, sends done within their
	// call, one per (destination, tag) slot (sentHandle).
	hslab atomic.Pointer[handleSlab]
	rslab *handleSlab
	rnext int
	kept  []*Handle
	sent  [sentSlots]atomic.Pointer[Handle]
}

type procSeq struct {
	send atomic.Uint32
	// grant: as a sender, messages with sequence numbers (mod 2^16) below
	// it may carry data (flow.go); written under e.mu, read without.
	grant  atomic.Uint32
	expect uint16 // guarded by e.mu
	ooo    *frag  // out-of-sequence arrivals, sorted by seq (guarded by e.mu)
	// As a receiver (guarded by e.mu; flow.go): messages with data from
	// this peer in the unexpected queue, the grant sent last, the expect
	// value at which the next one is due, and whether it is queued.
	held, granted, grantAt uint16
	grantQ                 bool
}

// ProposeContext reserves and returns the lowest context id >= from that
// is neither in use nor reserved here. Communicator creation agrees on an
// id in rounds (as Open MPI's CID allocation does): every participant
// proposes, all take the maximum, each tries to Reserve it, and if any
// cannot, all Release and go again from the maximum + 1. Reservations
// keep two creations running at once on different communicators from
// choosing the same id.
func (e *Engine) ProposeContext(from uint32) uint32 {
	e.mu.Lock()
	defer e.mu.Unlock()
	id := max(from, e.nextCtx, 1) // never reuse a freed id: stale traffic cannot reach a new communicator
	for e.ctxTaken(id) {
		id++
	}
	e.reserveLocked(id)
	return id
}

// ReserveContext reserves id if it is free here (or already reserved by
// the caller's own proposal, which it then keeps); false otherwise.
func (e *Engine) ReserveContext(id uint32, mine bool) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if mine {
		return true
	}
	if e.ctxTaken(id) {
		return false
	}
	e.reserveLocked(id)
	return true
}

// ReleaseContext drops a reservation that did not become a communicator.
func (e *Engine) ReleaseContext(id uint32) {
	e.mu.Lock()
	delete(e.reserved, id)
	e.mu.Unlock()
}

func (e *Engine) ctxTaken(id uint32) bool {
	_, used := e.comms[id]
	_, res := e.reserved[id]
	return used || res
}

func (e *Engine) reserveLocked(id uint32) {
	if e.reserved == nil {
		e.reserved = map[uint32]struct{}{}
	}
	e.reserved[id] = struct{}{}
}

// NewComm creates the communicator with context id ctx, where this process
// has rank rank and group maps communicator ranks to world ranks. Fragments
// that arrived for ctx before are matched now.
func (e *Engine) NewComm(ctx uint32, rank int, group []int) (*Comm, error) {
	c := &Comm{e: e, ctx: ctx, rank: rank, group: group, toComm: make(map[int]int, len(group)),
		seqs: make([]procSeq, len(group)), m: newMatchState(len(group))}
	e.initFlow(c)
	for i, w := range group {
		c.toComm[w] = i
	}
	e.mu.Lock()
	if _, dup := e.comms[ctx]; dup {
		e.mu.Unlock()
		return nil, mpierr.Errorf(mpierr.ErrComm, "context %d in use", ctx)
	}
	c.noteFailedLocked()
	e.comms[ctx] = c
	delete(e.reserved, ctx)
	if ctx >= e.nextCtx {
		e.nextCtx = ctx + 1
	}
	parked := e.parked
	e.parked = nil
	var bad []*frag
	for _, f := range parked {
		switch {
		case f.m.Ctx != ctx:
			e.parked = append(e.parked, f)
		case int(f.m.Src) < 0 || int(f.m.Src) >= len(group) || group[f.m.Src] != f.peer.world:
			bad = append(bad, f)
		default:
			e.arrive(c, f, true)
		}
	}
	start := len(e.toStart) > 0
	e.unlockFlush()
	for _, f := range bad {
		e.protocolErrorFrom(f.peer.world, "source rank %d does not belong to rank %d in context %d", f.m.Src, f.peer.world, f.m.Ctx)
	}
	if start {
		e.runStarts()
	}
	return c, nil
}

// Free releases the communicator. Later calls on it fail with ErrComm.
func (c *Comm) Free() {
	if c.freed.Swap(true) {
		return
	}
	c.e.mu.Lock()
	delete(c.e.comms, c.ctx)
	c.e.mu.Unlock()
}

// Freed reports whether Free was called.
func (c *Comm) Freed() bool { return c.freed.Load() }

// Rank is this process's rank in c; Size the group size.
func (c *Comm) Rank() int { return c.rank }

// Size is the number of ranks in c.
func (c *Comm) Size() int { return len(c.group) }

// World maps a communicator rank to a world rank.
func (c *Comm) World(r int) int { return c.group[r] }

// Context is c's context id.
func (c *Comm) Context() uint32 { return c.ctx }

// Engine returns the engine of c.
func (c *Comm) Engine() *Engine { return c.e }

func (c *Comm) commRank(world int) (int, bool) {
	r, ok := c.toComm[world]
	return r, ok
}
