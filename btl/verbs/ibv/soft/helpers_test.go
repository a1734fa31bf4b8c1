package soft

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// end is one side of a test connection: a device, a PD, a CQ for both
// queues, a QP and a registered buffer.
type end struct {
	t   testing.TB
	ctx ibv.Context
	pd  ibv.PD
	scq ibv.CQ
	rcq ibv.CQ
	qp  ibv.QP
	mr  ibv.MR
	buf []byte
	ch  ibv.CompChannel
	swc []ibv.WC
}

func (e *end) sendWC() []ibv.WC {
	if e.swc == nil {
		e.swc = make([]ibv.WC, 16)
	}
	return e.swc
}

type pairOpts struct {
	bufSize   int
	cqe       int
	sendWR    int
	recvWR    int
	access    ibv.Access // both QPs' access flags
	mrAccess  ibv.Access
	timeout   uint8
	retryCnt  uint8
	rnrRetry  uint8
	minRNR    uint8
	rdAtomic  uint8
	inline    int
	mtu       ibv.MTU
	noConnect bool
}

func defaultOpts() pairOpts {
	return pairOpts{
		bufSize:  1 << 20,
		cqe:      4096,
		sendWR:   1024,
		recvWR:   1024,
		access:   ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic,
		mrAccess: ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic,
		timeout:  14, // 67 ms
		retryCnt: 7,
		rnrRetry: 7,
		minRNR:   1,
		rdAtomic: 16,
		inline:   256,
		mtu:      ibv.MTU4096,
	}
}

func openEnd(t testing.TB, p *Provider, o pairOpts) *end {
	t.Helper()
	c, err := p.Open("")
	require.NoError(t, err)
	e := &end{t: t, ctx: c}
	e.pd, err = c.AllocPD()
	require.NoError(t, err)
	e.scq, err = c.CreateCQ(o.cqe, nil)
	require.NoError(t, err)
	e.rcq, err = c.CreateCQ(o.cqe, nil)
	require.NoError(t, err)
	e.buf = make([]byte, o.bufSize)
	e.mr, err = e.pd.RegMR(e.buf, o.mrAccess)
	require.NoError(t, err)
	e.qp, err = e.pd.CreateQP(ibv.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, Cap: ibv.QPCap{
		MaxSendWR: o.sendWR, MaxRecvWR: o.recvWR, MaxSendSGE: 4, MaxRecvSGE: 4, MaxInlineData: o.inline}})
	require.NoError(t, err)
	return e
}

func (e *end) close() {
	if e.qp != nil {
		_ = e.qp.Destroy()
	}
	_ = e.mr.Dereg()
	_ = e.scq.Destroy()
	_ = e.rcq.Destroy()
	_ = e.pd.Dealloc()
	if e.ch != nil {
		require.NoError(e.t, e.ch.Close())
	}
	require.NoError(e.t, e.ctx.Close())
}

func (e *end) gid() ibv.GID {
	g, err := e.ctx.QueryGID(1, 0)
	require.NoError(e.t, err)
	return g
}

// connect moves a and b to RTS, each aimed at the other.
func connect(t testing.TB, a, b *end, o pairOpts) {
	t.Helper()
	for _, x := range [][2]*end{{a, b}, {b, a}} {
		me, peer := x[0], x[1]
		require.NoError(t, me.qp.Modify(&ibv.QPAttr{State: ibv.QPSInit, Port: 1, AccessFlags: o.access}, ibv.MaskResetToInit))
		require.NoError(t, me.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTR, PathMTU: o.mtu, DestQPN: peer.qp.QPN(), RQPSN: 100,
			MaxDestRdAtomic: o.rdAtomic, MinRNRTimer: o.minRNR,
			AH: ibv.AH{IsGlobal: true, DGID: peer.gid(), Port: 1}}, ibv.MaskInitToRTR))
		require.NoError(t, me.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTS, SQPSN: 100, Timeout: o.timeout,
			RetryCnt: o.retryCnt, RNRRetry: o.rnrRetry, MaxRdAtomic: o.rdAtomic}, ibv.MaskRTRToRTS))
	}
}

// newPair opens two devices (two providers) and connects a QP on each.
func newPair(t testing.TB, ca, cb Config, o pairOpts) (*end, *end) {
	t.Helper()
	a := openEnd(t, New(ca), o)
	b := openEnd(t, New(cb), o)
	if !o.noConnect {
		connect(t, a, b, o)
	}
	t.Cleanup(func() { a.close(); b.close() })
	return a, b
}

// deadline is the test's deadline, at most d from now.
func deadline(t testing.TB, d time.Duration) time.Time {
	dl := time.Now().Add(d)
	if tt, ok := t.(*testing.T); ok {
		if td, ok := tt.Deadline(); ok && td.Before(dl) {
			dl = td.Add(-time.Second)
		}
	}
	return dl
}

// poll waits for n completions on cq (or fails the test at the deadline).
func poll(t testing.TB, cq ibv.CQ, n int, d time.Duration) []ibv.WC {
	t.Helper()
	out := make([]ibv.WC, 0, n)
	wc := make([]ibv.WC, 64)
	dl := deadline(t, d)
	for len(out) < n {
		k, err := cq.Poll(wc[:min(len(wc), n-len(out))])
		require.NoError(t, err)
		out = append(out, wc[:k]...)
		if k == 0 {
			if time.Now().After(dl) {
				t.Fatalf("%d of %d completions after %v", len(out), n, d)
			}
			runtime.Gosched()
		}
	}
	return out
}

// pollOne waits for one completion and checks its status.
func pollOne(t testing.TB, cq ibv.CQ, st ibv.WCStatus) ibv.WC {
	t.Helper()
	wc := poll(t, cq, 1, 20*time.Second)[0]
	require.Equal(t, st, wc.Status, "completion %+v", wc)
	return wc
}

// noCompletion checks that cq stays empty for a short while.
func noCompletion(t testing.TB, cq ibv.CQ, d time.Duration) {
	t.Helper()
	wc := make([]ibv.WC, 1)
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		n, err := cq.Poll(wc)
		require.NoError(t, err)
		require.Zero(t, n, "unexpected completion %+v", wc[0])
		time.Sleep(time.Millisecond)
	}
}

// waitCtx returns a context that ends at the test's deadline.
func waitCtx(t testing.TB, d time.Duration) context.Context {
	c, cancel := context.WithDeadline(context.Background(), deadline(t, d))
	t.Cleanup(cancel)
	return c
}

// settleGoroutines waits until the goroutine count is back to at most n.
func settleGoroutines(t testing.TB, n int) {
	t.Helper()
	dl := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > n {
		if time.Now().After(dl) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines: %d, want <= %d\n%s", runtime.NumGoroutine(), n, buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(5 * time.Millisecond)
	}
}
