package ibvtest

import (
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

var stateCases = []testCase{
	{name: "QPLegalTransitions", run: caseLegalTransitions},
	{name: "QPIllegalTransitions", run: caseIllegalTransitions},
	{name: "QPMissingAttributes", run: caseMissingAttributes},
	{name: "QPBadAttributes", run: caseBadAttributes},
	{name: "QPResetFromAnyState", pair: true, run: caseResetFromAnyState},
	{name: "QPErrFromAnyState", run: caseErrFromAnyState},
	{name: "PostSendOutsideRTS", run: casePostSendOutsideRTS},
	{name: "PostRecvFromInit", pair: true, run: casePostRecvFromInit},
}

// stepTo moves s's QP from RESET forward to st (INIT, RTR or RTS) towards
// peer, or to ERR through a Modify from RESET.
func (e *env) stepTo(s *side, peer Endpoint, st ibv.QPState) {
	e.t.Helper()
	o := DefaultConnOpts()
	if st == ibv.QPSErr {
		must(e.t, s.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState), "RESET->ERR")
		return
	}
	if st >= ibv.QPSInit {
		must(e.t, ToInit(s.qp, e.port(), o), "to INIT")
	}
	if st >= ibv.QPSRTR {
		must(e.t, ToRTR(s.qp, s.ep, peer, o), "to RTR")
	}
	if st >= ibv.QPSRTS {
		must(e.t, ToRTS(s.qp, s.ep, o), "to RTS")
	}
	e.state(s.qp, st, "after stepping")
}

func (e *env) queryState(qp ibv.QP, want ibv.QPState, what string) ibv.QPAttr {
	e.t.Helper()
	a, err := qp.Query()
	must(e.t, err, "%s: Query", what)
	if a.State != want {
		e.t.Fatalf("%s: Query state %v, want %v", what, a.State, want)
	}
	e.state(qp, want, what)
	return a
}

// caseLegalTransitions: each legal RC transition succeeds with exactly its
// required attributes (plus allowed optional ones), and Query reports the
// state and the attributes given.
func caseLegalTransitions(t *testing.T, e *env) {
	a := e.newSide("a", 0, sideOpts{})
	b := e.newSide("b", 1, sideOpts{})
	o := DefaultConnOpts()

	must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSReset}, ibv.AttrState), "RESET->RESET")
	e.queryState(a.qp, ibv.QPSReset, "RESET->RESET")

	must(t, ToInit(a.qp, e.port(), o), "RESET->INIT")
	q := e.queryState(a.qp, ibv.QPSInit, "RESET->INIT")
	if q.AccessFlags != o.Access {
		t.Errorf("INIT: Query access %#x, want %#x", q.AccessFlags, o.Access)
	}

	must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSInit, AccessFlags: ibv.AccessRemoteRead}, ibv.AttrState|ibv.AttrAccessFlags), "INIT->INIT")
	q = e.queryState(a.qp, ibv.QPSInit, "INIT->INIT")
	if q.AccessFlags != ibv.AccessRemoteRead {
		t.Errorf("INIT->INIT: Query access %#x, want %#x", q.AccessFlags, ibv.AccessRemoteRead)
	}

	must(t, ToRTR(a.qp, a.ep, b.ep, o), "INIT->RTR")
	q = e.queryState(a.qp, ibv.QPSRTR, "INIT->RTR")
	if q.DestQPN != b.ep.QPN || q.RQPSN != b.ep.PSN {
		t.Errorf("RTR: Query dest QPN %#x rq PSN %#x, want %#x and %#x", q.DestQPN, q.RQPSN, b.ep.QPN, b.ep.PSN)
	}

	must(t, ToRTS(a.qp, a.ep, o), "RTR->RTS")
	q = e.queryState(a.qp, ibv.QPSRTS, "RTR->RTS")
	if q.SQPSN != a.ep.PSN || q.RetryCnt != o.RetryCnt || q.RNRRetry != o.RNRRetry {
		t.Errorf("RTS: Query sq PSN %#x retry %d rnr retry %d, want %#x, %d, %d", q.SQPSN, q.RetryCnt, q.RNRRetry, a.ep.PSN, o.RetryCnt, o.RNRRetry)
	}

	must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTS, MinRNRTimer: 2}, ibv.AttrState|ibv.AttrMinRNRTimer), "RTS->RTS")
	e.queryState(a.qp, ibv.QPSRTS, "RTS->RTS")

	must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState), "RTS->ERR")
	e.queryState(a.qp, ibv.QPSErr, "RTS->ERR")
	must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState), "ERR->ERR")
	must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSReset}, ibv.AttrState), "ERR->RESET")
	e.queryState(a.qp, ibv.QPSReset, "ERR->RESET")
}

