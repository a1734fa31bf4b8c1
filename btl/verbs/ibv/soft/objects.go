package soft

import (
	ctxpkg "context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// context is an open soft0. It counts the objects made from it so that
// Close can refuse while any remain.
type devContext struct {
	dev  *device
	prov *Provider

	mu      sync.Mutex
	objects int  // PDs, CQs and channels alive; guarded by mu
	closed  bool // guarded by mu
}

var _ ibv.Context = (*devContext)(nil)

func (c *devContext) Device() ibv.DeviceAttr { return deviceAttr() }

// Counters returns the device's packet statistics.
func (c *devContext) Counters() Counters { return c.dev.ctr.snapshot() }

// Addr returns the IP address the device is bound to.
func (c *devContext) Addr() string { return c.dev.addr.String() }

func (c *devContext) QueryPort(port uint8) (ibv.PortAttr, error) {
	if port != 1 {
		return ibv.PortAttr{}, fmt.Errorf("soft: port %d (have 1): %w", port, ibv.ErrInvalid)
	}
	return ibv.PortAttr{
		State:      ibv.PortActive,
		MaxMTU:     ibv.MTU4096,
		ActiveMTU:  ibv.MTU4096,
		GIDTblLen:  1,
		LinkLayer:  ibv.LinkEthernet,
		PKeyTblLen: 1,
	}, nil
}

func (c *devContext) QueryGID(port uint8, index int) (ibv.GID, error) {
	if port != 1 || index != 0 {
		return ibv.GID{}, fmt.Errorf("soft: GID port %d index %d (have port 1 index 0): %w", port, index, ibv.ErrInvalid)
	}
	return c.dev.gid, nil
}

func (c *devContext) hold() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ibv.ErrClosed
	}
	c.objects++
	return nil
}

func (c *devContext) unhold() {
	c.mu.Lock()
	c.objects--
	c.mu.Unlock()
}

func (c *devContext) AllocPD() (ibv.PD, error) {
	if err := c.hold(); err != nil {
		return nil, err
	}
	return &pd{ctx: c}, nil
}

func (c *devContext) CreateCompChannel() (ibv.CompChannel, error) {
	if err := c.hold(); err != nil {
		return nil, err
	}
	return &channel{ctx: c, wake: make(chan struct{}, 1)}, nil
}

func (c *devContext) CreateCQ(cqe int, ch ibv.CompChannel) (ibv.CQ, error) {
	if cqe < 1 || cqe > deviceAttr().MaxCQE {
		return nil, fmt.Errorf("soft: CQ of %d entries (1..%d): %w", cqe, deviceAttr().MaxCQE, ibv.ErrInvalid)
	}
	var chn *channel
	if ch != nil {
		var ok bool
		chn, ok = ch.(*channel)
		if !ok || chn.ctx.dev != c.dev {
			return nil, fmt.Errorf("soft: completion channel of another device: %w", ibv.ErrInvalid)
		}
		chn.mu.Lock()
		if chn.closed {
			chn.mu.Unlock()
			return nil, ibv.ErrClosed
		}
		chn.cqs++
		chn.mu.Unlock()
	}
	if err := c.hold(); err != nil {
		if chn != nil {
			chn.mu.Lock()
			chn.cqs--
			chn.mu.Unlock()
		}
		return nil, err
	}
	c.dev.ncq.Add(1)
	return &cq{ctx: c, ch: chn, ring: make([]ibv.WC, cqe)}, nil
}

// Close releases the context; the device closes with its last context.
func (c *devContext) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return ibv.ErrClosed
	}
	if c.objects > 0 {
		n := c.objects
		c.mu.Unlock()
		return fmt.Errorf("soft: context has %d PDs, CQs or channels left: %w", n, ibv.ErrBusy)
	}
	c.closed = true
	c.mu.Unlock()
	c.prov.release(c.dev)
	return nil
}

// pd is a protection domain.
type pd struct {
	ctx *devContext

	mu   sync.Mutex
	mrs  int  // guarded by mu
	qps  int  // guarded by mu
	dead bool // guarded by mu
}

var _ ibv.PD = (*pd)(nil)

func (p *pd) use() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dead {
		return ibv.ErrClosed
	}
	return nil
}

