//go:build rdmacore && linux && cgo

package rdmacore

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// qp is an RC queue pair.
type qp struct {
	pd       *pd
	qp       *C.struct_ibv_qp
	scq, rcq *cq
	cap      ibv.QPCap // as the driver granted it

	mu     sync.Mutex  // Modify, Destroy and the cached state
	state  ibv.QPState // the state the last Modify set; guarded by mu
	closed bool

	sendMu sync.Mutex // the send post buffer
	send   postBuf
	recvMu sync.Mutex // the receive post buffer
	recv   postBuf
}

var _ ibv.QP = (*qp)(nil)

// postBuf is C memory reused by every post of one queue: the flat request
// descriptors, their SGEs and the libibverbs work requests built from them.
type postBuf struct {
	desc, sges, wrs unsafe.Pointer
	nwr, nsge       int // capacities
}

// reserve makes room for nwr requests of descSize and wrSize bytes and
// nsge SGEs.
func (b *postBuf) reserve(nwr, nsge int, descSize, wrSize uintptr) {
	if nwr > b.nwr {
		b.nwr = max(nwr, 2*b.nwr, 16)
		C.free(b.desc)
		C.free(b.wrs)
		b.desc = C.calloc(C.size_t(b.nwr), C.size_t(descSize))
		b.wrs = C.calloc(C.size_t(b.nwr), C.size_t(wrSize))
	}
	if nsge > b.nsge || b.sges == nil {
		b.nsge = max(nsge, 2*b.nsge, 16)
		C.free(b.sges)
		b.sges = C.calloc(C.size_t(b.nsge), C.size_t(unsafe.Sizeof(C.struct_ibv_sge{})))
	}
	if b.desc == nil || b.wrs == nil || b.sges == nil {
		panic("rdmacore: out of C memory for work requests")
	}
}

func (b *postBuf) free() {
	C.free(b.desc)
	C.free(b.wrs)
	C.free(b.sges)
	*b = postBuf{}
}

func (p *pd) CreateQP(attr ibv.QPInitAttr) (ibv.QP, error) {
	if attr.Type != 0 && attr.Type != ibv.QPTypeRC {
		return nil, fmt.Errorf("rdmacore: QP type %d (only RC): %w", attr.Type, ibv.ErrInvalid)
	}
	scq, ok1 := attr.SendCQ.(*cq)
	rcq, ok2 := attr.RecvCQ.(*cq)
	if !ok1 || !ok2 || scq.c != p.c || rcq.c != p.c {
		return nil, fmt.Errorf("rdmacore: create QP: %w: %w", errNotOurs, ibv.ErrInvalid)
	}
	c := attr.Cap
	if c.MaxSendWR < 0 || c.MaxRecvWR < 0 || c.MaxSendSGE < 0 || c.MaxRecvSGE < 0 || c.MaxInlineData < 0 {
		return nil, fmt.Errorf("rdmacore: create QP with capacity %+v: %w", c, ibv.ErrInvalid)
	}
	if err := p.hold(); err != nil {
		return nil, err
	}
	if err := scq.hold(); err != nil {
		p.release()
		return nil, err
	}
	if err := rcq.hold(); err != nil {
		scq.release()
		p.release()
		return nil, err
	}
	var ia C.struct_ibv_qp_init_attr
	ia.send_cq, ia.recv_cq = scq.cq, rcq.cq
	ia.qp_type = C.IBV_QPT_RC
	ia.cap.max_send_wr = C.uint32_t(c.MaxSendWR)
	ia.cap.max_recv_wr = C.uint32_t(c.MaxRecvWR)
	ia.cap.max_send_sge = C.uint32_t(c.MaxSendSGE)
	ia.cap.max_recv_sge = C.uint32_t(c.MaxRecvSGE)
	ia.cap.max_inline_data = C.uint32_t(c.MaxInlineData)
	if attr.SigAll {
		ia.sq_sig_all = 1
	}
	q, err := C.ibv_create_qp(p.pd, &ia)
	if q == nil {
		rcq.release()
		scq.release()
		p.release()
		return nil, errnoErr(fmt.Sprintf("rdmacore: ibv_create_qp %+v", c), errnoOf(err, syscall.EINVAL))
	}
	return &qp{pd: p, qp: q, scq: scq, rcq: rcq, cap: ibv.QPCap{
		MaxSendWR:     int(ia.cap.max_send_wr),
		MaxRecvWR:     int(ia.cap.max_recv_wr),
		MaxSendSGE:    int(ia.cap.max_send_sge),
		MaxRecvSGE:    int(ia.cap.max_recv_sge),
		MaxInlineData: int(ia.cap.max_inline_data),
	}}, nil
}

