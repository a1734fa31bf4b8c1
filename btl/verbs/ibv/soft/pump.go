package soft

import (
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// ackEvery asks for an ACK at least every that many packets of a long
// message, so that the window moves before the message ends.
const ackEvery = 32

// pump builds and sends this QP's due packets: READ responses, then the
// owed ACK or NAK, then requests within the window. One goroutine pumps a
// QP at a time; a caller that finds it busy leaves (the pumper builds
// until nothing is due). After budget packets the rest goes to the
// device's transmit worker.
func (q *qp) pump(budget int) {
	q.mu.Lock()
	if q.pumping {
		q.mu.Unlock()
		return
	}
	q.pumping = true
	more := false
	for {
		if budget <= 0 {
			more = true
			break
		}
		q.tx.reset()
		more = q.buildLocked(min(budget, txBatchPkts))
		if q.tx.empty() {
			more = false
			break
		}
		q.tx.dst = q.peer
		s := q.dev.sock
		if q.txs != nil {
			s = q.txs
		}
		q.mu.Unlock()
		wireSync()
		n, err := s.send(q.ts, q.tx)
		c := &q.dev.ctr
		c.pktSent.Add(uint64(n))
		sent := 0
		for _, k := range q.tx.pkts[:n] {
			sent += k.size
		}
		c.bytesSent.Add(uint64(sent)) // one atomic per batch, not per packet
		if err != nil || n < len(q.tx.pkts) {
			c.sendErr.Add(uint64(len(q.tx.pkts) - n))
		}
		budget -= len(q.tx.pkts)
		q.mu.Lock()
		// Build again even when the batch was not full: while the lock
		// was released, others may have made packets due and left them
		// to this pumper.
	}
	q.pumping = false
	if q.txsOld != nil {
		q.txsOld.close()
		q.txsOld = nil
	}
	q.mu.Unlock()
	if more {
		q.dev.schedule(q)
	}
}

// sendAckNow sends the QP's deferred ACK, if it still owes one; a lazy
// one only when lazy is set (the lazy timer's pass).
func (q *qp) sendAckNow(lazy bool) {
	q.mu.Lock()
	due := q.r.ctl && q.r.ackLater && (lazy || !q.r.ackLazy)
	if due {
		q.r.ackLater, q.r.ackLazy = false, false
	}
	q.mu.Unlock()
	if due {
		q.pump(rxPumpBudget)
	}
}

// buildLocked fills q.tx with up to limit packets and reports whether it
// stopped at the limit (more may be due).
func (q *qp) buildLocked(limit int) bool {
	if q.destroyed {
		return false
	}
	r := &q.r
	n := 0
	for len(r.reads) > 0 {
		if n >= limit || q.tx.full() {
			return true
		}
		q.buildResponse(&r.reads[0])
		n++
		if rr := &r.reads[0]; rr.next == rr.npkts {
			copy(r.reads, r.reads[1:])
			r.reads = r.reads[:len(r.reads)-1]
		}
	}
	if r.ctl && !r.ackLater {
		if n >= limit || q.tx.full() {
			return true
		}
		q.buildCtl()
		n++
	}
	if q.state == ibv.QPSRTS || q.state == ibv.QPSSQD {
		for {
			if n >= limit || q.tx.full() {
				return true
			}
			if !q.buildRequest() {
				break
			}
			n++
		}
	}
	// A deferred ACK rides behind whatever else goes out: after the
	// requests, so that the peer takes the data first. A lazy one waits
	// for its timer (queueAckLazy).
	if r.ctl && n > 0 && !r.ackLazy {
		if n >= limit || q.tx.full() {
			return true
		}
		q.buildCtl()
	}
	return false
}

// seal finishes a packet begun with hdr: payload parts were added by the
// caller and c covers hdr's BTH through the payload; it appends the pad
// and the ICRC.
func (q *qp) seal(hdrLen, payLen int, c uint32) {
	pad := padLen(payLen)
	t := q.tx.alloc(pad + icrcLen)
	if pad > 0 {
		c = crcBytes(c, t[:pad])
	}
	putICRC(t[pad:], c)
	q.tx.part(t)
}

// startPacket encodes p's headers into the batch and returns the CRC
// state after them, for a packet with payLen payload bytes.
func (q *qp) startPacket(p *packet, payLen int) (uint32, int) {
	p.flags, _ = opInfo(p.bth.opcode)
	p.bth.pkey = defaultPKey
	p.bth.destQP = q.attr.DestQPN
	p.bth.padCnt = uint8(padLen(payLen))
	hl := headerLen(p.bth.opcode)
	h := q.tx.alloc(hl)
	p.encodeHeaders(h)
	q.tx.begin()
	q.tx.part(h)
	udpLen := hl + payLen + padLen(payLen) + icrcLen
	c := q.tx.icrc.start(&q.flow, udpLen, h)
	return crcBytes(c, h[bthLen:]), hl
}

// addPayload adds bytes [off, off+n) of segs to the packet and the CRC.
func (q *qp) addPayload(c uint32, segs [][]byte, off, n int) uint32 {
	for _, s := range segs {
		if n == 0 {
			break
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		piece := s[off:min(len(s), off+n)]
		q.tx.part(piece)
		c = icrcUpdate(c, piece)
		n -= len(piece)
		off = 0
	}
	return c
}

func (q *qp) buildCtl() {
	q.r.ctl, q.r.ackLater, q.r.ackLazy, q.r.sinceAck = false, false, false, 0
	p := packet{bth: bth{opcode: opAck, psn: q.r.ctlPSN}, aeth: aeth{syndrome: q.r.ctlSyn, msn: q.r.msn}}
	c, hl := q.startPacket(&p, 0)
	q.seal(hl, 0, c)
}

func (q *qp) buildResponse(rr *readResp) {
	k := rr.next
	rr.next++
	p := packet{bth: bth{psn: (rr.psn + k) & psnMask}, aeth: aeth{syndrome: synACK | creditsInvalid, msn: q.r.msn}}
	if rr.atomic {
		p.bth.opcode, p.orig = opAtomicAck, rr.orig
		c, hl := q.startPacket(&p, 0)
		q.seal(hl, 0, c)
		return
	}
	switch {
	case rr.npkts == 1:
		p.bth.opcode = opReadRespOnly
	case k == 0:
		p.bth.opcode = opReadRespFirst
	case k == rr.npkts-1:
		p.bth.opcode = opReadRespLast
	default:
		p.bth.opcode = opReadRespMiddle
	}
	off := int(k) * q.mtu
	n := min(q.mtu, len(rr.buf)-off)
	c, hl := q.startPacket(&p, n)
	if n > 0 {
		piece := rr.buf[off : off+n]
		q.tx.part(piece)
		c = icrcUpdate(c, piece)
	}
	q.seal(hl, n, c)
}

// Opcodes of a SEND or WRITE packet by position: first, middle, last,
// only; the immediate forms of last and only.
var (
	sendOps  = [4]uint8{opSendFirst, opSendMiddle, opSendLast, opSendOnly}
	writeOps = [4]uint8{opWriteFirst, opWriteMiddle, opWriteLast, opWriteOnly}
)

// buildRequest adds the packet at the transmit cursor, if the window,
// the READ limit, a fence or an RNR wait let it go.
func (q *qp) buildRequest() bool {
	if q.txIdx >= q.sqCount || !q.rnrUntil.IsZero() {
		return false
	}
	w := q.sqAt(q.txIdx)
	if w.locErr != ibv.WCSuccess {
		q.checkLocErr()
		return false
	}
	if q.txPkt == 0 {
		if q.state == ibv.QPSSQD {
			return false
		}
		if w.flags&ibv.FlagFence != 0 && q.rdOut > 0 {
			return false
		}
	}
	rd := isRd(w.op)
	if rd && q.txPkt == 0 && q.rdOut >= int(q.attr.MaxRdAtomic) {
		return false
	}
	if w.op == ibv.WRRDMARead && q.txPkt > w.rdRcvd {
		return false // the previous part of a long READ is still coming
	}
	psn := (w.psn + q.txPkt) & psnMask
	if int(psnDiff(psn, q.ackPSN)) > q.window() {
		return false
	}
	var now time.Time // read once per packet at most
	if q.txIdx == 0 && q.txPkt == 0 {
		now = q.dev.clock.Now()
		q.lastProgress = now
	}
	if q.sentAny && psnDiff(psn, q.maxSent) <= 0 {
		q.dev.ctr.retrans.Add(1)
	}
	p := packet{bth: bth{psn: psn}}
	k := int(q.txPkt)
	switch {
	case w.op == ibv.WRRDMARead:
		// A READ longer than the window is asked for in parts of a window
		// each, the next once the previous has arrived: READ responses
		// have no acknowledgement to pace them, so this bounds what is in
		// flight towards this requester.
		// Parts start at multiples of the window; a part asked again from
		// inside ends where the original did, so that the responder's PSNs
		// and the requester's stay the same.
		p.bth.opcode = opReadRequest
		done := k * q.mtu
		win := q.dev.cfg.Window
		n := min(w.length-done, (k/win+1)*win*q.mtu-done)
		p.reth = reth{va: w.raddr + uint64(done), rkey: w.rkey, dmaLen: uint32(n)}
		c, hl := q.startPacket(&p, 0)
		q.seal(hl, 0, c)
		if k == 0 {
			q.rdOut++
		}
		if next := uint32(k) + readPkts(n, q.mtu); next < w.npkts {
			q.txPkt = next
		} else {
			q.txIdx++
			q.txPkt = 0
		}
	case rd:
		p.bth.opcode = opFetchAdd
		p.atomic = atomicETH{va: w.raddr, rkey: w.rkey, swapAdd: w.cmpAdd}
		if w.op == ibv.WRAtomicCmpAndSwp {
			p.bth.opcode = opCmpSwap
			p.atomic.swapAdd, p.atomic.compare = w.swap, w.cmpAdd
		}
		c, hl := q.startPacket(&p, 0)
		q.seal(hl, 0, c)
		q.txIdx++
		q.txPkt = 0
		q.rdOut++
	default:
		first := k == 0
		last := uint32(k) == w.npkts-1
		pos := 1
		switch {
		case first && last:
			pos = 3
		case first:
			pos = 0
		case last:
			pos = 2
		}
		isWrite := w.op == ibv.WRRDMAWrite || w.op == ibv.WRRDMAWriteWithImm
		withImm := w.op == ibv.WRRDMAWriteWithImm || w.op == ibv.WRSendWithImm
		if isWrite {
			p.bth.opcode = writeOps[pos]
			if first {
				p.reth = reth{va: w.raddr, rkey: w.rkey, dmaLen: uint32(w.length)}
			}
		} else {
			p.bth.opcode = sendOps[pos]
		}
		if last && withImm {
			p.bth.opcode++ // the _WITH_IMMEDIATE form follows each last and only opcode
			p.imm = w.imm
		}
		if last && w.flags&ibv.FlagSolicited != 0 && (!isWrite || withImm) {
			p.bth.se = true
		}
		// Ask for an ACK at the end of a message whose completion the
		// user waits for (signaled), or when the send queue is half full
		// (its slots free only on acknowledgements); every quarter of the
		// window (at most every ackEvery packets) of a message and of
		// the packets unacknowledged; and when the window is full: the
		// window moves only on acknowledgements. The end of an unsignaled
		// message asks for none: the responder acknowledges it lazily,
		// so that a stream of small unsignaled messages (with a reply
		// for each) is not followed by an ACK datagram for each.
		every := max(1, min(ackEvery, q.window()/4))
		unacked := int(psnDiff(psn, q.ackPSN))
		p.bth.ackReq = (last && (w.signaled || q.sigAll || 2*q.sqCount >= len(q.sq))) ||
			(k+1)%every == 0 || unacked%every == 0 || unacked >= q.window()
		off := k * q.mtu
		n := min(q.mtu, w.length-off)
		c, hl := q.startPacket(&p, n)
		c = q.addPayload(c, w.segs, off, n)
		q.seal(hl, n, c)
		q.txPkt++
		if last {
			q.txIdx++
			q.txPkt = 0
		}
	}
	last := psn
	if rd {
		last = (w.psn + w.npkts - 1) & psnMask
	}
	if !q.sentAny || psnDiff(last, q.maxSent) > 0 {
		q.maxSent = last
	}
	q.sentAny = true
	if !q.probing && psnDiff(last, q.maxSent) >= 0 {
		// The round trip of a READ (part) ends with its first response
		// packet, which carries the request's PSN; timing it to the last
		// response would take the transfer (and its recoveries) for the
		// round trip, and the timeout estimate would run away.
		if now.IsZero() {
			now = q.dev.clock.Now()
		}
		q.probing, q.probePSN, q.probeAt = true, psn, now
	}
	if q.timeout > 0 && !q.timerArmed {
		q.arm(q.deadline())
	}
	return true
}