// transition is a Modify towards one state with that state's usual
// attributes and mask.
func (e *env) transition(s *side, peer Endpoint, to ibv.QPState) (ibv.QPAttr, ibv.AttrMask) {
	o := DefaultConnOpts()
	switch to {
	case ibv.QPSInit:
		return InitAttr(e.port(), o)
	case ibv.QPSRTR:
		return RTRAttr(s.ep, peer, o)
	case ibv.QPSRTS:
		return RTSAttr(s.ep, o)
	}
	return ibv.QPAttr{State: to}, ibv.AttrState
}

// caseIllegalTransitions: a transition the RC state machine does not have
// is ErrInvalid, with every attribute of the target given, and leaves the
// state as it was; a QP in RTS still carries data afterwards.
func caseIllegalTransitions(t *testing.T, e *env) {
	illegal := map[ibv.QPState][]ibv.QPState{
		ibv.QPSReset: {ibv.QPSRTR, ibv.QPSRTS},
		ibv.QPSInit:  {ibv.QPSRTS},
		ibv.QPSRTR:   {ibv.QPSInit},
		ibv.QPSRTS:   {ibv.QPSInit, ibv.QPSRTR},
		ibv.QPSErr:   {ibv.QPSInit, ibv.QPSRTR, ibv.QPSRTS},
	}
	for _, from := range []ibv.QPState{ibv.QPSReset, ibv.QPSInit, ibv.QPSRTR, ibv.QPSRTS, ibv.QPSErr} {
		t.Run(from.String(), func(t *testing.T) {
			e := e.sub(t)
			a := e.newSide("a", 0, sideOpts{})
			b := e.newSide("b", 1, sideOpts{})
			e.stepTo(a, b.ep, from)
			before, err := a.qp.Query()
			must(t, err, "Query")
			for _, to := range illegal[from] {
				attr, mask := e.transition(a, b.ep, to)
				err := a.qp.Modify(&attr, mask)
				wantErr(t, err, ibv.ErrInvalid, fmt.Sprintf("%v->%v", from, to))
				e.state(a.qp, from, fmt.Sprintf("after the refused %v->%v", from, to))
			}
			after, err := a.qp.Query()
			must(t, err, "Query")
			if after != before {
				t.Fatalf("refused transitions changed the QP's attributes:\nbefore %+v\nafter  %+v", before, after)
			}
			if from == ibv.QPSRTS {
				e.stepTo(b, a.ep, ibv.QPSRTS)
				e.exchange(a, b, 1)
			}
		})
	}
}

// sub returns an env for a subtest of the case.
func (e *env) sub(t *testing.T) *env {
	return &env{t: t, f: e.f, topo: e.topo}
}

// exchange sends one message each way between connected a and b and
// checks it arrives.
func (e *env) exchange(a, b *side, id uint64) {
	e.t.Helper()
	for _, d := range [][2]*side{{a, b}, {b, a}} {
		src, dst := d[0], d[1]
		sb := e.buf(src.pd, 100)
		db := e.buf(dst.pd, 100)
		fill(sb.Buf(), byte(id))
		e.postRecv(dst, ibv.RecvWR{ID: id, SGList: []ibv.SGEntry{ibv.SGE(db, 0, 100)}})
		e.postSend(src, ibv.SendWR{ID: id, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(sb, 0, 100)}})
		e.status(e.wc(src.scq), id, ibv.WCSuccess, src.name+" send")
		r := e.wc(dst.rcq)
		e.status(r, id, ibv.WCSuccess, dst.name+" receive")
		if r.ByteLen != 100 {
			e.t.Fatalf("receive of 100 bytes: byte_len %d", r.ByteLen)
		}
		e.sameBytes(db.Buf(), sb.Buf(), "received bytes")
	}
}

