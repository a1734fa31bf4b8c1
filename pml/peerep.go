package pml

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl"
)

// The hooks of this file serve the layers above the PML that move their
// own fragments and data (the tensor rendezvous, pml/tensor): the endpoint
// of a peer, sends and puts through the engine's queue of refused
// operations, the btl tags of their range, failure notices, and a wait
// that polls the transports as the PML's own waits do.

// Upper tags: the btl tags the engine routes to the layers above it
// (btl.go reserves 0x60-0x6f for the tensor rendezvous).
const (
	UpperTagFirst btl.Tag = 0x60
	UpperTagLast  btl.Tag = 0x6f
)

// upper is the engine's state for the layers above it.
type upper struct {
	handlers [UpperTagLast - UpperTagFirst + 1]atomic.Pointer[btl.Handler]
	attached sync.Map // key -> value (Attach)

	mu       sync.Mutex // guards the fields below
	watchers map[int]func(world int, err error)
	nextW    int
}

// register routes the upper tags of d to the handlers SetUpperHandler
// installs. A fragment of a tag without one is dropped: it is late
// traffic of a layer instance that is gone.
func (u *upper) register(d *btl.Dispatcher) {
	for t := UpperTagFirst; t <= UpperTagLast; t++ {
		slot := &u.handlers[t-UpperTagFirst]
		d.Register(t, func(ep btl.Endpoint, hdr, data []byte) {
			if h := slot.Load(); h != nil {
				(*h)(ep, hdr, data)
			}
		})
	}
}

// SetUpperHandler installs h for tag (UpperTagFirst..UpperTagLast),
// replacing the one before; nil removes it. h runs as any btl.Handler
// does: on the goroutine that polls the transport (or the sender's, for
// in-process ranks), with hdr and data valid only during the call; it
// must not block.
func (e *Engine) SetUpperHandler(tag btl.Tag, h btl.Handler) {
	if tag < UpperTagFirst || tag > UpperTagLast {
		panic(fmt.Sprintf("pml: upper tag %#x outside %#x-%#x", uint8(tag), uint8(UpperTagFirst), uint8(UpperTagLast)))
	}
	slot := &e.upper.handlers[tag-UpperTagFirst]
	if h == nil {
		slot.Store(nil)
		return
	}
	slot.Store(&h)
}

// Attach returns the value attached to e under key, made by mk on the
// first call for that key (once per engine and key, even when callers
// race). A layer above keeps its per-engine state there, so that it lives
// as long as the engine.
func (e *Engine) Attach(key any, mk func() any) any {
	if v, ok := e.upper.attached.Load(key); ok {
		return v
	}
	e.upper.mu.Lock()
	defer e.upper.mu.Unlock()
	if v, ok := e.upper.attached.Load(key); ok {
		return v
	}
	v := mk()
	e.upper.attached.Store(key, v)
	return v
}

// WatchPeers calls f(w, err) when world rank w fails (err wraps
// mpierr.ErrProcFailed or mpierr.ErrProtocol) and f(-1, err) when the
// engine is aborted or closed; failures that happened before the call
// are reported from within it. f may be called more than once for a rank
// (a failure that races with the call): it must be idempotent. It runs
// without the engine's lock, on the goroutine that reported the failure,
// and must not block. stop ends the calls (one in flight may still run).
func (e *Engine) WatchPeers(f func(world int, err error)) (stop func()) {
	u := &e.upper
	u.mu.Lock()
	if u.watchers == nil {
		u.watchers = map[int]func(int, error){}
	}
	id := u.nextW
	u.nextW++
	u.watchers[id] = f
	u.mu.Unlock()
	type past struct {
		w   int
		err error
	}
	var old []past
	e.mu.Lock()
	for w := range e.peers {
		if p := e.peers[w].Load(); p != nil && p.failed != nil {
			old = append(old, past{w, p.failed})
		}
	}
	if e.closed != nil {
		old = append(old, past{-1, e.closed})
	}
	e.mu.Unlock()
	for _, p := range old {
		f(p.w, p.err)
	}
	return func() {
		u.mu.Lock()
		delete(u.watchers, id)
		u.mu.Unlock()
	}
}

// notify calls the watchers with (w, err). Called without e.mu.
func (u *upper) notify(w int, err error) {
	u.mu.Lock()
	if len(u.watchers) == 0 {
		u.mu.Unlock()
		return
	}
	fs := make([]func(int, error), 0, len(u.watchers))
	for _, f := range u.watchers {
		fs = append(fs, f)
	}
	u.mu.Unlock()
	for _, f := range fs {
		f(w, err)
	}
}

