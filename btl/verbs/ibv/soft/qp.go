package soft

import (
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// sendWQE is a posted send work request. Its SGEs are resolved to
// registered memory at post time; a bad lkey is remembered (locErr) and
// reported when the request's turn to execute comes.
type sendWQE struct {
	id       uint64
	op       ibv.WROpcode
	flags    ibv.SendFlags
	signaled bool
	imm      uint32
	raddr    uint64
	rkey     uint32
	cmpAdd   uint64
	swap     uint64
	segs     [][]byte // local memory, in SGE order (slices of MRs or of inline)
	inline   []byte   // owned copy of inline data (capacity MaxInlineData)
	length   int
	locErr   ibv.WCStatus

	psn    uint32 // first PSN
	npkts  uint32 // PSNs it uses (READ: its response packets)
	rdRcvd uint32 // READ: response packets taken in order
	orig   uint64 // atomic: the value the response carried
	done   bool   // READ/atomic: the response is complete
}

// recvWQE is a posted receive work request.
type recvWQE struct {
	id     uint64
	segs   [][]byte
	length int
	locErr ibv.WCStatus
}

// qp is an RC queue pair: requester and responder state under mu.
type qp struct {
	dev    *device
	pd     *pd
	scq    *cq
	rcq    *cq
	qpn    uint32
	sigAll bool
	cap    ibv.QPCap

	mu        sync.Mutex
	state     ibv.QPState    // guarded by mu
	attr      ibv.QPAttr     // guarded by mu: the attributes set so far
	destroyed bool           // guarded by mu
	peer      netip.AddrPort // guarded by mu
	flow      flow           // guarded by mu: the ICRC's view of packets to peer
	mtu       int            // guarded by mu

	// Send queue: a ring of cap.MaxSendWR slots; guarded by mu.
	sq      []sendWQE
	sqHead  int
	sqCount int
	nextPSN uint32 // PSN of the next posted request

	// Transmit cursor: the next packet to send is packet txPkt of the
	// WQE txIdx places after the head. Guarded by mu.
	txIdx   int
	txPkt   uint32
	maxSent uint32 // highest PSN sent so far (+1 when sentAny)
	sentAny bool
	ackPSN  uint32 // last PSN acknowledged
	rdOut   int    // READs and atomics sent and not complete
	gapPSN  uint32 // READ response gap already asked again for
	gapSet  bool

	retries      int
	rnrRetries   int
	timeout      time.Duration // 0: no retransmission timer
	lastProgress time.Time
	rnrUntil     time.Time // while non-zero, requests wait (RNR NAK)
	rnrPSN       uint32
	timer        Timer
	timerArmed   bool
	srtt, rttvar time.Duration // measured round trip
	probing      bool          // probePSN was first sent at probeAt
	early        bool          // an early go-back went out since the last progress
	probePSN     uint32
	cwnd         int // packets the window allows now (0: not yet set)
	probeAt      time.Time
	timerAt      time.Time

	// Receive queue: a ring of cap.MaxRecvWR slots; guarded by mu.
	rq      []recvWQE
	rqHead  int
	rqCount int

	r respState // guarded by mu

	// Pumping: one goroutine at a time builds and sends this QP's
	// packets (pumping, guarded by mu); tx and ts belong to it.
	pumping bool
	tx      *txBatch
	ts      *txState
	// txs is the QP's send socket, connected to its peer (nil: the
	// device's); txsOld one it replaced, closed when the pumper leaves.
	// Guarded by mu.
	txs, txsOld *sock
	peerSport   uint16 // the pair's source port (roceSport); guarded by mu
	queued      bool   // on the transmit worker's list; guarded by dev.workMu
	// ackQueued: on the device's list of deferred ACKs; guarded by
	// dev.ackMu.
	ackQueued bool
	// lazyQueued: on the device's list of lazy ACKs; guarded by
	// dev.ackMu.
	lazyQueued bool
	// lazySince is when the owed lazy ACK's first packet arrived;
	// guarded by mu.
	lazySince time.Time

	rxEpoch uint64 // receive goroutine only
}

var _ ibv.QP = (*qp)(nil)

// txBatchPkts bounds the packets one pump iteration builds.
const txBatchPkts = 128

func newQP(p *pd, a ibv.QPInitAttr) (*qp, error) {
	dev := p.ctx.dev
	da := deviceAttr()
	if a.Type != 0 && a.Type != ibv.QPTypeRC {
		return nil, fmt.Errorf("soft: QP type %d (only RC): %w", a.Type, ibv.ErrInvalid)
	}
	scq, ok1 := a.SendCQ.(*cq)
	rcq, ok2 := a.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq == nil || rcq == nil || scq.ctx.dev != dev || rcq.ctx.dev != dev {
		return nil, fmt.Errorf("soft: QP needs send and receive CQs of this device: %w", ibv.ErrInvalid)
	}
	c := a.Cap
	if c.MaxSendWR < 0 || c.MaxSendWR > da.MaxQPWR || c.MaxRecvWR < 0 || c.MaxRecvWR > da.MaxQPWR ||
		c.MaxSendSGE < 0 || c.MaxSendSGE > da.MaxSGE || c.MaxRecvSGE < 0 || c.MaxRecvSGE > da.MaxSGE ||
		c.MaxInlineData < 0 || c.MaxInlineData > da.MaxInline {
		return nil, fmt.Errorf("soft: QP capabilities %+v beyond the device's: %w", c, ibv.ErrInvalid)
	}
	if err := p.use(); err != nil {
		return nil, err
	}
	for _, x := range []*cq{scq, rcq} {
		x.mu.Lock()
		dead := x.dead
		x.mu.Unlock()
		if dead {
			return nil, fmt.Errorf("soft: CQ destroyed: %w", ibv.ErrClosed)
		}
	}
	q := &qp{
		dev:    dev,
		pd:     p,
		scq:    scq,
		rcq:    rcq,
		sigAll: a.SigAll,
		cap:    c,
		state:  ibv.QPSReset,
		sq:     make([]sendWQE, c.MaxSendWR),
		rq:     make([]recvWQE, c.MaxRecvWR),
		tx:     newTxBatch(txBatchPkts),
		ts:     newTxState(txBatchPkts),
	}
	for i := range q.sq {
		q.sq[i].segs = make([][]byte, 0, max(c.MaxSendSGE, 1))
		if c.MaxInlineData > 0 {
			q.sq[i].inline = make([]byte, 0, c.MaxInlineData)
		}
	}
	for i := range q.rq {
		q.rq[i].segs = make([][]byte, 0, c.MaxRecvSGE)
	}
	q.timer = dev.clock.AfterFunc(time.Hour, q.onTimer)
	q.timer.Stop()
	p.mu.Lock()
	p.qps++
	p.mu.Unlock()
	scq.mu.Lock()
	scq.users++
	scq.mu.Unlock()
	rcq.mu.Lock()
	rcq.users++
	rcq.mu.Unlock()
	dev.addQP(q)
	return q, nil
}

func (q *qp) QPN() uint32 { return q.qpn }

func (q *qp) State() ibv.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.state
}