func (q *qp) QPN() uint32 { return uint32(q.qp.qp_num) }

// State returns the QP's state as the device reports it (an error
// completion moves it to ERR without a Modify).
func (q *qp) State() ibv.QPState {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stateLocked()
}

func (q *qp) stateLocked() ibv.QPState {
	if q.closed {
		return q.state
	}
	var g C.gompi_qp_attr
	if C.gompi_query_qp(q.qp, &g, C.IBV_QP_STATE) == 0 {
		q.state = ibv.QPState(g.state)
	}
	return q.state
}

// allAttrs is the mask Query asks for.
const allAttrs = C.IBV_QP_STATE | C.IBV_QP_CUR_STATE | C.IBV_QP_EN_SQD_ASYNC_NOTIFY | C.IBV_QP_ACCESS_FLAGS |
	C.IBV_QP_PKEY_INDEX | C.IBV_QP_PORT | C.IBV_QP_AV | C.IBV_QP_PATH_MTU | C.IBV_QP_TIMEOUT |
	C.IBV_QP_RETRY_CNT | C.IBV_QP_RNR_RETRY | C.IBV_QP_RQ_PSN | C.IBV_QP_MAX_QP_RD_ATOMIC |
	C.IBV_QP_MIN_RNR_TIMER | C.IBV_QP_SQ_PSN | C.IBV_QP_MAX_DEST_RD_ATOMIC | C.IBV_QP_CAP | C.IBV_QP_DEST_QPN

// Modify checks the transition and its attributes against the RC state
// table, then applies them.
func (q *qp) Modify(a *ibv.QPAttr, mask ibv.AttrMask) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("rdmacore: QP: %w", ibv.ErrClosed)
	}
	cur := q.stateLocked()
	if err := validateModify(cur, a, mask, q.pd.c.lim); err != nil {
		return fmt.Errorf("rdmacore: QP %#x: %w", q.QPN(), err)
	}
	g := C.gompi_qp_attr{
		state: C.uint32_t(a.State), cur_state: C.uint32_t(a.CurState), path_mtu: C.uint32_t(a.PathMTU),
		qkey: C.uint32_t(a.QKey), rq_psn: C.uint32_t(a.RQPSN), sq_psn: C.uint32_t(a.SQPSN),
		dest_qpn: C.uint32_t(a.DestQPN), access: C.uint32_t(a.AccessFlags),
		max_send_wr: C.uint32_t(a.Cap.MaxSendWR), max_recv_wr: C.uint32_t(a.Cap.MaxRecvWR),
		max_send_sge: C.uint32_t(a.Cap.MaxSendSGE), max_recv_sge: C.uint32_t(a.Cap.MaxRecvSGE),
		max_inline: C.uint32_t(a.Cap.MaxInlineData),
		dlid:       C.uint32_t(a.AH.DLID), sl: C.uint32_t(a.AH.SL), sgid_index: C.uint32_t(a.AH.SGIDIndex),
		hop_limit: C.uint32_t(a.AH.HopLimit), tclass: C.uint32_t(a.AH.TrafficClass),
		flow_label: C.uint32_t(a.AH.FlowLabel), ah_port: C.uint32_t(a.AH.Port),
		pkey_index: C.uint32_t(a.PKeyIndex), max_rd_atomic: C.uint32_t(a.MaxRdAtomic),
		max_dest_rd_atomic: C.uint32_t(a.MaxDestRdAtomic), min_rnr_timer: C.uint32_t(a.MinRNRTimer),
		port: C.uint32_t(a.Port), timeout: C.uint32_t(a.Timeout), retry_cnt: C.uint32_t(a.RetryCnt),
		rnr_retry: C.uint32_t(a.RNRRetry),
	}
	if g.ah_port == 0 {
		g.ah_port = g.port
		if g.ah_port == 0 {
			g.ah_port = 1
		}
	}
	if a.AH.IsGlobal {
		g.is_global = 1
	}
	if a.SQDrainNotify {
		g.sqd_drain = 1
	}
	for i, b := range a.AH.DGID {
		g.dgid[i] = C.uint8_t(b)
	}
	if r := C.gompi_modify_qp(q.qp, &g, C.int(mask)); r != 0 {
		return errnoErr(fmt.Sprintf("rdmacore: ibv_modify_qp %#x %v->%v", q.QPN(), cur, a.State), syscall.Errno(r))
	}
	if mask&ibv.AttrState != 0 {
		q.state = a.State
	}
	return nil
}

