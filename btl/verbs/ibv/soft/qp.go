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
