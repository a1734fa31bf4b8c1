package pml

import (
	"context"
	"sync/atomic"
)

// Handle is a nonblocking call's request as its caller holds it
// (mpi.Request is one): the result once the call is done, and until then
// the PML request behind it. Its state word is read and written here only.
//
// A receive's Handle is in sink mode: the engine writes the result into
// its sink at completion and gives the PML request back itself when no
// call on the Handle holds it (sink). Any other Handle's result is copied
// in by the first call that finds the PML request done, which gives that
// request back. Calls on one Handle from several goroutines at once stay
// safe: each holds a use count in the state word while it touches the PML
// request, and only an unused one is given back (MPI calls waiting twice
// on one request erroneous; gompi allows it).
//
// 32 bytes: the one allocation of a nonblocking call, whose bytes set the
// garbage collector's pace in a message-rate loop (48 -> 32 bytes raised
// sm's 8 B rate by 8%). The Handles of IrecvHandle and IsendHandle come
// from per-communicator slabs, so a window of calls allocates one slab
// per 64; mpi.Request is defined as this type, so mpi converts a *Handle
// to its *Request and back without copying or unsafe.
type Handle struct {
	s sink
	// p is the PML request, set at creation and never changed (nil for a
	// call done at once); once the sink is gone, p may be back in the
	// pool (and another's) and is not touched. A plain p saves an atomic
	// store, a locked instruction, per nonblocking call.
	p *Request
}

// handleSlab is a block of Handles handed out in order.
type handleSlab struct {
	next atomic.Int32
	hs   [64]Handle
}

// maxKept bounds the Handles a communicator keeps for reuse (KeepHandles).
const maxKept = 1024

// newHandle returns a zero Handle from c's slab: one allocation per 64
// Handles instead of one each (a nonblocking call's allocation was 16% of
// the receiving rank's time in gompi-bench rate 8 B, perf). A slab stays
// in memory while any of its Handles is referenced (2 KiB held by one kept
// Handle).
func (c *Comm) newHandle() *Handle {
	for {
		s := c.hslab.Load()
		if s != nil {
			if i := s.next.Add(1) - 1; int(i) < len(s.hs) {
				return &s.hs[i]
			}
		}
		ns := new(handleSlab)
		ns.next.Store(1)
		if c.hslab.CompareAndSwap(s, ns) {
			return &ns.hs[0]
		}
	}
}

// newHandleLocked returns a zero receive Handle in sink mode, reusable
// (KeepHandles), for an Irecv that postPlain posts: one KeepHandles gave
// back, or the next of rslab's. e.mu held, which is what makes it safe
// without newHandle's atomic add, a locked instruction per Irecv.
func (c *Comm) newHandleLocked(size int) *Handle {
	h := popLast(&c.kept)
	if h != nil {
		*h = Handle{}
	} else {
		if c.rslab == nil || c.rnext == len(c.rslab.hs) {
			c.rslab, c.rnext = new(handleSlab), 0
		}
		h = &c.rslab.hs[c.rnext]
		c.rnext++
	}
	h.s.State.set(sinkMode | sinkReusable | smallFlag(size))
	return h
}

// IrecvHandle posts a receive into buf from communicator rank src (or
// AnySource) with tag (or AnyTag) and returns the Handle the caller holds
// it by (see Handle): mpi.Comm.Irecv's one call into the PML. The caller
// validated src and tag. buf's fields go on separately: a Buffer (40
// bytes) passed on whole is copied through memory with stalling wide
// loads.
func (c *Comm) IrecvHandle(buf Buffer, src, tag int) (*Handle, error) {
	if buf.Conv == nil {
		if r, h := c.postPlain(nil, buf.Bytes, src, tag, nil, true); r != nil {
			h.p = r
			return h, nil
		}
	}
	// The sink gets the result: sink mode, set before postRecv shares h.
	h := c.newHandle()
	h.s.State.set(sinkMode | smallFlag(buf.Len()))
	r, err := c.postRecv(nil, buf.Bytes, buf.Conv, src, tag, kindRecv, &h.s)
	if err != nil {
		return nil, err
	}
	h.p = r
	return h, nil
}

