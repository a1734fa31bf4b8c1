package soft

import (
	"encoding/binary"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// isRd reports whether op is answered by response packets (READ, atomics)
// rather than acknowledged.
func isRd(op ibv.WROpcode) bool {
	return op == ibv.WRRDMARead || op == ibv.WRAtomicCmpAndSwp || op == ibv.WRAtomicFetchAndAdd
}

// requesterInput handles an ACK, NAK, READ response or atomic ACK.
// Called with q.mu held.
func (q *qp) requesterInput(p *packet) {
	if q.state != ibv.QPSRTS && q.state != ibv.QPSSQD {
		return
	}
	if !q.sentAny || psnDiff(p.bth.psn, q.maxSent) > 0 {
		q.dev.ctr.bad.Add(1) // answers something never sent
		return
	}
	if p.bth.opcode != opAck {
		q.response(p)
		return
	}
	psn := p.bth.psn
	syn := p.aeth.syndrome
	switch syn & synKindMsk {
	case synACK:
		q.ackUpTo(psn)
	case synRNR:
		q.dev.ctr.rnrNakRx.Add(1)
		q.ackUpTo(psn - 1)
		if q.state != ibv.QPSErr {
			q.rnrNAK(psn, syn&synValMsk)
		}
	case synNAK:
		q.ackUpTo(psn - 1)
		if q.state == ibv.QPSErr {
			return
		}
		switch syn & synValMsk {
		case nakPSNSeq:
			q.dev.ctr.seqNakRx.Add(1)
			q.shrink()
			q.goBack(psn)
		case nakInvReq:
			q.failAt(psn, ibv.WCRemInvReqErr)
		case nakRemAccess:
			q.failAt(psn, ibv.WCRemAccessErr)
		case nakRemOp:
			q.failAt(psn, ibv.WCRemOpErr)
		default:
			q.failAt(psn, ibv.WCRemInvRdReqErr)
		}
	}
}

// progress notes that the peer answered for every PSN up to psn: the
// retry counters start over, and an RTT sample is taken when the probe
// packet is answered. It runs on the receive path: the time is the
// receive batch's.
func (q *qp) progress(psn uint32) {
	q.retries = int(q.attr.RetryCnt)
	q.rnrRetries = int(q.attr.RNRRetry)
	now := q.dev.rxNow
	q.lastProgress = now
	q.gapSet = false
	q.early = false
	if q.probing && psnDiff(psn, q.probePSN) >= 0 {
		q.probing = false
		q.rttSample(now.Sub(q.probeAt))
	}
}

// The requester's window (packets sent ahead of acknowledgement) halves
// on every loss it learns of (sequence NAK, READ response gap, timeout)
// and grows back by about eight packets per window acknowledged, up to
// Config.Window. Go-back-N resends everything after a loss, so under
// random loss a window near the distance between losses sends least in
// vain; the verbs leave the requester's pacing to the implementation.
const minWindow = 16

func (q *qp) window() int {
	if q.cwnd == 0 {
		q.cwnd = q.dev.cfg.Window
	}
	return q.cwnd
}

func (q *qp) shrink() { q.cwnd = max(q.window()/2, min(minWindow, q.dev.cfg.Window)) }

// restart is the window after a local ACK timeout: the least one. A
// timeout says nothing of how much was lost, and on a busy host it is
// often only late ACKs (the peer's receiver was not scheduled): sending a
// few packets from the oldest unacknowledged one costs little then, and
// their answer (a duplicate's ACK names the last PSN the responder has)
// moves the window past everything that did arrive instead of the whole
// window going out again.
func (q *qp) restart() { q.cwnd = min(minWindow, q.dev.cfg.Window) }

func (q *qp) grow(acked int) {
	w := q.window()
	q.cwnd = min(q.dev.cfg.Window, w+max(1, acked*8/w))
}

// rttSample updates the smoothed round-trip time and its variation
// (Jacobson's estimator, as TCP's RFC 6298). Samples run from a packet's
// first transmission, also when it was sent again (unlike Karn's rule):
// that can only overestimate, and it lets the estimate grow out of a
// timeout shorter than the round trip, which would otherwise retransmit
// every probe before its answer came.
func (q *qp) rttSample(r time.Duration) {
	if q.srtt == 0 {
		q.srtt, q.rttvar = r, r/2
		return
	}
	d := q.srtt - r
	if d < 0 {
		d = -d
	}
	q.rttvar += (d - q.rttvar) / 4
	q.srtt += (r - q.srtt) / 8
}

// rto is the local ACK timeout in force: the QP's (4.096 us * 2^timeout,
// at least Config.MinTimeout), or longer when the measured round trip
// needs it (a software peer on a busy host answers a full window later
// than the verbs value of a small timeout allows). It does not back off:
// retry_cnt expiries of it end the request, as the verbs say.
func (q *qp) rto() time.Duration { return max(q.timeout, q.srtt+4*q.rttvar) }

// earlyDelay is how long the requester waits without progress before it
// goes back once to the oldest unacknowledged packet, ahead of the local
// ACK timeout: the measured round trip plus four times its variation, at
// least Config.MinTimeout; ok is false before the first round trip is
// measured (then only the timeout applies). A sequence NAK lost on the
// way, or the last packets of a burst, otherwise stall the QP for the
// whole timeout (67 ms at the usual timeout 14); the responder answers a
// packet it already has with an ACK of everything it has, so a needless
// early go-back costs a restarted window of packets. It counts no retry:
// only the QP's own timeout decides that the peer is gone.
func (q *qp) earlyDelay() (d time.Duration, ok bool) {
	return max(q.dev.cfg.MinTimeout, q.srtt+4*q.rttvar), q.srtt > 0
}

// deadline is the wait before the timer's next look at the QP: the early
// go-back's, until it has gone out, then the local ACK timeout's.
func (q *qp) deadline() time.Duration {
	if ed, ok := q.earlyDelay(); ok && !q.early && ed < q.rto() {
		return ed
	}
	return q.rto()
}

// ackUpTo records that every PSN up to psn was executed and completes the
// requests that finished, in order. A READ or atomic acknowledged by a
// later PSN while its response is incomplete lost response packets: it is
// asked for again from the first missing one.
func (q *qp) ackUpTo(psn uint32) {
	psn &= psnMask
	if d := psnDiff(psn, q.ackPSN); d > 0 && psnDiff(psn, q.maxSent) <= 0 {
		q.ackPSN = psn
		q.progress(psn)
		q.grow(int(d))
	}
	q.completeDone()
	q.skipAcked()
}

// skipAcked moves the transmit cursor past packets of the head request
// that the responder has acknowledged: after a timeout (often only a late
// ACK) the cursor went back to the oldest unacknowledged packet, and a
// duplicate's ACK can name a PSN well past it; what it covers is not sent
// again.
func (q *qp) skipAcked() {
	if q.sqCount == 0 || q.txIdx != 0 {
		return
	}
	w := &q.sq[q.sqHead]
	if isRd(w.op) || w.locErr != ibv.WCSuccess {
		return
	}
	if off := psnDiff(q.ackPSN+1, w.psn); off > 0 && uint32(off) < w.npkts && uint32(off) > q.txPkt {
		q.txPkt = uint32(off)
	}
}

// completeDone completes, from the head, the requests known finished: a
// READ or atomic whose response is whole, wherever the transmit cursor
// is (after a go-back into a READ, its missing responses can arrive
// before the cursor passes it again, and the request asked again then
// has no answer left that would complete it), and a request acknowledged
// once the cursor has passed it.
func (q *qp) completeDone() {
	for q.sqCount > 0 {
		w := &q.sq[q.sqHead]
		last := (w.psn + w.npkts - 1) & psnMask
		if isRd(w.op) {
			if !w.done {
				if q.txIdx > 0 && psnDiff(last, q.ackPSN) <= 0 {
					q.goBack(w.psn + w.rdRcvd)
				}
				break
			}
		} else if q.txIdx == 0 || psnDiff(last, q.ackPSN) > 0 {
			break
		}
		q.completeSend(w, ibv.WCSuccess)
	}
	q.checkLocErr()
}

// checkLocErr fails the head request when its local memory was bad and
// everything before it has completed.
func (q *qp) checkLocErr() {
	if q.sqCount > 0 && q.txIdx == 0 && q.txPkt == 0 {
		if w := &q.sq[q.sqHead]; w.locErr != ibv.WCSuccess {
			q.completeSend(w, w.locErr)
			q.toErrLocked()
		}
	}
}

// failAt completes the request holding psn (the head, once earlier ones
// were acknowledged) with st and moves the QP to ERR.
func (q *qp) failAt(psn uint32, st ibv.WCStatus) {
	if q.sqCount > 0 {
		q.completeSend(&q.sq[q.sqHead], st)
	}
	q.toErrLocked()
}

// goBack moves the transmit cursor back to psn (go-back-N): every packet
// from there on is sent again. A psn at or after the cursor changes
// nothing.
func (q *qp) goBack(psn uint32) {
	psn &= psnMask
	for i := 0; i < q.sqCount && i <= q.txIdx; i++ {
		w := q.sqAt(i)
		off := psnDiff(psn, w.psn)
		if off < 0 || uint32(off) >= w.npkts {
			continue
		}
		if i == q.txIdx && uint32(off) >= q.txPkt {
			return
		}
		if isRd(w.op) {
			if w.done {
				return
			}
			off = int32(w.rdRcvd)
		}
		q.txIdx, q.txPkt = i, uint32(off)
		q.rdOut = 0
		for j := 0; j <= i && j < q.sqCount; j++ {
			if x := q.sqAt(j); isRd(x.op) && !x.done && (j < i || q.txPkt > 0) {
				q.rdOut++
			}
		}
		return
	}
}

// oldestUnacked is the first PSN the requester has no answer for.
func (q *qp) oldestUnacked() uint32 {
	w := &q.sq[q.sqHead]
	if isRd(w.op) {
		return w.psn + w.rdRcvd
	}
	if n := psnDiff(q.ackPSN+1, w.psn); n > 0 && uint32(n) < w.npkts {
		return q.ackPSN + 1
	}
	return w.psn
}

// rnrNAK waits out an RNR NAK for psn, then sends from psn again; after
// rnr_retry waits (7: no limit) the request fails.
func (q *qp) rnrNAK(psn uint32, code uint8) {
	if q.attr.RNRRetry != 7 {
		if q.rnrRetries == 0 {
			q.failAt(psn, ibv.WCRNRRetryExcErr)
			return
		}
		q.rnrRetries--
	}
	q.goBack(psn)
	q.rnrUntil = q.dev.clock.Now().Add(rnrDelay(code))
	q.arm(rnrDelay(code))
}

// rnrTimes is the IBA RNR NAK timer table (code -> wait), in
// microseconds; code 0 is the longest.
var rnrTimes = [32]uint32{
	655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
	2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520,
}

func rnrDelay(code uint8) time.Duration { return time.Duration(rnrTimes[code&31]) * time.Microsecond }

// response takes a READ response or atomic ACK packet.
func (q *qp) response(p *packet) {
	var w *sendWQE
	for i := 0; i < q.sqCount && (i < q.txIdx || i == q.txIdx && q.txPkt > 0); i++ {
		if x := q.sqAt(i); isRd(x.op) && !x.done {
			w = x
			break
		}
	}
	if w == nil {
		return // stale: nothing waits for a response
	}
	exp := (w.psn + w.rdRcvd) & psnMask
	d := psnDiff(p.bth.psn, exp)
	if d < 0 {
		return // duplicate
	}
	if d > 0 {
		// A response went missing: ask again from it, once until the
		// next progress or timeout.
		if !q.gapSet || q.gapPSN != exp {
			q.gapSet, q.gapPSN = true, exp
			q.shrink()
			q.goBack(exp)
		}
		return
	}
	f := p.flags
	if (w.op == ibv.WRRDMARead) != (f&fReadResp != 0) {
		q.badResponse(exp)
		return
	}
	q.ackUpTo(w.psn - 1) // a response acknowledges every request before it
	if q.state == ibv.QPSErr {
		return
	}
	if w.op != ibv.WRRDMARead {
		if len(w.segs) > 0 {
			binary.LittleEndian.PutUint64(w.segs[0], p.orig)
		}
		w.done = true
	} else {
		// A READ asked for in parts, or asked again from packet k, gets
		// a response per request (FIRST .. LAST) while packets of an
		// earlier one may still come: they carry the same bytes, so the
		// position flags are checked only at the ends of the whole READ.
		k := int(w.rdRcvd)
		last := w.rdRcvd == w.npkts-1
		want := min(q.mtu, w.length-k*q.mtu)
		if (k == 0 && f&fFirst == 0) || (last && f&fLast == 0) || len(p.payload) != want {
			q.badResponse(exp)
			return
		}
		scatter(w.segs, k*q.mtu, p.payload)
		w.rdRcvd++
		w.done = w.rdRcvd == w.npkts
	}
	q.ackPSN = exp
	q.progress(exp)
	if w.done {
		q.rdOut--
		q.completeDone()
	}
}

// badResponse fails the request waiting for exp with BAD_RESP_ERR.
func (q *qp) badResponse(exp uint32) {
	q.ackUpTo(exp - 1)
	if q.state != ibv.QPSErr {
		q.failAt(exp, ibv.WCBadRespErr)
	}
}

// arm starts the QP's timer for d unless it is already armed.
func (q *qp) arm(d time.Duration) {
	if q.timerArmed {
		if !q.timerAt.After(q.dev.clock.Now().Add(d)) {
			return
		}
	}
	q.timerArmed = true
	q.timerAt = q.dev.clock.Now().Add(d)
	q.timer.Reset(d)
}

// onTimer ends an RNR wait and retransmits after a local ACK timeout;
// after retry_cnt retransmissions without an answer the head request
// fails with RETRY_EXC_ERR.
func (q *qp) onTimer() {
	q.mu.Lock()
	q.timerArmed = false
	if q.destroyed || (q.state != ibv.QPSRTS && q.state != ibv.QPSSQD) {
		q.mu.Unlock()
		return
	}
	now := q.dev.clock.Now()
	kick := false
	if !q.rnrUntil.IsZero() {
		if now.Before(q.rnrUntil) {
			q.arm(q.rnrUntil.Sub(now))
			q.mu.Unlock()
			return
		}
		q.rnrUntil = time.Time{}
		q.lastProgress = now
		kick = true
	}
	if q.sqCount > 0 && (q.txIdx > 0 || q.txPkt > 0) && q.timeout > 0 {
		el := now.Sub(q.lastProgress)
		to := q.rto()
		if el >= to {
			if q.retries == 0 {
				q.failAt(q.oldestUnacked(), ibv.WCRetryExcErr)
				q.mu.Unlock()
				return
			}
			q.retries--
			q.dev.ctr.timeouts.Add(1)
			q.restart()
			q.gapSet = false
			q.goBack(q.oldestUnacked())
			q.lastProgress = now
			q.early = false
			kick = true
			q.arm(q.deadline())
		} else if ed, ok := q.earlyDelay(); ok && !q.early && el >= ed {
			q.early = true
			q.dev.ctr.early.Add(1)
			q.restart()
			q.gapSet = false
			q.goBack(q.oldestUnacked())
			kick = true
			q.arm(to - el)
		} else if ok && !q.early && ed < to {
			q.arm(ed - el)
		} else {
			q.arm(to - el)
		}
	}
	q.mu.Unlock()
	if kick {
		q.pump(txBatchPkts * 2)
	}
}
