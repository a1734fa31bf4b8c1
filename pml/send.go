package pml

import (
	"errors"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml/hdr"
	"runtime"
)

// isend starts a send of buf to communicator rank dest. release, if not
// nil, is called once the PML no longer needs buf (buffered mode: buf is
// then the packed copy in the attached buffer and the request completes at
// once). The caller validated dest and tag.
func (c *Comm) isend(buf Buffer, dest, tag int, mode Mode, release func()) (*Request, error) {
	r := newReq(true)
	if err := c.startSend(r, buf, dest, tag, mode, release); err != nil {
		recycleUnstarted(r)
		return nil, err
	}
	return r, nil
}

// Send is a blocking send. It allocates nothing when the message goes
// eagerly and completes during the call.
func (c *Comm) Send(buf Buffer, dest, tag int, mode Mode) error {
	e := c.e
	// sendNow called here rather than through a wrapper: one call less
	// before the transport's on a blocking send's path.
	if r, done, err := c.sendNow(buf.Bytes, buf.Conv, dest, tag, mode); done || err != nil {
		if r != nil { // went from the user's buffer under r
			e.Wait(nil, r)
			err = r.err
			recycle(r)
		}
		return err
	}
	r := newReq(true)
	if err := c.startSend(r, buf, dest, tag, mode, nil); err != nil {
		recycleUnstarted(r)
		return err
	}
	e.Wait(nil, r)
	err := r.err
	recycle(r)
	return err
}

func (c *Comm) target(dest, tag int) (*peer, error) {
	e := c.e
	p := e.peers[c.group[dest]].Load()
	if p == nil || p.ep == nil {
		return nil, mpierr.Errorf(mpierr.ErrProcFailed, "no transport reaches rank %d", dest)
	}
	if e.troubled.Load() {
		// A peer failed or the engine closed: read why under the lock.
		e.mu.Lock()
		err := p.failed
		if err == nil {
			err = e.closed
		}
		if err == nil && tag < 0 && len(c.failed) != 0 {
			err = c.groupFailure() // an operation of the whole group (ft.go)
		}
		e.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if e.queues[p.world].n.Load() != 0 {
			return p, errQueued
		}
	}
	return p, nil
}

// errQueued: Comm.target found operations to the peer queued (queue.go).
// The message must queue behind them: not by the fast path.
var errQueued = errors.New("pml: operations queued for the peer")

// isendNow is isend (without a release) that sends a small message at once
// when it can: it then returns a nil request and the send is complete
// (ob1's isend tries the transport's immediate send the same way, before
// it allocates a request). Otherwise it returns the request in flight.
func (c *Comm) isendNow(buf Buffer, dest, tag int, mode Mode) (*Request, error) {
	r, done, err := c.sendNow(buf.Bytes, buf.Conv, dest, tag, mode)
	if err != nil || done {
		if done {
			tick(c.seqs[dest].send.Load()) // about once per yieldEvery, however many goroutines send
		}
		return r, err
	}
	return c.isend(buf, dest, tag, mode, nil)
}