// caseMissingAttributes: each of a transition's required attributes left
// out of the mask is ErrInvalid and the state stays.
func caseMissingAttributes(t *testing.T, e *env) {
	a := e.newSide("a", 0, sideOpts{})
	b := e.newSide("b", 1, sideOpts{})
	for _, to := range []ibv.QPState{ibv.QPSInit, ibv.QPSRTR, ibv.QPSRTS} {
		from := a.qp.State()
		attr, mask := e.transition(a, b.ep, to)
		for bit := ibv.AttrMask(1); bit != 0 && bit <= mask; bit <<= 1 {
			if mask&bit == 0 || bit == ibv.AttrState {
				continue
			}
			err := a.qp.Modify(&attr, mask&^bit)
			wantErr(t, err, ibv.ErrInvalid, fmt.Sprintf("%v->%v without attribute %#x", from, to, bit))
			e.state(a.qp, from, fmt.Sprintf("after %v->%v without attribute %#x", from, to, bit))
		}
		must(t, a.qp.Modify(&attr, mask), "%v->%v with every required attribute", from, to)
	}
}

// caseBadAttributes: attributes out of range, or not allowed in the
// transition, are ErrInvalid and leave the state.
func caseBadAttributes(t *testing.T, e *env) {
	a := e.newSide("a", 0, sideOpts{})
	b := e.newSide("b", 1, sideOpts{})
	ports := e.dev(0).Device().PhysPortCnt
	type bad struct {
		what string
		edit func(*ibv.QPAttr, *ibv.AttrMask)
	}
	table := map[ibv.QPState][]bad{
		ibv.QPSInit: {
			{"port 0", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.Port = 0 }},
			{"a port past the device's", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.Port = uint8(ports + 1) }},
			{"an SQ PSN (an RTS attribute)", func(a *ibv.QPAttr, m *ibv.AttrMask) { *m |= ibv.AttrSQPSN }},
		},
		ibv.QPSRTR: {
			{"path MTU 0", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.PathMTU = 0 }},
			{"path MTU 6", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.PathMTU = 6 }},
			{"a 25-bit destination QPN", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.DestQPN |= 1 << 24 }},
			{"a 25-bit RQ PSN", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.RQPSN |= 1 << 24 }},
			{"min RNR timer 32", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.MinRNRTimer = 32 }},
		},
		ibv.QPSRTS: {
			{"retry count 8", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.RetryCnt = 8 }},
			{"RNR retry 8", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.RNRRetry = 8 }},
			{"timeout 32", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.Timeout = 32 }},
			{"a 25-bit SQ PSN", func(a *ibv.QPAttr, _ *ibv.AttrMask) { a.SQPSN |= 1 << 24 }},
		},
	}
	for _, to := range []ibv.QPState{ibv.QPSInit, ibv.QPSRTR, ibv.QPSRTS} {
		from := a.qp.State()
		for _, c := range table[to] {
			attr, mask := e.transition(a, b.ep, to)
			c.edit(&attr, &mask)
			err := a.qp.Modify(&attr, mask)
			wantErr(t, err, ibv.ErrInvalid, fmt.Sprintf("%v->%v with %s", from, to, c.what))
			e.state(a.qp, from, fmt.Sprintf("after %v->%v with %s", from, to, c.what))
		}
		attr, mask := e.transition(a, b.ep, to)
		must(t, a.qp.Modify(&attr, mask), "%v->%v with good attributes", from, to)
	}
}

// caseResetFromAnyState: RESET is reachable from every state, drops the
// outstanding receives without completions, and a QP brought up again
// from RESET carries data.
func caseResetFromAnyState(t *testing.T, e *env) {
	for _, from := range []ibv.QPState{ibv.QPSInit, ibv.QPSRTR, ibv.QPSRTS, ibv.QPSErr} {
		t.Run(from.String(), func(t *testing.T) {
			e := e.sub(t)
			a := e.newSide("a", 0, sideOpts{})
			b := e.newSide("b", 1, sideOpts{})
			stale := e.buf(a.pd, 100)
			e.stepTo(a, b.ep, from)
			if from != ibv.QPSErr {
				e.postRecv(a, ibv.RecvWR{ID: 999, SGList: []ibv.SGEntry{ibv.SGE(stale, 0, 100)}})
			}
			must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSReset}, ibv.AttrState), "%v->RESET", from)
			e.queryState(a.qp, ibv.QPSReset, fmt.Sprintf("%v->RESET", from))
			e.connect(a, b, DefaultConnOpts(), DefaultConnOpts())
			// The receive posted before RESET is gone: the next message
			// lands in the receive posted now, and ID 999 never completes.
			e.exchange(a, b, 1)
			e.none(a.rcq, "the receive dropped by RESET")
			e.sameBytes(stale.Buf(), make([]byte, 100), "the buffer of the receive dropped by RESET")
		})
	}
}

