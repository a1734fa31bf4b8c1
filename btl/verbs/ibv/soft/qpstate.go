package soft

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// transitions lists, per (current, next) state of an RC QP, the attribute
// masks a Modify must and may give (ibv_modify_qp(3), IBA 10.3).
type transition struct{ req, opt ibv.AttrMask }

var transitions = map[[2]ibv.QPState]transition{
	{ibv.QPSReset, ibv.QPSInit}: {req: ibv.MaskResetToInit},
	{ibv.QPSInit, ibv.QPSInit}:  {opt: ibv.AttrState | ibv.AttrPKeyIndex | ibv.AttrPort | ibv.AttrAccessFlags},
	{ibv.QPSInit, ibv.QPSRTR}: {req: ibv.MaskInitToRTR,
		opt: ibv.AttrAltPath | ibv.AttrAccessFlags | ibv.AttrPKeyIndex},
	{ibv.QPSRTR, ibv.QPSRTS}: {req: ibv.MaskRTRToRTS,
		opt: ibv.AttrCurState | ibv.AttrAltPath | ibv.AttrAccessFlags | ibv.AttrMinRNRTimer | ibv.AttrPathMigState},
	{ibv.QPSRTS, ibv.QPSRTS}: {opt: ibv.AttrState | ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrAltPath |
		ibv.AttrPathMigState | ibv.AttrMinRNRTimer},
	{ibv.QPSRTS, ibv.QPSSQD}: {req: ibv.AttrState, opt: ibv.AttrEnSQDAsyncNotify},
	{ibv.QPSSQD, ibv.QPSSQD}: {opt: ibv.AttrState | ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrAltPath |
		ibv.AttrPathMigState | ibv.AttrMinRNRTimer | ibv.AttrPKeyIndex | ibv.AttrPort | ibv.AttrAV | ibv.AttrPathMTU |
		ibv.AttrTimeout | ibv.AttrRetryCnt | ibv.AttrRNRRetry | ibv.AttrMaxQPRdAtomic | ibv.AttrMaxDestRdAtomic},
	{ibv.QPSSQD, ibv.QPSRTS}: {req: ibv.AttrState, opt: ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrAltPath |
		ibv.AttrPathMigState | ibv.AttrMinRNRTimer},
}

func lookupTransition(cur, next ibv.QPState) (transition, bool) {
	if next == ibv.QPSReset || next == ibv.QPSErr {
		return transition{req: ibv.AttrState}, cur <= ibv.QPSErr
	}
	t, ok := transitions[[2]ibv.QPState{cur, next}]
	return t, ok
}

// Modify applies a state transition and/or attributes. Anything it
// refuses (ErrInvalid) leaves the QP as it was.
func (q *qp) Modify(a *ibv.QPAttr, mask ibv.AttrMask) error {
	if a == nil {
		return fmt.Errorf("soft: nil attributes: %w", ibv.ErrInvalid)
	}
	q.mu.Lock()
	kick, err := q.modifyLocked(a, mask)
	q.mu.Unlock()
	if kick {
		q.pump(txBatchPkts)
	}
	return err
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("soft: modify QP: "+format+": %w", append(args, ibv.ErrInvalid)...)
}

