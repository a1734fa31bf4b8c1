package soft

import (
	"encoding/binary"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// respState is a QP's responder: what it expects next, the message it is
// in the middle of, and what it owes the requester.
type respState struct {
	ePSN    uint32 // next PSN expected
	msn     uint32 // messages completed (24 bits)
	nakSent bool   // a sequence or RNR NAK for ePSN went out; no more until it arrives

	inSend    bool   // between SEND FIRST and LAST (the head receive is taken)
	inWrite   bool   // between RDMA WRITE FIRST and LAST
	recvOff   int    // bytes placed into the taken receive
	solicited bool   // the completing packet had SE
	wrBuf     []byte // the WRITE's target memory
	wrPos     int

	// One control packet (ACK or NAK) owed, sent after any READ
	// responses so that responses stay in PSN order. ackLater marks a
	// plain ACK that may wait for a carrier (see queueAckLater), ackLazy
	// one that no one asked for and that waits for the device's lazy
	// timer (see queueAckLazy); sinceAck counts the request packets
	// executed since the last control packet was built.
	ctl      bool
	ackLater bool
	ackLazy  bool
	ctlSyn   uint8
	ctlPSN   uint32
	sinceAck int

	reads   []readResp // READ and atomic responses to send, in PSN order
	atomics [16]atomicResult
	atomicN int
}

// readResp is a READ response (or atomic ACK) in progress.
type readResp struct {
	psn    uint32 // PSN of the first response packet
	npkts  uint32
	next   uint32 // next packet to send
	buf    []byte
	atomic bool
	orig   uint64
	// dup marks responses queued again for a duplicate request whose
	// original had been answered in full: they repeat an old READ or
	// atomic and hold none of the max_dest_rd_atomic resources that new
	// requests are counted against.
	dup bool
}

// atomicResult remembers an executed atomic, to answer a duplicate with
// the same value instead of executing it again.
type atomicResult struct {
	psn   uint32
	orig  uint64
	valid bool
}

// psnDiff returns a-b as a signed 24-bit distance.
func psnDiff(a, b uint32) int32 { return int32((a-b)<<8) >> 8 }

func (q *qp) queueCtl(syn uint8, psn uint32) {
	q.r.ctl, q.r.ackLater, q.r.ackLazy, q.r.ctlSyn, q.r.ctlPSN = true, false, false, syn, psn&psnMask
}

func (q *qp) queueAck() { q.queueCtl(synACK|creditsInvalid, q.r.ePSN-1) }

// ackDeferMax bounds the request packets a deferred ACK may leave
// unacknowledged; past it the ACK goes out at once.
const ackDeferMax = 16

// queueAckLater owes an ACK for a packet that completed a receive. The
// ACK need not leave at once (the IBA lets a responder coalesce ACKs: one
// covers every PSN up to it): it rides behind the next request packets
// this QP sends (the user's reply to the completion, usually), or leaves
// at the device's next progress pass or within ackDeferBound, whichever
// comes first (device.deferAck). An owed NAK or immediate ACK, or more
// than ackDeferMax packets unacknowledged, keep it immediate.
func (q *qp) queueAckLater() {
	r := &q.r
	if (r.ctl && !r.ackLater) || r.sinceAck > ackDeferMax {
		q.queueAck()
		return
	}
	q.queueAck()
	r.ackLater = true
	q.dev.deferAck(q)
}

// ackLazyMax is how many request packets an ACK no one asked for may
// leave unacknowledged before it rides with the QP's next requests.
const ackLazyMax = ackDeferMax

// queueAckLazy owes an ACK for the last packet of a message whose
// requester did not ask for one (no AckReq: its work request was
// unsignaled and its send queue and window have room). The requester
// needs it only to free its send queue slots and window, so it waits up
// to the device's lazy bound from the first packet it covers
// (device.deferLazy, well below the requester's least local ACK
// timeout), or rides with the QP's next requests once
// ackLazyMax packets are unacknowledged; a packet that asks for an ACK,
// or any other control packet, takes it along earlier (one ACK covers
// every PSN up to it).
func (q *qp) queueAckLazy() {
	r := &q.r
	switch {
	case r.ctl && !r.ackLater:
		q.queueAck() // an immediate one is owed anyway: it covers this packet
	case r.ctl && !r.ackLazy:
		q.queueAck() // a deferred one is owed: it stays deferred
		r.ackLater = true
	case r.sinceAck >= ackLazyMax:
		q.queueAckLater()
	default:
		if !r.ackLazy {
			q.lazySince = q.dev.rxNow
		}
		q.queueAck()
		r.ackLater, r.ackLazy = true, true
		q.dev.deferLazy(q, q.dev.lazyBound)
	}
}

// responderInput handles a request packet (SEND, WRITE, READ, atomic) in
// the order of the IBA responder: PSN, opcode sequence, access, length,
// resources, keys, execution. Called with q.mu held.
func (q *qp) responderInput(p *packet) {
	if q.state != ibv.QPSRTR && q.state != ibv.QPSRTS && q.state != ibv.QPSSQD {
		q.dev.ctr.bad.Add(1)
		return
	}
	r := &q.r
	d := psnDiff(p.bth.psn, r.ePSN)
	if d < 0 {
		q.duplicate(p)
		return
	}
	if d > 0 {
		q.dev.ctr.oos.Add(1)
		if !r.nakSent {
			r.nakSent = true
			q.queueCtl(synNAK|nakPSNSeq, r.ePSN)
			q.dev.ctr.seqNakTx.Add(1)
		}
		return
	}
	f := p.flags
	first := f&fFirst != 0
	last := f&fLast != 0
	switch {
	case r.inSend:
		if f&fSend == 0 || first {
			q.respFatal(nakInvReq, ibv.WCLocQPOpErr)
			return
		}
	case r.inWrite:
		if f&fWrite == 0 || first {
			q.respFatal(nakInvReq, 0)
			return
		}
	default:
		if !first {
			q.respFatal(nakInvReq, 0)
			return
		}
	}
	acc := q.attr.AccessFlags
	if (f&fWrite != 0 && first && acc&ibv.AccessRemoteWrite == 0) ||
		(f&fRead != 0 && acc&ibv.AccessRemoteRead == 0) ||
		(f&fAtomic != 0 && acc&ibv.AccessRemoteAtomic == 0) {
		q.accessError(p)
		return
	}
	if f&fPayload != 0 {
		n := len(p.payload)
		if (!last && n != q.mtu) || n > q.mtu {
			q.respFatal(nakInvReq, 0)
			return
		}
	}
	if f&fNeedsRecv != 0 && q.rqCount == 0 {
		r.nakSent = true
		q.queueCtl(synRNR|q.attr.MinRNRTimer&synValMsk, r.ePSN)
		q.dev.ctr.rnrNakTx.Add(1)
		return
	}
	switch {
	case f&fSend != 0:
		if !q.execSend(p) {
			return
		}
	case f&fWrite != 0:
		if !q.execWrite(p) {
			return
		}
	case f&fRead != 0:
		q.execRead(p)
		return
	case f&fAtomic != 0:
		q.execAtomic(p)
		return
	}
	r.ePSN = (r.ePSN + 1) & psnMask
	r.nakSent = false
	r.sinceAck++
	if last {
		r.msn = (r.msn + 1) & psnMask
	}
	switch {
	case p.bth.ackReq && last && f&(fSend|fImm) != 0:
		// A completion the user polls: the reply it provokes carries
		// the ACK.
		q.queueAckLater()
	case p.bth.ackReq:
		q.queueAck()
	case last:
		q.queueAckLazy()
	}
}

// execSend places a SEND packet into the head receive. It returns false
// when the QP failed.
func (q *qp) execSend(p *packet) bool {
	r := &q.r
	f := p.flags
	w := &q.rq[q.rqHead]
	if f&fFirst != 0 {
		if w.locErr != ibv.WCSuccess {
			q.respFatal(nakRemOp, w.locErr)
			return false
		}
		r.inSend, r.recvOff = true, 0
	}
	if r.recvOff+len(p.payload) > w.length {
		q.respFatal(nakInvReq, ibv.WCLocLenErr)
		return false
	}
	scatter(w.segs, r.recvOff, p.payload)
	r.recvOff += len(p.payload)
	if f&fLast != 0 {
		r.inSend = false
		r.solicited = p.bth.se
		q.completeRecv(ibv.WCSuccess, ibv.WCRecv, r.recvOff, p.imm, f&fImm != 0)
	}
	return true
}

// execWrite places an RDMA WRITE packet. It returns false when the QP
// failed.
func (q *qp) execWrite(p *packet) bool {
	r := &q.r
	f := p.flags
	if f&fFirst != 0 {
		b, ok := q.remoteMem(p.reth.rkey, p.reth.va, p.reth.dmaLen, ibv.AccessRemoteWrite)
		if !ok {
			q.accessError(p)
			return false
		}
		if p.reth.dmaLen > 1<<31 {
			q.respFatal(nakInvReq, 0)
			return false
		}
		r.wrBuf, r.wrPos, r.inWrite = b, 0, true
	}
	if r.wrPos+len(p.payload) > len(r.wrBuf) {
		q.respFatal(nakInvReq, 0)
		return false
	}
	copy(r.wrBuf[r.wrPos:], p.payload)
	r.wrPos += len(p.payload)
	if f&fLast != 0 {
		if r.wrPos != len(r.wrBuf) {
			q.respFatal(nakInvReq, 0)
			return false
		}
		r.inWrite = false
		if f&fImm != 0 {
			r.solicited = p.bth.se
			q.completeRecv(ibv.WCSuccess, ibv.WCRecvRDMAWithImm, len(r.wrBuf), p.imm, true)
		}
		r.wrBuf = nil
	}
	return true
}

// remoteMem checks an rkey and a range for access and returns the memory.
// A zero-length range needs no valid key.
func (q *qp) remoteMem(rkey uint32, va uint64, n uint32, need ibv.Access) ([]byte, bool) {
	if n == 0 {
		return nil, true
	}
	m := q.dev.lookupMR(rkey)
	if m == nil || m.dead.Load() || m.rkey != rkey || m.pd != q.pd || m.access&need == 0 {
		return nil, false
	}
	return m.slice(va, uint64(n))
}

func (q *qp) maxReads() int { return int(q.attr.MaxDestRdAtomic) }

// readsHeld is how many queued responses answer new READ and atomic
// requests (not repeats for duplicates): what max_dest_rd_atomic bounds.
// A requester keeps at most max_rd_atomic of them outstanding, but a
// duplicate it sent after a go-back can come when the original's
// responses are all out, and the repeat then stays queued beside the new
// requests that follow it.
func (q *qp) readsHeld() (held, dups int) {
	for i := range q.r.reads {
		if q.r.reads[i].dup {
			dups++
		} else {
			held++
		}
	}
	return held, dups
}

func (q *qp) execRead(p *packet) {
	r := &q.r
	if p.reth.dmaLen > 1<<31 {
		q.respFatal(nakInvReq, 0)
		return
	}
	if held, _ := q.readsHeld(); held >= q.maxReads() {
		q.respFatal(nakInvReq, 0)
		return
	}
	b, ok := q.remoteMem(p.reth.rkey, p.reth.va, p.reth.dmaLen, ibv.AccessRemoteRead)
	if !ok {
		q.accessError(p)
		return
	}
	n := readPkts(int(p.reth.dmaLen), q.mtu)
	r.reads = append(r.reads, readResp{psn: r.ePSN, npkts: n, buf: b})
	r.ePSN = (r.ePSN + n) & psnMask
	r.nakSent = false
	r.msn = (r.msn + 1) & psnMask
}

// readPkts is the number of response packets of an n-byte READ.
func readPkts(n, mtu int) uint32 {
	if n <= mtu {
		return 1
	}
	return uint32((n + mtu - 1) / mtu)
}

func (q *qp) execAtomic(p *packet) {
	r := &q.r
	if held, _ := q.readsHeld(); held >= q.maxReads() {
		q.respFatal(nakInvReq, 0)
		return
	}
	a := &p.atomic
	if a.va%8 != 0 {
		q.respFatal(nakInvReq, 0)
		return
	}
	b, ok := q.remoteMem(a.rkey, a.va, 8, ibv.AccessRemoteAtomic)
	if !ok {
		q.accessError(p)
		return
	}
	q.dev.atomicMu.Lock()
	orig := binary.LittleEndian.Uint64(b)
	if p.bth.opcode == opCmpSwap {
		if orig == a.compare {
			binary.LittleEndian.PutUint64(b, a.swapAdd)
		}
	} else {
		binary.LittleEndian.PutUint64(b, orig+a.swapAdd)
	}
	q.dev.atomicMu.Unlock()
	r.atomics[r.atomicN%len(r.atomics)] = atomicResult{psn: r.ePSN, orig: orig, valid: true}
	r.atomicN++
	r.reads = append(r.reads, readResp{psn: r.ePSN, npkts: 1, atomic: true, orig: orig})
	r.ePSN = (r.ePSN + 1) & psnMask
	r.nakSent = false
	r.msn = (r.msn + 1) & psnMask
}

// duplicate answers a request the responder has already executed: a
// repeated ACK for SEND and WRITE, the response again for READ (executed
// anew from the packet's RETH, which names the part still missing) and
// the remembered result for an atomic.
func (q *qp) duplicate(p *packet) {
	r := &q.r
	q.dev.ctr.dups.Add(1)
	f := p.flags
	switch {
	case f&fRead != 0:
		b, ok := q.remoteMem(p.reth.rkey, p.reth.va, p.reth.dmaLen, ibv.AccessRemoteRead)
		if !ok || p.reth.dmaLen > 1<<31 || q.attr.AccessFlags&ibv.AccessRemoteRead == 0 {
			return // the original was valid; the requester's retry is not
		}
		rr := readResp{psn: p.bth.psn, npkts: readPkts(int(p.reth.dmaLen), q.mtu), buf: b}
		q.replaceResponse(rr)
	case f&fAtomic != 0:
		for _, a := range r.atomics {
			if a.valid && a.psn == p.bth.psn {
				q.replaceResponse(readResp{psn: a.psn, npkts: 1, atomic: true, orig: a.orig})
				return
			}
		}
	default:
		if p.bth.ackReq || f&fLast != 0 {
			q.queueAck()
		}
	}
}

// replaceResponse queues rr, replacing a pending response it overlaps
// (the requester asks again from rr.psn), keeping PSN order.
func (q *qp) replaceResponse(rr readResp) {
	r := &q.r
	for i := range r.reads {
		x := &r.reads[i]
		if psnDiff(rr.psn, x.psn) >= 0 && psnDiff(rr.psn, x.psn+x.npkts) < 0 {
			rr.dup = x.dup // the same request as the one it replaces
			*x = rr
			return
		}
	}
	if _, dups := q.readsHeld(); dups >= max(q.maxReads(), 1) {
		return // the requester retries later
	}
	rr.dup = true
	i := len(r.reads)
	for i > 0 && psnDiff(r.reads[i-1].psn, rr.psn) > 0 {
		i--
	}
	r.reads = append(r.reads, readResp{})
	copy(r.reads[i+1:], r.reads[i:])
	r.reads[i] = rr
}

// accessError answers an rkey, PD, range or access-flag failure: a
// remote access error NAK, the receive the packet would consume (if any)
// completes with LOC_PROT_ERR, and the QP goes to ERR.
func (q *qp) accessError(p *packet) {
	st := ibv.WCStatus(0)
	if p.flags&fNeedsRecv != 0 && q.rqCount > 0 {
		st = ibv.WCLocProtErr
	}
	q.respFatal(nakRemAccess, st)
}

// respFatal ends the responder on a class C error: the taken receive (if
// recvSt is not success) completes with recvSt, the QP goes to ERR and a
// NAK with code for ePSN is owed to the requester.
func (q *qp) respFatal(code uint8, recvSt ibv.WCStatus) {
	psn := q.r.ePSN
	if recvSt != ibv.WCSuccess && q.rqCount > 0 {
		q.completeRecv(recvSt, 0, 0, 0, false)
	}
	q.dev.ctr.errNakTx.Add(1)
	q.toErrLocked()
	q.queueCtl(synNAK|code, psn)
}

// scatter copies data into segs starting at byte off of their
// concatenation.
func scatter(segs [][]byte, off int, data []byte) {
	for _, s := range segs {
		if len(data) == 0 {
			return
		}
		if off >= len(s) {
			off -= len(s)
			continue
		}
		n := copy(s[off:], data)
		data = data[n:]
		off = 0
	}
}