func (q *qp) Query() (ibv.QPAttr, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return ibv.QPAttr{}, fmt.Errorf("rdmacore: QP: %w", ibv.ErrClosed)
	}
	var g C.gompi_qp_attr
	if r := C.gompi_query_qp(q.qp, &g, allAttrs); r != 0 {
		return ibv.QPAttr{}, errnoErr("rdmacore: ibv_query_qp", syscall.Errno(r))
	}
	a := ibv.QPAttr{
		State: ibv.QPState(g.state), CurState: ibv.QPState(g.cur_state), PathMTU: ibv.MTU(g.path_mtu),
		QKey: uint32(g.qkey), RQPSN: uint32(g.rq_psn), SQPSN: uint32(g.sq_psn), DestQPN: uint32(g.dest_qpn),
		AccessFlags: ibv.Access(g.access),
		Cap: ibv.QPCap{MaxSendWR: int(g.max_send_wr), MaxRecvWR: int(g.max_recv_wr), MaxSendSGE: int(g.max_send_sge),
			MaxRecvSGE: int(g.max_recv_sge), MaxInlineData: int(g.max_inline)},
		AH: ibv.AH{DLID: uint16(g.dlid), SL: uint8(g.sl), IsGlobal: g.is_global != 0, SGIDIndex: uint8(g.sgid_index),
			HopLimit: uint8(g.hop_limit), TrafficClass: uint8(g.tclass), FlowLabel: uint32(g.flow_label), Port: uint8(g.ah_port)},
		PKeyIndex: uint16(g.pkey_index), SQDrainNotify: g.sqd_drain != 0, MaxRdAtomic: uint8(g.max_rd_atomic),
		MaxDestRdAtomic: uint8(g.max_dest_rd_atomic), MinRNRTimer: uint8(g.min_rnr_timer), Port: uint8(g.port),
		Timeout: uint8(g.timeout), RetryCnt: uint8(g.retry_cnt), RNRRetry: uint8(g.rnr_retry),
	}
	for i := range a.AH.DGID {
		a.AH.DGID[i] = byte(g.dgid[i])
	}
	q.state = a.State
	return a, nil
}

// checkSend finds the first request PostSend refuses without asking the
// driver: too many SGEs, or inline data past the QP's capacity.
func (q *qp) checkSend(wrs []ibv.SendWR) (int, error) {
	for i := range wrs {
		w := &wrs[i]
		if len(w.SGList) > q.cap.MaxSendSGE {
			return i, fmt.Errorf("rdmacore: send request %d has %d SGEs, QP takes %d: %w", i, len(w.SGList), q.cap.MaxSendSGE, ibv.ErrInvalid)
		}
		if w.Flags&ibv.FlagInline != 0 {
			n := 0
			for _, s := range w.SGList {
				n += int(s.Length)
			}
			if n > q.cap.MaxInlineData {
				return i, fmt.Errorf("rdmacore: inline send request %d of %d bytes, QP takes %d: %w", i, n, q.cap.MaxInlineData, ibv.ErrInvalid)
			}
		}
	}
	return len(wrs), nil
}

// PostSend posts wrs in order (see ibv.QP). The SGE addresses are the
// MRs' virtual addresses; inline data is read from them during the call.
func (q *qp) PostSend(wrs []ibv.SendWR) (int, error) {
	q.mu.Lock()
	st, closed := q.state, q.closed
	q.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("rdmacore: QP: %w", ibv.ErrClosed)
	}
	// Before RTS a send is refused; in ERR the device takes it and
	// flushes it (WCWRFlushErr), as it does every request behind an error.
	if st == ibv.QPSReset || st == ibv.QPSInit || st == ibv.QPSRTR {
		return 0, fmt.Errorf("rdmacore: post send on QP %#x in %v: %w", q.QPN(), st, ibv.ErrInvalid)
	}
	n, refused := q.checkSend(wrs)
	bad, err := q.postSend(wrs[:n])
	if err != nil {
		return bad, err
	}
	if refused != nil {
		return n, refused
	}
	return 0, nil
}

