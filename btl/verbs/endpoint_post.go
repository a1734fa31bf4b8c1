// The send queue, shared by both send paths: posting work requests and
// choosing which go signaled (postLocked, signalLocked), posting the
// queued operations and the ACKs owed as room comes (drainLocked), and
// Flush with the in-order count of completed operations it waits on
// (doneSeqLocked, fenceLocked).

package verbs

import (
	"fmt"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// Flush calls cb (or returns done) once every operation submitted on the
// endpoint before the call has completed: its work requests finished at
// the device (for fragments: written into the peer's ring; this covers
// copied Sends that returned done too). Operations that failed count as
// completed; cb then gets the endpoint's error. After the module's Close
// it returns an error wrapping ErrClosed and fences nothing.
func (e *endpoint) Flush(cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	e.mu.Lock()
	defer e.unlock()
	if e.doneSeq >= e.opSeq {
		return true, nil
	}
	e.flushes = append(e.flushes, flushWait{seq: e.opSeq, cb: cb})
	e.doneSeqLocked(e.doneSeq) // a pair already down releases it at once
	e.fenceLocked()
	return false, nil
}

// fenceLocked posts a signaled zero-length RDMA WRITE when a flush waits
// and the last work request posted was unsignaled: no completion would
// come for it, and the write's completes everything before it (RC
// completes in order). While flushes wait, every work request is posted
// signaled (postLocked), so one fence is enough.
func (e *endpoint) fenceLocked() {
	if len(e.flushes) == 0 || e.unsig == 0 || e.state != epConnected || e.sqFree == 0 {
		return
	}
	wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWrite, RemoteAddr: e.remote.RingAddr, RKey: e.remote.RingKey}}
	e.postLocked(wr, []wrOp{{kind: opFence}})
}

// sigEvery bounds the unsignaled work requests in a row (at most a
// quarter of the queue depth).
const sigEvery = 16

// signalLocked reports whether op's work request is posted signaled. A
// copied message, its pad and a credit ACK need no completion of their
// own (nothing waits for one): they go unsignaled, so that the device's
// requester need not ask the peer for an acknowledgement of each (the
// soft device's ACK datagram per message), and a later signaled one
// completes them. One in sigEvery work requests, and the one that brings
// the unsignaled messages' ring bytes to a quarter of the ring, are
// signaled: a sender short of queue slots or of its staging copy of the
// ring then always has a signaled request outstanding whose completion
// frees them. Everything is signaled while a flush waits.
func (e *endpoint) signalLocked(op *wrOp) bool {
	switch op.kind {
	case opPad, opMsg, opACK:
	default:
		return true
	}
	return op.cb != nil || op.reg != nil || len(e.flushes) > 0 ||
		e.unsig+1 >= min(sigEvery, max(1, e.m.depth/4)) ||
		uint64(e.unsigTake+op.take)*4 >= e.win.ringSize
}

// post posts wrs, recording ops for their completions; a refusal fails the
// endpoint (the device took some of them, or none, so the pair's state is
// unknown).
func (e *endpoint) postLocked(wrs []ibv.SendWR, ops []wrOp) bool {
	unsig, take := e.unsig, e.unsigTake
	for i := range wrs {
		e.nextID++
		wrs[i].ID = e.nextID
		ops[i].id = e.nextID
		if e.signalLocked(&ops[i]) {
			wrs[i].Flags |= ibv.FlagSignaled
			e.unsig, e.unsigTake = 0, 0
		} else {
			wrs[i].Flags &^= ibv.FlagSignaled
			e.unsig++
			e.unsigTake += ops[i].take
		}
	}
	bad, err := e.qp.PostSend(wrs)
	if err == nil {
		bad = len(wrs)
	} else {
		e.unsig, e.unsigTake = unsig, take // a failed endpoint posts nothing more
	}
	for i := range bad {
		e.ops = append(e.ops, ops[i])
		e.sqFree--
	}
	if err != nil {
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: posting to rank %d: %w", e.m.env.Rank, e.peer, err)))
		return false
	}
	return true
}

// postACKLocked sends the acknowledgements owed, as the send queue allows.
func (e *endpoint) postACKLocked() {
	for e.acksOwed > 0 && e.sqFree > 0 && e.state == epConnected {
		wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWriteWithImm, Imm: immACK, RemoteAddr: e.remote.RingAddr, RKey: e.remote.RingKey}}
		if !e.postLocked(wr, []wrOp{{kind: opACK}}) {
			return
		}
		e.acksOwed--
		e.m.acksSent.Add(1)
	}
}

// drainLocked posts queued operations in order while they fit.
func (e *endpoint) drainLocked() {
	e.postACKLocked()
	for len(e.pending) > 0 && e.state == epConnected {
		op := e.pending[0]
		switch op.kind {
		case opMsg, opClose:
			fk := frameMsg
			if op.kind == opClose {
				fk = frameClose
			}
			if !e.postMsgLocked(fk, op.tag, op.hdr, op.data, op.reg, op.cb, op.seq) {
				return
			}
			if op.abuf != nil {
				e.m.recycle(op.abuf)
			}
			if op.cb != nil && op.reg == nil { // copied: complete now
				e.later = append(e.later, doneCB{op.cb, nil})
			}
		default:
			if !e.postRDMALocked(op) {
				return
			}
		}
		e.pending[0] = nil
		e.pending = e.pending[1:]
	}
	if len(e.pending) == 0 {
		e.pending = nil
	} else if e.state == epConnected {
		e.stalledLocked()
	}
	e.fenceLocked()
}

// doneSeqLocked records that operations up to seq completed and releases
// the flushes they satisfy (all of them once the endpoint is down and
// nothing is posted).
func (e *endpoint) doneSeqLocked(seq uint64) {
	if seq > e.doneSeq {
		e.doneSeq = seq
	}
	down := (e.state == epFailed || e.state == epClosed) && len(e.ops) == e.opsHead && len(e.pending) == 0
	kept := e.flushes[:0]
	for _, f := range e.flushes {
		switch {
		case e.doneSeq >= f.seq && e.err == nil:
			e.later = append(e.later, doneCB{f.cb, nil})
		case e.doneSeq >= f.seq || down:
			e.later = append(e.later, doneCB{f.cb, e.err})
		default:
			kept = append(kept, f)
		}
	}
	e.flushes = kept
}