// IsendHandle starts a send of buf to communicator rank dest and returns
// the Handle the caller holds it by: mpi.Comm's one call into the PML for
// a nonblocking send. A message sent within the call (isendNow) gets a
// Handle done at once, shared by the sends with the same status
// (sentHandle). release, if not nil, is called once the PML no longer
// needs buf (buffered mode, see isend); such a send does not try
// isendNow's immediate way. The caller validated dest and tag.
func (c *Comm) IsendHandle(buf Buffer, dest, tag int, mode Mode, release func()) (*Handle, error) {
	var r *Request
	var err error
	if release == nil {
		r, err = c.isendNow(buf, dest, tag, mode)
		if err == nil && r == nil {
			return c.sentHandle(dest, tag, buf.Len()), nil
		}
	} else {
		r, err = c.isend(buf, dest, tag, mode, release)
	}
	if err != nil {
		return nil, err
	}
	h := c.newHandle()
	h.p = r
	return h, nil
}

// sentSlots is how many Handles of sends done at once a communicator
// keeps (sentHandle), a power of two.
const sentSlots = 8

// sentHandle returns a Handle done at once with the status of a send of n
// bytes to dest with tag. Such a Handle never changes (no call on it
// writes to it), so one can stand for every such send with the same
// status: a loop of eager Isends allocates nothing, as Open MPI returns
// one shared completed request for them. The communicator keeps the last
// one made for each of sentSlots slots of (dest, tag), so that a halo
// exchange's sends to its neighbours, or a loop's sends with two tags,
// find theirs too (one Handle for all would allocate one per such send).
func (c *Comm) sentHandle(dest, tag, n int) *Handle {
	slot := &c.sent[uint(dest*5+tag)%sentSlots]
	if d := slot.Load(); d != nil && d.s.Extra == nil && int(d.s.Source) == dest && int(d.s.Tag) == tag && int(d.s.Count) == n {
		return d
	}
	d := DoneHandle(Status{Source: dest, Tag: tag, Count: n})
	slot.Store(d)
	return d
}

// handleOf returns a Handle for r, a request the caller made and hands
// over (Mrecv's, say).
func handleOf(r *Request) *Handle { return &Handle{p: r} }

// DoneHandle returns a Handle done with status st.
func DoneHandle(st Status) *Handle {
	h := &Handle{}
	h.s.store(st, nil)
	if st.Cancelled {
		h.s.State.set(sinkCancelled)
	}
	return h
}

// Pin keeps h from ever being taken back by KeepHandles: for a caller
// that holds on to h after handing it out (mpi.Persistent asks its last
// round's Handle whether that round is over), so that a WaitallRelease
// given h cannot pass it to another Irecv.
func (h *Handle) Pin() {
	if h.s.State.Load()&sinkReusable != 0 {
		h.s.State.and(^uint32(sinkReusable))
	}
}

// KeepHandles gives back Handles that no call, nor the engine, touches
// any more, for c's later Irecvs (newHandleLocked); it keeps those that
// IrecvHandle made reusable, done without an error and unheld, and
// ignores the others. It clears hs.
func (c *Comm) KeepHandles(hs []*Handle) {
	n := 0
	for _, h := range hs {
		if h != nil && h.s.State.Load()&^sinkSmall == sinkGone|sinkMode|sinkReusable && h.s.Extra == nil {
			hs[n] = h
			n++
		}
	}
	if n > 0 {
		e := c.e
		e.mu.Lock()
		k := min(n, maxKept-len(c.kept))
		c.kept = append(c.kept, hs[:k]...)
		e.mu.Unlock()
	}
	clear(hs)
}

// stored returns the result copied into h; valid once Acquire returned
// nil.
func (h *Handle) stored() (Status, error) { return h.s.Result() }

// Ready returns h's result when it is here without an error and nothing
// is left to wait for or give back (a send done at once, a receive whose
// sink the engine filled): read in place, about 30 instructions a request
// of a rate window against about 100 through WaitAlone (callgrind of
// gompi-bench rate 8 B under gorun).
func (h *Handle) Ready() (Status, bool) {
	if s := h.s.State.Load(); (h.p == nil || s&sinkGone != 0) && h.s.Extra == nil {
		return Status{Source: int(h.s.Source), Tag: int(h.s.Tag), Count: int(h.s.Count), Cancelled: s&sinkCancelled != 0}, true
	}
	return Status{}, false
}

// Acquire returns the PML request with a use count held (Release drops
// it), or nil when the result is already here (stored).
func (h *Handle) Acquire() *Request {
	if h.p == nil || h.s.State.Load()&sinkGone != 0 { // gone never ends: no count needed
		return nil
	}
	if h.s.State.Add(1)&sinkGone != 0 {
		h.Release()
		return nil
	}
	return h.p
}

// Release drops a use taken by Acquire (giving the PML request back when
// the engine left that to the last user).
func (h *Handle) Release() { h.s.release(h.p) }