// sendNow is the eager fast path of Send and isendNow. done reports that
// it took the message: then either it is gone (r nil) or it went to the
// transport from the user's buffer under r (r must be waited on and
// recycled). done false: the general path must carry it; nothing changed.
// The buffer comes in its fields: a whole Buffer (40 bytes) passed on is
// copied through memory with stalling wide loads.
func (c *Comm) sendNow(b []byte, conv Convertor, dest, tag int, mode Mode) (r *Request, done bool, err error) {
	if mode == Synchronous || mode == Buffered || conv != nil {
		return nil, false, nil
	}
	p, err := c.target(dest, tag)
	if err != nil {
		if err == errQueued {
			return nil, false, nil // startSend queues it
		}
		return nil, false, err
	}
	e := c.e
	// What Select answers, without asking it for the common sizes
	// (peer_internal_test checks peer.immMax and peer.prepMax).
	proto := EagerImmediate
	if e.force != ForceNone || len(b) > p.immMax {
		if e.force == ForceNone && len(b) != 0 && len(b) <= p.prepMax {
			proto = EagerPrepared
		} else {
			proto = Select(SendInfo{Mode: mode, Size: len(b), Contiguous: true, Caps: p.caps, Limits: p.lim, LeavePinned: e.leavePinned, Force: e.force})
			if !proto.Eager() || proto == EagerAllocated {
				return nil, false, nil
			}
		}
	}
	ps := &c.seqs[dest]
	seq := uint16(ps.send.Add(1) - 1)
	if int16(seq-uint16(ps.grant.Load())) >= 0 && e.window != 0 { // c.overWindow, written out: sendNow is too big to inline it
		// Flow control: the receiver holds enough of this rank's
		// messages; this one goes without its data (flow.go).
		r = newReq(true)
		if err := c.startSendSeq(r, Buffer{Bytes: b}, dest, tag, mode, nil, uint32(seq), true); err != nil {
			recycleUnstarted(r)
			return nil, true, err
		}
		return r, true, nil
	}
	m := hdr.Match{Seq: seq, Ctx: c.ctx, Src: int32(c.rank), Tag: int32(tag)}
	// A transport that takes the header by value is offered every eager
	// message from the user's buffer, not only those up to ImmediateMax:
	// ob1 too tries the transport's sendi for a larger eager message once
	// it has its request (start_copy); here the request is made only if
	// the transport refuses (gompi-bench rate over sm, 512 B: 2.46-3.51 ->
	// 4.01-5.59 M/s, four alternated runs). Not when a protocol is forced:
	// then the message goes the forced way.
	if p.hs != nil && (proto == EagerImmediate || proto == EagerPrepared && e.force == ForceNone) {
		// The header by value, in registers: no pooled buffer.
		h0, h1 := m.Words()
		if err = p.hs.SendImmediateHeader(btl.Tag(hdr.TypeMatch), h0, h1, b); err == nil {
			e.count(EagerImmediate, len(b))
			return nil, true, nil
		}
		proto = EagerPrepared // refused (ErrWouldBlock): as below
	}
	hb := hdrPool.Get().(*[hdr.MaxLen]byte)
	n := m.Encode(hb[:])
	if proto == EagerImmediate {
		err = e.sendImmTo(p.world, p.ep, btl.Tag(hdr.TypeMatch), hb[:n], b)
		if err == nil {
			hdrPool.Put(hb)
			e.count(EagerImmediate, len(b))
			return nil, true, nil
		}
	}
	// Prepared: from the user buffer (the sequence number is taken).
	r = newReq(true)
	r.kind, r.comm, r.peer, r.tag, r.mode, r.proto = kindSend, c, dest, tag, mode, EagerPrepared
	r.buf.Bytes = b
	r.msgLen, r.peerWorld, r.ep = len(b), p.world, p.ep
	e.count(EagerPrepared, len(b))
	sent, err := c.sendEager(r, p, hb[:n])
	hdrPool.Put(hb)
	if err != nil {
		recycle(r)
		return nil, true, err
	}
	if sent {
		e.finishSend(r, nil)
	}
	return r, true, nil
}

// yieldEvery: a goroutine that makes nonblocking calls (or rendezvous
// sends) gives up its processor once per this many of them (a power of
// two). Each nonblocking call allocates its mpi.Request, and a rank in a
// loop of them runs until the runtime preempts it, 10 ms later; a garbage
// collection that starts meanwhile gets no processor for its worker, so
// its mark phase, with write barriers on, stretched over 1.6-3.5 ms of
// every ~16 ms of an 8-byte message-rate loop (GODEBUG=gctrace=1).
// Yielding ends it in 0.1-0.2 ms: rate 8 B 7.03-7.32 -> 7.95-8.19 M/s,
// 512 B 2.86-2.98 -> 3.29-3.54 (five alternated runs). Blocking eager
// calls allocate
// nothing and do not yield: their paths stay as they were (yielding in the
// paths both kinds share measured 2-3% slower in a blocking ping-pong).
const yieldEvery = 1024

// tick yields when n, a running count of calls, is a multiple of
// yieldEvery.
func tick(n uint32) {
	if n&(yieldEvery-1) == 0 {
		yield()
	}
}

// yield is runtime.Gosched (a variable for a test that counts the yields).
var yield = runtime.Gosched