// PeerEndpoint returns the transport endpoint this engine uses for world
// rank r (nil when none was chosen, or r is out of range). Layers above
// the PML that move data themselves (the tensor rendezvous's puts) use it,
// so that their data and the engine's messages to r take the same
// endpoint, whose ordering (a Put's data lands before a fragment sent after
// the Put completed) they rely on.
func (e *Engine) PeerEndpoint(r int) btl.Endpoint {
	if r < 0 || r >= len(e.peers) {
		return nil
	}
	if p := e.peers[r].Load(); p != nil {
		return p.ep
	}
	return nil
}

// PeerSend is PeerEndpoint(w).Send through the engine's queue for w: a
// send the transport refuses with btl.ErrWouldBlock, or any made while
// operations to w wait in that queue, is queued and posted again from
// progress (done false; cb runs once it was posted and completed), so
// that fragments to w keep their order. hdr is copied; data is the
// module's until completion, as for btl.Endpoint.Send. cb must not be
// nil. An error means nothing was sent and cb is not called: w failed,
// the engine closed, or w has no endpoint (btl.ErrUnreachable).
func (e *Engine) PeerSend(w int, tag btl.Tag, hdr, data []byte, cb btl.Completion) (done bool, err error) {
	ep := e.PeerEndpoint(w)
	if ep == nil {
		return false, fmt.Errorf("rank %d: %w", w, btl.ErrUnreachable)
	}
	return e.sendTo(w, ep, tag, hdr, data, cb)
}

// PeerPut is PeerEndpoint(w).Put through the engine's queue for w, as
// PeerSend is Send: a refused put waits in the queue and is posted again
// from progress, and sends made after it queue behind it. local and
// handle are the module's (or the queue's) until completion; cb must not
// be nil. Errors as btl.Endpoint.Put (btl.ErrBadHandle: nothing posted)
// and as PeerSend.
func (e *Engine) PeerPut(w int, local, handle []byte, off int, cb btl.Completion) (done bool, err error) {
	ep := e.PeerEndpoint(w)
	if ep == nil {
		return false, fmt.Errorf("rank %d: %w", w, btl.ErrUnreachable)
	}
	return e.putTo(w, ep, local, handle, off, cb)
}

// PeerQueued reports whether operations to world rank w wait in the
// engine's queue (a caller that posts on the endpoint directly must then
// go through PeerSend or PeerPut to keep the order).
func (e *Engine) PeerQueued(w int) bool {
	return w >= 0 && w < len(e.queues) && e.queues[w].n.Load() != 0
}

// Await waits until done reports true, as Wait waits for a request: it
// polls the polled transports (dispatching what they find, on this
// goroutine) for pml_wait_spin, then parks where the PML's own waiters
// park (a transport's Block, announced, so that senders wake it), until
// wake is signalled. Whoever makes done true must then signal wake (a
// channel of capacity 1, whose tokens merge). size is the largest
// message the wait is for, which in-process ranks weigh to choose
// whether to spin (btl.Spinner.SpinFor); a negative size says that what
// the wait is for does not come through their hand-offs, and they do not
// spin for it. It returns nil once done holds, or ctx.Err() when ctx ends
// first; ctx may be nil.
func (e *Engine) Await(ctx context.Context, size int, done func() bool, wake chan struct{}) error {
	if done() {
		return nil
	}
	if size < 0 && !e.poll.active() {
		e.Progress()
		if done() {
			return nil
		}
	} else if e.spinWait(nil, done, max(size, 0), false) {
		return nil
	}
	if e.inbox != nil {
		e.inbox.Park() // as in wait: senders dispatch their hand-offs themselves
		defer e.inbox.Unpark()
	}
	var stop <-chan struct{}
	if ctx != nil {
		stop = ctx.Done()
		// A transport's Block watches wake only: have ctx ring it too.
		defer context.AfterFunc(ctx, func() {
			select {
			case wake <- struct{}{}:
			default:
			}
		})()
	}
	for !done() {
		if stop != nil && ctx.Err() != nil {
			return ctx.Err()
		}
		switch {
		case e.poll.active():
			e.poll.block(wake, stop)
		case e.poll.blocked.Load() != 0:
			e.waitQueued(wake, stop)
		case stop == nil:
			<-wake
		default:
			select {
			case <-wake:
			case <-stop:
			}
		}
	}
	return nil
}
