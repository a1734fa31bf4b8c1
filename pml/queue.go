package pml

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
)

// A transport whose queue to a peer is full refuses Send, SendAlloc, Put
// and Get with btl.ErrWouldBlock. The engine then keeps the operation in
// that peer's sendQueue and posts it again from progress (Engine.Progress,
// the waiters' polls and naps, the background poller), oldest first; until
// the queue is empty every later operation to that peer queues behind it,
// so none overtakes a refused one. To the code that made the call, a
// queued operation is one posted and not done yet: its completion runs
// once it was posted and completed, or failed.
//
// The eager fast path (sendNow) does not look at the queues: a queue that
// is not empty sets Engine.troubled, which sends it to the checks of
// Comm.target, as a failed peer does. Nothing is added to it while no
// queue holds anything.

// sendQueue is one peer's refused operations.
type sendQueue struct {
	mu      sync.Mutex
	ops     []queuedOp   // guarded by mu: oldest first
	posting bool         // guarded by mu: a drain is posting ops[0] (it stays there until the transport took it)
	n       atomic.Int32 // len(ops), read without mu: not zero, later operations queue
}

type opKind uint8

const (
	opSend opKind = iota
	opSendAlloc
	opPut
	opGet
)

// queuedOp is an operation the transport refused, with what it needs to
// be posted again.
type queuedOp struct {
	kind   opKind
	ep     btl.Endpoint
	tag    btl.Tag
	hdr    []byte // opSend: a copy of the header, the queue's own
	data   []byte // opSend: the payload; opSendAlloc: the Alloc buffer; opPut, opGet: local memory
	hdrLen int    // opSendAlloc
	handle []byte // opPut, opGet (owned by the caller until completion, as local is)
	off    int    // opPut, opGet
	cb     btl.Completion
}

func (op *queuedOp) post() (bool, error) {
	switch op.kind {
	case opSend:
		return op.ep.Send(op.tag, op.hdr, op.data, op.cb)
	case opSendAlloc:
		return op.ep.SendAlloc(op.tag, op.data, op.hdrLen, op.cb)
	case opPut:
		return op.ep.Put(op.data, op.handle, op.off, op.cb)
	}
	return op.ep.Get(op.data, op.handle, op.off, op.cb)
}

// finish runs the completion of an operation that was queued (its caller
// was told it is not done) once posting it returned done or an error.
func (op *queuedOp) finish(err error) {
	if op.cb != nil {
		op.cb(err)
	}
}

// retryNap is how long a waiter sleeps between retries while operations
// are queued, when polling found nothing to do.
const retryNap = 50 * time.Microsecond

// sendTo is ep.Send (ep reaches world rank w) that never returns
// ErrWouldBlock: a refused send, or any while operations to w are
// queued, is queued (done false, cb runs later). hdr is copied then.
func (e *Engine) sendTo(w int, ep btl.Endpoint, tag btl.Tag, hdr, data []byte, cb btl.Completion) (bool, error) {
	q := &e.queues[w]
	if q.n.Load() == 0 {
		done, err := ep.Send(tag, hdr, data, cb)
		if err == nil || !errors.Is(err, btl.ErrWouldBlock) {
			return done, err
		}
	}
	return e.enqueue(w, queuedOp{kind: opSend, ep: ep, tag: tag, hdr: bytes.Clone(hdr), data: data, cb: cb})
}

// sendAllocTo is ep.SendAlloc as sendTo is ep.Send: a queued buf stays
// with the queue until it is sent.
func (e *Engine) sendAllocTo(w int, ep btl.Endpoint, tag btl.Tag, buf []byte, hdrLen int, cb btl.Completion) (bool, error) {
	q := &e.queues[w]
	if q.n.Load() == 0 {
		done, err := ep.SendAlloc(tag, buf, hdrLen, cb)
		if err == nil || !errors.Is(err, btl.ErrWouldBlock) {
			return done, err
		}
	}
	done, err := e.enqueue(w, queuedOp{kind: opSendAlloc, ep: ep, tag: tag, data: buf, hdrLen: hdrLen, cb: cb})
	if err != nil {
		ep.Free(buf) // refused (peer failed): the buffer is still ours
	}
	return done, err
}

// putTo and getTo are ep.Put and ep.Get as sendTo is ep.Send.
func (e *Engine) putTo(w int, ep btl.Endpoint, local, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdmaTo(w, opPut, ep, local, handle, off, cb)
}

func (e *Engine) getTo(w int, ep btl.Endpoint, local, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdmaTo(w, opGet, ep, local, handle, off, cb)
}

