package ibvtest

import (
	"fmt"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

var errorCases = []testCase{
	{name: "ErrorFlushesOutstanding", pair: true, run: caseErrorFlushesOutstanding},
	{name: "RNRRetryThenSuccess", pair: true, run: caseRNRRetryThenSuccess},
	{name: "RNRRetryExhausted", pair: true, run: caseRNRRetryExhausted},
	{name: "RetryExhausted", pair: true, run: caseRetryExhausted},
	{name: "RecvTooSmall", pair: true, run: caseRecvTooSmall},
	{name: "WriteWithImmNeedsRecv", pair: true, run: caseWriteWithImmNeedsRecv},
	{name: "WriteWithImmAccessError", pair: true, run: caseWriteWithImmAccessError},
}

// caseErrorFlushesOutstanding: an error completion moves the QP to ERR
// and every send behind it and every posted receive completes with
// WCWRFlushErr, with their IDs, in post order, on their own CQs.
func caseErrorFlushesOutstanding(t *testing.T, e *env) {
	for _, c := range []struct {
		what   string
		status ibv.WCStatus
		first  func(e *env, a, b *side) ibv.SendWR
	}{
		{"remote access error", ibv.WCRemAccessErr, func(e *env, a, b *side) ibv.SendWR {
			ro := e.mr(b.pd, make([]byte, 64), ibv.AccessLocalWrite|ibv.AccessRemoteRead)
			src := e.buf(a.pd, 64)
			return ibv.SendWR{Opcode: ibv.WRRDMAWrite, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}, RemoteAddr: ro.Addr(), RKey: ro.RKey()}
		}},
		{"local protection error", ibv.WCLocProtErr, func(e *env, a, b *side) ibv.SendWR {
			src := e.buf(a.pd, 64)
			s := ibv.SGE(src, 0, 64)
			s.LKey ^= 0x5A5A00
			return ibv.SendWR{Opcode: ibv.WRSend, SGList: []ibv.SGEntry{s}}
		}},
	} {
		t.Run(c.what, func(t *testing.T) {
			e := e.sub(t)
			a, b := e.pair(sideOpts{})
			rb := e.buf(a.pd, 256)
			for i := range 4 {
				e.postRecv(a, ibv.RecvWR{ID: uint64(100 + i), SGList: []ibv.SGEntry{ibv.SGE(rb, 64*i, 64)}})
			}
			wr := c.first(e, a, b)
			wr.ID, wr.Flags = 1, ibv.FlagSignaled
			src := e.buf(a.pd, 64)
			dst := e.buf(b.pd, 64)
			sge := []ibv.SGEntry{ibv.SGE(src, 0, 64)}
			e.postSend(a, wr,
				ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: sge},
				ibv.SendWR{ID: 3, Opcode: ibv.WRRDMAWrite, Flags: ibv.FlagSignaled, SGList: sge, RemoteAddr: dst.Addr(), RKey: dst.RKey()},
				ibv.SendWR{ID: 4, Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled, SGList: sge, RemoteAddr: dst.Addr(), RKey: dst.RKey()},
				ibv.SendWR{ID: 5, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: sge})
			sends := e.wcs(a.scq, 5)
			e.status(sends[0], 1, c.status, "the failing request")
			for i, wc := range sends[1:] {
				e.status(wc, uint64(i+2), ibv.WCWRFlushErr, fmt.Sprintf("send %d behind the error", i+2))
			}
			recvs := e.wcs(a.rcq, 4)
			for i, wc := range recvs {
				e.status(wc, uint64(100+i), ibv.WCWRFlushErr, fmt.Sprintf("receive %d", i))
			}
			for _, wc := range append(sends, recvs...) {
				if wc.QPNum != a.qp.QPN() {
					t.Fatalf("completion %s names QP %#x, want %#x", fmtWC(wc), wc.QPNum, a.qp.QPN())
				}
			}
			e.state(a.qp, ibv.QPSErr, "after an error completion")
			e.sameBytes(dst.Buf(), make([]byte, 64), "the target of a flushed WRITE")
			e.none(a.scq, "after the flush")
			e.none(a.rcq, "after the flush")
		})
	}
}

// caseRNRRetryThenSuccess: a SEND that finds no receive posted waits (RNR
// NAKs, rnr_retry 7 retries without end) and completes once the receive
// is posted.
func caseRNRRetryThenSuccess(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	src := e.mr(a.pd, pattern(3000, 12), allAccess)
	dst := e.buf(b.pd, 3000)
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 3000)}})
	// A correct device cannot complete the send here: there is no
	// receive. The pause lets the responder answer with RNR NAKs.
	got, err := PollFor(a.scq, 50*time.Millisecond)
	if err != nil || len(got) > 0 {
		t.Fatalf("a SEND with no receive posted completed: %s (err %v)", fmtWCs(got), err)
	}
	e.postRecv(b, ibv.RecvWR{ID: 7, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 3000)}})
	e.status(e.wc(a.scq), 1, ibv.WCSuccess, "the SEND once a receive is posted")
	r := e.wc(b.rcq)
	e.status(r, 7, ibv.WCSuccess, "the late receive")
	if r.ByteLen != 3000 {
		t.Fatalf("late receive: byte_len %d, want 3000", r.ByteLen)
	}
	e.sameBytes(dst.Buf(), src.Buf(), "data of the retried SEND")
	e.state(a.qp, ibv.QPSRTS, "requester after RNR retries")
}

