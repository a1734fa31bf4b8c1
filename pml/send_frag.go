// The sender's side after its first fragment: packing message bytes, sending
// header-only and data fragments, accounting for their completion and
// completing send requests, and the handlers of the receiver's ACK, PUT and
// FIN that drive a rendezvous.

package pml

import (
	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/pml/hdr"
)

// pack copies message bytes [off, off+len(dst)) into dst; returns bytes packed.
func (e *Engine) pack(r *Request, dst []byte, off int) int {
	if r.buf.Conv == nil {
		return copy(dst, r.buf.Bytes[off:])
	}
	r.convMu.Lock()
	defer r.convMu.Unlock()
	c := r.buf.Conv
	if pos := c.SetPosition(off); pos < off {
		// off is inside a basic element (the receiver asked for a range
		// that starts there): pack the element's head and drop it; Pack
		// then finishes the element first.
		var skip [16]byte
		for pos < off {
			k := c.Pack(skip[:min(len(skip), off-pos)])
			if k == 0 {
				return 0
			}
			pos += k
		}
	}
	return c.Pack(dst)
}

// sendCtl sends a header-only fragment that belongs to send request r.
func (e *Engine) sendCtl(r *Request, p *peer, t hdr.Type, h []byte) error {
	ep := p.ep
	if p.caps&btl.CapSendImmediate != 0 && e.sendImmTo(p.world, ep, btl.Tag(t), h, nil) == nil {
		// Sent, and nothing of r is touched after: no fragment to count
		// in flight, and no completion closure (an allocation per
		// rendezvous). Refused or failed: the counted path below, whose
		// Send reports a failure through sendDone.
		return nil
	}
	e.mu.Lock()
	r.inflight++
	e.mu.Unlock()
	done, err := e.sendTo(p.world, ep, btl.Tag(t), h, nil, func(err error) { e.sendDone(r, 0, err) })
	if err != nil {
		e.sendDone(r, 0, err)
		return nil
	}
	if done {
		e.sendDone(r, 0, nil)
	}
	return nil
}

// sendChunk sends header h followed by message bytes [off, off+n).
func (e *Engine) sendChunk(r *Request, p *peer, t hdr.Type, h []byte, off, n int) error {
	e.mu.Lock()
	r.inflight++
	e.mu.Unlock()
	if t == hdr.TypeRndv && n == r.msgLen && n <= ImmediateMax && r.buf.Conv == nil && p.caps&btl.CapSendImmediate != 0 {
		// A RNDV that carries a whole small message (a synchronous
		// send's) and that the transport takes at once needs no
		// completion callback, whose closure is an allocation on the way
		// to the ACK (bench/shapes -mode ssend over sm, six alternated
		// runs gated on the cache-line probe: 0.59-0.75 against
		// 0.66-0.84 us, every run faster).
		if e.sendImmTo(p.world, p.ep, btl.Tag(t), h, r.buf.Bytes[:n]) == nil {
			e.sendDone(r, n, nil)
			return nil
		}
	}
	return e.sendChunkCb(r, p, t, h, off, n)
}

// sendChunkCb is sendChunk with a completion callback. A function of its
// own: the callback refers to n, which it may change, so n lives on the
// heap from the function's entry, an allocation sendChunk's immediate
// way does without.
func (e *Engine) sendChunkCb(r *Request, p *peer, t hdr.Type, h []byte, off, n int) error {
	cb := func(err error) { e.sendDone(r, n, err) }
	var done bool
	var err error
	if r.buf.Conv == nil && p.caps&btl.CapSendInPlace != 0 {
		done, err = e.sendTo(p.world, p.ep, btl.Tag(t), h, r.buf.Bytes[off:off+n], cb)
	} else {
		var b []byte
		b, err = p.ep.Alloc(len(h) + n)
		if err != nil {
			b = make([]byte, len(h)+n)
		}
		copy(b, h)
		got := e.pack(r, b[len(h):], off)
		if got != n {
			// The convertor packs whole basic elements only: the rest of
			// this range goes with the next fragment. A RNDV keeps
			// nothing: the receiver asks for everything past what it got.
			if t != hdr.TypeRndv {
				e.mu.Lock()
				rest := span{off + got, n - got}
				if len(r.ranges) > 0 && r.ranges[0].off == off+n {
					r.ranges[0].off = rest.off
					r.ranges[0].n += rest.n
				} else {
					r.ranges = append([]span{rest}, r.ranges...)
				}
				e.mu.Unlock()
			}
			n = got
			b = b[:len(h)+n]
		}
		if err != nil {
			done, err = e.sendTo(p.world, p.ep, btl.Tag(t), b[:len(h)], b[len(h):], cb)
		} else {
			done, err = e.sendAllocTo(p.world, p.ep, btl.Tag(t), b, len(h), cb)
		}
	}
	if err != nil {
		e.sendDone(r, n, err)
		return nil
	}
	if done {
		e.sendDone(r, n, nil)
	}
	return nil
}

