package sm

import (
	"fmt"

	"github.com/gompi-org/gompi/btl"
)

// queue appends a pending send and lists the endpoint for Progress.
// Called with e.mu held.
func (e *endpoint) queue(ps pendingSend) {
	if !e.listed {
		e.listed = true
		e.m.pendMu.Lock()
		e.m.pendEps = append(e.m.pendEps, e)
		e.m.pendingN.Store(int32(len(e.m.pendEps)))
		e.m.pendMu.Unlock()
	}
	e.pending = append(e.pending, ps)
}

// drained is what drain completed: callbacks to run once e.mu is released.
type drained struct {
	ok     []btl.Completion // posted: called with nil
	failed []pendingSend    // stopped: called with err
	err    error
}

// run is called after every send: an empty d (nothing was queued) costs
// a test here, not a call with d copied.
func (d *drained) run() {
	if d.ok != nil || d.failed != nil {
		d.runAll()
	}
}

func (d *drained) runAll() {
	for _, cb := range d.ok {
		if cb != nil {
			cb(nil)
		}
	}
	for _, ps := range d.failed {
		if ps.cb != nil {
			ps.cb(d.err)
		}
	}
}

// drain posts queued sends in order until one does not fit. A send that
// fails for good (the peer broke the protocol) fails every queued one.
// Called with e.mu held.
func (e *endpoint) drain() drained {
	var d drained
	k := 0
	var err error
	for ; k < len(e.pending); k++ {
		ps := &e.pending[k]
		if ps.frag == fenceMark {
			d.ok = append(d.ok, ps.cb)
			continue
		}
		if ps.frag >= 0 {
			err = e.post(ps.frag)
		} else {
			var st int
			h := bytesHeader(ps.hdr)
			st, err = e.trySend(ps.tag, &h, ps.data)
			switch {
			case err != nil:
			case st == sentFrag:
				ps.frag, ps.hdr, ps.data = e.lastFrag, nil, nil
				err = errFifoFull
			case st == notSent:
				err = errFifoFull
			}
		}
		if err != nil {
			break
		}
		d.ok = append(d.ok, ps.cb)
	}
	if k > 0 {
		clear(e.pending[:k])
		e.pending = append(e.pending[:0], e.pending[k:]...)
	}
	if err != nil && !isFull(err) {
		if e.err == nil {
			e.err = err
		}
		d.err = e.err
		d.failed = e.dropPending(nil)
	}
	return d
}

// fenceMark is the frag of a Flush's marker in the queue.
const fenceMark = -2

// Flush completes once the sends queued before it are posted: at once
// when none is queued, else through cb when the drain reaches its marker
// (or with the error that fails the queue). Put and Get complete during
// their calls. An error return: the module is closed or the endpoint
// failed.
func (e *endpoint) Flush(cb btl.Completion) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m.closed.Load() {
		return false, fmt.Errorf("sm: module closed: %w", btl.ErrClosed)
	}
	if e.err != nil {
		return false, e.err
	}
	if len(e.pending) == 0 {
		return true, nil
	}
	e.queue(pendingSend{frag: fenceMark, cb: cb})
	return false, nil
}

// terminate fails every queued send with err (returned for the caller to
// complete outside the lock) and makes err the endpoint's terminal error.
func (e *endpoint) terminate(err error, out []pendingSend) []pendingSend {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err == nil {
		e.err = err
	}
	return e.dropPending(out)
}

// dropPending empties the queue, returning its fragments to the pool, and
// appends the dropped sends to out. Called with e.mu held.
func (e *endpoint) dropPending(out []pendingSend) []pendingSend {
	for _, ps := range e.pending {
		if ps.frag >= 0 {
			e.m.pool.put(ps.frag)
		}
		out = append(out, ps)
	}
	e.pending = nil
	return out
}