func (e *Engine) count(p Protocol, n int) {
	if !e.countStats {
		return
	}
	e.Stats.Sent[p].Add(1)
	e.Stats.Bytes[p].Add(int64(n))
}

// startSend runs the sender's side of the chosen protocol up to the first
// fragment.
func (c *Comm) startSend(r *Request, buf Buffer, dest, tag int, mode Mode, release func()) error {
	return c.startSendSeq(r, buf, dest, tag, mode, release, 0, false)
}

// startSendSeq is startSend for a message whose sequence number seq was
// taken already (haveSeq), or is taken here.
func (c *Comm) startSendSeq(r *Request, buf Buffer, dest, tag int, mode Mode, release func(), seq uint32, haveSeq bool) error {
	e := c.e
	p, err := c.target(dest, tag)
	if err != nil && err != errQueued { // queued: the sends below queue behind
		return err
	}
	size := buf.Len()
	contig := buf.Conv == nil
	proto := Select(SendInfo{Mode: mode, Size: size, Contiguous: contig, Caps: p.caps, Limits: p.lim, LeavePinned: e.leavePinned, Force: e.force})
	if !haveSeq {
		seq = c.seqs[dest].send.Add(1) - 1
	}
	// Flow control (flow.go): beyond the window nothing carries data
	// before the receiver matched it.
	over := c.overWindow(dest, uint16(seq))
	if over && proto.Eager() {
		proto = SendPipeline
	}
	r.kind, r.comm, r.peer, r.tag, r.buf, r.mode, r.proto, r.release = kindSend, c, dest, tag, buf, mode, proto, release
	r.msgLen, r.peerWorld, r.ep = size, p.world, p.ep
	m := hdr.Match{Seq: uint16(seq), Ctx: c.ctx, Src: int32(c.rank), Tag: int32(tag)}
	defer tick(seq) // a rendezvous is long: the defer costs nothing to speak of
	e.count(proto, size)
	hb := hdrPool.Get().(*[hdr.MaxLen]byte)
	defer hdrPool.Put(hb)

	if proto.Eager() {
		if mode == Buffered && release != nil {
			// The data is the packed copy in the attached buffer: the
			// request completes now; the space returns when the transport
			// is done with it.
			r.mpiDone = true
			r.complete(Status{Source: dest, Tag: tag, Count: size}, nil)
		}
		if proto == EagerImmediate {
			n := m.Encode(hb[:])
			var data []byte
			if contig {
				data = buf.Bytes
			} else { // (a local array here would escape: one allocation per Isend)
				tmp := make([]byte, size)
				buf.Conv.SetPosition(0)
				data = tmp[:buf.Conv.Pack(tmp)]
			}
			if e.sendImmTo(p.world, p.ep, btl.Tag(hdr.TypeMatch), hb[:n], data) == nil {
				e.finishSend(r, nil)
				return nil
			}
			proto = EagerAllocated
			if contig && size > 0 && p.caps&btl.CapSendInPlace != 0 {
				proto = EagerPrepared
			}
			r.proto = proto
		}
		done, err := c.sendEager(r, p, hb[:m.Encode(hb[:])])
		if err != nil {
			return err
		}
		if done {
			e.finishSend(r, nil)
		}
		return nil
	}

	// Everything the engine reads under its lock is set before the request
	// becomes findable (another goroutine may fail it at once: Abort, a
	// peer's death).
	var handle []byte
	if proto == RDMADirectGet {
		if reg, err := p.ep.Module().Register(buf.Bytes, btl.AccessRemoteRead); err == nil {
			r.reg, handle = reg, reg.Handle()
		} else {
			// Registration failed: fall back to a plain rendezvous.
			r.proto, proto = SendPipeline, SendPipeline
		}
	}
	// Rendezvous: the request must be findable before the peer can answer.
	// An Abort or the peer's failure since target() looked would not see
	// it: check again under the lock.
	e.mu.Lock()
	if err := e.closed; err != nil || p.failed != nil {
		if err == nil {
			err = p.failed
		}
		e.mu.Unlock()
		if r.reg != nil {
			r.reg.Release()
			r.reg = nil
		}
		return err
	}
	r.id = e.nextID
	e.nextID++
	e.reqs[r.id] = r
	if mode == Buffered && release != nil {
		// The data lives in the attached buffer now: complete at MPI level.
		r.mpiDone = true
		r.complete(Status{Source: dest, Tag: tag, Count: size}, nil)
	}
	e.mu.Unlock()

	switch proto {
	case RDMADirectGet:
		h := hdr.Rget{Match: m, MsgLen: uint64(size), SrcReq: r.id, Handle: handle}
		h.Flags = hdr.FlagContig
		n := h.Encode(hb[:])
		return e.sendCtl(r, p, hdr.TypeRget, hb[:n])
	case RDMADirectPut:
		h := hdr.Rndv{Match: m, MsgLen: uint64(size), SrcReq: r.id}
		h.Flags = hdr.FlagContig | hdr.FlagPin
		if mode == Synchronous {
			h.Flags |= hdr.FlagSync
		}
		n := h.Encode(hb[:])
		return e.sendCtl(r, p, hdr.TypeRndv, hb[:n])
	}
	// RNDV with a first chunk: send pipeline, RDMA pipeline, buffered, synchronous.
	h := hdr.Rndv{Match: m, MsgLen: uint64(size), SrcReq: r.id}
	if contig && proto == RDMAPipeline {
		h.Flags |= hdr.FlagContig
	}
	if mode == Synchronous {
		h.Flags |= hdr.FlagSync
	}
	n := h.Encode(hb[:])
	first := min(size, FirstChunk(p.lim))
	if over {
		first = 0
	}
	return e.sendChunk(r, p, hdr.TypeRndv, hb[:n], 0, first)
}

