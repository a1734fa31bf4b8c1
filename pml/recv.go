package pml

import (
	"context"
	"sync"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml/hdr"
)

// ---- inbound matching fragments ----

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
		if c := e.commLocked(m.Ctx); c != nil && c.fromRank(m.Src, p.world) && e.deliverInOrderLocked(c, m.Src, m.Tag, m.Seq, p, data) {
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
	if !inOrderTried && f.typ == hdr.TypeMatch && e.deliverInOrderLocked(c, f.m.Src, f.m.Tag, f.m.Seq, f.peer, f.data) {
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

// deliverInOrderLocked is the common case of a MATCH fragment (source,
// tag and sequence number of its header), without the general path's
// copies: eager data from peer p for communicator c, in sequence with
// nothing waiting behind it, for a posted receive (not a probe). It
// reports whether it delivered; false changes nothing. The source is
// checked against c's group by the caller. Called with e.mu held.
func (e *Engine) deliverInOrderLocked(c *Comm, src32, tag32 int32, seq uint16, p *peer, data []byte) bool {
	ps := &c.seqs[src32]
	if seq != ps.expect || ps.ooo != nil {
		return false
	}
	src, tag := int(src32), int(tag32)
	r := c.m.takeFirst(src, tag)
	if r == nil {
		return false
	}
	ps.expect++
	if ps.expect == ps.grantAt { // the sender's window is due to grow (flow.go)
		e.grantDueLocked(c, src32)
	}
	if r.buf.Conv != nil || len(data) > len(r.buf.Bytes) || e.countStats {
		e.deliverEager(r, p, src, tag, data)
		return true
	}
	// A receive whose message fits, in place: the data and the result
	// are written, none of deliverEager's bookkeeping, which nobody
	// reads once the request is done, and a request given back from
	// here is cleaned by resetPosted.
	n := copy(r.buf.Bytes, data)
	r.mpiDone = true
	r.status = Status{Source: src, Tag: tag, Count: n}
	// complete's work, written out for this case (no error, a count
	// that fits the sink): the call with its general result cost 40
	// instructions a message here (bench/instr.sh).
	parks := r.parks
	s := r.sink
	if s == nil { // a blocking Recv's, say: its poster resets it before reuse
		r.done.Store(r.gen + 1)
		r.notify(parks)
		return true
	}
	s.Source, s.Tag, s.Count = int32(src), int32(tag), uint32(n) // eager data is far below 4 GiB
	free := s.gone(false)
	r.notify(parks)
	if free && r.owned && len(e.free) < freeMax { // poolable: no id, no release
		r.resetPosted()
		e.free = append(e.free, r)
	}
	return true
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
			if c := e.commLocked(m.Ctx); c != nil && c.fromRank(m.Src, r) && e.deliverInOrderLocked(c, m.Src, m.Tag, m.Seq, p, datas[i]) {
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
		e.deliverEager(r, f.peer, int(f.m.Src), int(f.m.Tag), f.data)
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
	r.id = e.nextID
	e.nextID++
	e.reqs[r.id] = r
	r.flags |= 0x80 // marks "RGET" below when typ is RGET
	if f.typ != hdr.TypeRget {
		r.flags &^= 0x80
	}
	e.toStart = append(e.toStart, r)
}

// deliverEager stores an eager message (a MATCH fragment's data) into
// receive r and completes it. e.mu held.
func (e *Engine) deliverEager(r *Request, p *peer, src, tag int, data []byte) {
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

// unpack stores data at message offset off of r, clipped to the buffer.
func (e *Engine) unpack(r *Request, off int, data []byte) {
	if off >= r.stored {
		return
	}
	data = data[:min(len(data), r.stored-off)]
	if r.buf.Conv == nil {
		copy(r.buf.Bytes[off:], data)
		return
	}
	r.convMu.Lock()
	r.buf.Conv.SetPosition(off)
	r.buf.Conv.Unpack(data)
	r.convMu.Unlock()
}

func (e *Engine) finishRecvLocked(r *Request) {
	if r.mpiDone {
		return
	}
	r.mpiDone = true
	if r.id != 0 {
		delete(e.reqs, r.id)
	}
	if r.regs != nil { // ranging over a nil map still starts an iterator (a call)
		for _, reg := range r.regs {
			reg.Release()
		}
		r.regs = nil
	}
	st := r.status
	st.Count = r.stored
	var err error
	if r.msgLen > r.stored {
		err = mpierr.Errorf(mpierr.ErrTruncate, "message of %d bytes from rank %d tag %d into a buffer of %d", r.msgLen, st.Source, st.Tag, r.stored)
	}
	if r.complete(st, err) && r.poolable() && len(e.free) < freeMax {
		// The result is in the owner's sink and no call of the owner holds
		// r, and nothing here touches r after this: it goes back now.
		r.reset()
		e.free = append(e.free, r)
	}
}

func (e *Engine) checkRecvLocked(r *Request) {
	if r.received >= r.msgLen && r.inflight == 0 {
		e.finishRecvLocked(r)
	}
}

// runStarts starts matched rendezvous receives (outside the lock).
func (e *Engine) runStarts() {
	for {
		e.mu.Lock()
		n := len(e.toStart)
		if n == 0 {
			e.mu.Unlock()
			return
		}
		r := e.toStart[n-1]
		e.toStart[n-1] = nil
		e.toStart = e.toStart[:n-1]
		e.mu.Unlock()
		e.startRecv(r)
	}
}

func (e *Engine) sendAck(r *Request, off, size int, flags uint8) {
	hb := hdrPool.Get().(*[hdr.MaxLen]byte)
	h := hdr.Ack{Flags: flags, SrcReq: r.srcReq, DstReq: r.id, SendOffset: uint64(off), SendSize: uint64(size)}
	n := h.Encode(hb[:])
	if err := e.sendImmTo(r.peerWorld, r.ep, btl.Tag(hdr.TypeAck), hb[:n], nil); err != nil {
		if _, err := e.sendTo(r.peerWorld, r.ep, btl.Tag(hdr.TypeAck), hb[:n], nil, func(error) {}); err != nil {
			e.PeerFailed(r.peerWorld, err)
		}
	}
	hdrPool.Put(hb)
}

// startRecv runs the receiver's side of a matched RNDV or RGET (notes A.5).
func (e *Engine) startRecv(r *Request) {
	p := e.peers[r.peerWorld].Load()
	contig := r.buf.Conv == nil && r.stored == r.msgLen
	if r.flags&0x80 != 0 { // RGET
		if !contig || p.caps&btl.CapGet == 0 || e.force == ForceSendPipeline {
			e.sendAck(r, 0, 0, hdr.FlagNoRDMA)
			return
		}
		e.getAll(r, p)
		return
	}
	choice := Choose(RecvInfo{MsgLen: r.msgLen, Received: r.received, Flags: r.flags, Contiguous: contig, Caps: p.caps, Limits: p.lim, Force: e.force})
	switch choice {
	case RecvDirectPut:
		e.mu.Lock()
		r.ranges = append(r.ranges[:0], span{r.received, r.msgLen - r.received})
		e.mu.Unlock()
		e.schedPutsFirst(r, true, r.msgLen-r.received)
		return
	case RecvRDMAPipeline:
		sendOff := max(r.received, r.msgLen-p.lim.RDMAPipelineSendLength)
		e.mu.Lock()
		if sendOff > r.received {
			r.ranges = append(r.ranges[:0], span{r.received, sendOff - r.received})
		}
		e.mu.Unlock()
		if sendOff < r.msgLen {
			e.sendAck(r, sendOff, 0, 0)
			e.schedPutsFirst(r, false, p.lim.RDMAPipelineFragSize)
		} else {
			e.schedPutsFirst(r, true, p.lim.RDMAPipelineFragSize)
		}
		return
	}
	// Copy pipeline (also: everything already arrived; the ACK tells the
	// sender we matched, which completes a synchronous send).
	e.sendAck(r, r.received, 0, hdr.FlagNoRDMA)
	e.mu.Lock()
	e.checkRecvLocked(r)
	e.mu.Unlock()
}

// getAll reads the whole message with RDMA gets (RDMA direct get).
func (e *Engine) getAll(r *Request, p *peer) {
	chunk := r.msgLen
	if l := p.lim.MaxRDMASize; l > 0 {
		chunk = l
	}
	if r.msgLen == 0 {
		e.sendFin(r.ep, r.srcReq, 0, 0)
		e.mu.Lock()
		e.checkRecvLocked(r)
		e.mu.Unlock()
		return
	}
	// msgLen, ep and the handle are read before the last GET: it may
	// complete r.
	handle, msgLen, ep := r.handle, r.msgLen, r.ep
	for off := 0; off < msgLen; off += chunk {
		n := min(chunk, msgLen-off)
		if p.sg != nil && p.ep == ep {
			// Done before it returns: nothing in flight to count, no
			// completion closure to allocate.
			e.getDone(r, off, n, false, p.sg.GetNow(r.buf.Bytes[off:off+n], handle, off))
			continue
		}
		e.mu.Lock()
		r.inflight++
		e.mu.Unlock()
		off := off
		done, err := e.getTo(r.peerWorld, ep, r.buf.Bytes[off:off+n], handle, off, func(err error) { e.getDone(r, off, n, true, err) })
		if err != nil {
			e.getDone(r, off, n, true, err)
		} else if done {
			e.getDone(r, off, n, true, nil)
		}
	}
}

// getDone accounts for the GET of message bytes [off, off+n) of receive r
// (counted: it was counted in flight). A failed one asks the sender to
// copy that range instead.
func (e *Engine) getDone(r *Request, off, n int, counted bool, err error) {
	if err != nil {
		// The GET no longer counts as in flight before the ACK goes out:
		// over a synchronous transport the FRAGs that answer it arrive
		// before Send returns.
		e.mu.Lock()
		if counted {
			r.inflight--
		}
		r.slow = true // FRAGs will answer: their handlers hold r
		e.mu.Unlock()
		e.sendFin(r.ep, r.srcReq, off, -1)
		e.sendAck(r, off, n, hdr.FlagNoRDMA)
		e.mu.Lock()
		e.checkRecvLocked(r)
		e.mu.Unlock()
		return
	}
	e.sendFin(r.ep, r.srcReq, off, n)
	e.mu.Lock()
	if counted {
		r.inflight--
	}
	r.received += n
	if !counted && !r.slow && !r.mpiDone && r.received >= r.msgLen && r.inflight == 0 {
		// This call completes r, and neither getAll (which reads nothing
		// of r after its last GET) nor anyone else touches it afterwards.
		r.quiet = true
	}
	e.checkRecvLocked(r)
	e.mu.Unlock()
}

// schedPutsFirst starts the PUT pipeline; ack says whether the first PUT
// stands for the ACK (no ACK was sent), fragSize bounds each PUT.
func (e *Engine) schedPutsFirst(r *Request, ack bool, fragSize int) {
	e.mu.Lock()
	r.acked = !ack // on the receive side: "an ACK or ACK-carrying PUT went out"
	r.delivered = max(1, fragSize)
	if len(r.ranges) == 0 {
		e.checkRecvLocked(r)
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	e.schedPuts(r)
}

// schedPuts keeps up to pml_recv_pipeline_depth PUT requests in flight.
func (e *Engine) schedPuts(r *Request) {
	if r.sched.Add(1) != 1 {
		return
	}
	for {
		e.sendPuts(r)
		if r.sched.Add(-1) == 0 {
			return
		}
	}
}

func (e *Engine) sendPuts(r *Request) {
	mod := r.ep.Module()
	hb := hdrPool.Get().(*[hdr.MaxLen]byte)
	defer hdrPool.Put(hb)
	for {
		e.mu.Lock()
		if r.mpiDone || len(r.ranges) == 0 || r.inflight >= e.recvDepth {
			e.mu.Unlock()
			return
		}
		sp := &r.ranges[0]
		off, n := sp.off, min(sp.n, r.delivered)
		sp.off += n
		sp.n -= n
		if sp.n == 0 {
			r.ranges = r.ranges[1:]
		}
		flags := uint8(0)
		if !r.acked {
			flags = hdr.FlagAck
			r.acked = true
		}
		r.inflight++
		e.mu.Unlock()
		reg, err := mod.Register(r.buf.Bytes[off:off+n], btl.AccessRemoteWrite|btl.AccessLocalWrite)
		if err != nil || len(reg.Handle()) > hdr.MaxHandle {
			// Cannot register: ask for this range by copy.
			e.mu.Lock()
			r.inflight--
			e.mu.Unlock()
			e.sendAck(r, off, n, hdr.FlagNoRDMA)
			continue
		}
		e.mu.Lock()
		if r.regs == nil {
			r.regs = map[uint64]btl.Registration{}
		}
		r.regs[uint64(off)] = reg
		e.mu.Unlock()
		h := hdr.Put{Flags: flags, SrcReq: r.srcReq, DstReq: r.id, Offset: uint64(off), Size: uint64(n), Handle: reg.Handle()}
		l := h.Encode(hb[:])
		if _, err := e.sendTo(r.peerWorld, r.ep, btl.Tag(hdr.TypePut), hb[:l], nil, func(error) {}); err != nil {
			e.PeerFailed(r.peerWorld, err)
			return
		}
	}
}

// finPutLocked accounts a FIN for the PUT at off (n < 0: it failed and the
// range will come by FRAGs).
func (e *Engine) finPutLocked(r *Request, off, n int) {
	if reg := r.regs[uint64(off)]; reg != nil {
		reg.Release()
		delete(r.regs, uint64(off))
	}
	r.inflight--
	if n > 0 {
		r.received += n
	}
	e.checkRecvLocked(r)
}

// onFrag stores a FRAG's bytes.
func (e *Engine) onFrag(ep btl.Endpoint, b, data []byte) {
	h, _, err := hdr.DecodeFrag(b)
	if err != nil {
		e.protocolError(ep, "%v", err)
		return
	}
	e.mu.Lock()
	r := e.reqs[h.DstReq]
	if r == nil || r.kind != kindRecv || r.peerWorld != ep.Peer() || r.srcReq != h.SrcReq {
		e.mu.Unlock()
		e.protocolError(ep, "FRAG for unknown receive %d", h.DstReq)
		return
	}
	if h.Offset > uint64(r.msgLen) || uint64(len(data)) > uint64(r.msgLen)-h.Offset {
		e.mu.Unlock()
		e.protocolError(ep, "FRAG [%d,+%d) beyond a message of %d bytes", h.Offset, len(data), r.msgLen)
		return
	}
	e.mu.Unlock()
	e.unpack(r, int(h.Offset), data)
	e.mu.Lock()
	r.received += len(data)
	e.checkRecvLocked(r)
	e.mu.Unlock()
}

// ---- fragment storage ----

// copyFrag copies f (whose slices alias a transport's buffer) for storage.
func (e *Engine) copyFrag(f *frag) *frag {
	g := new(frag)
	*g = *f
	g.data = append([]byte(nil), f.data...)
	g.handle = append([]byte(nil), f.handle...)
	return g
}

func (e *Engine) freeFrag(*frag) {}

// ---- receives ----

// check returns the error a call on c gets: c freed, or its engine
// closed. The common case is a test small enough to be inlined into
// postRecv; the errors are checkSlow's.
func (c *Comm) check() error {
	if !c.freed.Load() && c.e.closed == nil {
		return nil
	}
	return c.checkSlow()
}

func (c *Comm) checkSlow() error {
	if c.freed.Load() {
		return mpierr.Errorf(mpierr.ErrComm, "communicator freed")
	}
	if err := c.e.closed; err != nil {
		return err
	}
	return nil
}

// Irecv posts a receive into buf from communicator rank src (or AnySource)
// with tag (or AnyTag). The caller validated src and tag.
func (c *Comm) Irecv(buf Buffer, src, tag int) (*Request, error) {
	// buf's fields go on separately: a Buffer (40 bytes) passed on whole
	// is copied through memory with stalling wide loads (perf annotate:
	// most of this function's time).
	return c.postRecv(nil, buf.Bytes, buf.Conv, src, tag, kindRecv, nil)
}

// Recv is a blocking receive; it allocates nothing for an eager message.
func (c *Comm) Recv(buf Buffer, src, tag int) (Status, error) {
	e := c.e
	r := e.takeSpare()
	r.parks = e.parksOnly() // Wait parks at once (spinWait)
	var posted *Request
	if buf.Conv == nil {
		posted, _ = c.postPlain(r, buf.Bytes, src, tag, nil, nil)
	}
	if posted == nil {
		if _, err := c.postRecv(r, buf.Bytes, buf.Conv, src, tag, kindRecv, nil); err != nil {
			recycleUnstarted(r)
			return Status{}, err
		}
	}
	e.Wait(nil, r)
	st, err := r.status, r.err
	e.putSpare(r)
	return st, err
}

// takeSpare returns a clean pooled request, preferring a spare: the
// request of an earlier blocking receive, put aside uncleaned so that the
// cleaning happens here, when the next receive is posted (while the peer
// is busy with the message this rank just sent), and not between a
// receive's completion and the caller's next send. One spare is kept in
// the engine, more in a sync.Pool.
func (e *Engine) takeSpare() *Request {
	if e.parksOnly() {
		// In-process ranks that park run both sides on one processor in
		// turn: nothing is gained by moving the cleaning, and the pool is
		// cheaper. Ranks that spin (SetSpinner) run on two, as processes
		// do: the spare measured better there (go test -bench PingPong
		// ./mpi, eight alternated runs: median 1.54x -> 1.25x the channel).
		return newReq(true)
	}
	r := e.spare.Swap(nil)
	if r == nil {
		x := spares.Get()
		if x == nil {
			return newReq(true)
		}
		r = x.(*Request)
	}
	r.reset()
	return r
}

// spares holds done blocking receives' requests, not yet cleaned, beyond
// the engine's one spare. The engine's slot costs two locked instructions
// per receive, the pool's per-processor one none but more work: 7.0-7.3 ns
// against 14.7-14.9 for a take and a give back on this kind of machine,
// AMD EPYC (`go test -bench TakeGive ./bench/lockcost`).
var spares sync.Pool

// putSpare puts a finished blocking receive's request aside for a later
// takeSpare, dropping its reference to the user's buffer at once; a
// request the engine may still reference goes the way of recycle.
func (e *Engine) putSpare(r *Request) {
	if e.parksOnly() || !r.Done() || !r.poolable() {
		recycle(r)
		return
	}
	r.buf = Buffer{}
	if !e.spare.CompareAndSwap(nil, r) {
		spares.Put(r)
	}
}

// postPlain is postRecv's common case under one hold of the lock: a
// receive of contiguous bytes from a specific source and tag, with
// nothing unexpected, failed, closed or to start in the way. r is a clean
// request, or nil for one from the free list (an Irecv's, which counts
// for yieldEvery). The sink is s, or when s is nil and alloc is not, one
// from alloc, called with the lock held once the receive is sure to be
// posted (IrecvAlloc). It returns the request posted and its sink, or nil
// with nothing changed when the case does not apply (postRecv then checks
// it all).
func (c *Comm) postPlain(r *Request, b []byte, src, tag int, s *Sink, alloc func() *Sink) (*Request, *Sink) {
	e := c.e
	if uint(src) >= uint(len(c.group)) || tag < 0 {
		return nil, nil
	}
	e.mu.Lock()
	if c.m.uAll.head != nil || len(e.toStart) > 0 || e.troubled.Load() || c.check() != nil {
		e.mu.Unlock()
		return nil, nil
	}
	irecv := r == nil
	if irecv {
		if len(e.free) == 0 { // postRecv makes a new one
			e.mu.Unlock()
			return nil, nil
		}
		r = e.popFreeLocked()
	}
	if s == nil && alloc != nil {
		s = alloc()
	}
	r.kind, r.comm, r.peer, r.tag, r.buf.Bytes, r.sink = kindRecv, c, src, tag, b, s
	c.m.postSpecific(r)
	yielding := irecv && r.postSeq&(yieldEvery-1) == yieldEvery-1
	e.mu.Unlock()
	if yielding {
		yield()
	}
	return r, s
}

// setRecv fills in a receive's fields.
func (r *Request) setRecv(kind reqKind, c *Comm, src, tag int, b []byte, conv Convertor) {
	r.kind, r.comm, r.peer, r.tag = kind, c, src, tag
	r.buf.Bytes, r.buf.Conv = b, conv
}

// postRecv posts receive (or probe) r, or, when r is nil (Irecv), a
// request it takes, once the checks passed, from the engine's free list
// under the lock the post takes anyway, instead of from the sync.Pool
// (whose shared queue costs a locked instruction each way once a window of
// receives overflows its per-processor slot). It returns the request
// posted. The buffer comes in its fields: a whole Buffer (40 bytes) passed
// on is copied through memory with stalling wide loads.
func (c *Comm) postRecv(r *Request, b []byte, conv Convertor, src, tag int, kind reqKind, sink *Sink) (*Request, error) {
	rNil := r == nil
	if r != nil {
		r.setRecv(kind, c, src, tag, b, conv)
	}
	e := c.e
	e.mu.Lock()
	if err := c.check(); err != nil {
		e.mu.Unlock()
		return nil, err
	}
	var f *frag
	if len(c.failed) == 0 || tag >= AnyTag {
		f = c.m.findUnexpected(src, tag)
	}
	if f == nil && len(c.failed) != 0 {
		// A rank of c failed: see ft.go for who may still post.
		if err := c.recvFailureLocked(src, tag); err != nil {
			e.mu.Unlock()
			return nil, err
		}
	}
	if r == nil {
		r = e.takeFreeLocked()
		r.setRecv(kind, c, src, tag, b, conv)
		r.sink = sink // before it can match
	}
	if f != nil {
		switch kind {
		case kindProbe:
			r.complete(Status{Source: int(f.m.Src), Tag: int(f.m.Tag), Count: f.msgLen}, nil)
		case kindMprobe:
			e.takeUnexpectedLocked(c, f)
			r.frag = f
			r.complete(Status{Source: int(f.m.Src), Tag: int(f.m.Tag), Count: f.msgLen}, nil)
		default:
			e.takeUnexpectedLocked(c, f)
			e.deliver(r, f)
			e.freeFrag(f)
		}
	} else {
		c.m.post(r)
	}
	// An Irecv (r taken here) that was posted counts for yieldEvery; its
	// post number is read under the lock: one that completed at once may
	// be back in the free list (a sink's), with postSeq 0.
	yielding := rNil && (r.postSeq+1)&(yieldEvery-1) == 0
	start := len(e.toStart) > 0
	due := len(e.grants) != 0
	if start && e.poll.active() {
		// A rendezvous matched at post time starts at the next progress
		// call (the Wait that follows, or the background goroutine), not
		// here: an RDMA get of a large message would hold up the caller's
		// next calls, e.g. the Isends of a window posted after its Irecvs,
		// and with them the peer's copies, which then run after this
		// rank's instead of beside them (bidirectional bandwidth).
		e.poll.deferStarts()
		start = false
	}
	e.mu.Unlock()
	if due {
		e.sendGrants()
	}
	if start {
		e.runStarts()
	}
	if yielding {
		yield()
	}
	return r, nil
}

// Iprobe reports whether a message matching (src, tag) can be received,
// without receiving it.
func (c *Comm) Iprobe(src, tag int) (Status, bool, error) {
	e := c.e
	e.Progress()
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := c.check(); err != nil {
		return Status{}, false, err
	}
	if f := c.m.findUnexpected(src, tag); f != nil {
		return Status{Source: int(f.m.Src), Tag: int(f.m.Tag), Count: f.msgLen}, true, nil
	}
	if len(c.failed) != 0 {
		if err := c.recvFailureLocked(src, tag); err != nil {
			return Status{}, false, err
		}
	}
	return Status{}, false, nil
}

// Probe blocks until a message matching (src, tag) can be received.
func (c *Comm) Probe(ctx context.Context, src, tag int) (Status, error) {
	r := newReq(true)
	defer recycle(r)
	if _, err := c.postRecv(r, nil, nil, src, tag, kindProbe, nil); err != nil {
		return Status{}, err
	}
	if err := c.e.Wait(ctx, r); err != nil {
		c.Cancel(r)
		return Status{}, err
	}
	return r.status, r.err
}

// Improbe is a matched probe: a matching message is removed from matching
// and returned as a request to receive with Mrecv. ok is false when there
// is none now.
func (c *Comm) Improbe(src, tag int) (*Request, Status, bool, error) {
	e := c.e
	e.Progress()
	e.mu.Lock()
	if err := c.check(); err != nil {
		e.mu.Unlock()
		return nil, Status{}, false, err
	}
	f := c.m.findUnexpected(src, tag)
	if f == nil {
		var err error
		if len(c.failed) != 0 {
			err = c.recvFailureLocked(src, tag)
		}
		e.mu.Unlock()
		return nil, Status{}, false, err
	}
	e.takeUnexpectedLocked(c, f)
	e.unlockFlush()
	r := newReq(false)
	r.kind, r.comm, r.frag = kindMprobe, c, f
	st := Status{Source: int(f.m.Src), Tag: int(f.m.Tag), Count: f.msgLen}
	r.complete(st, nil)
	return r, st, true, nil
}

// Mprobe blocks until a matching message arrives and removes it from matching.
func (c *Comm) Mprobe(ctx context.Context, src, tag int) (*Request, Status, error) {
	r := newReq(false)
	if _, err := c.postRecv(r, nil, nil, src, tag, kindMprobe, nil); err != nil {
		return nil, Status{}, err
	}
	if err := c.e.Wait(ctx, r); err != nil {
		if c.Cancel(r) {
			return nil, Status{}, err
		}
		c.e.Wait(nil, r) // matched meanwhile: the message is ours
	}
	if r.err != nil {
		return nil, Status{}, r.err
	}
	return r, r.status, nil
}

// Mrecv receives the message a matched probe returned into buf.
func (c *Comm) Mrecv(m *Request, buf Buffer) (*Request, error) {
	if m == nil || m.kind != kindMprobe || m.frag == nil {
		return nil, mpierr.Errorf(mpierr.ErrArg, "message already received or not from a matched probe")
	}
	e := c.e
	r := newReq(true)
	r.kind, r.comm, r.buf, r.peer, r.tag = kindRecv, c, buf, int(m.frag.m.Src), int(m.frag.m.Tag)
	f := m.frag
	m.frag = nil
	e.mu.Lock()
	e.deliver(r, f)
	start := len(e.toStart) > 0
	e.mu.Unlock()
	if start {
		e.runStarts()
	}
	return r, nil
}

// Cancel cancels a receive or probe that has not matched yet; true if it
// took effect (the request is then complete with Status.Cancelled). Sends
// are never cancelled (false).
func (c *Comm) Cancel(r *Request) bool {
	if r == nil || r.kind == kindSend {
		return false
	}
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if r.Done() || !c.m.unpost(r) {
		return false
	}
	r.mpiDone = true
	r.complete(Status{Source: r.peer, Tag: r.tag, Cancelled: true}, nil)
	return true
}

// ---- failure draining (e.mu held) ----

func (m *matchState) drainList(l *reqList, out []*Request) []*Request {
	for r := l.head; r != nil; {
		next := r.next
		l.remove(r)
		out = append(out, r)
		r = next
	}
	return out
}

// drainPosted removes every posted request.
func (m *matchState) drainPosted(out []*Request) []*Request {
	for _, l := range m.specific {
		out = m.drainList(l, out)
	}
	m.sweep()
	for i := range m.srcAny {
		out = m.drainList(&m.srcAny[i], out)
	}
	return m.drainList(&m.wild, out)
}

// drainSource removes the posted requests that can only (or also) match
// source src: specific ones and wildcards.
func (m *matchState) drainSource(src int, out []*Request) []*Request {
	for k, l := range m.specific {
		if int(k.src) == src {
			out = m.drainList(l, out)
		}
	}
	m.sweep()
	out = m.drainList(&m.srcAny[src], out)
	return m.drainList(&m.wild, out)
}