func (q *qp) postSend(wrs []ibv.SendWR) (int, error) {
	if len(wrs) == 0 {
		return 0, nil
	}
	nsge := 0
	for i := range wrs {
		nsge += len(wrs[i].SGList)
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	b := &q.send
	b.reserve(len(wrs), nsge, unsafe.Sizeof(C.gompi_swr{}), unsafe.Sizeof(C.struct_ibv_send_wr{}))
	desc := unsafe.Slice((*C.gompi_swr)(b.desc), len(wrs))
	sges := unsafe.Slice((*C.struct_ibv_sge)(b.sges), max(nsge, 1))
	k := 0
	for i := range wrs {
		w := &wrs[i]
		desc[i] = C.gompi_swr{id: C.uint64_t(w.ID), raddr: C.uint64_t(w.RemoteAddr), compare_add: C.uint64_t(w.CompareAdd),
			swap: C.uint64_t(w.Swap), imm: C.uint32_t(w.Imm), rkey: C.uint32_t(w.RKey),
			opcode: C.int32_t(w.Opcode), flags: C.int32_t(w.Flags), nsge: C.int32_t(len(w.SGList))}
		for _, s := range w.SGList {
			sges[k] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
			k++
		}
	}
	var bad C.int
	if r := C.gompi_post_send(q.qp, (*C.gompi_swr)(b.desc), C.int(len(wrs)), (*C.struct_ibv_sge)(b.sges),
		(*C.struct_ibv_send_wr)(b.wrs), &bad); r != 0 {
		return int(bad), errnoErr(fmt.Sprintf("rdmacore: ibv_post_send request %d", int(bad)), syscall.Errno(r))
	}
	return 0, nil
}

// PostRecv posts receive requests (from INIT on).
func (q *qp) PostRecv(wrs []ibv.RecvWR) (int, error) {
	q.mu.Lock()
	st, closed := q.state, q.closed
	q.mu.Unlock()
	if closed {
		return 0, fmt.Errorf("rdmacore: QP: %w", ibv.ErrClosed)
	}
	if st == ibv.QPSReset {
		return 0, fmt.Errorf("rdmacore: post receive on QP %#x in RESET: %w", q.QPN(), ibv.ErrInvalid)
	}
	n := len(wrs)
	var refused error
	nsge := 0
	for i := range wrs {
		if len(wrs[i].SGList) > q.cap.MaxRecvSGE {
			n = i
			refused = fmt.Errorf("rdmacore: receive request %d has %d SGEs, QP takes %d: %w", i, len(wrs[i].SGList), q.cap.MaxRecvSGE, ibv.ErrInvalid)
			break
		}
		nsge += len(wrs[i].SGList)
	}
	if n == 0 {
		return 0, refused // nil for an empty list
	}
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	b := &q.recv
	b.reserve(n, nsge, unsafe.Sizeof(C.gompi_rwr{}), unsafe.Sizeof(C.struct_ibv_recv_wr{}))
	desc := unsafe.Slice((*C.gompi_rwr)(b.desc), n)
	sges := unsafe.Slice((*C.struct_ibv_sge)(b.sges), max(nsge, 1))
	k := 0
	for i := range n {
		w := &wrs[i]
		desc[i] = C.gompi_rwr{id: C.uint64_t(w.ID), nsge: C.int32_t(len(w.SGList))}
		for _, s := range w.SGList {
			sges[k] = C.struct_ibv_sge{addr: C.uint64_t(s.Addr), length: C.uint32_t(s.Length), lkey: C.uint32_t(s.LKey)}
			k++
		}
	}
	var bad C.int
	if r := C.gompi_post_recv(q.qp, (*C.gompi_rwr)(b.desc), C.int(n), (*C.struct_ibv_sge)(b.sges),
		(*C.struct_ibv_recv_wr)(b.wrs), &bad); r != 0 {
		return int(bad), errnoErr(fmt.Sprintf("rdmacore: ibv_post_recv request %d", int(bad)), syscall.Errno(r))
	}
	if refused != nil {
		return n, refused
	}
	return 0, nil
}

// Destroy releases the QP; its outstanding requests are dropped.
func (q *qp) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("rdmacore: QP: %w", ibv.ErrClosed)
	}
	q.sendMu.Lock()
	defer q.sendMu.Unlock()
	q.recvMu.Lock()
	defer q.recvMu.Unlock()
	if r := C.ibv_destroy_qp(q.qp); r != 0 {
		return errnoErr("rdmacore: ibv_destroy_qp", syscall.Errno(r))
	}
	q.closed = true
	q.send.free()
	q.recv.free()
	q.scq.release()
	q.rcq.release()
	q.pd.release()
	return nil
}
