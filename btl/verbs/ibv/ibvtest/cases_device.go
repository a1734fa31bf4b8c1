package ibvtest

import (
	"errors"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

var deviceCases = []testCase{
	{name: "DeviceAttributes", run: caseDeviceAttributes},
	{name: "DestroyOrder", run: caseDestroyOrder},
	{name: "CompletionChannel", pair: true, run: caseCompletionChannel},
}

// caseDeviceAttributes: the device describes itself, its port is active
// with a valid MTU and GID, and queries of ports or GIDs that do not exist
// fail.
func caseDeviceAttributes(t *testing.T, e *env) {
	c := e.dev(0)
	d := c.Device()
	if d.Name == "" || d.MaxQPWR <= 0 || d.MaxSGE <= 0 || d.MaxCQE <= 0 || d.MaxMR <= 0 || d.MaxPD <= 0 || d.MaxQP <= 0 || d.PhysPortCnt < 1 {
		t.Fatalf("device attributes incomplete: %+v", d)
	}
	if int(e.port()) > d.PhysPortCnt {
		t.Fatalf("fixture port %d, device has %d ports", e.port(), d.PhysPortCnt)
	}
	pa, err := c.QueryPort(e.port())
	must(t, err, "QueryPort(%d)", e.port())
	if pa.State != ibv.PortActive {
		t.Fatalf("port %d is %v, want PORT_ACTIVE", e.port(), pa.State)
	}
	if pa.ActiveMTU.Bytes() == 0 || pa.MaxMTU.Bytes() == 0 || pa.ActiveMTU > pa.MaxMTU {
		t.Fatalf("port MTUs: active %d, max %d", pa.ActiveMTU, pa.MaxMTU)
	}
	if pa.GIDTblLen <= e.f.GIDIndex {
		t.Fatalf("GID table of %d entries, fixture uses index %d", pa.GIDTblLen, e.f.GIDIndex)
	}
	if _, err := c.QueryGID(e.port(), e.f.GIDIndex); err != nil {
		t.Fatalf("QueryGID(%d, %d): %v", e.port(), e.f.GIDIndex, err)
	}
	if _, err := c.QueryPort(uint8(d.PhysPortCnt + 1)); err == nil {
		t.Errorf("QueryPort(%d) of a %d-port device succeeded", d.PhysPortCnt+1, d.PhysPortCnt)
	}
	if _, err := c.QueryGID(e.port(), pa.GIDTblLen); err == nil {
		t.Errorf("QueryGID(%d, %d) past a table of %d succeeded", e.port(), pa.GIDTblLen, pa.GIDTblLen)
	}
}

func wantErr(t testing.TB, err, class error, what string) {
	t.Helper()
	if !errors.Is(err, class) {
		t.Fatalf("%s: error %v, want %v", what, err, class)
	}
}

// caseDestroyOrder: an object still used by another cannot be destroyed
// (ErrBusy) and stays usable; destroyed in order, everything goes.
func caseDestroyOrder(t *testing.T, e *env) {
	c := e.f.Open(t, 0)
	closed := false
	t.Cleanup(func() {
		if !closed {
			_ = c.Close()
		}
	})
	pd, err := c.AllocPD()
	must(t, err, "AllocPD")
	ch, err := c.CreateCompChannel()
	must(t, err, "CreateCompChannel")
	cq, err := c.CreateCQ(16, ch)
	must(t, err, "CreateCQ")
	mr, err := pd.RegMR(make([]byte, 4096), allAccess)
	must(t, err, "RegMR")
	qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: cq, RecvCQ: cq, Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(t, err, "CreateQP")

	wantErr(t, c.Close(), ibv.ErrBusy, "Close of a context with a PD, CQ, channel, MR and QP")
	wantErr(t, pd.Dealloc(), ibv.ErrBusy, "Dealloc of a PD with an MR and a QP")
	wantErr(t, cq.Destroy(), ibv.ErrBusy, "Destroy of a CQ a QP uses")
	wantErr(t, ch.Close(), ibv.ErrBusy, "Close of a channel a CQ uses")

	// The refused calls changed nothing: the QP still takes a receive
	// into the MR, and a transition to ERR flushes it to the CQ.
	must(t, ToInit(qp, e.port(), DefaultConnOpts()), "RESET->INIT after refused destroys")
	if bad, err := qp.PostRecv([]ibv.RecvWR{{ID: 7, SGList: []ibv.SGEntry{ibv.SGE(mr, 0, 64)}}}); err != nil {
		t.Fatalf("PostRecv after refused destroys: %d, %v", bad, err)
	}
	must(t, qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState), "INIT->ERR")
	got, err := Poll(e.wait(0), cq, 1)
	if err != nil || got[0].ID != 7 || got[0].Status != ibv.WCWRFlushErr {
		t.Fatalf("flushed receive: %s, %v; want ID 7 flushed", fmtWCs(got), err)
	}

	must(t, qp.Destroy(), "QP Destroy")
	wantErr(t, pd.Dealloc(), ibv.ErrBusy, "Dealloc of a PD with an MR")
	must(t, mr.Dereg(), "MR Dereg")
	must(t, pd.Dealloc(), "PD Dealloc")
	wantErr(t, ch.Close(), ibv.ErrBusy, "Close of a channel a CQ uses (after the QP went)")
	must(t, cq.Destroy(), "CQ Destroy")
	must(t, ch.Close(), "channel Close")
	must(t, c.Close(), "context Close")
	closed = true
}

