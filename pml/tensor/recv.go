package tensor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// Recv receives the tensor that rank src sends under (step, name). It
// returns when the tensor is here, the request failed, or ctx ended
// (ctx.Err(); the request is then withdrawn: nothing is written into
// memory of this rank's after the sender acknowledges, and the tensor
// stays at the sender for a later Recv). The returned tensor's slices
// belong to the caller; Recycle gives Data back for reuse.
func (r *Rendezvous) Recv(ctx context.Context, step int64, name string, src int) (Tensor, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return Tensor{}, err
	}
	w := waiters.Get().(*recvWaiter)
	rq, size, err := r.start(step, name, src, nil, w)
	if err != nil {
		putWaiter(w)
		return Tensor{}, err
	}
	// This goroutine polls the transports for the answer (and handles
	// whatever control messages they bring), as a plain Recv does.
	e := r.pc.Engine()
	wctx := ctx
	if ctx.Done() == nil {
		wctx = nil // never ends: no watch needed
	}
	if err := e.Await(wctx, size, w.ready, w.wake); err != nil {
		if r.cancel(rq) {
			return Tensor{}, err // (w is dropped: nothing tells it now, but it is not reused)
		}
		e.Await(nil, size, w.ready, w.wake) // the outcome came first: it is being told
	}
	res := w.res
	putWaiter(w)
	r.recycleReq(rq)
	return res.t, res.err
}

// recvReqs recycles Recv's receives (RecvAsync's are left to the
// collector): one allocation a Recv fewer.
var recvReqs = sync.Pool{New: func() any { return new(recvReq) }}

// recycleReq gives rq back once it is told and out of the table (a
// receive the sender still has a last word on stays there, and is left
// to the collector).
func (r *Rendezvous) recycleReq(rq *recvReq) {
	r.mu.Lock()
	done := rq.told && r.reqs[rq.idx] != rq
	r.mu.Unlock()
	if done {
		*rq = recvReq{}
		recvReqs.Put(rq)
	}
}

// waiters recycles Recv's waiters (each with its channel): two
// allocations a Recv fewer (few, in outbox.go, says what one costs). A
// waiter goes back once its outcome is in (ready): the one thing its
// teller may still do then is offer a token on wake, which a later
// Recv's wait takes as a spurious wake-up and checks ready again.
var waiters = sync.Pool{New: func() any { return &recvWaiter{wake: make(chan struct{}, 1)} }}

func putWaiter(w *recvWaiter) {
	w.res = result{}
	w.done.Store(false)
	select {
	case <-w.wake:
	default:
	}
	waiters.Put(w)
}

// recvWaiter is where a Recv's outcome goes: res, then done, then a token
// on wake.
type recvWaiter struct {
	res  result
	done atomic.Bool
	wake chan struct{}
}

func (w *recvWaiter) ready() bool { return w.done.Load() }