func (q *qp) Query() (ibv.QPAttr, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed {
		return ibv.QPAttr{}, ibv.ErrClosed
	}
	a := q.attr
	a.State, a.CurState = q.state, q.state
	a.Cap = q.cap
	return a, nil
}

// Destroy removes the QP: its packets are no longer accepted, its timer
// stops, and outstanding requests are dropped without completions.
func (q *qp) Destroy() error {
	q.mu.Lock()
	if q.destroyed {
		q.mu.Unlock()
		return ibv.ErrClosed
	}
	q.destroyed = true
	q.timer.Stop()
	q.timerArmed = false
	q.closeTxLocked()
	q.mu.Unlock()
	q.dev.removeQP(q)
	for _, x := range []*cq{q.scq, q.rcq} {
		x.mu.Lock()
		x.users--
		x.mu.Unlock()
	}
	q.pd.mu.Lock()
	q.pd.qps--
	q.pd.mu.Unlock()
	return nil
}

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

// completeSend pops the head send WQE w with status st, reporting it when
// signalled or failed.
func (q *qp) completeSend(w *sendWQE, st ibv.WCStatus) {
	if w.signaled || q.sigAll || st != ibv.WCSuccess {
		wc := ibv.WC{ID: w.id, Status: st, QPNum: q.qpn}
		if st == ibv.WCSuccess {
			wc.Opcode = wcOpcode(w.op)
			if w.op == ibv.WRRDMARead || w.op >= ibv.WRAtomicCmpAndSwp {
				wc.ByteLen = uint32(w.length)
			}
		}
		q.scq.push(&wc, false)
	}
	clear(w.segs)
	w.segs = w.segs[:0]
	q.sqHead++
	if q.sqHead == len(q.sq) {
		q.sqHead = 0
	}
	q.sqCount--
	if q.txIdx > 0 {
		q.txIdx--
	} else {
		q.txPkt = 0
	}
}

