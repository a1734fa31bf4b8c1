// The completion side of a pair. poll empties its completion queue: send
// completions retire the posted work requests in order, ACKs give back
// ring room, inbound frames in the ring and immediates are dispatched
// upward (onRecv), and consumed receives are posted again.

package verbs

import (
	"encoding/binary"
	"fmt"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// onSendDoneLocked handles a send completion: it completes the work
// request it names and every unsignaled one posted before it (RC
// completes in post order).
func (e *endpoint) onSendDoneLocked(wc *ibv.WC) {
	if e.opsHead == len(e.ops) || wc.ID < e.ops[e.opsHead].id || wc.ID > e.ops[len(e.ops)-1].id {
		e.failLocked(mpierr.Errorf(mpierr.ErrProtocol, "verbs: rank %d: completion %#x for rank %d names no work request posted", e.m.env.Rank, wc.ID, e.peer))
		return
	}
	for e.opsHead < len(e.ops) && e.ops[e.opsHead].id <= wc.ID {
		e.retireLocked(wc)
	}
}

// retireLocked completes the oldest posted work request, whose
// completion (or a later one's) is wc.
func (e *endpoint) retireLocked(wc *ibv.WC) {
	op := &e.ops[e.opsHead]
	e.opsHead++
	e.sendsDone++
	if e.opsHead == len(e.ops) {
		e.ops, e.opsHead = e.ops[:0], 0
	}
	e.sqFree++
	err := wc.Err()
	if err != nil {
		if e.state == epConnected {
			e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: %v to rank %d: %w", e.m.env.Rank, opName(op.kind), e.peer, err)))
		}
		err = e.err
		if err == nil { // a flush while connecting cannot happen; keep the class anyway
			err = procFailed(wc.Err())
		}
	}
	switch op.kind {
	case opMsg, opClose:
		e.win.written(op.take)
	case opProbe:
		e.probing = false
	}
	if op.reg != nil {
		e.m.cache.put(op.reg)
	}
	if op.last {
		e.completeLocked(op.cb, err)
		if op.seq != 0 {
			e.doneSeqLocked(op.seq)
		}
	}
	*op = wrOp{}
}

func opName(k opKind) string {
	return [...]string{"pad", "message", "close frame", "ACK", "RDMA write", "RDMA read", "RDMA write with immediate", "liveness probe", "fence"}[k]
}

// poll takes what the endpoint's completion queue holds: send
// completions and ACKs under mu, then messages and immediates dispatched
// in order with no endpoint lock held, then the ACKs due and the receives
// to post again. Called with module.pollMu held.
func (e *endpoint) poll() int {
	if e.cqDead {
		return 0
	}
	n, err := e.cq.Poll(e.wcs)
	if err != nil {
		e.cqDead = true
		e.mu.Lock()
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: completion queue of rank %d: %w", e.m.env.Rank, e.peer, err)))
		e.abandonLocked()
		e.unlock()
		return 1
	}
	if n == 0 {
		return 0
	}
	wcs := e.wcs[:n]
	// Pass 1: send completions, ACKs, receive errors.
	e.mu.Lock()
	for i := range wcs {
		wc := &wcs[i]
		if wc.ID&recvBit == 0 {
			e.onSendDoneLocked(wc)
			continue
		}
		e.rqFree++
		if err := wc.Err(); err != nil {
			if e.state == epConnected {
				e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: receive from rank %d: %w", e.m.env.Rank, e.peer, err)))
			}
			continue
		}
		if wc.Imm == immACK && e.state == epConnected {
			if err := e.win.acked(); err != nil {
				e.failLocked(fmt.Errorf("rank %d: %w", e.peer, err))
			}
		}
	}
	e.drainLocked()
	e.unlock()
	// Pass 2: messages and immediates, in arrival order.
	acks := 0
	for i := range wcs {
		wc := &wcs[i]
		if wc.ID&recvBit == 0 || wc.Status != ibv.WCSuccess || wc.Imm == immACK {
			continue
		}
		e.mu.Lock()
		st := e.state
		e.mu.Unlock()
		if st != epConnected {
			continue // the ring's contents no longer count
		}
		due, err := e.onRecv(wc)
		if err != nil {
			e.mu.Lock()
			e.failLocked(err)
			e.unlock()
			continue
		}
		if due {
			acks++
		}
	}
	e.mu.Lock()
	e.acksOwed += acks
	e.postACKLocked()
	if e.state == epConnected && e.rqFree >= e.m.repostBatch {
		e.repostLocked()
	}
	e.unlock()
	return n
}

// repostLocked posts the receives consumed (zero-length: immediates need
// a receive, the data goes to the written address).
func (e *endpoint) repostLocked() {
	r := e.rwrs[:e.rqFree]
	for i := range r {
		r[i] = ibv.RecvWR{ID: recvBit | uint64(i)}
	}
	if _, err := e.qp.PostRecv(r); err != nil {
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: posting receives for rank %d: %w", e.m.env.Rank, e.peer, err)))
		return
	}
	e.rqFree = 0
}

// onRecv handles an inbound WRITE_WITH_IMM: a control message in the ring
// (dispatched in place) or an immediate for TagImm. It reports whether an
// ACK is due. Garbage in the ring is an error wrapping mpierr.ErrProtocol.
func (e *endpoint) onRecv(wc *ibv.WC) (bool, error) {
	m := e.m
	if wc.Imm != immMsg {
		var h [8]byte
		binary.LittleEndian.PutUint32(h[0:], wc.Imm)
		binary.LittleEndian.PutUint32(h[4:], wc.ByteLen)
		m.env.Dispatch.Dispatch(e, TagImm, h[:], nil)
		return false, nil
	}
	r := len(e.ring)
	pos := int(e.rwin.tail % uint64(r))
	take := 0
	h, err := decodeFrame(e.ring[pos:], e.rwin.seq)
	if err == nil && h.kind == framePad {
		take, pos = int(h.length), 0
		h, err = decodeFrame(e.ring, e.rwin.seq)
		if err == nil && h.kind == framePad {
			err = mpierr.Errorf(mpierr.ErrProtocol, "verbs: two pad frames in a row")
		}
	}
	if err == nil && h.length != wc.ByteLen {
		err = mpierr.Errorf(mpierr.ErrProtocol, "verbs: %d-byte control frame written with %d bytes", h.length, wc.ByteLen)
	}
	if err != nil {
		return false, fmt.Errorf("rank %d at ring offset %d: %w", e.peer, pos, err)
	}
	take += alignUp(int(h.length))
	f := e.ring[pos : pos+int(h.length)]
	hdrEnd := frameHdrLen + int(h.hdrLen)
	switch h.kind {
	case frameMsg:
		m.fragsRecv.Add(1)
		m.bytesRecv.Add(int64(len(f) - frameHdrLen))
		m.env.Dispatch.Dispatch(e, h.tag, f[frameHdrLen:hdrEnd:hdrEnd], f[hdrEnd:len(f):len(f)])
	case frameClose:
		e.mu.Lock()
		e.failLocked(fmt.Errorf("verbs: rank %d closed: %w", e.peer, btl.ErrClosed))
		e.unlock()
	}
	return e.rwin.consumed(take), nil
}