func (q *qp) modifyLocked(a *ibv.QPAttr, mask ibv.AttrMask) (kick bool, err error) {
	if q.destroyed {
		return false, ibv.ErrClosed
	}
	cur := q.state
	next := cur
	if mask&ibv.AttrState != 0 {
		next = a.State
		if next > ibv.QPSErr {
			return false, invalid("state %d", next)
		}
	}
	if mask&ibv.AttrCurState != 0 && a.CurState != cur {
		return false, invalid("current state given as %v, is %v", a.CurState, cur)
	}
	t, ok := lookupTransition(cur, next)
	if !ok {
		return false, invalid("transition %v -> %v", cur, next)
	}
	if mask&t.req != t.req {
		return false, invalid("%v -> %v lacks attributes %#x", cur, next, uint32(t.req&^mask))
	}
	if extra := mask &^ (t.req | t.opt | ibv.AttrState); extra != 0 {
		return false, invalid("%v -> %v does not take attributes %#x", cur, next, uint32(extra))
	}
	da := deviceAttr()
	if mask&ibv.AttrPKeyIndex != 0 && a.PKeyIndex != 0 {
		return false, invalid("pkey index %d (table of 1)", a.PKeyIndex)
	}
	if mask&ibv.AttrPort != 0 && a.Port != 1 {
		return false, invalid("port %d (have 1)", a.Port)
	}
	known := ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic
	if mask&ibv.AttrAccessFlags != 0 && a.AccessFlags&^known != 0 {
		return false, invalid("access flags %#x", uint32(a.AccessFlags))
	}
	var peer netip.Addr
	if mask&ibv.AttrAV != 0 {
		ah := &a.AH
		peer = ah.DGID.Addr()
		if !ah.IsGlobal {
			return false, invalid("RoCE address vectors are global (set AH.IsGlobal and AH.DGID)")
		}
		if !peer.IsValid() || peer.IsUnspecified() || peer.Is4() != q.dev.addr.Is4() {
			return false, invalid("destination GID %v not reachable from %v", ah.DGID, q.dev.addr)
		}
		if ah.SGIDIndex != 0 {
			return false, invalid("source GID index %d (table of 1)", ah.SGIDIndex)
		}
		if ah.Port > 1 {
			return false, invalid("address vector port %d", ah.Port)
		}
	}
	if mask&ibv.AttrPathMTU != 0 && (a.PathMTU.Bytes() == 0 || a.PathMTU > ibv.MTU4096) {
		return false, invalid("path MTU %d", a.PathMTU)
	}
	if mask&ibv.AttrDestQPN != 0 && a.DestQPN > psnMask {
		return false, invalid("destination QPN %#x", a.DestQPN)
	}
	if mask&ibv.AttrRQPSN != 0 && a.RQPSN > psnMask {
		return false, invalid("RQ PSN %#x", a.RQPSN)
	}
	if mask&ibv.AttrSQPSN != 0 && a.SQPSN > psnMask {
		return false, invalid("SQ PSN %#x", a.SQPSN)
	}
	if mask&ibv.AttrMaxDestRdAtomic != 0 && int(a.MaxDestRdAtomic) > da.MaxQPRdAtom {
		return false, invalid("max_dest_rd_atomic %d (device: %d)", a.MaxDestRdAtomic, da.MaxQPRdAtom)
	}
	if mask&ibv.AttrMaxQPRdAtomic != 0 && int(a.MaxRdAtomic) > da.MaxQPInitRdAtom {
		return false, invalid("max_rd_atomic %d (device: %d)", a.MaxRdAtomic, da.MaxQPInitRdAtom)
	}
	if mask&ibv.AttrMinRNRTimer != 0 && a.MinRNRTimer > 31 {
		return false, invalid("min_rnr_timer %d", a.MinRNRTimer)
	}
	if mask&ibv.AttrTimeout != 0 && a.Timeout > 31 {
		return false, invalid("timeout %d", a.Timeout)
	}
	if mask&ibv.AttrRetryCnt != 0 && a.RetryCnt > 7 {
		return false, invalid("retry_cnt %d", a.RetryCnt)
	}
	if mask&ibv.AttrRNRRetry != 0 && a.RNRRetry > 7 {
		return false, invalid("rnr_retry %d", a.RNRRetry)
	}

	// Everything checked: apply.
	at := &q.attr
	if mask&ibv.AttrPKeyIndex != 0 {
		at.PKeyIndex = a.PKeyIndex
	}
	if mask&ibv.AttrPort != 0 {
		at.Port = a.Port
	}
	if mask&ibv.AttrAccessFlags != 0 {
		at.AccessFlags = a.AccessFlags
	}
	if mask&ibv.AttrAV != 0 {
		at.AH = a.AH
		q.peer = netip.AddrPortFrom(peer, q.dev.port)
	}
	if mask&ibv.AttrPathMTU != 0 {
		at.PathMTU = a.PathMTU
		q.mtu = a.PathMTU.Bytes()
	}
	if mask&ibv.AttrDestQPN != 0 {
		at.DestQPN = a.DestQPN
	}
	if mask&ibv.AttrRQPSN != 0 {
		at.RQPSN = a.RQPSN
		q.r.ePSN = a.RQPSN
	}
	if mask&ibv.AttrSQPSN != 0 {
		at.SQPSN = a.SQPSN
		q.nextPSN = a.SQPSN
		q.ackPSN = (a.SQPSN - 1) & psnMask
		q.maxSent = q.ackPSN
	}
	if mask&ibv.AttrMaxDestRdAtomic != 0 {
		at.MaxDestRdAtomic = a.MaxDestRdAtomic
	}
	if mask&ibv.AttrMaxQPRdAtomic != 0 {
		at.MaxRdAtomic = a.MaxRdAtomic
	}
	if mask&ibv.AttrMinRNRTimer != 0 {
		at.MinRNRTimer = a.MinRNRTimer
	}
	if mask&ibv.AttrTimeout != 0 {
		at.Timeout = a.Timeout
		q.timeout = 0
		if a.Timeout != 0 {
			q.timeout = max(time.Duration(4096)<<a.Timeout, q.dev.cfg.MinTimeout)
		}
	}
	if mask&ibv.AttrRetryCnt != 0 {
		at.RetryCnt = a.RetryCnt
		q.retries = int(a.RetryCnt)
	}
	if mask&ibv.AttrRNRRetry != 0 {
		at.RNRRetry = a.RNRRetry
		q.rnrRetries = int(a.RNRRetry)
	}
	if mask&ibv.AttrEnSQDAsyncNotify != 0 {
		at.SQDrainNotify = a.SQDrainNotify
	}
	if mask&(ibv.AttrAV|ibv.AttrDestQPN) != 0 && q.peer.IsValid() {
		q.openTxLocked()
	}
	switch {
	case next == ibv.QPSReset && cur != ibv.QPSReset:
		q.resetLocked()
	case next == ibv.QPSErr && cur != ibv.QPSErr:
		q.toErrLocked()
		return false, nil
	}
	q.state = next
	return cur == ibv.QPSSQD && next == ibv.QPSRTS, nil
}