// sendDone accounts for a completed fragment of send request r carrying n
// message bytes.
func (e *Engine) sendDone(r *Request, n int, err error) {
	e.mu.Lock()
	r.inflight--
	if err != nil {
		e.failSendLocked(r, err)
		e.mu.Unlock()
		return
	}
	r.delivered += n
	more := len(r.ranges) > 0
	e.checkSendLocked(r)
	e.mu.Unlock()
	if more {
		e.schedSend(r)
	}
}

func (e *Engine) failSendLocked(r *Request, err error) {
	if !r.pmlDone {
		e.endSendLocked(r, Status{Source: r.peer, Tag: r.tag}, err)
	}
}

// checkSendLocked completes r when the protocol is finished.
func (e *Engine) checkSendLocked(r *Request) {
	if r.pmlDone || !r.acked || r.delivered < r.msgLen || r.inflight > 0 || len(r.ranges) > 0 {
		return
	}
	e.endSendLocked(r, Status{Source: r.peer, Tag: r.tag, Count: r.msgLen}, nil)
}

// endSendLocked ends the PML's part of send r (its registration and
// buffer released) and completes it for mpi with st and err unless that
// was done already.
func (e *Engine) endSendLocked(r *Request, st Status, err error) {
	r.pmlDone = true
	e.reqs.del(r.id)
	if r.reg != nil {
		r.reg.Release()
		r.reg = nil
	}
	if r.release != nil {
		r.release()
	}
	if !r.mpiDone {
		r.mpiDone = true
		r.complete(st, err)
	}
}

// finishSend completes an eager send.
func (e *Engine) finishSend(r *Request, err error) {
	if r.release != nil {
		r.release()
	}
	r.pmlDone = true
	if r.mpiDone {
		if err != nil {
			e.logf("pml: buffered send to rank %d tag %d failed after it completed: %v", r.peer, r.tag, err)
		}
		return
	}
	r.mpiDone = true
	r.complete(Status{Source: r.peer, Tag: r.tag, Count: r.msgLen}, err)
}

// schedSend sends FRAGs for r's copy ranges, at most pml_send_pipeline_depth
// in flight. Only one goroutine schedules a request at a time (ob1's
// req_lock): others just ask the running one to loop again.
func (e *Engine) schedSend(r *Request) {
	if r.sched.Add(1) != 1 {
		return
	}
	for {
		e.sendFrags(r)
		if r.sched.Add(-1) == 0 {
			return
		}
	}
}

func (e *Engine) sendFrags(r *Request) {
	p := e.peers[r.peerWorld].Load()
	maxData := max(1, p.lim.MaxSendSize-hdr.FragLen)
	hb := hdrPool.Get().(*[hdr.MaxLen]byte)
	defer hdrPool.Put(hb)
	for {
		e.mu.Lock()
		if r.pmlDone || len(r.ranges) == 0 || r.inflight >= e.depth {
			e.mu.Unlock()
			return
		}
		sp := &r.ranges[0]
		off, n := sp.off, min(sp.n, maxData)
		sp.off += n
		sp.n -= n
		if sp.n == 0 {
			r.ranges = r.ranges[1:]
		}
		dst := r.dstReq
		e.mu.Unlock()
		h := hdr.Frag{Offset: uint64(off), SrcReq: r.id, DstReq: dst}
		hl := h.Encode(hb[:])
		e.sendChunk(r, p, hdr.TypeFrag, hb[:hl], off, n)
	}
}

// onAck: the receiver matched and asks for bytes [off, off+size) by copy.
func (e *Engine) onAck(ep btl.Endpoint, b, _ []byte) {
	h, _, err := hdr.DecodeAck(b)
	if err != nil {
		e.protocolError(ep, "%v", err)
		return
	}
	e.mu.Lock()
	r := e.reqs.get(h.SrcReq)
	if r == nil || r.kind != kindSend || r.peerWorld != ep.Peer() {
		e.mu.Unlock()
		e.protocolError(ep, "ACK for unknown send request %d", h.SrcReq)
		return
	}
	off, size := int(h.SendOffset), int(h.SendSize)
	if h.SendOffset > uint64(r.msgLen) || h.SendSize > uint64(r.msgLen) || off+size > r.msgLen {
		e.mu.Unlock()
		e.protocolError(ep, "ACK range [%d,+%d) beyond a message of %d bytes", h.SendOffset, h.SendSize, r.msgLen)
		return
	}
	if size == 0 {
		size = r.msgLen - off
	}
	r.acked = true
	r.dstReq = h.DstReq
	if size > 0 {
		r.ranges = append(r.ranges, span{off, size})
	}
	if r.proto == RDMADirectGet && off == 0 && size == r.msgLen {
		// The receiver declined the get: everything goes by copy.
		r.delivered = 0
	}
	// An ACK that completes r (everything sent and nothing in flight: a
	// synchronous send whose RNDV carried the whole message, say) is the
	// last of the engine to hold it, and schedSend, with nothing to send,
	// is left out: r can go back to the pool instead of to the garbage
	// collector (gompi-bench's Ssend ping-pong allocated two 440-byte
	// requests per message).
	last := !r.pmlDone && !r.mpiDone && !r.slow && r.delivered >= r.msgLen && r.inflight == 0 && len(r.ranges) == 0
	if last {
		r.quiet = true
	}
	e.checkSendLocked(r)
	e.mu.Unlock()
	if !last {
		e.schedSend(r)
	}
}