// caseCompletionChannel: an armed CQ produces one event on its next
// completion; GetEvent returns that CQ; an unarmed CQ produces none; the
// event is acknowledged with AckEvents before the CQ is destroyed.
func caseCompletionChannel(t *testing.T, e *env) {
	a := e.newSide("a", 0, sideOpts{})
	c := e.dev(1)
	ch, err := c.CreateCompChannel()
	must(t, err, "CreateCompChannel")
	e.cleanup("channel", ch.Close)
	rcq := e.cq(c, 64, ch)
	pd := e.pd(c)
	bscq := e.cq(c, 64, nil)
	qp, err := pd.CreateQP(ibv.QPInitAttr{SendCQ: bscq, RecvCQ: rcq, Cap: ibv.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1}})
	must(t, err, "CreateQP")
	e.cleanup("QP", qp.Destroy)
	ep, err := LocalEndpoint(c, qp, e.port(), e.f.GIDIndex, 77)
	must(t, err, "LocalEndpoint")
	b := &side{c: c, pd: pd, scq: bscq, rcq: rcq, qp: qp, ep: ep, name: "b"}
	e.connect(a, b, DefaultConnOpts(), DefaultConnOpts())
	src := e.buf(a.pd, 64)
	dst := e.buf(b.pd, 64)

	// Nothing armed, nothing pending: GetEvent ends with its context.
	short, cancel := contextWithTimeout(20 * time.Millisecond)
	defer cancel()
	if cq, err := ch.GetEvent(short); err == nil {
		t.Fatalf("GetEvent on an idle channel returned CQ %v", cq)
	} else if short.Err() == nil || !errors.Is(err, short.Err()) {
		t.Fatalf("GetEvent on an idle channel: %v, want the context's error", err)
	}

	// Unarmed: a completion arrives in the CQ but no event.
	e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 64)}})
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 8)}})
	e.status(e.wc(rcq), 1, ibv.WCSuccess, "receive on an unarmed CQ")
	e.status(e.wc(a.scq), 1, ibv.WCSuccess, "send")
	short2, cancel2 := contextWithTimeout(20 * time.Millisecond)
	defer cancel2()
	if cq, err := ch.GetEvent(short2); err == nil {
		t.Fatalf("an unarmed CQ produced an event (CQ %v)", cq)
	}

	// Armed, then two completions: one event, for rcq.
	must(t, rcq.ReqNotify(false), "ReqNotify")
	e.postRecv(b, ibv.RecvWR{ID: 2, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 64)}}, ibv.RecvWR{ID: 3, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 64)}})
	e.postSend(a,
		ibv.SendWR{ID: 2, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 8)}},
		ibv.SendWR{ID: 3, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 8)}})
	got, err := ch.GetEvent(e.wait(0))
	must(t, err, "GetEvent after ReqNotify and a completion")
	if got != rcq {
		t.Fatalf("GetEvent returned CQ %v, want the armed CQ %v", got, rcq)
	}
	e.wcs(a.scq, 2)
	wcs := e.wcs(rcq, 2)
	e.status(wcs[0], 2, ibv.WCSuccess, "first receive after arming")
	e.status(wcs[1], 3, ibv.WCSuccess, "second receive after arming")
	// One arm, one event: the second completion raised none.
	short3, cancel3 := contextWithTimeout(20 * time.Millisecond)
	defer cancel3()
	if cq, err := ch.GetEvent(short3); err == nil {
		t.Fatalf("one ReqNotify produced a second event (CQ %v)", cq)
	}
	rcq.AckEvents(1)

	// Re-armed, a later completion produces the next event.
	must(t, rcq.ReqNotify(false), "second ReqNotify")
	e.postRecv(b, ibv.RecvWR{ID: 4, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 64)}})
	e.postSend(a, ibv.SendWR{ID: 4, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 8)}})
	got, err = ch.GetEvent(e.wait(0))
	must(t, err, "GetEvent after the second ReqNotify")
	if got != rcq {
		t.Fatalf("second event for CQ %v, want %v", got, rcq)
	}
	e.status(e.wc(rcq), 4, ibv.WCSuccess, "receive after re-arming")
	e.wc(a.scq)
	rcq.AckEvents(1)
}