// resetLocked empties both queues without completions and forgets the
// connection.
func (q *qp) resetLocked() {
	for i := range q.sq {
		q.sq[i].segs = q.sq[i].segs[:0]
	}
	for i := range q.rq {
		q.rq[i].segs = q.rq[i].segs[:0]
	}
	q.sqHead, q.sqCount, q.rqHead, q.rqCount = 0, 0, 0, 0
	q.txIdx, q.txPkt, q.rdOut, q.sentAny, q.gapSet = 0, 0, 0, false, false
	q.rnrUntil = time.Time{}
	q.timer.Stop()
	q.timerArmed = false
	q.r = respState{}
	q.attr = ibv.QPAttr{}
	q.peer = netip.AddrPort{}
	q.mtu = 0
}

// toErrLocked moves the QP to ERR: every outstanding request of both
// queues completes with WR_FLUSH_ERR, in order.
func (q *qp) toErrLocked() {
	q.state = ibv.QPSErr
	q.timer.Stop()
	q.timerArmed = false
	q.rnrUntil = time.Time{}
	for q.sqCount > 0 {
		w := &q.sq[q.sqHead]
		q.completeSend(w, ibv.WCWRFlushErr)
	}
	q.txIdx, q.txPkt, q.rdOut = 0, 0, 0
	q.r.reads = q.r.reads[:0]
	q.r.inSend, q.r.inWrite = false, false
	for q.rqCount > 0 {
		q.completeRecv(ibv.WCWRFlushErr, 0, 0, 0, false)
	}
}