// RegMR registers buf. The device reads and writes buf directly (no copy)
// until Dereg; buf must stay valid until then.
func (p *pd) RegMR(buf []byte, access ibv.Access) (ibv.MR, error) {
	known := ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic
	if access&^known != 0 {
		return nil, fmt.Errorf("soft: access flags %#x: %w", uint32(access), ibv.ErrInvalid)
	}
	if access&(ibv.AccessRemoteWrite|ibv.AccessRemoteAtomic) != 0 && access&ibv.AccessLocalWrite == 0 {
		return nil, fmt.Errorf("soft: remote write or atomic access needs local write: %w", ibv.ErrInvalid)
	}
	if uint64(len(buf)) > deviceAttr().MaxMRSize {
		return nil, fmt.Errorf("soft: region of %d bytes: %w", len(buf), ibv.ErrInvalid)
	}
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return nil, ibv.ErrClosed
	}
	p.mrs++
	p.mu.Unlock()
	m := &mr{pd: p, buf: buf, access: access}
	p.ctx.dev.addMR(m)
	return m, nil
}

func (p *pd) CreateQP(attr ibv.QPInitAttr) (ibv.QP, error) { return newQP(p, attr) }

// Dealloc releases the PD.
func (p *pd) Dealloc() error {
	p.mu.Lock()
	if p.dead {
		p.mu.Unlock()
		return ibv.ErrClosed
	}
	if p.mrs > 0 || p.qps > 0 {
		p.mu.Unlock()
		return fmt.Errorf("soft: PD has %d MRs and %d QPs: %w", p.mrs, p.qps, ibv.ErrBusy)
	}
	p.dead = true
	p.mu.Unlock()
	p.ctx.unhold()
	return nil
}

// mr is a registered memory region.
type mr struct {
	pd     *pd
	buf    []byte
	addr   uint64
	lkey   uint32
	rkey   uint32
	access ibv.Access
	dead   atomic.Bool
}

var _ ibv.MR = (*mr)(nil)

func (m *mr) LKey() uint32       { return m.lkey }
func (m *mr) RKey() uint32       { return m.rkey }
func (m *mr) Addr() uint64       { return m.addr }
func (m *mr) Len() int           { return len(m.buf) }
func (m *mr) Access() ibv.Access { return m.access }
func (m *mr) Buf() []byte        { return m.buf }

// Dereg removes the keys from the device: later work requests naming them
// fail. Operations already executing may still touch the memory until
// they complete.
func (m *mr) Dereg() error {
	if m.dead.Swap(true) {
		return ibv.ErrClosed
	}
	m.pd.ctx.dev.removeMR(m)
	m.pd.mu.Lock()
	m.pd.mrs--
	m.pd.mu.Unlock()
	return nil
}

// slice returns the bytes [addr, addr+n) of m, or nil when they are not
// all inside it.
func (m *mr) slice(addr uint64, n uint64) ([]byte, bool) {
	if addr < m.addr {
		return nil, false
	}
	off := addr - m.addr
	if off > uint64(len(m.buf)) || n > uint64(len(m.buf))-off {
		return nil, false
	}
	return m.buf[off : off+n : off+n], true
}

// cq is a completion queue: a bounded ring. Completions are pushed under
// the QP's lock (lock order qp.mu -> cq.mu -> channel.mu).
type cq struct {
	ctx *devContext
	ch  *channel

	mu      sync.Mutex
	ring    []ibv.WC // guarded by mu
	head, n int      // guarded by mu
	overrun bool     // guarded by mu
	armed   bool     // guarded by mu
	solOnly bool     // guarded by mu
	users   int      // QPs using the CQ; guarded by mu
	dead    bool     // guarded by mu
	unacked atomic.Int64
}

var _ ibv.CQ = (*cq)(nil)

// push adds a completion. A full CQ overruns: the completion is lost, the
// CQ is unusable from then on (Poll returns ErrCQOverrun).
func (c *cq) push(wc *ibv.WC, solicited bool) {
	c.mu.Lock()
	if c.dead || c.overrun {
		c.mu.Unlock()
		return
	}
	if c.n == len(c.ring) {
		c.overrun = true
		c.mu.Unlock()
		c.event() // IBV_EVENT_CQ_ERR has no channel event; wake a waiter so it polls and sees the error
		return
	}
	i := c.head + c.n
	if i >= len(c.ring) {
		i -= len(c.ring)
	}
	c.ring[i] = *wc
	c.n++
	fire := c.armed && (!c.solOnly || solicited || wc.Status != ibv.WCSuccess)
	if fire {
		c.armed = false
	}
	c.mu.Unlock()
	if fire {
		c.event()
	}
}

func (c *cq) event() {
	if c.ch != nil {
		c.ch.post(c)
	}
}

