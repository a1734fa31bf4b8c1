// Package loopib is an in-process verbs provider for the verbs transport's
// own tests: devices of one Fabric reach each other's QPs directly, a work
// request executes when it is posted (or, waiting for a receive or for the
// responder to reach RTR, as soon as it can), and completions land in the
// CQs at once. It keeps the rules the transport relies on (RC order,
// receives consumed by WRITE_WITH_IMM, rkey/range/access checks with
// REM_ACCESS_ERR, a QP in ERR flushing its work requests, a vanished peer
// giving RETRY_EXC_ERR) and nothing of the wire: for the wire, the soft
// provider.
package loopib

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// Fabric connects the devices of one test.
type Fabric struct {
	mu      sync.Mutex // guards everything of every device of the fabric
	devs    map[ibv.GID]*Device
	next    int
	nextKey uint32
	nextQPN uint32
}

// NewFabric returns an empty fabric.
func NewFabric() *Fabric { return &Fabric{devs: map[ibv.GID]*Device{}, nextKey: 0x100, nextQPN: 0x10} }

// NewProvider returns a provider with one new device on the fabric.
func (f *Fabric) NewProvider() *Provider {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	gid := ibv.GIDFromAddr(netip.AddrFrom4([4]byte{127, 9, byte(f.next >> 8), byte(f.next)}))
	d := &Device{f: f, gid: gid, name: fmt.Sprintf("loop%d", f.next), mrs: map[uint32]*mr{}, qps: map[uint32]*qp{}}
	f.devs[gid] = d
	return &Provider{d: d}
}

// Provider has one device.
type Provider struct{ d *Device }

func (p *Provider) Name() string { return "loopib" }
func (p *Provider) Devices() ([]ibv.DeviceAttr, error) {
	return []ibv.DeviceAttr{p.d.attr()}, nil
}
func (p *Provider) Open(name string) (ibv.Context, error) {
	if name != "" && name != p.d.name {
		return nil, ibv.ErrNoDevice
	}
	return p.d, nil
}

// Device is a device and its one open context.
type Device struct {
	f     *Fabric
	gid   ibv.GID
	name  string
	gone  bool
	mrs   map[uint32]*mr
	qps   map[uint32]*qp
	iova  uint64
	chans []*channel
}

// Kill removes the device from the fabric as a crash would: its QPs stop
// answering (peers' requests fail with RETRY_EXC_ERR) and flush nothing.
func (d *Device) Kill() {
	d.f.mu.Lock()
	defer d.f.mu.Unlock()
	d.gone = true
	delete(d.f.devs, d.gid)
	for _, q := range d.qps {
		q.wake()
	}
}

func (d *Device) attr() ibv.DeviceAttr {
	return ibv.DeviceAttr{Name: d.name, Provider: "loopib", NodeGUID: 1, MaxQPWR: 1 << 14, MaxSGE: 4, MaxCQE: 1 << 20,
		MaxQPRdAtom: 16, MaxQPInitRdAtom: 16, PhysPortCnt: 1, MaxMRSize: 1 << 40}
}

func (d *Device) Device() ibv.DeviceAttr { return d.attr() }
func (d *Device) QueryPort(port uint8) (ibv.PortAttr, error) {
	if port != 1 {
		return ibv.PortAttr{}, ibv.ErrInvalid
	}
	return ibv.PortAttr{State: ibv.PortActive, MaxMTU: ibv.MTU4096, ActiveMTU: ibv.MTU4096, GIDTblLen: 1, LinkLayer: ibv.LinkEthernet, PKeyTblLen: 1}, nil
}
func (d *Device) QueryGID(port uint8, index int) (ibv.GID, error) {
	if port != 1 || index != 0 {
		return ibv.GID{}, ibv.ErrInvalid
	}
	return d.gid, nil
}
func (d *Device) AllocPD() (ibv.PD, error) { return &pd{d: d}, nil }
func (d *Device) CreateCompChannel() (ibv.CompChannel, error) {
	return &channel{ev: make(chan *cq, 1<<16)}, nil
}
func (d *Device) CreateCQ(cqe int, ch ibv.CompChannel) (ibv.CQ, error) {
	c := &cq{d: d, max: cqe}
	if ch != nil {
		c.ch = ch.(*channel)
	}
	return c, nil
}
func (d *Device) Close() error { d.Kill(); return nil }

type pd struct{ d *Device }

type mr struct {
	pd     *pd
	buf    []byte
	iova   uint64
	key    uint32
	access ibv.Access
}

func (m *mr) LKey() uint32       { return m.key }
func (m *mr) RKey() uint32       { return m.key }
func (m *mr) Addr() uint64       { return m.iova }
func (m *mr) Len() int           { return len(m.buf) }
func (m *mr) Access() ibv.Access { return m.access }
func (m *mr) Buf() []byte        { return m.buf }
func (m *mr) Dereg() error {
	f := m.pd.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(m.pd.d.mrs, m.key)
	return nil
}