// onPut: the receiver asks for an RDMA write of [off, off+size) into handle.
func (e *Engine) onPut(ep btl.Endpoint, b, _ []byte) {
	h, _, err := hdr.DecodePut(b)
	if err != nil {
		e.protocolError(ep, "%v", err)
		return
	}
	e.mu.Lock()
	r := e.reqs.get(h.SrcReq)
	if r == nil || r.kind != kindSend || r.peerWorld != ep.Peer() {
		e.mu.Unlock()
		e.protocolError(ep, "PUT for unknown send request %d", h.SrcReq)
		return
	}
	if h.Offset > uint64(r.msgLen) || h.Size > uint64(r.msgLen)-h.Offset || r.buf.Conv != nil {
		e.mu.Unlock()
		e.protocolError(ep, "PUT of [%d,+%d) outside a message of %d bytes", h.Offset, h.Size, r.msgLen)
		return
	}
	if h.Flags&hdr.FlagAck != 0 {
		r.acked = true
		r.dstReq = h.DstReq
	}
	r.inflight++
	e.mu.Unlock()
	off, n := int(h.Offset), int(h.Size)
	handle := append([]byte(nil), h.Handle...)
	dst := h.DstReq
	finish := func(err error) {
		if err != nil {
			// Tell the receiver the put failed, then send the range by copy.
			e.sendFin(ep, dst, off, -1)
			e.mu.Lock()
			r.inflight--
			r.ranges = append(r.ranges, span{off, n})
			e.mu.Unlock()
			e.schedSend(r)
			return
		}
		e.sendFin(ep, dst, off, n)
		e.sendDone(r, n, nil)
	}
	done, err := e.putTo(ep.Peer(), ep, r.buf.Bytes[off:off+n], handle, 0, finish)
	if err != nil {
		finish(err)
	} else if done {
		finish(nil)
	}
}

func (e *Engine) sendFin(ep btl.Endpoint, req uint64, off, n int) {
	hb := hdrPool.Get().(*[hdr.MaxLen]byte)
	h := hdr.Fin{Req: req, Offset: uint64(off), Size: int64(n)}
	l := h.Encode(hb[:])
	w := ep.Peer()
	if err := e.sendImmTo(w, ep, btl.Tag(hdr.TypeFin), hb[:l], nil); err != nil {
		e.sendTo(w, ep, btl.Tag(hdr.TypeFin), hb[:l], nil, func(error) {})
	}
	hdrPool.Put(hb)
}

// onFin: an RDMA operation on our memory finished.
func (e *Engine) onFin(ep btl.Endpoint, b, _ []byte) {
	h, _, err := hdr.DecodeFin(b)
	if err != nil {
		e.protocolError(ep, "%v", err)
		return
	}
	e.mu.Lock()
	r := e.reqs.get(h.Req)
	if r == nil || r.peerWorld != ep.Peer() || (h.Size > 0 && (h.Offset > uint64(r.msgLen) || uint64(h.Size) > uint64(r.msgLen)-h.Offset)) {
		e.mu.Unlock()
		e.protocolError(ep, "FIN for unknown request %d or range", h.Req)
		return
	}
	if r.kind == kindSend {
		// RGET: the receiver read [off, off+size) (or failed: it then ACKs that range).
		if r.proto != RDMADirectGet {
			e.mu.Unlock()
			e.protocolError(ep, "FIN for send request %d, which offered no RDMA get", h.Req)
			return
		}
		r.acked = true
		if h.Size > 0 {
			r.delivered += int(h.Size)
		} else if h.Size < 0 {
			r.slow = true // an ACK follows: FRAGs, scheduled outside the lock
		}
		if !r.slow && !r.pmlDone && !r.mpiDone && r.delivered >= r.msgLen && r.inflight == 0 && len(r.ranges) == 0 {
			// Completed here by the receiver's GETs alone: nothing of the
			// engine holds r after this handler.
			r.quiet = true
		}
		e.checkSendLocked(r)
		e.mu.Unlock()
		return
	}
	if r.regs[h.Offset] == nil {
		e.mu.Unlock()
		e.protocolError(ep, "FIN at offset %d of receive %d, which asked for no PUT there", h.Offset, h.Req)
		return
	}
	e.finPutLocked(r, int(h.Offset), int(h.Size))
	e.mu.Unlock()
	e.schedPuts(r)
}