// Progress runs the engine of h's PML request once (nothing when the
// result is already here).
func (h *Handle) Progress() {
	if pr := h.Acquire(); pr != nil {
		pr.Engine().Progress()
		h.Release()
	}
}

// Done reports whether the call completed.
func (h *Handle) Done() bool {
	pr := h.Acquire()
	if pr == nil {
		return true
	}
	d := pr.Done()
	h.Release()
	return d
}

// Result returns the status and error of a Handle known to be done.
func (h *Handle) Result() (Status, error) {
	pr := h.Acquire()
	if pr == nil {
		return h.stored()
	}
	return h.finish(pr)
}

// finish takes the result of pr, which is done and held by the caller (a
// use count), and gives pr back to the pool when nobody else holds it.
func (h *Handle) finish(pr *Request) (Status, error) {
	st, back, err := h.finishKeep(pr)
	if back != nil {
		recycle(back)
	}
	return st, err
}

// finishKeep is finish that returns pr to the caller to give back (nil
// when it is not this call's to give back), as finishTakenKeep does.
func (h *Handle) finishKeep(pr *Request) (Status, *Request, error) {
	// Sink mode: the engine stores the result (maybe not quite yet: it
	// marks the sink gone just after completing pr); held, pr is still
	// ours. Or another call takes the result.
	if h.s.State.Load()&sinkMode != 0 || h.s.State.or(sinkTaken)&sinkTaken != 0 {
		st, err := pr.Result()
		return st, h.s.releaseKeep(pr), err
	}
	return h.finishTakenKeep(pr)
}

// finishTaken stores the result of pr, which is done, taken by this call
// and held with a use count, and gives pr back when nobody else holds it.
func (h *Handle) finishTaken(pr *Request) (Status, error) {
	st, back, err := h.finishTakenKeep(pr)
	if back != nil {
		recycle(back)
	}
	return st, err
}

// finishTakenKeep is finishTaken that returns pr to the caller to give
// back (nil when another call still holds it).
func (h *Handle) finishTakenKeep(pr *Request) (Status, *Request, error) {
	st, err := pr.Result()
	h.s.store(st, err)
	// Gone (later calls read st and err) and this call's use dropped, at
	// once. A call that looks from now on sees gone: once the count is
	// zero, nobody can reach pr any more.
	add := uint32(sinkGone - 1)
	if st.Cancelled {
		add += sinkCancelled
	}
	if h.s.State.Add(add)&sinkUsers == 0 {
		return st, pr, err
	}
	return st, nil, err
}

// WaitAlone is Wait's common case: no other call on h yet. For a
// receive's Handle whose sink is gone, the result is read with no locked
// instruction and nothing to give back. Otherwise this call takes the
// result (later calls see taken and leave it), with one use held: two
// locked instructions per request (the swap and finishTakenKeep's add)
// instead of three (acquire, taken, gone). A wait without a context always
// ends with the result, so taking it first is safe; a WaitContext may give
// up, so it takes it at the end. more: the caller has more requests to
// wait for after this one (Engine.waitMore). back is the PML request for
// the caller to give back (Engine.RecycleAll: a Waitall gives them back in
// batches); ok false: not the common case, nothing done.
func (h *Handle) WaitAlone(more bool) (st Status, back *Request, ok bool, err error) {
	pr := h.p
	if pr == nil { // done at once (an eager send, say): the result is here
		st, err = h.stored()
		return st, nil, true, err
	}
	if s := h.s.State.Load(); s&sinkMode != 0 {
		if s&sinkGone != 0 {
			st, err = h.stored()
			return st, nil, true, err
		}
		// The process's one engine is this request's: poll it first
		// without a use count (spinSink says why).
		if e := engines.sole.Load(); e != nil && h.spinSink(e, more) {
			st, err = h.stored()
			return st, nil, true, err
		}
		if pr = h.Acquire(); pr == nil {
			st, err = h.stored()
			return st, nil, true, err
		}
		waitFor(pr, more) // without a context it returns once pr is done
		if h.s.State.Load()&sinkUsers > 1 {
			pr.wake() // another goroutine may be parked on pr too
		}
		st, back, err = h.finishKeep(pr)
		return st, back, true, err
	}
	if !h.s.State.compareAndSwap(0, sinkTaken|1) {
		return Status{}, nil, false, nil
	}
	waitFor(pr, more) // without a context it returns once pr is done
	if h.s.State.Load()&sinkUsers > 1 {
		pr.wake() // another goroutine may be parked on pr too
	}
	st, back, err = h.finishTakenKeep(pr)
	return st, back, true, err
}

