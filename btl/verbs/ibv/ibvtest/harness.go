package ibvtest

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// cleanup registers destroy to run at the end of the case, in reverse
// order of creation. An object the case already destroyed answers
// ErrClosed, which is expected; any other error fails a case that had not
// failed yet.
func (e *env) cleanup(what string, destroy func() error) {
	e.t.Cleanup(func() {
		if err := destroy(); err != nil && !errors.Is(err, ibv.ErrClosed) && !e.t.Failed() {
			e.t.Errorf("destroying %s at the end of the case: %v", what, err)
		}
	})
}

func (e *env) pd(c ibv.Context) ibv.PD {
	e.t.Helper()
	pd, err := c.AllocPD()
	must(e.t, err, "AllocPD")
	e.cleanup("PD", pd.Dealloc)
	return pd
}

func (e *env) cq(c ibv.Context, cqe int, ch ibv.CompChannel) ibv.CQ {
	e.t.Helper()
	cq, err := c.CreateCQ(cqe, ch)
	must(e.t, err, "CreateCQ(%d)", cqe)
	e.cleanup("CQ", cq.Destroy)
	return cq
}

func (e *env) mr(pd ibv.PD, buf []byte, acc ibv.Access) ibv.MR {
	e.t.Helper()
	mr, err := pd.RegMR(buf, acc)
	must(e.t, err, "RegMR(%d bytes, access %#x)", len(buf), acc)
	e.cleanup("MR", mr.Dereg)
	return mr
}

// buf returns a registered buffer of n bytes with every access.
func (e *env) buf(pd ibv.PD, n int) ibv.MR {
	e.t.Helper()
	return e.mr(pd, make([]byte, n), allAccess)
}

const allAccess = ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic

// side is one end of a connection: its device, PD, CQs and QP.
type side struct {
	c        ibv.Context
	pd       ibv.PD
	scq, rcq ibv.CQ
	qp       ibv.QP
	ep       Endpoint
	name     string
}

// sideOpts shape a side's QP.
type sideOpts struct {
	cap    ibv.QPCap
	cqe    int // each CQ's size (0: 256)
	sigAll bool
	pd     ibv.PD // nil: a new PD
}

func (o sideOpts) withDefaults() sideOpts {
	if o.cap.MaxSendWR == 0 {
		o.cap.MaxSendWR = 64
	}
	if o.cap.MaxRecvWR == 0 {
		o.cap.MaxRecvWR = 64
	}
	if o.cap.MaxSendSGE == 0 {
		o.cap.MaxSendSGE = 1
	}
	if o.cap.MaxRecvSGE == 0 {
		o.cap.MaxRecvSGE = 1
	}
	if o.cqe == 0 {
		o.cqe = 256
	}
	return o
}

// newSide makes a side on device dev with its QP in RESET.
func (e *env) newSide(name string, dev int, o sideOpts) *side {
	e.t.Helper()
	o = o.withDefaults()
	s := &side{c: e.dev(dev), name: name}
	s.pd = o.pd
	if s.pd == nil {
		s.pd = e.pd(s.c)
	}
	s.scq = e.cq(s.c, o.cqe, nil)
	s.rcq = e.cq(s.c, o.cqe, nil)
	qp, err := s.pd.CreateQP(ibv.QPInitAttr{SendCQ: s.scq, RecvCQ: s.rcq, Cap: o.cap, Type: ibv.QPTypeRC, SigAll: o.sigAll})
	must(e.t, err, "CreateQP(%+v)", o.cap)
	e.cleanup("QP", qp.Destroy)
	s.qp = qp
	if qp.State() != ibv.QPSReset {
		e.t.Fatalf("a new QP is in %v, want RESET", qp.State())
	}
	s.ep, err = LocalEndpoint(s.c, qp, e.port(), e.f.GIDIndex, psnOf(qp.QPN()))
	must(e.t, err, "LocalEndpoint")
	return s
}

// psnOf picks a distinct first PSN per QP, near the 24-bit wrap for some,
// so that PSN arithmetic across the wrap is exercised.
func psnOf(qpn uint32) uint32 {
	return (0xFFFFF0 + qpn*0x9E3779) & 0xFFFFFF
}

// connect moves a and b to RTS, connected to each other with oa and ob.
func (e *env) connect(a, b *side, oa, ob ConnOpts) {
	e.t.Helper()
	must(e.t, Connect(a.qp, a.ep, b.ep, oa), "connect %s", a.name)
	must(e.t, Connect(b.qp, b.ep, a.ep, ob), "connect %s", b.name)
}

// pair makes two connected sides: a on device 0, b on device 1 (the same
// device in the loopback topology), both with o and DefaultConnOpts.
func (e *env) pair(o sideOpts) (a, b *side) {
	e.t.Helper()
	a = e.newSide("a", 0, o)
	b = e.newSide("b", 1, o)
	e.connect(a, b, DefaultConnOpts(), DefaultConnOpts())
	return a, b
}

