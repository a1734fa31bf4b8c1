// How a pair goes down: the liveness probe of a pair whose queued
// operations wait on the peer, failure (failLocked, reported once with
// PeerFailed), the close frame of an orderly Close, and the release of
// the pair's device objects.

package verbs

import (
	"errors"
	"fmt"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// probeAfter is how long operations wait for room before the endpoint
// checks that the peer is alive.
const probeAfter = 100 * time.Millisecond

// stalledLocked starts the liveness probe of an endpoint whose queued
// operations wait for the peer (its ACKs): without it a peer that died
// after taking our messages would leave them queued forever (TensorFlow's
// hang on a lost ACK), since no work request would be outstanding to fail.
func (e *endpoint) stalledLocked() {
	if e.probe == nil {
		e.probe = time.AfterFunc(probeAfter, e.probeAlive)
	}
}

// probeAlive posts a zero-length RDMA WRITE while operations are still
// queued: a live peer's device completes it at once, a dead one's never,
// and the QP's retries then end in RETRY_EXC_ERR, which fails the pair.
func (e *endpoint) probeAlive() {
	e.mu.Lock()
	defer e.unlock()
	e.probe = nil
	if e.state != epConnected || len(e.pending) == 0 {
		e.idleTicks = 0
		return
	}
	if e.sendsDone != e.probeMark {
		e.probeMark, e.idleTicks = e.sendsDone, 0
	} else if e.idleTicks++; e.m.livenessTicks > 0 && e.idleTicks >= e.m.livenessTicks {
		// The device has completed nothing, not even a probe, for the
		// liveness limit: the peer is gone even if the QP's own retries
		// have not said so yet.
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: rank %d completed no work request for %v while operations waited",
			e.m.env.Rank, e.peer, time.Duration(e.idleTicks)*probeAfter)))
		return
	}
	if e.sqFree > 0 && !e.probing {
		wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWrite, RemoteAddr: e.remote.RingAddr, RKey: e.remote.RingKey}}
		if !e.postLocked(wr, []wrOp{{kind: opProbe}}) {
			return
		}
		e.probing = true
	}
	e.probe = time.AfterFunc(probeAfter, e.probeAlive)
}

// procFailed wraps err as a peer failure.
func procFailed(err error) error {
	return &classedError{msg: err.Error(), wraps: []error{mpierr.ErrProcFailed, err}}
}

type classedError struct {
	msg   string
	wraps []error
}

func (e *classedError) Error() string   { return e.msg }
func (e *classedError) Unwrap() []error { return e.wraps }

// failLocked moves the endpoint to failed (err wraps ErrProcFailed or
// ErrProtocol: reported with PeerFailed once mu is released) or closed
// (err wraps ErrClosed), completes the queued operations with err and
// moves the QP to the error state, so that the device flushes the posted
// ones (their completions then carry err).
func (e *endpoint) failLocked(err error) {
	if e.state == epFailed || e.state == epClosed {
		return
	}
	wasLive := e.state == epConnected
	if errors.Is(err, btl.ErrClosed) {
		e.state = epClosed
	} else {
		e.state = epFailed
		if !e.reported && !e.m.closed.Load() {
			e.reported = true
			e.report = err
		}
	}
	e.err = err
	if e.probe != nil {
		e.probe.Stop()
		e.probe = nil
	}
	e.failPendingLocked(err)
	if wasLive {
		e.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState)
	}
	e.doneSeqLocked(e.doneSeq)
}

// failPendingLocked completes every queued operation with err and gives
// back its staging buffer and registration.
func (e *endpoint) failPendingLocked(err error) {
	for _, op := range e.pending {
		e.completeLocked(op.cb, err)
		if op.abuf != nil {
			e.m.recycle(op.abuf)
		}
		if op.reg != nil {
			e.m.cache.put(op.reg)
		}
	}
	e.pending = nil
}

// sendClose fails the queued operations with ErrClosed and sends the
// close frame (queued behind nothing, waiting for room if needed). It
// reports whether a frame is on its way.
func (e *endpoint) sendClose() bool {
	e.mu.Lock()
	defer e.unlock()
	if e.state != epConnected {
		return false
	}
	err := e.m.errClosed()
	e.failPendingLocked(err)
	e.opSeq++
	e.closeSeq = e.opSeq
	if !e.postMsgLocked(frameClose, 0, nil, nil, nil, nil, e.closeSeq) && e.state == epConnected {
		e.pending = append(e.pending, &pendOp{kind: opClose, seq: e.closeSeq})
	}
	return true
}

// closeDelivered reports whether the close frame completed (or the pair
// went down).
func (e *endpoint) closeDelivered() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state != epConnected || e.doneSeq >= e.closeSeq
}

// close marks the endpoint closed for the module's Close and completes
// everything with err: queued and posted operations (the device objects
// go next, so no completion will come for the posted ones). Called with
// the module's goroutines stopped and pollMu held.
func (e *endpoint) close(err error) {
	e.mu.Lock()
	e.failLocked(err)
	e.abandonLocked()
	e.unlock()
}

// abandonLocked completes the posted operations with the endpoint's
// error without waiting for their completions.
func (e *endpoint) abandonLocked() {
	for i := e.opsHead; i < len(e.ops); i++ {
		op := &e.ops[i]
		if op.reg != nil {
			e.m.cache.put(op.reg)
		}
		if op.last {
			e.completeLocked(op.cb, e.err)
		}
	}
	e.ops, e.opsHead = nil, 0
	e.doneSeqLocked(e.opSeq)
}

// destroy releases the pair's device objects.
func (e *endpoint) destroy() {
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Destroy())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Destroy())
	}
	for _, mr := range []ibv.MR{e.ringMR, e.stageMR} {
		if mr != nil {
			errs = append(errs, mr.Dereg())
		}
	}
	e.pin.Unpin()
	if err := errors.Join(errs...); err != nil {
		e.m.env.Logf("verbs: rank %d: releasing the pair with rank %d: %v", e.m.env.Rank, e.peer, err)
	}
}
