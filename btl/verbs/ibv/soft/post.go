package soft

import (
	"fmt"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// resolve checks one SGE against the QP's PD and returns its memory, or
// LOC_PROT_ERR.
func (q *qp) resolve(s ibv.SGEntry, needWrite bool) ([]byte, ibv.WCStatus) {
	if s.Length == 0 {
		return nil, ibv.WCSuccess
	}
	m := q.dev.lookupMR(s.LKey)
	if m == nil || m.pd != q.pd || m.lkey != s.LKey || m.dead.Load() {
		return nil, ibv.WCLocProtErr
	}
	if needWrite && m.access&ibv.AccessLocalWrite == 0 {
		return nil, ibv.WCLocProtErr
	}
	b, ok := m.slice(s.Addr, uint64(s.Length))
	if !ok {
		return nil, ibv.WCLocProtErr
	}
	return b, ibv.WCSuccess
}

// PostSend queues send work requests; see ibv.QP. The data of a request
// without FlagInline is read from its registered memory when packets are
// built (and again for retransmissions), until the request completes.
func (q *qp) PostSend(wrs []ibv.SendWR) (int, error) {
	q.mu.Lock()
	for i := range wrs {
		if err := q.postSendLocked(&wrs[i]); err != nil {
			q.mu.Unlock()
			if i > 0 {
				q.pump(txBatchPkts * 2)
			}
			return i, err
		}
	}
	q.mu.Unlock()
	q.pump(txBatchPkts * 2)
	return 0, nil
}

// flushLocked ends a work request posted to a destroyed QP (ErrClosed)
// or to one in the error state, which completes at once on cq with a
// flush error. The posting paths test for those two cases themselves.
func (q *qp) flushLocked(id uint64, cq *cq) error {
	if q.destroyed {
		return ibv.ErrClosed
	}
	wc := ibv.WC{ID: id, Status: ibv.WCWRFlushErr, QPNum: q.qpn}
	cq.push(&wc, false)
	return nil
}

func (q *qp) postSendLocked(wr *ibv.SendWR) error {
	if q.destroyed || q.state == ibv.QPSErr {
		return q.flushLocked(wr.ID, q.scq)
	}
	if q.state != ibv.QPSRTS && q.state != ibv.QPSSQD {
		return fmt.Errorf("soft: post send on a QP in %v: %w", q.state, ibv.ErrInvalid)
	}
	if wr.Opcode > ibv.WRAtomicFetchAndAdd {
		return fmt.Errorf("soft: opcode %v: %w", wr.Opcode, ibv.ErrInvalid)
	}
	if len(wr.SGList) > q.cap.MaxSendSGE {
		return fmt.Errorf("soft: %d SGEs (QP takes %d): %w", len(wr.SGList), q.cap.MaxSendSGE, ibv.ErrInvalid)
	}
	total := uint64(0)
	for _, s := range wr.SGList {
		total += uint64(s.Length)
	}
	if total > 1<<31 {
		return fmt.Errorf("soft: message of %d bytes (limit 2 GiB): %w", total, ibv.ErrInvalid)
	}
	inline := wr.Flags&ibv.FlagInline != 0
	isAtomic := wr.Opcode == ibv.WRAtomicCmpAndSwp || wr.Opcode == ibv.WRAtomicFetchAndAdd
	if inline {
		if wr.Opcode == ibv.WRRDMARead || isAtomic {
			return fmt.Errorf("soft: inline %v: %w", wr.Opcode, ibv.ErrInvalid)
		}
		if total > uint64(q.cap.MaxInlineData) {
			return fmt.Errorf("soft: %d inline bytes (QP takes %d): %w", total, q.cap.MaxInlineData, ibv.ErrInvalid)
		}
	}
	if isAtomic && (total != 8 || len(wr.SGList) != 1 || wr.RemoteAddr%8 != 0) {
		return fmt.Errorf("soft: atomics take one 8-byte SGE and an aligned remote address: %w", ibv.ErrInvalid)
	}
	if (wr.Opcode == ibv.WRRDMARead || isAtomic) && q.attr.MaxRdAtomic == 0 {
		return fmt.Errorf("soft: %v on a QP with max_rd_atomic 0: %w", wr.Opcode, ibv.ErrInvalid)
	}
	if q.sqCount >= len(q.sq) {
		return fmt.Errorf("soft: send queue full (%d): %w", len(q.sq), ibv.ErrNoMem)
	}
	i := q.sqHead + q.sqCount
	if i >= len(q.sq) {
		i -= len(q.sq)
	}
	w := &q.sq[i]
	*w = sendWQE{
		id: wr.ID, op: wr.Opcode, flags: wr.Flags, signaled: wr.Flags&ibv.FlagSignaled != 0,
		imm: wr.Imm, raddr: wr.RemoteAddr, rkey: wr.RKey, cmpAdd: wr.CompareAdd, swap: wr.Swap,
		segs: w.segs[:0], inline: w.inline[:0], length: int(total),
	}
	if inline {
		for _, s := range wr.SGList {
			if s.Length == 0 {
				continue
			}
			m := q.dev.lookupMR(s.LKey)
			var b []byte
			ok := false
			if m != nil && m.pd == q.pd {
				b, ok = m.slice(s.Addr, uint64(s.Length))
			}
			if !ok {
				if m = q.dev.mrCovering(q.pd, s.Addr, int(s.Length)); m != nil {
					b, ok = m.slice(s.Addr, uint64(s.Length))
				}
			}
			if !ok {
				return fmt.Errorf("soft: inline SGE %#x+%d is in no region of the PD: %w", s.Addr, s.Length, ibv.ErrInvalid)
			}
			w.inline = append(w.inline, b...)
		}
		if len(w.inline) > 0 {
			w.segs = append(w.segs, w.inline)
		}
	} else {
		needWrite := wr.Opcode == ibv.WRRDMARead || isAtomic
		for _, s := range wr.SGList {
			b, st := q.resolve(s, needWrite)
			if st != ibv.WCSuccess {
				w.locErr = st
				break
			}
			if len(b) > 0 {
				w.segs = append(w.segs, b)
			}
		}
	}
	w.psn = q.nextPSN
	w.npkts = 1
	if !isAtomic && w.length > q.mtu {
		w.npkts = uint32((w.length + q.mtu - 1) / q.mtu)
	}
	q.nextPSN = (q.nextPSN + w.npkts) & psnMask
	q.sqCount++
	return nil
}

// PostRecv queues receive work requests; see ibv.QP. The memory of each
// is written when a SEND or WRITE_WITH_IMM consumes it and is the
// caller's again once its completion is polled.
func (q *qp) PostRecv(wrs []ibv.RecvWR) (int, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i := range wrs {
		if err := q.postRecvLocked(&wrs[i]); err != nil {
			return i, err
		}
	}
	return 0, nil
}

func (q *qp) postRecvLocked(wr *ibv.RecvWR) error {
	if q.destroyed || q.state == ibv.QPSErr {
		return q.flushLocked(wr.ID, q.rcq)
	}
	if q.state == ibv.QPSReset {
		return fmt.Errorf("soft: post receive on a QP in RESET: %w", ibv.ErrInvalid)
	}
	if len(wr.SGList) > q.cap.MaxRecvSGE {
		return fmt.Errorf("soft: %d SGEs (QP takes %d): %w", len(wr.SGList), q.cap.MaxRecvSGE, ibv.ErrInvalid)
	}
	if q.rqCount >= len(q.rq) {
		return fmt.Errorf("soft: receive queue full (%d): %w", len(q.rq), ibv.ErrNoMem)
	}
	i := q.rqHead + q.rqCount
	if i >= len(q.rq) {
		i -= len(q.rq)
	}
	w := &q.rq[i]
	*w = recvWQE{id: wr.ID, segs: w.segs[:0]}
	for _, s := range wr.SGList {
		b, st := q.resolve(s, true)
		if st != ibv.WCSuccess {
			w.locErr = st
			break
		}
		if len(b) > 0 {
			w.segs = append(w.segs, b)
		}
		w.length += int(s.Length)
	}
	q.rqCount++
	return nil
}