// spinSink polls e, the engine of h's request, until the engine stored
// the result in h, for as long as a wait spins; it reports whether it
// did. h is a receive's Handle (sink mode): only its state word is read,
// with no use count on the PML request, whose atomic add (a locked
// instruction) waited for the stores of a send just before it, a
// Sendrecv's or an Irecv-Send-Wait's, to reach the peer's cache (8% of
// the samples of a Sendrecv exchange over sm).
// more: the caller waits for more requests after this one; polls that
// find nothing then pause as waitMore's do, for a small receive
// (sinkSmall).
func (h *Handle) spinSink(e *Engine, more bool) bool {
	return e.spinWait(nil, func() bool { return h.s.State.Load()&sinkGone != 0 }, 0, more && h.s.State.Load()&sinkSmall != 0)
}

// SpinAny polls the process's one engine, for as long as a wait spins,
// until one of n Handles (at(i) for i < n; nil ones skipped) is done, and
// returns its index: Waitany's common case, without the use counts of
// Acquire and Release (spinSink says why). It returns -1 when the spin
// ends first, or at once when the process has several engines or a
// Handle is not a receive's in sink mode: the caller then waits the
// general way.
func SpinAny(n int, at func(int) *Handle) int {
	e := engines.sole.Load()
	if e == nil {
		return -1
	}
	live := false
	for i := range n {
		if h := at(i); h != nil {
			if h.p == nil || h.s.State.Load()&sinkMode == 0 {
				return -1
			}
			live = true
		}
	}
	if !live {
		return -1
	}
	found := -1
	e.spinWait(nil, func() bool {
		for i := range n {
			if h := at(i); h != nil && h.s.State.Load()&sinkGone != 0 {
				found = i
				return true
			}
		}
		return false
	}, 0, false)
	return found
}

// smallFlag is sinkSmall for a receive of size bytes that waitMore would
// pause for.
func smallFlag(size int) uint32 {
	if size <= bulkMax {
		return sinkSmall
	}
	return 0
}

// waitFor waits for pr; more: the caller has more requests to wait for
// after this one (Engine.waitMore).
func waitFor(pr *Request, more bool) {
	if more {
		pr.Engine().waitMore(pr)
	} else {
		pr.Engine().Wait(nil, pr)
	}
}

// Wait blocks until the call completes and returns its result; with a
// ctx that ends first it returns ctx.Err() and h stays valid. ctx may be
// nil.
func (h *Handle) Wait(ctx context.Context) (Status, error) {
	if ctx == nil {
		if st, back, ok, err := h.WaitAlone(false); ok {
			if back != nil {
				recycle(back)
			}
			return st, err
		}
	}
	pr := h.Acquire()
	if pr == nil {
		return h.stored()
	}
	if err := pr.Engine().Wait(ctx, pr); err != nil {
		h.Release()
		return Status{}, err
	}
	// Alone on h (one use, ours, not taken): take it with one swap.
	if h.s.State.Load()&sinkMode == 0 && h.s.State.compareAndSwap(1, sinkTaken|1) {
		return h.finishTaken(pr)
	}
	// One completion rings one parked waiter: pass it on when another
	// goroutine may be parked on pr too.
	if h.s.State.Load()&sinkUsers > 1 {
		pr.wake()
	}
	return h.finish(pr)
}

// Test reports whether the call completed, without blocking; the status
// and error are valid when done is true.
func (h *Handle) Test() (Status, bool, error) {
	if h.p != nil && h.s.State.Load()&(sinkMode|sinkGone) == sinkMode {
		// A receive's Handle (sink mode) not done yet, in a process
		// with one engine, the request's: poll it and read the state
		// word, without the use count's two locked instructions
		// (spinSink says why; a loop of Test waiting for a message).
		if e := engines.sole.Load(); e != nil {
			e.Progress()
			if h.s.State.Load()&sinkGone == 0 {
				return Status{}, false, nil
			}
			st, err := h.stored()
			return st, true, err
		}
	}
	pr := h.Acquire()
	if pr == nil {
		st, err := h.stored()
		return st, true, err
	}
	if !pr.Done() {
		pr.Engine().Progress()
		if !pr.Done() {
			h.Release()
			return Status{}, false, nil
		}
	}
	st, err := h.finish(pr)
	return st, true, err
}

// Cancel cancels a receive that has not matched yet (Comm.Cancel).
func (h *Handle) Cancel() {
	if pr := h.Acquire(); pr != nil {
		pr.Comm().Cancel(pr)
		h.Release()
	}
}
