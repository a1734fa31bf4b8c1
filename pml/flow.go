package pml

import (
	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/pml/hdr"
)

// Flow control bounds what a receiver holds for a sender whose messages
// it has not asked for: per (communicator, sender) pair, a window of
// pml_unexpected_window messages (W) may carry data without the
// receiver's say. The window is counted in sequence numbers, which both
// sides already keep:
//
//   - the sender may send message seq with data (eager, or a rendezvous
//     announcement with a first chunk) while seq is below the grant it
//     holds (initially W); a later one goes as a rendezvous announcement
//     without data, so its data waits at the sender until the receiver
//     matches it (a blocking Send then blocks, an Isend stays pending);
//   - the receiver grants expect + W - held, where expect is the next
//     sequence number it waits for and held the sender's messages with
//     data in its unexpected queue; it sends a CREDIT once the grant has
//     grown by W/2 since the last one (as it receives, or as unexpected
//     messages are taken).
//
// So the messages with data held or in flight from one sender on one
// communicator never exceed W: the grant last received was computed when
// the messages held plus the window left came to W, and every arrival
// since turned one in flight into at most one held. A rendezvous
// announcement without data keeps matching order and costs a header.
//
// The sender's check is a load and a compare beside the sequence number
// it takes anyway; the receiver's, on its common path, one compare
// (procSeq.grantAt). A CREDIT goes back every W/2 messages per pair.

func init() {
	params.Register(params.Def{Name: "pml_unexpected_window", Kind: params.Int, Default: "512",
		Help: "eager messages one sender may have unreceived at a receiver per communicator before the rest go as rendezvous announcements without data (flow control; 0 = no limit)"})
}

// grantRef names a (communicator, source) pair whose grant is due.
type grantRef struct {
	c   *Comm
	src int32
}

// initFlow sets c's windows: the grants this side holds as a sender and
// the state it keeps as a receiver. Called before c is published.
func (e *Engine) initFlow(c *Comm) {
	w := uint16(e.window)
	for i := range c.seqs {
		ps := &c.seqs[i]
		ps.grant.Store(uint32(w))
		ps.granted = w
		ps.grantAt = w / 2
		if e.window == 0 {
			ps.grantAt = 1 << 15 // never reached in practice; grantDueLocked ignores it
		}
	}
}

// overWindow reports whether message seq to dest of c may not carry data
// (flow control).
func (c *Comm) overWindow(dest int, seq uint16) bool {
	return int16(seq-uint16(c.seqs[dest].grant.Load())) >= 0 && c.e.window != 0
}

// holdsData reports whether unexpected fragment f counts against its
// sender's window: an eager message, or an announcement with a first chunk.
func (f *frag) holdsData() bool { return f.typ == hdr.TypeMatch || len(f.data) > 0 }

// heldLocked accounts for f entering (d = 1) or leaving (d = -1) c's
// unexpected queue. Called with e.mu held.
func (e *Engine) heldLocked(c *Comm, f *frag, d int) {
	if !f.holdsData() {
		return
	}
	ps := &c.seqs[f.m.Src]
	ps.held += uint16(d)
	ps.grantAt += uint16(d)
	if d < 0 {
		e.flowCheckLocked(c, f.m.Src)
	}
}

// takeUnexpectedLocked removes f from c's unexpected queue.
func (e *Engine) takeUnexpectedLocked(c *Comm, f *frag) {
	c.m.removeUnexpected(f)
	e.heldLocked(c, f, -1)
}

// flowCheckLocked queues a grant for source src of c if one is due.
func (e *Engine) flowCheckLocked(c *Comm, src int32) {
	ps := &c.seqs[src]
	if int16(ps.expect-ps.grantAt) >= 0 {
		e.grantDueLocked(c, src)
	}
}

// grantDueLocked queues a CREDIT for source src of c; unlockFlush or
// sendGrants sends it.
func (e *Engine) grantDueLocked(c *Comm, src int32) {
	ps := &c.seqs[src]
	if e.window == 0 || ps.grantQ {
		return
	}
	ps.grantQ = true
	e.grants = append(e.grants, grantRef{c, src})
}

// unlockFlush releases e.mu and sends the grants that became due.
func (e *Engine) unlockFlush() {
	due := len(e.grants) != 0
	e.mu.Unlock()
	if due {
		e.sendGrants()
	}
}

// sendGrants sends the CREDITs that are due, outside the lock.
func (e *Engine) sendGrants() {
	type credit struct {
		w  int
		ep btl.Endpoint
		h  hdr.Credit
	}
	var batch [8]credit
	for {
		n := 0
		e.mu.Lock()
		w := uint16(e.window)
		for n < len(batch) && len(e.grants) > 0 {
			g := e.grants[len(e.grants)-1]
			e.grants = e.grants[:len(e.grants)-1]
			ps := &g.c.seqs[g.src]
			ps.grantQ = false
			grant := ps.expect + w - ps.held
			ps.granted = grant
			ps.grantAt = ps.expect + w/2
			p := e.peers[g.c.group[g.src]].Load()
			if p == nil || p.ep == nil || p.failed != nil || g.c.freed.Load() {
				continue
			}
			batch[n] = credit{p.world, p.ep, hdr.Credit{Grant: grant, Ctx: g.c.ctx, Dst: int32(g.c.rank)}}
			n++
		}
		e.mu.Unlock()
		if n == 0 {
			return
		}
		var b [hdr.CreditLen]byte
		for i := range batch[:n] {
			cr := &batch[i]
			l := cr.h.Encode(b[:])
			if e.sendImmTo(cr.w, cr.ep, btl.Tag(hdr.TypeCredit), b[:l], nil) != nil {
				e.sendTo(cr.w, cr.ep, btl.Tag(hdr.TypeCredit), b[:l], nil, func(error) {}) // a failed peer needs none
			}
			batch[i] = credit{}
		}
	}
}

// onCredit: a receiver extends this rank's window.
func (e *Engine) onCredit(ep btl.Endpoint, b, _ []byte) {
	h, _, err := hdr.DecodeCredit(b)
	if err != nil {
		e.protocolError(ep, "%v", err)
		return
	}
	e.mu.Lock()
	c := e.commLocked(h.Ctx)
	if c == nil {
		e.mu.Unlock() // freed since: nothing to extend
		return
	}
	if !c.fromRank(h.Dst, ep.Peer()) {
		e.mu.Unlock()
		e.protocolError(ep, "CREDIT from rank %d for rank %d of context %d", ep.Peer(), h.Dst, h.Ctx)
		return
	}
	ps := &c.seqs[h.Dst]
	if int16(h.Grant-uint16(ps.grant.Load())) > 0 { // grants only grow
		ps.grant.Store(uint32(h.Grant))
	}
	e.mu.Unlock()
}