func (p *pd) RegMR(buf []byte, access ibv.Access) (ibv.MR, error) {
	f := p.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextKey++
	p.d.iova += 1 << 32
	m := &mr{pd: p, buf: buf, iova: p.d.iova, key: f.nextKey, access: access}
	p.d.mrs[m.key] = m
	return m, nil
}
func (p *pd) Dealloc() error { return nil }

// slice returns the bytes [addr, addr+n) of the MR key names if it allows
// access (0: local read), else nil and false.
func (d *Device) slice(key uint32, addr uint64, n int, access ibv.Access) ([]byte, bool) {
	m := d.mrs[key]
	if m == nil || m.access&access != access || addr < m.iova || addr-m.iova > uint64(len(m.buf)) || uint64(n) > uint64(len(m.buf))-(addr-m.iova) {
		return nil, false
	}
	o := addr - m.iova
	return m.buf[o : o+uint64(n)], true
}

type channel struct{ ev chan *cq }

func (c *channel) GetEvent(ctx context.Context) (ibv.CQ, error) {
	select {
	case q := <-c.ev:
		return q, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
func (c *channel) Close() error { return nil }

type cq struct {
	d     *Device
	ch    *channel
	max   int
	wcs   []ibv.WC
	armed bool
	err   bool
}

// push adds a completion (fabric lock held).
func (c *cq) push(wc ibv.WC) {
	if len(c.wcs) >= c.max {
		c.err = true
		return
	}
	c.wcs = append(c.wcs, wc)
	if c.armed && c.ch != nil {
		c.armed = false
		select {
		case c.ch.ev <- c:
		default:
		}
	}
}

func (c *cq) Poll(wc []ibv.WC) (int, error) {
	f := c.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if c.err {
		return 0, ibv.ErrCQOverrun
	}
	n := copy(wc, c.wcs)
	c.wcs = c.wcs[:copy(c.wcs, c.wcs[n:])]
	return n, nil
}
func (c *cq) ReqNotify(bool) error {
	f := c.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	c.armed = true
	return nil
}
func (c *cq) AckEvents(int)  {}
func (c *cq) Destroy() error { return nil }

type qp struct {
	d       *Device
	qpn     uint32
	cq      *cq
	state   ibv.QPState
	attr    ibv.QPAttr
	cap     ibv.QPCap
	sq      []ibv.SendWR // posted, not executed (RC order: the head blocks the rest)
	recvs   []ibv.RecvWR
	waiters []*qp // requesters waiting for a receive or for RTR here
}

func (p *pd) CreateQP(a ibv.QPInitAttr) (ibv.QP, error) {
	f := p.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nextQPN++
	q := &qp{d: p.d, qpn: f.nextQPN, cq: a.SendCQ.(*cq), cap: a.Cap}
	p.d.qps[q.qpn] = q
	return q, nil
}

func (q *qp) QPN() uint32 { return q.qpn }
func (q *qp) State() ibv.QPState {
	q.d.f.mu.Lock()
	defer q.d.f.mu.Unlock()
	return q.state
}
func (q *qp) Query() (ibv.QPAttr, error) {
	q.d.f.mu.Lock()
	defer q.d.f.mu.Unlock()
	a := q.attr
	a.State = q.state
	return a, nil
}

func (q *qp) Modify(a *ibv.QPAttr, mask ibv.AttrMask) error {
	f := q.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if mask&ibv.AttrState == 0 {
		return ibv.ErrInvalid
	}
	switch a.State {
	case ibv.QPSInit:
		q.attr.AccessFlags = a.AccessFlags
	case ibv.QPSRTR:
		q.attr.DestQPN, q.attr.AH = a.DestQPN, a.AH
	case ibv.QPSRTS:
	case ibv.QPSErr:
		q.toErr()
		return nil
	default:
		return ibv.ErrInvalid
	}
	q.state = a.State
	if q.state == ibv.QPSRTR || q.state == ibv.QPSRTS {
		q.wake()
	}
	return nil
}

// toErr moves the QP to ERR and flushes its work requests.
func (q *qp) toErr() {
	if q.state == ibv.QPSErr {
		return
	}
	q.state = ibv.QPSErr
	for _, w := range q.sq {
		q.cq.push(ibv.WC{ID: w.ID, Status: ibv.WCWRFlushErr, QPNum: q.qpn})
	}
	q.sq = nil
	for _, r := range q.recvs {
		q.cq.push(ibv.WC{ID: r.ID, Status: ibv.WCWRFlushErr, QPNum: q.qpn, Opcode: ibv.WCRecv})
	}
	q.recvs = nil
}

func (q *qp) Destroy() error {
	f := q.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(q.d.qps, q.qpn)
	q.state = ibv.QPSErr
	q.sq, q.recvs = nil, nil
	q.wake()
	return nil
}

func (q *qp) PostRecv(wrs []ibv.RecvWR) (int, error) {
	f := q.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.state == ibv.QPSReset {
		return 0, ibv.ErrInvalid
	}
	if q.state == ibv.QPSErr {
		for _, r := range wrs {
			q.cq.push(ibv.WC{ID: r.ID, Status: ibv.WCWRFlushErr, QPNum: q.qpn, Opcode: ibv.WCRecv})
		}
		return 0, nil
	}
	if len(q.recvs)+len(wrs) > q.cap.MaxRecvWR {
		return 0, ibv.ErrNoMem
	}
	q.recvs = append(q.recvs, wrs...)
	q.wake()
	return 0, nil
}

func (q *qp) PostSend(wrs []ibv.SendWR) (int, error) {
	f := q.d.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if q.state != ibv.QPSRTS {
		return 0, ibv.ErrInvalid
	}
	if len(q.sq)+len(wrs) > q.cap.MaxSendWR {
		return 0, ibv.ErrNoMem
	}
	for _, w := range wrs {
		w.SGList = append([]ibv.SGEntry(nil), w.SGList...)
		q.sq = append(q.sq, w)
	}
	q.run()
	return 0, nil
}

// wake retries the requesters waiting on q.
func (q *qp) wake() {
	ws := q.waiters
	q.waiters = nil
	for _, r := range ws {
		r.run()
	}
}

// peer returns the responder QP, or nil when it is gone.
func (q *qp) peer() *qp {
	d := q.d.f.devs[q.attr.AH.DGID]
	if d == nil || d.gone {
		return nil
	}
	return d.qps[q.attr.DestQPN]
}

// run executes the send queue in order until it empties or its head must
// wait.
func (q *qp) run() {
	for len(q.sq) > 0 && q.state == ibv.QPSRTS && !q.d.gone {
		w := q.sq[0]
		r := q.peer()
		if r == nil || r.state == ibv.QPSErr {
			q.complete(w, ibv.WCRetryExcErr, 0)
			q.toErr()
			return
		}
		if r.state != ibv.QPSRTR && r.state != ibv.QPSRTS {
			r.waiters = append(r.waiters, q)
			return
		}
		needRecv := w.Opcode == ibv.WRRDMAWriteWithImm || w.Opcode == ibv.WRSend || w.Opcode == ibv.WRSendWithImm
		if needRecv && len(r.recvs) == 0 {
			r.waiters = append(r.waiters, q)
			return
		}
		n := 0
		for _, s := range w.SGList {
			n += int(s.Length)
		}
		status := q.execute(w, r, n)
		if status != ibv.WCSuccess {
			q.complete(w, status, 0)
			q.toErr()
			r.toErr()
			return
		}
		if needRecv {
			rv := r.recvs[0]
			r.recvs = r.recvs[1:]
			r.cq.push(ibv.WC{ID: rv.ID, Opcode: ibv.WCRecvRDMAWithImm, ByteLen: uint32(n), Imm: w.Imm, QPNum: r.qpn, SrcQP: q.qpn, Flags: ibv.WCWithImm})
		}
		q.complete(w, ibv.WCSuccess, n)
	}
}

func (q *qp) complete(w ibv.SendWR, st ibv.WCStatus, n int) {
	op := map[ibv.WROpcode]ibv.WCOpcode{ibv.WRRDMAWrite: ibv.WCRDMAWrite, ibv.WRRDMAWriteWithImm: ibv.WCRDMAWrite, ibv.WRRDMARead: ibv.WCRDMARead}[w.Opcode]
	q.sq = q.sq[1:]
	q.cq.push(ibv.WC{ID: w.ID, Status: st, Opcode: op, ByteLen: uint32(n), QPNum: q.qpn})
}

// execute moves the data of w between q's device and r's.
func (q *qp) execute(w ibv.SendWR, r *qp, n int) ibv.WCStatus {
	local := make([]byte, 0, n)
	switch w.Opcode {
	case ibv.WRRDMAWrite, ibv.WRRDMAWriteWithImm:
		for _, s := range w.SGList {
			b, ok := q.d.slice(s.LKey, s.Addr, int(s.Length), 0)
			if !ok {
				return ibv.WCLocProtErr
			}
			local = append(local, b...)
		}
		if n == 0 {
			return ibv.WCSuccess
		}
		if r.attr.AccessFlags&ibv.AccessRemoteWrite == 0 {
			return ibv.WCRemAccessErr
		}
		dst, ok := r.d.slice(w.RKey, w.RemoteAddr, n, ibv.AccessRemoteWrite)
		if !ok {
			return ibv.WCRemAccessErr
		}
		copy(dst, local)
	case ibv.WRRDMARead:
		if n == 0 {
			return ibv.WCSuccess
		}
		if r.attr.AccessFlags&ibv.AccessRemoteRead == 0 {
			return ibv.WCRemAccessErr
		}
		src, ok := r.d.slice(w.RKey, w.RemoteAddr, n, ibv.AccessRemoteRead)
		if !ok {
			return ibv.WCRemAccessErr
		}
		for _, s := range w.SGList {
			b, ok := q.d.slice(s.LKey, s.Addr, int(s.Length), ibv.AccessLocalWrite)
			if !ok {
				return ibv.WCLocProtErr
			}
			src = src[copy(b, src):]
		}
	default:
		return ibv.WCRemInvReqErr
	}
	return ibv.WCSuccess
}