func (w *recvWaiter) tell(t Tensor, err error) {
	w.res = result{t, err}
	w.done.Store(true)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// RecvAsync is Recv without waiting: done is called once with the tensor
// or the error. It may be called before RecvAsync returns (an argument
// error, a closed rendezvous); otherwise it runs where the answer is
// handled: on a goroutine that polls the transports (the rendezvous's
// progress goroutine, which polls while RecvAsyncs are pending, any MPI
// call of this process waiting meanwhile, or a Send of a large tensor) or
// on the goroutine of an in-process peer. So done must be short and must not block: it must not
// call Recv, Close or blocking MPI operations (RecvAsync, Send and
// Recycle are fine). Requests are batched (WithBatching).
func (r *Rendezvous) RecvAsync(step int64, name string, src int, done func(Tensor, error)) {
	if done == nil {
		done = func(Tensor, error) {}
	}
	if _, _, err := r.start(step, name, src, done, nil); err != nil {
		done(Tensor{}, err)
	}
}

// Recycle gives the Data of a tensor returned by Recv back to the
// rendezvous, which hands it to a later Recv of the same size instead of
// allocating (and zeroing) a new buffer. The caller must not use t.Data
// afterwards. Other slices are ignored.
func (r *Rendezvous) Recycle(t Tensor) {
	if len(t.Data) == 0 {
		return
	}
	r.mu.Lock()
	r.pool.put(t.Data)
	r.mu.Unlock()
}

// result is a receive's outcome, for Recv's channel.
type result struct {
	t   Tensor
	err error
}

// recvReq is a receive in progress on the receiving rank, keyed by its
// request index. Guarded by Rendezvous.mu.
type recvReq struct {
	idx  uint32
	src  int
	key  key
	m    meta   // what the destination is sized for
	dest []byte // the destination (nil for an empty or dead tensor)
	// Registration of the destination (or of the proxy) with the
	// transport to src; handle and transport go in the request.
	reg       btl.Registration
	proxy     *proxyBuf
	proxyMod  btl.Module
	handle    []byte
	transport string
	pull      bool // the receiver reads the content (its transport's Get finishes within the call)

	done   func(Tensor, error) // RecvAsync's callback, or
	w      *recvWaiter         // Recv's waiter
	told   bool                // the caller has its outcome (or gave up)
	queued bool                // its request waits in a batch, unsent
	sentRe bool                // a TENSOR_RE_REQUEST went out
}

// releaseReg gives up the destination's registration (the proxy's goes
// back to the rendezvous with putProxy).
func (rq *recvReq) releaseReg() {
	if rq.reg != nil && rq.proxy == nil {
		rq.reg.Release()
	}
	rq.reg = nil
}

// start validates a receive, allocates its destination when the
// meta-data is cached, and sends (or batches) its TENSOR_REQUEST. size is
// the content's expected size (0 when unknown), for the wait.
func (r *Rendezvous) start(step int64, name string, src int, done func(Tensor, error), w *recvWaiter) (rq *recvReq, size int, err error) {
	if err := checkName(name); err != nil {
		return nil, 0, fmt.Errorf("tensor: recv: %w", mpierr.Errorf(mpierr.ErrArg, "%v", err))
	}
	if src < 0 || src >= r.size {
		return nil, 0, mpierr.Errorf(mpierr.ErrRank, "tensor: source %d not in 0..%d", src, r.size-1)
	}
	var out outbox
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		r.run(&out)
	}()
	switch {
	case r.aborted != nil:
		return nil, 0, r.aborted
	case r.closed:
		return nil, 0, ErrClosed
	case r.peerErr[src] != nil:
		return nil, 0, r.peerErr[src]
	}
	rq = recvReqs.Get().(*recvReq)
	*rq = recvReq{idx: r.slot<<slotShift | r.nextIdx, src: src, key: key{step, name}, done: done, w: w}
	for { // the next counter value whose index is free (it wraps; until it does, every one is)
		r.nextIdx = (r.nextIdx + 1) & idxMask
		if r.nextIdx == 0 {
			r.idxWrapped = true
		} else if !r.idxWrapped || r.reqs[r.slot<<slotShift|r.nextIdx] == nil {
			break
		}
	}
	r.reqs[rq.idx] = rq
	r.live[src]++
	e := reqEntry{index: rq.idx, step: step, name: name}
	if m, ok := r.cache[cacheKey{src, name}]; ok {
		r.st.hits.Add(1)
		r.destLocked(rq, m)
		e.hasMeta, e.meta, e.handle, e.transport, e.pull = true, m, rq.handle, rq.transport, rq.pull
	} else {
		r.st.misses.Add(1)
	}
	r.st.requests.Add(1)
	if done != nil {
		r.async.Add(1)
		r.wakePump() // it polls while RecvAsyncs pend
	}
	r.requestLocked(rq, e, false, w != nil, &out)
	return rq, int(rq.m.bytes), nil
}

// destLocked allocates rq's destination for m and registers it with the
// transport to rq.src when that transport can put. A destination the
// transport does not register gets a registered proxy buffer. A content
// of pullMin bytes or more that the transport can read within its call
// (btl.SyncGetter: shared memory, where a Get is copied by both
// processes at once, and in-process ranks) is pulled instead: nothing is
// registered here, the sender exposes the content and this rank reads it.
// A content of at most inlineMax bytes comes inline in the NOTIFY.
func (r *Rendezvous) destLocked(rq *recvReq, m meta) {
	rq.m = m
	rq.dest, rq.handle, rq.transport, rq.pull = nil, nil, "", false
	if m.dead || m.bytes == 0 {
		return
	}
	rq.dest = r.pool.get(int(m.bytes))
	if m.bytes <= inlineMax && !r.cfg.forceProxy {
		// Small: the content rides in the NOTIFY (no registration here,
		// no put, which over shared memory is a system call per tensor).
		return
	}
	ep := r.endpoint(rq.src)
	if r.canPull(ep, m.bytes) {
		rq.pull = true
		return
	}
	if ep == nil || ep.Module().Caps()&btl.CapPut == 0 {
		return // the content comes in a message
	}
	mod := ep.Module()
	var reg btl.Registration
	var err error
	if !r.cfg.forceProxy {
		reg, err = mod.Register(rq.dest, btl.AccessRemoteWrite|btl.AccessLocalWrite)
	}
	if r.cfg.forceProxy || err != nil {
		p, perr := r.takeProxyLocked(mod, len(rq.dest))
		if perr != nil {
			return // neither registers: the content comes in a message
		}
		rq.proxy, rq.proxyMod, reg = p, mod, p.reg
	}
	rq.reg = reg
	rq.handle = append([]byte(nil), reg.Handle()...)
	rq.transport = mod.Name()
}

// canPull reports whether a content of n bytes from the peer of ep is
// read by this rank (destLocked).
func (r *Rendezvous) canPull(ep btl.Endpoint, n uint64) bool {
	if ep == nil || r.cfg.pullMin <= 0 || n < uint64(r.cfg.pullMin) || r.cfg.forceProxy || ep.Module().Caps()&btl.CapGet == 0 {
		return false
	}
	_, ok := ep.(btl.SyncGetter)
	return ok
}
