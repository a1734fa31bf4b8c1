package pml

import (
	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/pml/hdr"
)

// Inbound matching fragments (MATCH, RNDV, RGET): admission in sequence
// order, matching against posted receives, and hand-over of a matched
// message to its receive (recv.go stores and completes it; recv_rndv.go
// runs the rest of a rendezvous).

// onMatching handles MATCH, RNDV and RGET: admission in sequence order,
// then matching against posted receives. A well-formed MATCH is decoded
// in place and, when in sequence for a posted receive, delivered by
// deliverInOrderLocked without building a frag; anything else goes to
// admitLocked under the same hold of the lock. Other types (and faults)
// are onMatchingFrag's.
func (e *Engine) onMatching(ep btl.Endpoint, b, data []byte) {
	var m hdr.Match
	if !m.DecodeMatch(b) {
		e.onMatchingFrag(ep, b, data)
		return
	}
	p := e.peerOf(ep)
	if p == nil {
		e.protocolError(ep, "fragment from a rank without a transport")
		return
	}
	e.mu.Lock()
	if e.closed == nil {
		if c := e.commLocked(m.Ctx); c != nil && c.fromRank(m.Src, p.world) && (e.deliverInOrderLocked(c, &m, p, data) || e.queueInOrderLocked(c, &m, p, data, hdr.TypeMatch, 0)) {
			due := len(e.grants) != 0
			e.mu.Unlock()
			if due {
				e.sendGrants()
			}
			return
		}
	}
	f := frag{typ: hdr.TypeMatch, m: m, msgLen: len(data), data: data, peer: p}
	e.admitLocked(ep, &f, true)
}

// onMatchingFrag is onMatching for the other types and for malformed
// headers: decoded by type into a frag, then admitted.
func (e *Engine) onMatchingFrag(ep btl.Endpoint, b, data []byte) {
	var f frag // decoded here, then copied into e.scratch under the lock (f must not escape)
	if len(b) == 0 {
		e.protocolError(ep, "empty header on a matching tag")
		return
	}
	f.typ = hdr.Type(b[0])
	switch f.typ {
	case hdr.TypeMatch:
		if err := f.m.Decode(b); err != nil { // in place: see Match.Decode
			e.protocolError(ep, "%v", err)
			return
		}
		f.msgLen = len(data)
	case hdr.TypeRndv:
		h, _, err := hdr.DecodeRndv(b)
		if err != nil {
			e.protocolError(ep, "%v", err)
			return
		}
		if h.MsgLen > 1<<62 || uint64(len(data)) > h.MsgLen {
			e.protocolError(ep, "RNDV carries %d bytes of a %d-byte message", len(data), h.MsgLen)
			return
		}
		if int(h.MsgLen) == len(data) && e.rndvWhole(ep, &h, data) {
			return
		}
		f.m, f.msgLen, f.srcReq = h.Match, int(h.MsgLen), h.SrcReq
	case hdr.TypeRget:
		h, _, err := hdr.DecodeRget(b)
		if err != nil {
			e.protocolError(ep, "%v", err)
			return
		}
		if h.MsgLen > 1<<62 || len(data) != 0 {
			e.protocolError(ep, "malformed RGET")
			return
		}
		f.m, f.msgLen, f.srcReq, f.handle = h.Match, int(h.MsgLen), h.SrcReq, h.Handle
	default:
		e.protocolError(ep, "a %v header on a matching tag", f.typ)
		return
	}
	f.data = data
	f.peer = e.peerOf(ep)
	if f.peer == nil {
		e.protocolError(ep, "fragment from a rank without a transport")
		return
	}
	e.mu.Lock()
	e.admitLocked(ep, &f, false)
}