func (e *env) postSend(s *side, wrs ...ibv.SendWR) {
	e.t.Helper()
	if bad, err := s.qp.PostSend(wrs); err != nil {
		e.t.Fatalf("%s: PostSend of %d requests failed at %d: %v", s.name, len(wrs), bad, err)
	}
}

func (e *env) postRecv(s *side, wrs ...ibv.RecvWR) {
	e.t.Helper()
	if bad, err := s.qp.PostRecv(wrs); err != nil {
		e.t.Fatalf("%s: PostRecv of %d requests failed at %d: %v", s.name, len(wrs), bad, err)
	}
}

// wcs waits for n completions on cq.
func (e *env) wcs(cq ibv.CQ, n int) []ibv.WC {
	e.t.Helper()
	return e.wcsWithin(cq, n, 0)
}

func (e *env) wcsWithin(cq ibv.CQ, n int, d time.Duration) []ibv.WC {
	e.t.Helper()
	got, err := Poll(e.wait(d), cq, n)
	if err != nil {
		e.t.Fatalf("waiting for %d completions: %v (got %s)", n, err, fmtWCs(got))
	}
	return got
}

// wc waits for one completion.
func (e *env) wc(cq ibv.CQ) ibv.WC { e.t.Helper(); return e.wcs(cq, 1)[0] }

// none checks that cq produces no completion for a short while.
func (e *env) none(cq ibv.CQ, what string) {
	e.t.Helper()
	got, err := PollFor(cq, 20*time.Millisecond)
	if err != nil || len(got) > 0 {
		e.t.Fatalf("%s: want no completion, got %s (err %v)", what, fmtWCs(got), err)
	}
}

// status checks a completion's ID and status (and, for success, opcode).
func (e *env) status(wc ibv.WC, id uint64, st ibv.WCStatus, what string) {
	e.t.Helper()
	if wc.ID != id || wc.Status != st {
		e.t.Fatalf("%s: completion %s, want ID %d status %q", what, fmtWC(wc), id, st)
	}
}

func (e *env) opcode(wc ibv.WC, op ibv.WCOpcode, what string) {
	e.t.Helper()
	if wc.Opcode != op {
		e.t.Fatalf("%s: completion %s, want opcode %#x", what, fmtWC(wc), op)
	}
}

// state checks a QP's state.
func (e *env) state(qp ibv.QP, want ibv.QPState, what string) {
	e.t.Helper()
	if got := qp.State(); got != want {
		e.t.Fatalf("%s: QP state %v, want %v", what, got, want)
	}
}

// awaitState waits for an asynchronous state change (a responder that
// moves to ERR after sending a NAK).
func (e *env) awaitState(qp ibv.QP, want ibv.QPState, what string) {
	e.t.Helper()
	ctx := e.wait(0)
	for i := 0; qp.State() != want; i++ {
		if ctx.Err() != nil {
			e.t.Fatalf("%s: QP state %v, want %v", what, qp.State(), want)
		}
		pause(i)
	}
}

func fmtWC(wc ibv.WC) string {
	return fmt.Sprintf("{ID %d status %q opcode %#x len %d imm %#x flags %#x qp %#x}",
		wc.ID, wc.Status, wc.Opcode, wc.ByteLen, wc.Imm, wc.Flags, wc.QPNum)
}

// fmtWCs prints up to the first 4 and the last 4 completions of a list.
func fmtWCs(wcs []ibv.WC) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d: [", len(wcs))
	for i, wc := range wcs {
		if len(wcs) > 8 && i == 4 {
			fmt.Fprintf(&b, " ... ")
		}
		if len(wcs) > 8 && i >= 4 && i < len(wcs)-4 {
			continue
		}
		if i > 0 {
			b.WriteString(" ")
		}
		b.WriteString(fmtWC(wc))
	}
	b.WriteString("]")
	return b.String()
}

// fill writes a pattern that differs per seed and per position.
func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	fill(b, seed)
	return b
}

// sameBytes fails with the first difference.
func (e *env) sameBytes(got, want []byte, what string) {
	e.t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	if len(got) != len(want) {
		e.t.Fatalf("%s: %d bytes, want %d", what, len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			e.t.Fatalf("%s: byte %d is %#x, want %#x", what, i, got[i], want[i])
		}
	}
}

// syncID marks the requests of sync.
const syncID = 1 << 60

// sync makes b's memory safe to read after WRITEs from a: a 0-byte SEND
// from a completes a receive at b, and RC ordering puts every earlier
// WRITE on the QP before that completion (F.4). Reading after the
// requester's WRITE completion alone would rely on the ACK, which a
// provider delivers through the network (soft: a UDP socket) and which
// therefore orders nothing for Go's memory model or the race detector.
func (e *env) sync(a, b *side) {
	e.t.Helper()
	e.postRecv(b, ibv.RecvWR{ID: syncID})
	e.postSend(a, ibv.SendWR{ID: syncID, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled})
	e.status(e.wc(a.scq), syncID, ibv.WCSuccess, "the sync SEND")
	e.status(e.wc(b.rcq), syncID, ibv.WCSuccess, "the sync receive")
}