// Poll moves up to len(wc) completions into wc, oldest first.
func (c *cq) Poll(wc []ibv.WC) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return 0, ibv.ErrClosed
	}
	if c.overrun {
		return 0, fmt.Errorf("soft: CQ of %d entries: %w", len(c.ring), ibv.ErrCQOverrun)
	}
	if c.n == 0 && len(wc) > 0 {
		// Empty: help the device along (receive, send), as polling a
		// NIC's queue would, then look again.
		c.mu.Unlock()
		c.ctx.dev.progress()
		c.mu.Lock()
		if c.dead {
			return 0, ibv.ErrClosed
		}
		if c.overrun {
			return 0, fmt.Errorf("soft: CQ of %d entries: %w", len(c.ring), ibv.ErrCQOverrun)
		}
	}
	k := 0
	for k < len(wc) && c.n > 0 {
		wc[k] = c.ring[c.head]
		c.head++
		if c.head == len(c.ring) {
			c.head = 0
		}
		c.n--
		k++
	}
	return k, nil
}

// ReqNotify arms the CQ for one event. A CQ that already holds
// completions does not fire for them; the consumer polls after arming.
func (c *cq) ReqNotify(solicitedOnly bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.dead {
		return ibv.ErrClosed
	}
	if c.ch == nil {
		return fmt.Errorf("soft: CQ has no completion channel: %w", ibv.ErrInvalid)
	}
	if c.overrun {
		return fmt.Errorf("soft: %w", ibv.ErrCQOverrun)
	}
	c.armed = true
	c.solOnly = solicitedOnly
	return nil
}

func (c *cq) AckEvents(n int) { c.unacked.Add(-int64(n)) }

// Destroy releases the CQ: ErrBusy while QPs use it or events taken with
// GetEvent are not acknowledged.
func (c *cq) Destroy() error {
	c.mu.Lock()
	if c.dead {
		c.mu.Unlock()
		return ibv.ErrClosed
	}
	if c.users > 0 {
		c.mu.Unlock()
		return fmt.Errorf("soft: CQ used by %d QPs: %w", c.users, ibv.ErrBusy)
	}
	if u := c.unacked.Load(); u > 0 {
		c.mu.Unlock()
		return fmt.Errorf("soft: CQ has %d unacknowledged events: %w", u, ibv.ErrBusy)
	}
	c.dead = true
	c.mu.Unlock()
	c.ctx.dev.ncq.Add(-1)
	if c.ch != nil {
		c.ch.mu.Lock()
		c.ch.cqs--
		c.ch.mu.Unlock()
	}
	c.ctx.unhold()
	return nil
}

// channel is a completion channel: a queue of CQ events and a wake-up.
type channel struct {
	ctx  *devContext
	wake chan struct{} // capacity 1: merges wake-ups

	mu     sync.Mutex
	queue  []*cq // guarded by mu
	cqs    int   // guarded by mu
	closed bool  // guarded by mu
}

var _ ibv.CompChannel = (*channel)(nil)

func (ch *channel) post(c *cq) {
	ch.mu.Lock()
	ch.queue = append(ch.queue, c)
	ch.mu.Unlock()
	select {
	case ch.wake <- struct{}{}:
	default:
	}
}

// GetEvent waits for the next CQ event.
func (ch *channel) GetEvent(ctx ctxpkg.Context) (ibv.CQ, error) {
	for {
		ch.mu.Lock()
		if ch.closed {
			ch.mu.Unlock()
			return nil, ibv.ErrClosed
		}
		if len(ch.queue) > 0 {
			c := ch.queue[0]
			copy(ch.queue, ch.queue[1:])
			ch.queue[len(ch.queue)-1] = nil
			ch.queue = ch.queue[:len(ch.queue)-1]
			more := len(ch.queue) > 0
			ch.mu.Unlock()
			if more {
				select {
				case ch.wake <- struct{}{}:
				default:
				}
			}
			c.unacked.Add(1)
			return c, nil
		}
		ch.mu.Unlock()
		select {
		case <-ch.wake:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close destroys the channel (ErrBusy while CQs use it).
func (ch *channel) Close() error {
	ch.mu.Lock()
	if ch.closed {
		ch.mu.Unlock()
		return ibv.ErrClosed
	}
	if ch.cqs > 0 {
		n := ch.cqs
		ch.mu.Unlock()
		return fmt.Errorf("soft: channel used by %d CQs: %w", n, ibv.ErrBusy)
	}
	ch.closed = true
	ch.mu.Unlock()
	select {
	case ch.wake <- struct{}{}:
	default:
	}
	ch.ctx.unhold()
	return nil
}