// admitLocked takes f, a decoded matching fragment with its peer, with
// e.mu held, and releases the lock: dropped when the engine is closed,
// parked when its communicator does not exist here yet, refused when its
// source does not belong to its sender, otherwise delivered or queued in
// sequence order. inOrderTried: deliverInOrderLocked already declined it.
func (e *Engine) admitLocked(ep btl.Endpoint, f *frag, inOrderTried bool) {
	if e.closed != nil {
		e.mu.Unlock()
		return
	}
	c := e.commLocked(f.m.Ctx)
	if c == nil {
		// The communicator does not exist here yet (a peer finished Dup
		// first): keep the fragment until NewComm.
		sf := &e.scratch
		*sf = *f
		e.parked = append(e.parked, e.copyFrag(sf))
		*sf = frag{}
		e.mu.Unlock()
		return
	}
	if !c.fromRank(f.m.Src, ep.Peer()) {
		e.mu.Unlock()
		e.protocolError(ep, "source rank %d does not belong to rank %d in context %d", f.m.Src, ep.Peer(), f.m.Ctx)
		return
	}
	if !inOrderTried && f.typ == hdr.TypeMatch && e.deliverInOrderLocked(c, &f.m, f.peer, f.data) {
		e.unlockFlush()
		return
	}
	sf := &e.scratch
	*sf = *f
	e.arrive(c, sf, false)
	*sf = frag{}
	start := len(e.toStart) > 0
	e.unlockFlush()
	if start {
		e.runStarts()
	}
}

// commLocked returns the communicator of context ctx, nil if it does not
// exist here (yet). Called with e.mu held.
func (e *Engine) commLocked(ctx uint32) *Comm {
	c := e.lastComm
	if c == nil || c.ctx != ctx {
		if c = e.comms[ctx]; c != nil {
			e.lastComm = c // communicators never leave e.comms
		}
	}
	return c
}

// fromRank reports whether communicator rank src is world rank world.
func (c *Comm) fromRank(src int32, world int) bool {
	return int(src) >= 0 && int(src) < len(c.group) && c.group[src] == world
}

// deliverInOrderLocked is arrive and match for the common case of a MATCH
// fragment m: eager data from peer p, in sequence with nothing parked
// behind it, for a posted receive (not a probe) of m's communicator c,
// delivered by deliverEager. It reports whether it delivered; false
// changes nothing (the caller then admits a frag the general way). The
// source is checked against c's group by the caller. Called with e.mu
// held.
func (e *Engine) deliverInOrderLocked(c *Comm, m *hdr.Match, p *peer, data []byte) bool {
	return c.deliverEager(nil, m.Src, m.Tag, m.Seq, p, data)
}

// queueInOrderLocked is arrive and match for a MATCH fragment m that
// deliverInOrderLocked declined because nothing posted matches it: eager
// data from peer p, in sequence with nothing parked behind it, stored in
// a fragment of the free list and queued as unexpected. It reports whether
// it queued; false changes nothing. The general way (admitLocked, arrive,
// match) builds a frag on the stack, copies it twice (the scratch, then
// copyFrag) and searches the posted receives twice more; this is the way
// of the message a blocking Probe or Mprobe waits for and of one sent
// before its receive was posted, as when ranks outnumber cores
// (bench/instr.sh: probe ping-pong 2759 -> 2531 instructions a message;
// callgrind of bench/ring -mode nb with two ranks on one core: 4817 ->
// 4350 a step). An RNDV that carries its whole message (typ TypeRndv,
// with the sender's request id) is queued the same way, for postRecv to
// deliver and answer (recv.go). e.mu held.
func (e *Engine) queueInOrderLocked(c *Comm, m *hdr.Match, p *peer, data []byte, typ hdr.Type, srcReq uint64) bool {
	ps := &c.seqs[m.Src]
	if m.Seq != ps.expect || ps.ooo != nil || c.m.findPosted(int(m.Src), int(m.Tag)) != nil {
		return false
	}
	ps.expect++
	f := e.takeFrag()
	f.typ, f.m, f.msgLen, f.srcReq, f.peer = typ, *m, len(data), srcReq, p
	f.data = append(f.data[:0], data...)
	c.m.addUnexpected(f)
	e.heldLocked(c, f, 1)
	e.flowCheckLocked(c, m.Src)
	return true
}