func wcOpcode(op ibv.WROpcode) ibv.WCOpcode {
	switch op {
	case ibv.WRRDMAWrite, ibv.WRRDMAWriteWithImm:
		return ibv.WCRDMAWrite
	case ibv.WRRDMARead:
		return ibv.WCRDMARead
	case ibv.WRAtomicCmpAndSwp:
		return ibv.WCCompSwap
	case ibv.WRAtomicFetchAndAdd:
		return ibv.WCFetchAdd
	}
	return ibv.WCSend
}

// completeRecv pops the head receive WQE with status st.
func (q *qp) completeRecv(st ibv.WCStatus, op ibv.WCOpcode, byteLen int, imm uint32, withImm bool) {
	w := &q.rq[q.rqHead]
	wc := ibv.WC{ID: w.id, Status: st, QPNum: q.qpn}
	solicited := false
	if st == ibv.WCSuccess {
		wc.Opcode = op
		wc.ByteLen = uint32(byteLen)
		wc.SrcQP = q.attr.DestQPN
		if withImm {
			wc.Imm = imm
			wc.Flags = ibv.WCWithImm
		}
		solicited = q.r.solicited
	}
	q.rcq.push(&wc, solicited)
	clear(w.segs)
	w.segs = w.segs[:0]
	q.rqHead++
	if q.rqHead == len(q.rq) {
		q.rqHead = 0
	}
	q.rqCount--
}

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

func (q *qp) postSendLocked(wr *ibv.SendWR) error {
	if q.destroyed {
		return ibv.ErrClosed
	}
	if q.state == ibv.QPSErr {
		wc := ibv.WC{ID: wr.ID, Status: ibv.WCWRFlushErr, QPNum: q.qpn}
		q.scq.push(&wc, false)
		return nil
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
	if q.destroyed {
		return ibv.ErrClosed
	}
	if q.state == ibv.QPSErr {
		wc := ibv.WC{ID: wr.ID, Status: ibv.WCWRFlushErr, QPNum: q.qpn}
		q.rcq.push(&wc, false)
		return nil
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

// roceSport is the UDP source port of the packets of the QP pair (lqpn,
// rqpn), the same at both ends: as RoCEv2 NICs derive it, from the flow
// label of the pair (the product of the QPNs folded to 20 bits), folded
// again to 14 bits above 0xC000.
func roceSport(lqpn, rqpn uint32) uint16 {
	fl := uint64(lqpn) * uint64(rqpn)
	fl ^= fl >> 20
	fl ^= fl >> 40
	fl &= 0xfffff
	return uint16((fl&0x3fff)^(fl>>14)) | 0xc000
}

// openTxLocked gives the QP a send socket connected to q.peer, bound to
// the pair's source port (roceSport), and the ICRC's view of its packets
// (the ICRC covers the UDP source port). When that port is taken (the
// peer QP of a loopback pair on one device has it) or the socket cannot
// be opened, packets leave from the device's socket; the responder takes
// a peer's packets from either port (qp.fromPeer). Called with mu held.
func (q *qp) openTxLocked() {
	sport := roceSport(q.qpn, q.attr.DestQPN)
	q.peerSport = sport
	if q.txs == nil || q.txs.connectedTo != q.peer || q.txs.local.Port() != sport {
		q.closeTxLocked()
		if s, err := openTxSock(netip.AddrPortFrom(q.dev.addr, sport), q.peer, q.dev.cfg.SockBuf, q.dev.cfg.NoGSO); err == nil {
			s.connectedTo = q.peer
			q.txs = s
		}
	}
	if q.txs == nil {
		sport = q.dev.port
	}
	q.flow = flow{src: q.dev.addr, dst: q.peer.Addr(), sport: sport, dport: q.peer.Port()}
}

// fromPeer reports whether a packet from src comes from the QP's peer:
// its address, from the device's port or the pair's. Called with mu held.
func (q *qp) fromPeer(src netip.AddrPort) bool {
	return src == q.peer || (src.Port() == q.peerSport && src.Addr() == q.peer.Addr())
}

// closeTxLocked closes the QP's send socket, or leaves that to the
// pumper when one is sending on it. Called with mu held.
func (q *qp) closeTxLocked() {
	if q.txs == nil {
		return
	}
	if q.pumping {
		if q.txsOld != nil {
			q.txsOld.close()
		}
		q.txsOld = q.txs
	} else {
		q.txs.close()
	}
	q.txs = nil
}

// sqAt returns the send WQE i places after the head.
func (q *qp) sqAt(i int) *sendWQE {
	j := q.sqHead + i
	if j >= len(q.sq) {
		j -= len(q.sq)
	}
	return &q.sq[j]
}
