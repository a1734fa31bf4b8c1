package pml

import (
	"context"
	"errors"
	"sync"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml/hdr"
)

// The common path of a receive: posting it (Irecv, Recv, the probes),
// storing a matched message's bytes and completing it. Matching is in
// recv_match.go, the rendezvous receive in recv_rndv.go.

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

// Recv is a blocking receive; it allocates nothing for an eager message.
//
// Sendrecv posts its receive with the same lines: the two shared one
// function, which the compiler does not inline (cost 223), and its call
// cost a blocking ping-pong 26 instructions a message (bench/instr.sh:
// 1670.2 against 1696.2).
func (c *Comm) Recv(buf Buffer, src, tag int) (Status, error) {
	e := c.e
	r := e.takeSpare()
	r.parks = e.parksOnly() // Wait parks at once (spinWait)
	var posted *Request
	if buf.Conv == nil {
		posted, _ = c.postPlain(r, buf.Bytes, src, tag, nil, false)
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

// Sendrecv receives into rbuf from src with rtag while it sends sbuf to
// dest with stag (MPI_Sendrecv: the receive posted first, then a blocking
// send, then the wait for the receive, as Open MPI's Irecv, Send, Wait).
// The receive is a blocking Recv's request, not a Handle: nobody else
// holds it. A send that fails cancels the receive unless it matched; the
// result then has both errors. The caller validated the arguments.
func (c *Comm) Sendrecv(sbuf Buffer, dest, stag int, rbuf Buffer, src, rtag int) (Status, error) {
	e := c.e
	r := e.takeSpare()
	r.parks = e.parksOnly()
	var posted *Request
	if rbuf.Conv == nil {
		posted, _ = c.postPlain(r, rbuf.Bytes, src, rtag, nil, false)
	}
	if posted == nil {
		if _, err := c.postRecv(r, rbuf.Bytes, rbuf.Conv, src, rtag, kindRecv, nil); err != nil {
			recycleUnstarted(r)
			return Status{}, err
		}
	}
	serr := c.Send(sbuf, dest, stag, Standard)
	if serr != nil && c.Cancel(r) {
		e.putSpare(r)
		return Status{}, serr
	}
	e.Wait(nil, r)
	st, err := r.status, r.err
	e.putSpare(r)
	if serr != nil {
		err = errors.Join(err, serr)
	}
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
// receive of contiguous bytes from a specific source and tag, with no
// unexpected message of that source and tag but eager data (taken at
// once), nothing failed, closed or to start in the way. r is a clean
// request, or nil for one from the free list (an Irecv's, which counts
// for yieldEvery). The sink is s, or with handle a new Handle's, made
// with the lock held once the receive is sure to be posted (IrecvHandle).
// It returns the request posted and the new Handle, or nil with nothing
// changed when the case does not apply (postRecv then checks it all).
func (c *Comm) postPlain(r *Request, b []byte, src, tag int, s *sink, handle bool) (*Request, *Handle) {
	e := c.e
	if uint(src) >= uint(len(c.group)) || tag < 0 {
		return nil, nil
	}
	e.mu.Lock()
	if len(e.toStart) > 0 || e.troubled.Load() || c.check() != nil {
		e.mu.Unlock()
		return nil, nil
	}
	if c.m.uAll.head != nil {
		if f := c.m.searchUnexpected(src, tag); f != nil {
			// The message is here (a Recv after a Probe; in a neighbour
			// exchange, the peer's message when this rank is the later
			// one, step after step). Eager data is delivered at once,
			// into a blocking Recv's request or, for an Irecv, into a
			// Handle through a request of the free list, which the
			// delivery gives back; the other cases are postRecv's.
			if f.typ != hdr.TypeMatch || s != nil || (r == nil && (!handle || len(e.free) == 0)) {
				e.mu.Unlock()
				return nil, nil
			}
			var h *Handle
			if r == nil {
				r = e.popFreeLocked()
				h = c.newHandleLocked(len(b))
				s = &h.s
			}
			r.kind, r.comm, r.peer, r.tag, r.buf.Bytes, r.sink = kindRecv, c, src, tag, b, s
			e.takeUnexpectedLocked(c, f)
			c.deliverEager(r, f.m.Src, f.m.Tag, f.m.Seq, f.peer, f.data)
			e.freeFrag(f)
			e.unlockFlush()
			return r, h
		}
	}
	irecv := r == nil
	if irecv {
		if len(e.free) == 0 { // postRecv makes a new one
			e.mu.Unlock()
			return nil, nil
		}
		r = e.popFreeLocked()
	}
	var h *Handle
	if handle {
		h = c.newHandleLocked(len(b))
		s = &h.s
	}
	r.kind, r.comm, r.peer, r.tag, r.buf.Bytes, r.sink = kindRecv, c, src, tag, b, s
	c.m.postSpecific(r)
	yielding := irecv && r.postSeq&(yieldEvery-1) == yieldEvery-1
	e.mu.Unlock()
	if yielding {
		yield()
	}
	return r, h
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
func (c *Comm) postRecv(r *Request, b []byte, conv Convertor, src, tag int, kind reqKind, sink *sink) (*Request, error) {
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
	var ackTo *peer // an RNDV's whole message delivered: its ACK
	var ackReq uint64
	var ackLen int
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
			if f.typ == hdr.TypeRndv && len(f.data) == f.msgLen && kind == kindRecv && e.peers[f.peer.world].Load().failed == nil {
				// An RNDV that carried its whole message (queued by
				// rndvWhole): stored and completed as an eager message,
				// answered below, after the lock, as rndvWhole answers.
				c.deliverEager(r, f.m.Src, f.m.Tag, f.m.Seq, f.peer, f.data)
				ackTo, ackReq, ackLen = f.peer, f.srcReq, f.msgLen
			} else {
				e.deliver(r, f)
			}
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
	if ackTo != nil {
		e.ackWhole(ackTo, ackReq, ackLen)
	}
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
	c.e.Progress()
	return c.look(src, tag)
}

// look is Iprobe without the progress call.
func (c *Comm) look(src, tag int) (Status, bool, error) {
	e := c.e
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
//
// While the wait spins it looks at the unexpected queue, after each poll
// that queued a message there, rather than posting a probe: the message
// goes to that queue either way (the receive that follows takes it from
// there), and posting and withdrawing a probe request doubled the
// instructions of a Probe-then-Recv ping-pong. A wait that outlasts the
// spin posts the probe and parks.
func (c *Comm) Probe(ctx context.Context, src, tag int) (Status, error) {
	var st Status
	var found bool
	var err error
	seen := c.m.queued.Load()
	if st, found, err = c.look(src, tag); found || err != nil {
		return st, err
	}
	if c.e.spinWait(nil, func() bool {
		if q := c.m.queued.Load(); q != seen {
			seen = q
			st, found, err = c.look(src, tag)
		}
		return found || err != nil
	}, 0, false) {
		return st, err
	}
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

// Matched is a message a matched probe took out of matching, for Mrecv
// to receive (once).
type Matched struct{ f *frag }

// Improbe is a matched probe: a matching message is removed from matching
// and returned for Mrecv. ok is false when there is none now.
func (c *Comm) Improbe(src, tag int) (Matched, Status, bool, error) {
	c.e.Progress()
	return c.take(src, tag)
}

// take is Improbe without the progress call.
func (c *Comm) take(src, tag int) (Matched, Status, bool, error) {
	e := c.e
	e.mu.Lock()
	if err := c.check(); err != nil {
		e.mu.Unlock()
		return Matched{}, Status{}, false, err
	}
	f := c.m.findUnexpected(src, tag)
	if f == nil {
		var err error
		if len(c.failed) != 0 {
			err = c.recvFailureLocked(src, tag)
		}
		e.mu.Unlock()
		return Matched{}, Status{}, false, err
	}
	e.takeUnexpectedLocked(c, f)
	e.unlockFlush()
	return Matched{f}, Status{Source: int(f.m.Src), Tag: int(f.m.Tag), Count: f.msgLen}, true, nil
}

// Mprobe blocks until a matching message arrives and removes it from
// matching. As Probe, it looks at the unexpected queue while its wait
// spins, and posts a matched probe only to park.
func (c *Comm) Mprobe(ctx context.Context, src, tag int) (Matched, Status, error) {
	var m Matched
	var st Status
	var found bool
	var err error
	seen := c.m.queued.Load()
	if m, st, found, err = c.take(src, tag); found || err != nil {
		return m, st, err
	}
	if c.e.spinWait(nil, func() bool {
		if q := c.m.queued.Load(); q != seen {
			seen = q
			m, st, found, err = c.take(src, tag)
		}
		return found || err != nil
	}, 0, false) {
		return m, st, err
	}
	r := newReq(true)
	if _, err := c.postRecv(r, nil, nil, src, tag, kindMprobe, nil); err != nil {
		recycleUnstarted(r)
		return Matched{}, Status{}, err
	}
	if err := c.e.Wait(ctx, r); err != nil {
		if c.Cancel(r) {
			recycle(r)
			return Matched{}, Status{}, err
		}
		c.e.Wait(nil, r) // matched meanwhile: the message is ours
	}
	m, st, err = Matched{r.frag}, r.status, r.err
	r.frag = nil
	recycle(r)
	if err != nil {
		return Matched{}, Status{}, err
	}
	return m, st, nil
}

// Mrecv receives the message a matched probe returned into buf. A message
// delivered within the call (eager) gets a Handle done at once, shared as
// a send's is (sentHandle): the same status, and nothing to allocate.
func (c *Comm) Mrecv(m *Matched, buf Buffer) (*Handle, error) {
	if m == nil || m.f == nil {
		return nil, mpierr.Errorf(mpierr.ErrArg, "message already received or not from a matched probe")
	}
	f := m.f
	m.f = nil
	e := c.e
	if f.typ == hdr.TypeMatch && buf.Conv == nil && len(f.data) <= len(buf.Bytes) && !e.countStats {
		// Eager bytes that fit, the common case: deliverEager's
		// storing without a request to complete.
		n := copy(buf.Bytes, f.data)
		src, tag := int(f.m.Src), int(f.m.Tag)
		e.mu.Lock()
		e.freeFrag(f)
		e.mu.Unlock()
		return c.sentHandle(src, tag, n), nil
	}
	r := newReq(true)
	r.kind, r.comm, r.buf, r.peer, r.tag = kindRecv, c, buf, int(f.m.Src), int(f.m.Tag)
	e.mu.Lock()
	e.deliver(r, f)
	e.freeFrag(f)
	start := len(e.toStart) > 0
	e.mu.Unlock()
	if start {
		e.runStarts()
	}
	if r.Done() && r.err == nil && r.poolable() {
		st := r.status
		recycle(r)
		return c.sentHandle(st.Source, st.Tag, st.Count), nil
	}
	return handleOf(r), nil
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

// ---- storing and completing (e.mu held but for unpack) ----

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

// finishRecvLocked completes receive r with what it stored (a truncation
// error when the message was longer than the buffer) and gives r back to
// the free list when nobody holds it any more. e.mu held.
func (e *Engine) finishRecvLocked(r *Request) {
	if r.mpiDone {
		return
	}
	r.mpiDone = true
	if r.id != 0 {
		e.reqs.del(r.id)
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

// checkRecvLocked completes r once all of its message arrived and no RDMA
// operation of it is in flight. e.mu held.
func (e *Engine) checkRecvLocked(r *Request) {
	if r.received >= r.msgLen && r.inflight == 0 {
		e.finishRecvLocked(r)
	}
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
	for _, l := range m.spec.m {
		out = m.drainList(l, out)
	}
	m.spec.sweep(nil)
	for i := range m.srcAny {
		out = m.drainList(&m.srcAny[i], out)
	}
	return m.drainList(&m.wild, out)
}

// drainSource removes the posted requests that can only (or also) match
// source src: specific ones and wildcards.
func (m *matchState) drainSource(src int, out []*Request) []*Request {
	for k, l := range m.spec.m {
		if int(k.src()) == src {
			out = m.drainList(l, out)
		}
	}
	m.spec.sweep(nil)
	out = m.drainList(&m.srcAny[src], out)
	return m.drainList(&m.wild, out)
}