// rndvWhole is arrive, match and the receiver's start for an RNDV that
// carries its whole message (a synchronous send of an eager size, say):
// in sequence with nothing parked behind it, for a posted receive (not a
// probe), the message is stored and the receive completed as an eager
// one (deliverEager), and the ACK that completes the sender's request
// goes out at once, with no receive request id (nothing more of the
// message will come to need one). The general way built a frag, registered
// the receive by id, queued it to be started and took the lock twice more
// (bench/shapes -mode ssend over sm: 0.371 us that way, 0.319 this one).
// With nothing posted for it, it is queued as unexpected in the same hold
// of the lock (queueInOrderLocked), and the Recv that takes it answers it
// the same way (postRecv, ackWhole). False changes nothing: admitLocked
// then takes the fragment. It runs
// before the frag is built, as onMatching's deliverInOrderLocked does for
// a MATCH: inside admitLocked, after the frag, the same delivery measured
// 4% slower (bench/abprog.sh 8 ssend "-iters 100000": 0.316 against
// 0.328 us, 7 rounds of 8 slower).
func (e *Engine) rndvWhole(ep btl.Endpoint, h *hdr.Rndv, data []byte) bool {
	p := e.peerOf(ep)
	if p == nil {
		return false
	}
	e.mu.Lock()
	if e.closed != nil || p.failed != nil {
		e.mu.Unlock()
		return false
	}
	c := e.commLocked(h.Ctx)
	if c == nil || !c.fromRank(h.Src, p.world) {
		e.mu.Unlock()
		return false
	}
	// Not posted yet (the answer of an Ssend ping-pong arrives while its
	// receiver still waits for its own ACK): queued for postRecv.
	delivered := c.deliverEager(nil, h.Src, h.Tag, h.Seq, p, data)
	queued := !delivered && e.queueInOrderLocked(c, &h.Match, p, data, hdr.TypeRndv, h.SrcReq)
	due := len(e.grants) != 0
	e.mu.Unlock()
	if due {
		e.sendGrants()
	}
	if delivered {
		e.ackWhole(p, h.SrcReq, len(data))
	}
	return delivered || queued
}

// ackWhole answers an RNDV that carried its whole message, stored as an
// eager one: an ACK with no receive id (nothing more of the message will
// come to need one), sent as sendAck sends (at once, or queued; a rank it
// cannot be sent to has failed).
func (e *Engine) ackWhole(p *peer, srcReq uint64, msgLen int) {
	hb := hdrPool.Get().(*[hdr.MaxLen]byte)
	a := hdr.Ack{Flags: hdr.FlagNoRDMA, SrcReq: srcReq, SendOffset: uint64(msgLen)}
	n := a.Encode(hb[:])
	if err := e.sendImmTo(p.world, p.ep, btl.Tag(hdr.TypeAck), hb[:n], nil); err != nil {
		if _, err := e.sendTo(p.world, p.ep, btl.Tag(hdr.TypeAck), hb[:n], nil, func(error) {}); err != nil {
			e.PeerFailed(p.world, err)
		}
	}
	hdrPool.Put(hb)
}

// onMatchingRun takes a run of MATCH fragments from one endpoint (a
// btl.RunHandler): the common ones under one hold of the engine lock, any
// other through onMatching, in order.
func (e *Engine) onMatchingRun(ep btl.Endpoint, hdrs, datas [][]byte) {
	if len(hdrs) == 1 {
		e.onMatching(ep, hdrs[0], datas[0])
		return
	}
	r := ep.Peer()
	var p *peer
	if r >= 0 && r < e.size {
		p = e.peers[r].Load()
	}
	var m hdr.Match
	known := p != nil && p.ep != nil
	e.mu.Lock()
	for i, b := range hdrs {
		if known && e.closed == nil && m.DecodeMatch(b) {
			if c := e.commLocked(m.Ctx); c != nil && c.fromRank(m.Src, r) && (e.deliverInOrderLocked(c, &m, p, datas[i]) || e.queueInOrderLocked(c, &m, p, datas[i], hdr.TypeMatch, 0)) {
				continue
			}
		}
		// Anything else (and every error) the way of a single fragment.
		e.mu.Unlock()
		e.onMatching(ep, b, datas[i])
		e.mu.Lock()
	}
	due := len(e.grants) != 0 // unlockFlush, written out on this path
	e.mu.Unlock()
	if due {
		e.sendGrants()
	}
}