// caseErrFromAnyState: ERR is reachable from every state; receives posted
// before are flushed with WCWRFlushErr in post order.
func caseErrFromAnyState(t *testing.T, e *env) {
	for _, from := range []ibv.QPState{ibv.QPSReset, ibv.QPSInit, ibv.QPSRTR, ibv.QPSRTS} {
		t.Run(from.String(), func(t *testing.T) {
			e := e.sub(t)
			a := e.newSide("a", 0, sideOpts{})
			b := e.newSide("b", 1, sideOpts{})
			e.stepTo(a, b.ep, from)
			n := 0
			if from != ibv.QPSReset {
				buf := e.buf(a.pd, 64)
				for i := range 3 {
					e.postRecv(a, ibv.RecvWR{ID: uint64(10 + i), SGList: []ibv.SGEntry{ibv.SGE(buf, 0, 64)}})
				}
				n = 3
			}
			must(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState), "%v->ERR", from)
			e.queryState(a.qp, ibv.QPSErr, fmt.Sprintf("%v->ERR", from))
			wcs := e.wcs(a.rcq, n)
			for i, wc := range wcs {
				e.status(wc, uint64(10+i), ibv.WCWRFlushErr, fmt.Sprintf("receive %d flushed by %v->ERR", i, from))
				if wc.QPNum != a.qp.QPN() {
					t.Fatalf("flushed receive names QP %#x, want %#x", wc.QPNum, a.qp.QPN())
				}
			}
			e.none(a.rcq, "after the flush")
		})
	}
}

// casePostSendOutsideRTS: PostSend in RESET, INIT and RTR is refused at
// once (ErrInvalid, bad index 0) and produces no completion. In ERR the
// request is taken and completes with WCWRFlushErr, as every request
// posted to a QP in ERR does (notes/protocols.md F.4), on both queues.
func casePostSendOutsideRTS(t *testing.T, e *env) {
	for _, st := range []ibv.QPState{ibv.QPSReset, ibv.QPSInit, ibv.QPSRTR, ibv.QPSErr} {
		t.Run(st.String(), func(t *testing.T) {
			e := e.sub(t)
			a := e.newSide("a", 0, sideOpts{})
			b := e.newSide("b", 1, sideOpts{})
			buf := e.buf(a.pd, 64)
			e.stepTo(a, b.ep, st)
			bad, err := a.qp.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(buf, 0, 64)}}})
			if st == ibv.QPSErr {
				must(t, err, "PostSend in ERR (bad index %d)", bad)
				e.status(e.wc(a.scq), 1, ibv.WCWRFlushErr, "a send posted in ERR")
				e.postRecv(a, ibv.RecvWR{ID: 2, SGList: []ibv.SGEntry{ibv.SGE(buf, 0, 64)}})
				e.status(e.wc(a.rcq), 2, ibv.WCWRFlushErr, "a receive posted in ERR")
				e.state(a.qp, ibv.QPSErr, "after posting in ERR")
				return
			}
			wantErr(t, err, ibv.ErrInvalid, fmt.Sprintf("PostSend in %v", st))
			if bad != 0 {
				t.Fatalf("PostSend in %v: bad index %d, want 0", st, bad)
			}
			e.none(a.scq, fmt.Sprintf("a send refused in %v", st))
			e.state(a.qp, st, "after the refused send")
		})
	}
}

// casePostRecvFromInit: PostRecv in RESET is refused; a receive posted in
// INIT is kept and takes the first SEND once connected.
func casePostRecvFromInit(t *testing.T, e *env) {
	a := e.newSide("a", 0, sideOpts{})
	b := e.newSide("b", 1, sideOpts{})
	dst := e.buf(b.pd, 32)
	bad, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 32)}}})
	wantErr(t, err, ibv.ErrInvalid, "PostRecv in RESET")
	if bad != 0 {
		t.Fatalf("PostRecv in RESET: bad index %d, want 0", bad)
	}
	must(t, ToInit(b.qp, e.port(), DefaultConnOpts()), "RESET->INIT")
	e.postRecv(b, ibv.RecvWR{ID: 2, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 32)}})
	e.connect(a, b, DefaultConnOpts(), DefaultConnOpts())
	src := e.buf(a.pd, 32)
	fill(src.Buf(), 9)
	e.postSend(a, ibv.SendWR{ID: 5, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 32)}})
	e.status(e.wc(a.scq), 5, ibv.WCSuccess, "send")
	e.status(e.wc(b.rcq), 2, ibv.WCSuccess, "the receive posted in INIT")
	e.sameBytes(dst.Buf(), src.Buf(), "data in the receive posted in INIT")
}