// caseRNRRetryExhausted: with rnr_retry n < 7 and no receive ever posted,
// the SEND completes with WCRNRRetryExcErr and the QP is in ERR.
func caseRNRRetryExhausted(t *testing.T, e *env) {
	for n := uint8(0); n < 7; n++ {
		t.Run(fmt.Sprintf("rnr_retry=%d", n), func(t *testing.T) {
			e := e.sub(t)
			a := e.newSide("a", 0, sideOpts{})
			b := e.newSide("b", 1, sideOpts{})
			oa := DefaultConnOpts()
			oa.RNRRetry = n
			e.connect(a, b, oa, DefaultConnOpts()) // b asks for the shortest RNR wait
			src := e.buf(a.pd, 64)
			e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}},
				ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}})
			wcs := e.wcs(a.scq, 2)
			e.status(wcs[0], 1, ibv.WCRNRRetryExcErr, fmt.Sprintf("SEND with no receive and rnr_retry %d", n))
			e.status(wcs[1], 2, ibv.WCWRFlushErr, "the SEND behind it")
			e.state(a.qp, ibv.QPSErr, "requester after RNR retry exhaustion")
		})
	}
}

// caseRetryExhausted: a peer QP that is gone never acknowledges; after
// retry_cnt retransmissions the request completes with WCRetryExcErr.
func caseRetryExhausted(t *testing.T, e *env) {
	a := e.newSide("a", 0, sideOpts{})
	b := e.newSide("b", 1, sideOpts{})
	oa := DefaultConnOpts()
	oa.Timeout = 8 // about 1 ms
	oa.RetryCnt = 2
	e.connect(a, b, oa, DefaultConnOpts())
	dst := e.buf(b.pd, 64)
	addr, rkey := dst.Addr(), dst.RKey()
	must(t, b.qp.Destroy(), "Destroy of the peer QP")
	src := e.buf(a.pd, 64)
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}, RemoteAddr: addr, RKey: rkey})
	e.status(e.wcsWithin(a.scq, 1, time.Minute)[0], 1, ibv.WCRetryExcErr, "WRITE to a destroyed QP")
	e.state(a.qp, ibv.QPSErr, "requester after retry exhaustion")
}

// caseRecvTooSmall: a SEND larger than the receive it lands in completes
// the receive with WCLocLenErr and the send with WCRemInvReqErr; both QPs
// end in ERR.
func caseRecvTooSmall(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	src := e.mr(a.pd, pattern(64, 13), allAccess)
	dst := e.buf(b.pd, 64)
	e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 16)}})
	e.postSend(a, ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}})
	e.status(e.wc(b.rcq), 1, ibv.WCLocLenErr, "receive of 16 bytes for a 64-byte SEND")
	e.status(e.wc(a.scq), 2, ibv.WCRemInvReqErr, "64-byte SEND into a 16-byte receive")
	e.state(a.qp, ibv.QPSErr, "requester")
	e.awaitState(b.qp, ibv.QPSErr, "responder")
	e.sameBytes(dst.Buf()[16:], make([]byte, 48), "memory past the receive's SGE")
}

// caseWriteWithImmNeedsRecv: WRITE_WITH_IMM consumes a receive like a
// SEND: with none posted and rnr_retry 0 it fails with WCRNRRetryExcErr
// and writes nothing.
func caseWriteWithImmNeedsRecv(t *testing.T, e *env) {
	a := e.newSide("a", 0, sideOpts{})
	b := e.newSide("b", 1, sideOpts{})
	oa := DefaultConnOpts()
	oa.RNRRetry = 0
	e.connect(a, b, oa, DefaultConnOpts())
	src := e.mr(a.pd, pattern(64, 14), allAccess)
	dst := e.buf(b.pd, 64)
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWriteWithImm, Flags: ibv.FlagSignaled, Imm: 3,
		SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	e.status(e.wc(a.scq), 1, ibv.WCRNRRetryExcErr, "WRITE_WITH_IMM with no receive posted and rnr_retry 0")
	e.state(a.qp, ibv.QPSErr, "requester after RNR retry exhaustion")
}

// caseWriteWithImmAccessError: a WRITE_WITH_IMM refused by the responder
// (an MR without REMOTE_WRITE) fails at the requester with
// WCRemAccessErr; the responder's receive does not complete successfully
// and its QP ends in ERR.
func caseWriteWithImmAccessError(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	src := e.mr(a.pd, pattern(64, 15), allAccess)
	dst := e.mr(b.pd, make([]byte, 64), ibv.AccessLocalWrite|ibv.AccessRemoteRead)
	e.postRecv(b, ibv.RecvWR{ID: 9})
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWriteWithImm, Flags: ibv.FlagSignaled, Imm: 3,
		SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()})
	e.remoteErr(a, e.wc(a.scq), 1, "WRITE_WITH_IMM into an MR without REMOTE_WRITE")
	r := e.wc(b.rcq)
	if r.ID != 9 || r.Status == ibv.WCSuccess {
		t.Fatalf("responder's receive after a refused WRITE_WITH_IMM: %s, want ID 9 with an error status", fmtWC(r))
	}
	e.awaitState(b.qp, ibv.QPSErr, "responder after a refused WRITE_WITH_IMM")
	e.sameBytes(dst.Buf(), make([]byte, 64), "the MR without REMOTE_WRITE")
}