// sendEager sends the MATCH fragment of an eager message (prepared or allocated).
func (c *Comm) sendEager(r *Request, p *peer, h []byte) (bool, error) {
	e := c.e
	size := r.buf.Len()
	cb := func(err error) { e.finishSend(r, err) }
	if r.proto == EagerPrepared {
		return e.sendTo(p.world, p.ep, btl.Tag(hdr.TypeMatch), h, r.buf.Bytes, cb)
	}
	b, err := p.ep.Alloc(len(h) + size)
	if err != nil {
		b = make([]byte, len(h)+size)
		copy(b, h)
		e.pack(r, b[len(h):], 0)
		return e.sendTo(p.world, p.ep, btl.Tag(hdr.TypeMatch), b[:len(h)], b[len(h):], cb)
	}
	copy(b, h)
	e.pack(r, b[len(h):], 0)
	return e.sendAllocTo(p.world, p.ep, btl.Tag(hdr.TypeMatch), b, len(h), cb)
}

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
	if r.pmlDone {
		return
	}
	r.pmlDone = true
	delete(e.reqs, r.id)
	if r.reg != nil {
		r.reg.Release()
		r.reg = nil
	}
	if r.release != nil {
		r.release()
	}
	if !r.mpiDone {
		r.mpiDone = true
		r.complete(Status{Source: r.peer, Tag: r.tag}, err)
	}
}

// checkSendLocked completes r when the protocol is finished.
func (e *Engine) checkSendLocked(r *Request) {
	if r.pmlDone || !r.acked || r.delivered < r.msgLen || r.inflight > 0 || len(r.ranges) > 0 {
		return
	}
	r.pmlDone = true
	delete(e.reqs, r.id)
	if r.reg != nil {
		r.reg.Release()
		r.reg = nil
	}
	if r.release != nil {
		r.release()
	}
	if !r.mpiDone {
		r.mpiDone = true
		r.complete(Status{Source: r.peer, Tag: r.tag, Count: r.msgLen}, nil)
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
	r := e.reqs[h.SrcReq]
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
	e.checkSendLocked(r)
	e.mu.Unlock()
	e.schedSend(r)
}

// onPut: the receiver asks for an RDMA write of [off, off+size) into handle.
func (e *Engine) onPut(ep btl.Endpoint, b, _ []byte) {
	h, _, err := hdr.DecodePut(b)
	if err != nil {
		e.protocolError(ep, "%v", err)
		return
	}
	e.mu.Lock()
	r := e.reqs[h.SrcReq]
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
	r := e.reqs[h.Req]
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
