package pml

import (
	"errors"
	"runtime"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml/hdr"
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

// startDone ends startSendSeq: its pooled header buffer, if it took one,
// goes back, and every yieldEvery-th send yields.
func startDone(hb *[hdr.MaxLen]byte, seq uint32) {
	putHeaderSpace(hb)
	tick(seq)
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
	e.count(proto, size)
	hb, hbp := r.headerSpace(proto == RDMADirectGet) // an RGET carries a handle
	// One deferred call: with two, this function's returns made the
	// compiler keep its defers on the heap-linked list (deferreturn and
	// its search: 300 instructions of an 8 B Ssend round trip, bench/shapes
	// -mode ssend under callgrind) instead of inline at each return.
	defer startDone(hbp, seq)

	if proto.Eager() {
		if mode == Buffered && release != nil {
			// The data is the packed copy in the attached buffer: the
			// request completes now; the space returns when the transport
			// is done with it.
			r.mpiDone = true
			r.complete(Status{Source: dest, Tag: tag, Count: size}, nil)
		}
		if proto == EagerImmediate {
			n := m.Encode(hb)
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
		done, err := c.sendEager(r, p, hb[:m.Encode(hb)])
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
	r.id = e.reqs.add(r)
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
		n := h.Encode(hb)
		return e.sendCtl(r, p, hdr.TypeRget, hb[:n])
	case RDMADirectPut:
		h := hdr.Rndv{Match: m, MsgLen: uint64(size), SrcReq: r.id}
		h.Flags = hdr.FlagContig | hdr.FlagPin
		if mode == Synchronous {
			h.Flags |= hdr.FlagSync
		}
		n := h.Encode(hb)
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
	n := h.Encode(hb)
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