// arrive admits f in sequence order (parking early arrivals) and matches
// it and any out-of-sequence fragments it unblocks. Called with e.mu held.
func (e *Engine) arrive(c *Comm, f *frag, copied bool) {
	ps := &c.seqs[f.m.Src]
	if f.m.Seq != ps.expect {
		if !copied {
			f = e.copyFrag(f)
		}
		// Insert sorted by distance from the expected number (handles wrap-around).
		d := int16(f.m.Seq - ps.expect)
		pp := &ps.ooo
		for *pp != nil && int16((*pp).m.Seq-ps.expect) < d {
			pp = &(*pp).oooNext
		}
		f.oooNext = *pp
		*pp = f
		return
	}
	ps.expect++
	src := f.m.Src
	e.match(c, f, copied)
	for ps.ooo != nil && ps.ooo.m.Seq == ps.expect {
		g := ps.ooo
		ps.ooo = g.oooNext
		g.oooNext = nil
		ps.expect++
		e.match(c, g, true)
	}
	e.flowCheckLocked(c, src)
}

// match delivers an in-sequence fragment to the earliest-posted matching
// receive, completing probes on the way, or queues it as unexpected.
func (e *Engine) match(c *Comm, f *frag, copied bool) {
	if e.dropsFromFailedLocked(f) {
		return
	}
	src, tag := int(f.m.Src), int(f.m.Tag)
	for {
		r := c.m.findPosted(src, tag)
		if r == nil {
			if !copied {
				f = e.copyFrag(f)
			}
			c.m.addUnexpected(f)
			e.heldLocked(c, f, 1)
			return
		}
		c.m.unpost(r)
		switch r.kind {
		case kindProbe:
			r.complete(Status{Source: src, Tag: tag, Count: f.msgLen}, nil)
			continue
		case kindMprobe:
			if !copied {
				f = e.copyFrag(f)
			}
			r.frag = f
			r.complete(Status{Source: src, Tag: tag, Count: f.msgLen}, nil)
			return
		}
		e.deliver(r, f)
		if copied {
			e.freeFrag(f)
		}
		return
	}
}

// deliver hands a matched message to receive r. Eager data is stored at
// once; a rendezvous is queued to be started outside the lock. e.mu held.
func (e *Engine) deliver(r *Request, f *frag) {
	if f.typ == hdr.TypeMatch {
		r.comm.deliverEager(r, f.m.Src, f.m.Tag, f.m.Seq, f.peer, f.data)
		return
	}
	r.msgLen = f.msgLen
	r.peerWorld = f.peer.world
	r.ep = f.peer.ep
	r.status = Status{Source: int(f.m.Src), Tag: int(f.m.Tag)}
	capacity := r.buf.Len()
	r.stored = min(f.msgLen, capacity)
	if e.countStats {
		e.Stats.Recvd.Add(1)
	}
	r.srcReq = f.srcReq
	r.flags = f.m.Flags
	if err := e.peers[f.peer.world].Load().failed; err != nil {
		// The sender died after its RNDV/RGET arrived: the rest never will.
		r.mpiDone = true
		r.complete(Status{Source: r.status.Source, Tag: r.status.Tag}, err)
		return
	}
	if f.typ == hdr.TypeRget {
		r.handle = append(r.hbuf[:0], f.handle...)
	} else {
		e.unpack(r, 0, f.data)
		r.received = len(f.data)
	}
	r.id = e.reqs.add(r)
	r.flags |= 0x80 // marks "RGET" below when typ is RGET
	if f.typ != hdr.TypeRget {
		r.flags &^= 0x80
	}
	e.toStart = append(e.toStart, r)
}