func (e *Engine) rdmaTo(w int, kind opKind, ep btl.Endpoint, local, handle []byte, off int, cb btl.Completion) (bool, error) {
	op := queuedOp{kind: kind, ep: ep, data: local, handle: handle, off: off, cb: cb}
	if e.queues[w].n.Load() == 0 {
		done, err := op.post()
		if err == nil || !errors.Is(err, btl.ErrWouldBlock) {
			return done, err
		}
	}
	return e.enqueue(w, op)
}

// sendImmTo is ep.SendImmediate that refuses (ErrWouldBlock) while
// operations to w are queued: the caller's fallback, a Send, queues
// behind them.
func (e *Engine) sendImmTo(w int, ep btl.Endpoint, tag btl.Tag, hdr, data []byte) error {
	if e.queues[w].n.Load() != 0 {
		return btl.ErrWouldBlock
	}
	return ep.SendImmediate(tag, hdr, data)
}

// enqueue queues op for world rank w and reports it not done, or returns
// the error that stops operations to w (it failed, the engine closed):
// then nothing is queued.
func (e *Engine) enqueue(w int, op queuedOp) (bool, error) {
	q := &e.queues[w]
	e.mu.Lock()
	err := e.closed
	if p := e.peers[w].Load(); err == nil && p != nil {
		err = p.failed
	}
	if err != nil {
		e.mu.Unlock()
		return false, err
	}
	q.mu.Lock()
	q.ops = append(q.ops, op)
	q.n.Add(1)
	q.mu.Unlock()
	e.poll.blocked.Add(1)
	e.troubled.Store(true) // the fast path must see the queue (Comm.target)
	e.mu.Unlock()
	e.poll.queued()
	return false, nil
}

// retry posts queued operations, each peer's oldest first, until the
// transport refuses one again; it returns how many it posted.
func (e *Engine) retry() int {
	n := 0
	for w := range e.queues {
		if e.queues[w].n.Load() != 0 {
			n += e.drain(&e.queues[w])
		}
	}
	return n
}

// drain posts q's operations in order while the transport takes them.
// One goroutine drains a queue at a time; the operation being posted
// stays first in q meanwhile, so that nothing overtakes it.
func (e *Engine) drain(q *sendQueue) int {
	q.mu.Lock()
	if q.posting {
		q.mu.Unlock()
		return 0
	}
	n := 0
	for len(q.ops) > 0 {
		op := q.ops[0]
		q.posting = true
		q.mu.Unlock()
		done, err := op.post()
		q.mu.Lock()
		q.posting = false
		if err != nil && errors.Is(err, btl.ErrWouldBlock) {
			break
		}
		q.ops[0] = queuedOp{}
		q.ops = q.ops[1:]
		q.n.Add(-1)
		e.poll.blocked.Add(-1)
		n++
		q.mu.Unlock()
		if err != nil {
			op.finish(err) // (a SendAlloc's buffer went back to the module with the error)
		} else if done {
			op.finish(nil)
		}
		q.mu.Lock()
	}
	empty := len(q.ops) == 0
	if empty {
		q.ops = nil
	}
	q.mu.Unlock()
	if empty && n > 0 {
		e.poll.settled()
		e.calm()
	}
	return n
}

// calm clears troubled when nothing else keeps it set: no queue holds an
// operation, no peer failed, the engine is open.
func (e *Engine) calm() {
	e.mu.Lock()
	e.calmLocked()
	e.mu.Unlock()
}

func (e *Engine) calmLocked() {
	if e.closed == nil && e.nfailed == 0 && e.poll.blocked.Load() == 0 {
		e.troubled.Store(false)
	}
}

// failQueueLocked takes world rank w's queued operations (but the one a
// drain is posting: its outcome is the drain's) for the caller to fail
// with err once e.mu is released (failQueued).
func (e *Engine) failQueueLocked(w int, out []queuedOp) []queuedOp {
	q := &e.queues[w]
	if q.n.Load() == 0 {
		return out
	}
	q.mu.Lock()
	keep := 0
	if q.posting {
		keep = 1
	}
	taken := q.ops[keep:]
	out = append(out, taken...)
	e.poll.blocked.Add(-int32(len(taken)))
	clear(taken)
	q.ops = q.ops[:keep]
	q.n.Store(int32(keep))
	q.mu.Unlock()
	e.poll.settled()
	return out
}

// failQueued completes taken operations with err (e.mu not held).
func failQueued(ops []queuedOp, err error) {
	for i := range ops {
		op := &ops[i]
		if op.kind == opSendAlloc {
			op.ep.Free(op.data)
		}
		op.finish(err)
	}
}

// waitQueued is the pause of a waiter without polled transports while
// operations are queued: it retries them (and polls), then naps until
// wake or done fires or retryNap passes, so that a transport that stays
// full (a peer that stopped reading) costs no processor.
func (e *Engine) waitQueued(wake, done <-chan struct{}) {
	if e.Progress() == 0 {
		retryPause(wake, done)
	}
}
