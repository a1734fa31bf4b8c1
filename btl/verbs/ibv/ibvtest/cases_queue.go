package ibvtest

import (
	"errors"
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

var queueCases = []testCase{
	{name: "SendQueueFull", pair: true, run: caseSendQueueFull},
	{name: "RecvQueueFull", run: caseRecvQueueFull},
	{name: "CQOverrun", pair: true, run: caseCQOverrun},
}

// capOf returns the queue sizes a QP really has (Query may report more
// than was asked for; never less).
func (e *env) capOf(qp ibv.QP, asked ibv.QPCap) ibv.QPCap {
	e.t.Helper()
	q, err := qp.Query()
	must(e.t, err, "Query")
	c := q.Cap
	if c.MaxSendWR == 0 && c.MaxRecvWR == 0 {
		return asked
	}
	if c.MaxSendWR < asked.MaxSendWR || c.MaxRecvWR < asked.MaxRecvWR {
		e.t.Fatalf("QP capacity %+v is below the %+v asked for", c, asked)
	}
	return c
}

// caseSendQueueFull: posting more sends than the send queue holds stops
// at the first that does not fit (ErrNoMem, its index); the queue takes
// sends again once completions are polled.
func caseSendQueueFull(t *testing.T, e *env) {
	asked := ibv.QPCap{MaxSendWR: 8, MaxRecvWR: 8}
	a, b := e.pair(sideOpts{cap: asked})
	c := e.capOf(a.qp, asked)
	if c.MaxSendWR > 4096 {
		t.Skipf("send queue of %d entries for %d asked", c.MaxSendWR, asked.MaxSendWR)
	}
	src := e.buf(a.pd, 8)
	// No receive is posted at b: the SENDs stay outstanding (RNR NAKs,
	// retried without end) and hold their send queue entries.
	wrs := make([]ibv.SendWR, c.MaxSendWR+2)
	for i := range wrs {
		wrs[i] = sendWR(uint64(i), ibv.SGE(src, 0, 8))
	}
	bad, err := a.qp.PostSend(wrs)
	if !errors.Is(err, ibv.ErrNoMem) || bad != c.MaxSendWR {
		t.Fatalf("posting %d sends to a queue of %d: bad %d, err %v; want bad %d and ErrNoMem", len(wrs), c.MaxSendWR, bad, err, c.MaxSendWR)
	}
	bad, err = a.qp.PostSend(wrs[:1])
	if !errors.Is(err, ibv.ErrNoMem) || bad != 0 {
		t.Fatalf("posting to a full send queue: bad %d, err %v; want 0 and ErrNoMem", bad, err)
	}
	dst := e.buf(b.pd, 8)
	for i := range c.MaxSendWR {
		e.postRecv(b, ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 8)}})
		if (i+1)%asked.MaxRecvWR == 0 {
			e.wcs(b.rcq, asked.MaxRecvWR)
		}
	}
	for i, wc := range e.wcs(a.scq, c.MaxSendWR) {
		e.status(wc, uint64(i), ibv.WCSuccess, "a send that filled the queue")
	}
	e.postRecv(b, ibv.RecvWR{ID: 1000, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 8)}})
	e.postSend(a, sendWR(1000, ibv.SGE(src, 0, 8)))
	e.status(e.wc(a.scq), 1000, ibv.WCSuccess, "a send after the queue drained")
}

// caseRecvQueueFull: posting more receives than the receive queue holds
// stops at the first that does not fit with ErrNoMem.
func caseRecvQueueFull(t *testing.T, e *env) {
	asked := ibv.QPCap{MaxSendWR: 8, MaxRecvWR: 8}
	a := e.newSide("a", 0, sideOpts{cap: asked})
	must(t, ToInit(a.qp, e.port(), DefaultConnOpts()), "RESET->INIT")
	c := e.capOf(a.qp, asked)
	if c.MaxRecvWR > 4096 {
		t.Skipf("receive queue of %d entries for %d asked", c.MaxRecvWR, asked.MaxRecvWR)
	}
	buf := e.buf(a.pd, 8)
	wrs := make([]ibv.RecvWR, c.MaxRecvWR+3)
	for i := range wrs {
		wrs[i] = ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(buf, 0, 8)}}
	}
	bad, err := a.qp.PostRecv(wrs)
	if !errors.Is(err, ibv.ErrNoMem) || bad != c.MaxRecvWR {
		t.Fatalf("posting %d receives to a queue of %d: bad %d, err %v; want bad %d and ErrNoMem", len(wrs), c.MaxRecvWR, bad, err, c.MaxRecvWR)
	}
	// The ones that fit were posted: ERR flushes exactly those.
	must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState), "INIT->ERR")
	for i, wc := range e.wcs(a.rcq, c.MaxRecvWR) {
		e.status(wc, uint64(i), ibv.WCWRFlushErr, "a posted receive")
	}
	e.none(a.rcq, "receives refused by a full queue")
}

// caseCQOverrun: more completions than a CQ holds make its next Poll fail
// with ErrCQOverrun instead of dropping completions silently.
func caseCQOverrun(t *testing.T, e *env) {
	const cqe, n = 8, 128
	a := e.newSide("a", 0, sideOpts{cap: ibv.QPCap{MaxSendWR: n, MaxRecvWR: n}})
	b := e.newSide("b", 1, sideOpts{cap: ibv.QPCap{MaxSendWR: n, MaxRecvWR: n}, cqe: cqe})
	// A responder stopped by the overrun ends the sends by retry
	// exhaustion: half a second with the default timeout and retries.
	e.connect(a, b, DefaultConnOpts(), DefaultConnOpts())
	src := e.buf(a.pd, 8)
	dst := e.buf(b.pd, 8)
	recvs := make([]ibv.RecvWR, n)
	sends := make([]ibv.SendWR, n)
	for i := range n {
		recvs[i] = ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 8)}}
		sends[i] = sendWR(uint64(i), ibv.SGE(src, 0, 8))
	}
	e.postRecv(b, recvs...)
	e.postSend(a, sends...)
	// Every send has completed (delivered, or failed once the responder
	// stopped): the receive completions were generated, and b's small
	// receive CQ, never polled, overflowed.
	done := e.wcsWithin(a.scq, n, 0)
	delivered := 0
	for _, wc := range done {
		if wc.Status == ibv.WCSuccess {
			delivered++
		}
	}
	if delivered <= cqe {
		t.Logf("only %d of %d sends were delivered before the responder stopped: %s", delivered, n, fmtWCs(done[:min(len(done), 4)]))
	}
	taken := 0
	buf := make([]ibv.WC, 1)
	for range n + 1 {
		k, err := b.rcq.Poll(buf)
		if errors.Is(err, ibv.ErrCQOverrun) {
			return
		}
		must(t, err, "Poll of the overrun CQ")
		if k == 0 {
			break
		}
		taken++
	}
	t.Fatalf("a CQ of %d entries took %d receive completions (%d sends delivered) and polled %d without ErrCQOverrun", cqe, delivered, delivered, taken)
}
