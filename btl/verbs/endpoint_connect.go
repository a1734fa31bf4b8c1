// Wire-up of a pair. The first operation on an idle endpoint (or the
// peer's address appearing) starts connect on its own goroutine: it makes
// the completion queue, the QP and the inbound ring (setup), trades
// addresses with the peer through the store, moves the QP through RTR and
// RTS (bringUp), and marks the pair connected once both sides have said
// their QP is up; the operations queued meanwhile are then posted.

package verbs

import (
	"fmt"
	"math/rand/v2"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// startConnect begins connecting an idle endpoint.
func (e *endpoint) startConnect() {
	e.mu.Lock()
	e.startConnectLocked()
	e.unlock()
}

func (e *endpoint) startConnectLocked() {
	if e.state != epIdle {
		return
	}
	m := e.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return
	}
	e.state = epConnecting
	m.wg.Add(1)
	go e.connect()
}

// connectFailed fails a connecting endpoint.
func (e *endpoint) connectFailed(err error) {
	e.mu.Lock()
	if e.state == epConnecting {
		e.failLocked(&classedError{msg: fmt.Sprintf("verbs: rank %d cannot connect to rank %d: %v", e.m.env.Rank, e.peer, err),
			wraps: []error{mpierr.ErrProcFailed, btl.ErrUnreachable, err}})
	}
	e.unlock()
}

// connect brings the pair up: QP, rings, address exchange through the
// store, RTR and RTS, then the "up" exchange, after which both sides may
// send.
func (e *endpoint) connect() {
	m := e.m
	defer m.wg.Done()
	if err := e.setup(); err != nil {
		e.connectFailed(err)
		return
	}
	ctx, cancel := contextWithTimeout(m)
	defer cancel()
	me := m.env.Rank
	local := addr{LID: m.port.LID, Port: m.cfg.port, MTU: m.mtu, QPN: e.qp.QPN(), PSN: e.psn, GID: m.gid,
		RingAddr: e.ringMR.Addr(), RingKey: e.ringMR.RKey(), RingSize: uint32(len(e.ring)), Credits: uint32(m.cfg.credits)}
	if err := m.env.Store.Set(pairKey(me, e.peer), local.encode()); err != nil {
		e.connectFailed(fmt.Errorf("publishing the address: %w", err))
		return
	}
	b, err := m.env.Store.Get(ctx, pairKey(e.peer, me))
	if err != nil {
		e.connectFailed(fmt.Errorf("waiting for its address: %w", err))
		return
	}
	ra, err := decodeAddr(b)
	if err != nil {
		e.connectFailed(err)
		return
	}
	if n := alignUp(m.cfg.maxFrag + frameHdrLen); n > int(ra.RingSize)/4 {
		e.connectFailed(mpierr.Errorf(mpierr.ErrArg, "its %d-byte control ring is too small for this rank's %d-byte fragments (set the same btl_verbs_* parameters on every rank)", ra.RingSize, m.cfg.maxFrag))
		return
	}
	if err := e.bringUp(ra); err != nil {
		e.connectFailed(err)
		return
	}
	if err := m.env.Store.Set(upKey(me, e.peer), []byte{1}); err != nil {
		e.connectFailed(fmt.Errorf("publishing readiness: %w", err))
		return
	}
	if _, err := m.env.Store.Get(ctx, upKey(e.peer, me)); err != nil {
		e.connectFailed(fmt.Errorf("waiting for its QP to come up: %w", err))
		return
	}
	e.mu.Lock()
	if e.state != epConnecting {
		e.unlock()
		return
	}
	e.remote = ra
	e.win = newSendWindow(int(ra.RingSize), int(ra.Credits))
	e.sqFree = m.depth
	e.state = epConnected
	m.addLive(e)
	e.drainLocked()
	e.unlock()
	m.wake() // completions may have come before the watcher armed the queue
	m.env.Logf("verbs: rank %d connected to rank %d: %v", me, e.peer, ra)
}

// setup makes the pair's completion queue, QP (moved to INIT, receives
// posted) and inbound ring.
func (e *endpoint) setup() error {
	m := e.m
	var err error
	if e.cq, err = m.dev.CreateCQ(2*m.depth+8, m.ch); err != nil {
		return fmt.Errorf("creating a completion queue: %w", err)
	}
	if e.qp, err = m.pd.CreateQP(ibv.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: m.depth, MaxRecvWR: m.depth, MaxSendSGE: 2, MaxRecvSGE: 1}}); err != nil {
		return fmt.Errorf("creating a QP: %w", err)
	}
	e.ring = make([]byte, m.cfg.ringSize)
	e.pin.Pin(&e.ring[0])
	if e.ringMR, err = m.pd.RegMR(e.ring, ibv.AccessLocalWrite|ibv.AccessRemoteWrite); err != nil {
		return fmt.Errorf("registering the control ring: %w", err)
	}
	if err = e.qp.Modify(&ibv.QPAttr{State: ibv.QPSInit, PKeyIndex: m.cfg.pkeyIndex, Port: m.cfg.port,
		AccessFlags: ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead}, ibv.MaskResetToInit); err != nil {
		return fmt.Errorf("QP to INIT: %w", err)
	}
	e.rwin = newRecvWindow(len(e.ring), m.cfg.credits)
	e.wcs = make([]ibv.WC, 32)
	e.rwrs = make([]ibv.RecvWR, m.depth)
	e.rqFree = m.depth
	e.mu.Lock()
	e.repostLocked()
	err = e.err
	e.unlock()
	if e.rqFree != 0 {
		return fmt.Errorf("posting receives: %v", err)
	}
	e.psn = rand.Uint32() & 0xFFFFFF
	return nil
}

// bringUp moves the QP to RTR and RTS towards ra and allocates the staging
// copy of the peer's ring.
func (e *endpoint) bringUp(ra addr) error {
	m := e.m
	rd := uint8(1)
	if a := min(m.attr.MaxQPRdAtom, m.attr.MaxQPInitRdAtom, 16); a > 1 {
		rd = uint8(a)
	}
	mtu := min(m.mtu, ra.MTU)
	global := m.port.LinkLayer == ibv.LinkEthernet || ra.GID != (ibv.GID{})
	rtr := ibv.QPAttr{State: ibv.QPSRTR, PathMTU: mtu, DestQPN: ra.QPN, RQPSN: ra.PSN, MaxDestRdAtomic: rd, MinRNRTimer: 12,
		AH: ibv.AH{DLID: ra.LID, SL: m.cfg.sl, IsGlobal: global, DGID: ra.GID, SGIDIndex: uint8(m.cfg.gidIndex),
			HopLimit: 64, TrafficClass: m.cfg.trafficClass, Port: m.cfg.port}}
	if err := e.qp.Modify(&rtr, ibv.MaskInitToRTR); err != nil {
		return fmt.Errorf("QP to RTR: %w", err)
	}
	rts := ibv.QPAttr{State: ibv.QPSRTS, SQPSN: e.psn, Timeout: m.cfg.timeout, RetryCnt: m.cfg.retry, RNRRetry: m.cfg.rnrRetry, MaxRdAtomic: rd}
	if err := e.qp.Modify(&rts, ibv.MaskRTRToRTS); err != nil {
		return fmt.Errorf("QP to RTS: %w", err)
	}
	e.stage = make([]byte, ra.RingSize)
	e.pin.Pin(&e.stage[0])
	var err error
	if e.stageMR, err = m.pd.RegMR(e.stage, ibv.AccessLocalWrite); err != nil {
		return fmt.Errorf("registering the staging ring: %w", err)
	}
	return nil
}