// deliverEager stores eager data (a MATCH fragment's, with source, tag
// and sequence number of its header) from peer p into receive r of c and
// completes it. With r nil it is arrive's and match's common case first
// (deliverInOrderLocked): the fragment must be in sequence with nothing
// parked behind it and find a posted receive, not a probe; otherwise it
// returns false with nothing changed.
//
// A message that fits a receive of contiguous bytes is stored and
// completed here: the data and the result, none of the bookkeeping that
// finishRecvLocked reads (nobody reads it of an eager receive once it is
// done), and complete's work written out for a result with no error and
// a count that fits the sink (the call costs 40 instructions a message,
// bench/instr.sh); a request given back from here is cleaned by
// resetPosted. Finding and storing are one function, on registers: split
// in two (a call between them) they cost 15-20 instructions a message
// more. e.mu held.
func (c *Comm) deliverEager(r *Request, src32, tag32 int32, seq uint16, p *peer, data []byte) bool {
	if r == nil {
		ps := &c.seqs[src32]
		if seq != ps.expect || ps.ooo != nil {
			return false
		}
		if r = c.m.takeFirst(int(src32), int(tag32)); r == nil {
			return false
		}
		ps.expect++
		if ps.expect == ps.grantAt { // flowCheckLocked: nothing is parked, so expect just reached it
			c.e.grantDueLocked(c, src32)
		}
	}
	e := c.e
	if r.buf.Conv != nil || len(data) > len(r.buf.Bytes) || e.countStats {
		e.deliverCopy(r, p, int(src32), int(tag32), data)
		return true
	}
	n := copy(r.buf.Bytes, data)
	r.mpiDone = true
	r.status = Status{Source: int(src32), Tag: int(tag32), Count: n}
	parks := r.parks
	s := r.sink
	if s == nil { // a blocking Recv's, say: its poster resets it before reuse
		r.done.Store(r.gen + 1)
		r.notify(parks)
		return true
	}
	s.Source, s.Tag, s.Count = src32, tag32, uint32(n) // eager data is far below 4 GiB
	free := s.gone(false)
	r.notify(parks)
	if free && r.owned && len(e.free) < freeMax { // poolable: no id, no release
		r.resetPosted()
		e.free = append(e.free, r)
	}
	return true
}

// deliverCopy is deliverEager for a message that does not fit r's bytes
// (a convertor, a truncation) or with statistics to count: the general
// storing and completion. e.mu held.
func (e *Engine) deliverCopy(r *Request, p *peer, src, tag int, data []byte) {
	r.msgLen = len(data)
	r.peerWorld = p.world
	r.ep = p.ep
	r.status = Status{Source: src, Tag: tag}
	r.stored = min(len(data), r.buf.Len())
	if e.countStats {
		e.Stats.Recvd.Add(1)
	}
	e.unpack(r, 0, data)
	r.received = len(data)
	e.finishRecvLocked(r)
}

// ---- fragment storage ----

// copyFrag copies f (whose slices alias a transport's buffer) for storage,
// into a fragment freeFrag gave back when there is one, whose buffers it
// reuses. e.mu held. A message that arrives before its receive (the
// peer's half of a Sendrecv exchange, most often) cost three allocations
// before the fragments were reused (this copy, its data and the
// unexpected queue's list, fragList).
func (e *Engine) copyFrag(f *frag) *frag {
	g := e.takeFrag()
	data, handle := g.data[:0], g.handle[:0]
	*g = *f
	g.data = append(data, f.data...)
	g.handle = append(handle, f.handle...)
	return g
}

// takeFrag returns a fragment of the free list, zero but for the buffers
// freeFrag kept, or a new one. e.mu held.
func (e *Engine) takeFrag() *frag {
	if f := popLast(&e.fragFree); f != nil {
		return f
	}
	return new(frag)
}

// Bounds of the fragments freeFrag keeps: how many, and the largest data
// buffer kept with one (an eager message of sm or tcp's default limit).
const (
	fragFreeMax  = 64
	fragKeepData = 4096
)

// freeFrag gives back f, a fragment copyFrag made that nothing refers to
// any more: its receive has taken what it needed (deliver copies the data
// and the rendezvous handle). e.mu held.
func (e *Engine) freeFrag(f *frag) {
	if len(e.fragFree) == fragFreeMax {
		return
	}
	var data, handle []byte
	if cap(f.data) <= fragKeepData {
		data = f.data[:0]
	}
	if cap(f.handle) <= fragKeepData {
		handle = f.handle[:0]
	}
	*f = frag{data: data, handle: handle}
	e.fragFree = append(e.fragFree, f)
}
