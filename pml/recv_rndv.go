package pml

import (
	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/pml/hdr"
)

// The receiver's side of a rendezvous, once its RNDV or RGET matched:
// RDMA gets, the PUT pipeline, ACKs asking for copies, and the FRAGs
// that bring them.

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
	hb, hbp := r.headerSpace(r.handle != nil) // an RGET's handle is kept in the scratch bytes
	h := hdr.Ack{Flags: flags, SrcReq: r.srcReq, DstReq: r.id, SendOffset: uint64(off), SendSize: uint64(size)}
	n := h.Encode(hb)
	if err := e.sendImmTo(r.peerWorld, r.ep, btl.Tag(hdr.TypeAck), hb[:n], nil); err != nil {
		if _, err := e.sendTo(r.peerWorld, r.ep, btl.Tag(hdr.TypeAck), hb[:n], nil, func(error) {}); err != nil {
			e.PeerFailed(r.peerWorld, err)
		}
	}
	putHeaderSpace(hbp)
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
	if !r.slow && !r.mpiDone && r.received >= r.msgLen && r.inflight == 0 {
		// Everything arrived with the RNDV: this completes r, and
		// nothing touches it afterwards (as in onFin's).
		r.quiet = true
	}
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
	r := e.reqs.get(h.DstReq)
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
