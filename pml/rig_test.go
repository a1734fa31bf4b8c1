package pml_test

// The test rig: N engines joined by a btl/fake network, a trace formatter
// for PML headers, tracked requests whose completions go into the trace,
// receive buffers with guard bytes, golden files and a hang watchdog.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/fake"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// watchdog fails the whole binary with every goroutine's stack if the test
// runs past its budget (or the go test -timeout deadline): no test hangs.
func watchdog(t testing.TB, budget time.Duration) {
	t.Helper()
	if tt, ok := t.(*testing.T); ok {
		if dl, ok := tt.Deadline(); ok {
			if left := time.Until(dl) - 2*time.Second; left < budget {
				budget = max(left, time.Second)
			}
		}
	}
	name := t.Name()
	timer := time.AfterFunc(budget, func() {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "watchdog: %s still running after %v\n%s\n", name, budget, buf)
		os.Exit(2)
	})
	t.Cleanup(func() { timer.Stop() })
}

// ---- trace formatting of PML headers ----

func flagString(f uint8) string {
	var p []string
	for _, x := range []struct {
		bit  uint8
		name string
	}{{hdr.FlagAck, "ack"}, {hdr.FlagPin, "pin"}, {hdr.FlagContig, "contig"}, {hdr.FlagNoRDMA, "nordma"}, {hdr.FlagSync, "sync"}} {
		if f&x.bit != 0 {
			p = append(p, x.name)
			f &^= x.bit
		}
	}
	if f != 0 {
		p = append(p, fmt.Sprintf("%#x", f))
	}
	if len(p) == 0 {
		return ""
	}
	return " flags=" + strings.Join(p, "|")
}

func matchString(m hdr.Match) string {
	return fmt.Sprintf("ctx=%d src=%d tag=%d seq=%d", m.Ctx, m.Src, m.Tag, m.Seq)
}

// formatHdr describes a PML header for the fake's trace.
func formatHdr(tag btl.Tag, b []byte) string {
	bad := func(err error) string { return fmt.Sprintf("MALFORMED tag=%#x len=%d (%v)", uint8(tag), len(b), err) }
	switch hdr.Type(tag) {
	case hdr.TypeMatch:
		m, _, err := hdr.DecodeMatch(b)
		if err != nil {
			return bad(err)
		}
		return "MATCH " + matchString(m) + flagString(m.Flags)
	case hdr.TypeRndv:
		h, _, err := hdr.DecodeRndv(b)
		if err != nil {
			return bad(err)
		}
		return fmt.Sprintf("RNDV %s len=%d req=%d%s", matchString(h.Match), h.MsgLen, h.SrcReq, flagString(h.Flags))
	case hdr.TypeRget:
		h, _, err := hdr.DecodeRget(b)
		if err != nil {
			return bad(err)
		}
		return fmt.Sprintf("RGET %s len=%d req=%d handle=%s%s", matchString(h.Match), h.MsgLen, h.SrcReq, fake.HandleString(h.Handle), flagString(h.Flags))
	case hdr.TypeAck:
		h, _, err := hdr.DecodeAck(b)
		if err != nil {
			return bad(err)
		}
		return fmt.Sprintf("ACK src_req=%d dst_req=%d off=%d size=%d%s", h.SrcReq, h.DstReq, h.SendOffset, h.SendSize, flagString(h.Flags))
	case hdr.TypeFrag:
		h, _, err := hdr.DecodeFrag(b)
		if err != nil {
			return bad(err)
		}
		return fmt.Sprintf("FRAG off=%d src_req=%d dst_req=%d%s", h.Offset, h.SrcReq, h.DstReq, flagString(h.Flags))
	case hdr.TypePut:
		h, _, err := hdr.DecodePut(b)
		if err != nil {
			return bad(err)
		}
		return fmt.Sprintf("PUT src_req=%d dst_req=%d off=%d size=%d handle=%s%s", h.SrcReq, h.DstReq, h.Offset, h.Size, fake.HandleString(h.Handle), flagString(h.Flags))
	case hdr.TypeFin:
		h, _, err := hdr.DecodeFin(b)
		if err != nil {
			return bad(err)
		}
		return fmt.Sprintf("FIN req=%d off=%d size=%d", h.Req, h.Offset, h.Size)
	}
	return fmt.Sprintf("tag=%#x hdr=%dB", uint8(tag), len(b))
}

// ---- buffers ----

const guardLen = 16

// guarded is a receive buffer with guard bytes on both sides, prefilled
// with 0xee so the bytes the engine wrote can be told apart.
type guarded struct {
	all []byte
	n   int
}

func newGuarded(n int) *guarded {
	g := &guarded{all: make([]byte, n+2*guardLen), n: n}
	for i := range g.all {
		g.all[i] = 0xa5
	}
	for i := range n {
		g.all[guardLen+i] = 0xee
	}
	return g
}

// buf is the part handed to the engine; its capacity ends at the guard.
func (g *guarded) buf() []byte { return g.all[guardLen : guardLen+g.n : guardLen+g.n] }

func (g *guarded) guardsIntact() bool {
	for i := range guardLen {
		if g.all[i] != 0xa5 || g.all[guardLen+g.n+i] != 0xa5 {
			return false
		}
	}
	return true
}

// pattern is deterministic message content identifying (seed, offset).
func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>8)
	}
	return b
}

// ---- the rig ----

// tracked is a request whose completion the rig reports in the trace.
type tracked struct {
	name string
	r    *pml.Handle
	seen bool
	g    *guarded // receives: the buffer
	want []byte   // receives: the bytes that should arrive (prefix that fits)
	rel  *int     // buffered sends: times release was called
}

type rig struct {
	t     testing.TB
	net   *fake.Network
	disp  []*btl.Dispatcher
	eng   []*pml.Engine
	comm  []*pml.Comm
	reqs  []*tracked
	nsend []int
	nrecv []int
}

// baseParams makes every test independent of GOMPI_* variables.
var baseParams = [][2]string{
	{"pml_force_protocol", ""},
	{"pml_leave_pinned", "false"},
	{"pml_send_pipeline_depth", "3"},
	{"pml_recv_pipeline_depth", "4"},
	{"pml_wait_spin", "0s"},
}

// newRig makes n ranks, each with a fake module configured by cfg and the
// pml parameters overrides, joined in communicator context 0.
func newRig(t testing.TB, n int, cfg fake.Config, overrides ...[2]string) *rig {
	t.Helper()
	return newRigRaw(t, n, cfg, -1, overrides...)
}

// newRigRaw is newRig where rank raw (if >= 0) has no engine: its module
// delivers to a dispatcher without handlers, and the test speaks for it
// with Network.Inject.
func newRigRaw(t testing.TB, n int, cfg fake.Config, raw int, overrides ...[2]string) *rig {
	t.Helper()
	watchdog(t, 20*time.Second)
	g := &rig{t: t, net: fake.NewNetwork(), nsend: make([]int, n), nrecv: make([]int, n)}
	g.net.SetFormatter(formatHdr)
	ps, err := params.NewSet(append(append([][2]string(nil), baseParams...), overrides...))
	require.NoError(t, err)
	for r := range n {
		d := &btl.Dispatcher{}
		var e *pml.Engine
		if r != raw {
			e, err = pml.New(pml.Config{Rank: r, Size: n, Params: ps, Dispatch: d, Stats: true})
			require.NoError(t, err)
		}
		g.net.Attach(r, d, cfg)
		g.disp = append(g.disp, d)
		g.eng = append(g.eng, e)
	}
	group := make([]int, n)
	for i := range group {
		group[i] = i
	}
	for r := range n {
		if r == raw {
			g.comm = append(g.comm, nil)
			continue
		}
		for p := range n {
			ep, err := g.net.Module(r).AddProc(p)
			require.NoError(t, err)
			require.NoError(t, g.eng[r].SetPeer(p, ep))
		}
		c, err := g.eng[r].NewComm(0, r, group)
		require.NoError(t, err)
		g.comm = append(g.comm, c)
	}
	return g
}

func (g *rig) note(format string, a ...any) { g.net.Note(format, a...) }

// isend starts a send of data and tracks it.
func (g *rig) isend(from, to, tag int, data []byte, mode pml.Mode) *tracked {
	g.t.Helper()
	g.nsend[from]++
	tr := &tracked{name: fmt.Sprintf("rank%d send#%d(to=%d tag=%d len=%d %s)", from, g.nsend[from], to, tag, len(data), mode)}
	var release func()
	if mode == pml.Buffered {
		tr.rel = new(int)
		release = func() { *tr.rel++; g.note("   release %s", tr.name) }
	}
	r, err := g.comm[from].IsendHandle(pml.Buffer{Bytes: data}, to, tag, mode, release)
	require.NoError(g.t, err)
	tr.r = r
	g.reqs = append(g.reqs, tr)
	g.poll()
	return tr
}

// irecv posts a receive of capacity n and tracks it; want is the message
// it should get (checked by checkData).
func (g *rig) irecv(rank, src, tag, n int, want []byte) *tracked {
	g.t.Helper()
	g.nrecv[rank]++
	tr := &tracked{name: fmt.Sprintf("rank%d recv#%d(src=%s tag=%s cap=%d)", rank, g.nrecv[rank], wild(src, pml.AnySource), wild(tag, pml.AnyTag), n), g: newGuarded(n)}
	if want != nil {
		tr.want = want[:min(len(want), n)]
	}
	r, err := g.comm[rank].IrecvHandle(pml.Buffer{Bytes: tr.g.buf()}, src, tag)
	require.NoError(g.t, err)
	tr.r = r
	g.reqs = append(g.reqs, tr)
	g.poll()
	return tr
}

// cancel cancels the request behind h on c (Comm.Cancel) and reports
// whether it was; false when h is done and its request given back.
func cancel(c *pml.Comm, h *pml.Handle) bool {
	pr := h.Acquire()
	if pr == nil {
		return false
	}
	defer h.Release()
	return c.Cancel(pr)
}

func wild(v, w int) string {
	if v == w {
		return "any"
	}
	return fmt.Sprint(v)
}

// track adds a request made outside isend/irecv (Mrecv's).
func (g *rig) track(name string, r *pml.Handle, gb *guarded, want []byte) *tracked {
	tr := &tracked{name: name, r: r, g: gb}
	if want != nil && gb != nil {
		tr.want = want[:min(len(want), gb.n)]
	}
	g.reqs = append(g.reqs, tr)
	g.poll()
	return tr
}

func errString(err error) string {
	if err == nil {
		return "ok"
	}
	var cls []string
	for _, c := range []error{mpierr.ErrTruncate, mpierr.ErrProcFailed, mpierr.ErrProtocol, mpierr.ErrNotInit} {
		if errors.Is(err, c) {
			cls = append(cls, strings.TrimPrefix(c.Error(), "mpi: "))
		}
	}
	return fmt.Sprintf("ERROR [%s] %v", strings.Join(cls, ","), err)
}

// poll reports requests that completed since the last poll.
func (g *rig) poll() {
	for _, tr := range g.reqs {
		if tr.seen || !tr.r.Done() {
			continue
		}
		tr.seen = true
		st, err := tr.r.Result()
		extra := ""
		if st.Cancelled {
			extra = " cancelled"
		}
		g.note("=> %s done: src=%d tag=%d count=%d%s %s", tr.name, st.Source, st.Tag, st.Count, extra, errString(err))
	}
}

// step delivers the oldest pending operation, and has the engines post
// again what the transport refused (btl.ErrWouldBlock); false when there
// was nothing to do.
func (g *rig) step() bool {
	ok := g.net.Step()
	for _, e := range g.eng {
		if e != nil && e.Queued() > 0 {
			e.Progress()
			ok = true
		}
	}
	g.poll()
	return ok
}

// deliver delivers pending operation i.
func (g *rig) deliver(i int) {
	g.t.Helper()
	require.NoError(g.t, g.net.Deliver(i))
	g.poll()
}

// run delivers until nothing is pending.
func (g *rig) run() {
	g.t.Helper()
	for k := 0; g.step(); k++ {
		require.Less(g.t, k, 100000, "livelock")
	}
}

// find returns the index of the first pending op from->to of header type
// typ (a send) or of RDMA kind, -1 if none.
func (g *rig) find(from, to int, typ hdr.Type) int {
	return g.net.Find(func(op fake.Op) bool {
		return op.From == from && op.To == to && op.Kind.IsSend() && hdr.Type(op.Tag) == typ
	})
}

// checkData verifies every completed receive's bytes and guards.
func (g *rig) checkData() {
	g.t.Helper()
	for _, tr := range g.reqs {
		if tr.g == nil {
			continue
		}
		require.True(g.t, tr.g.guardsIntact(), "%s: guard bytes overwritten", tr.name)
		if tr.want != nil && tr.r.Done() {
			_, err := tr.r.Result()
			if err == nil || errors.Is(err, mpierr.ErrTruncate) {
				require.Equal(g.t, tr.want, tr.g.buf()[:len(tr.want)], "%s: data", tr.name)
			}
		}
	}
}

// checkClean asserts the end state of a successful scenario: every
// request done, nothing pending, no registration or Alloc buffer left,
// no transport-contract violation, data and guards right.
func (g *rig) checkClean() {
	g.t.Helper()
	g.checkData()
	for _, tr := range g.reqs {
		require.True(g.t, tr.r.Done(), "%s not done", tr.name)
		if tr.rel != nil {
			require.Equal(g.t, 1, *tr.rel, "%s: release calls", tr.name)
		}
	}
	require.Equal(g.t, 0, g.net.Len(), "operations pending")
	require.Equal(g.t, 0, g.net.LiveRegistrations(), "registrations leaked")
	require.Equal(g.t, 0, g.net.OutstandingAllocs(), "Alloc buffers leaked")
	require.Empty(g.t, g.net.Violations())
	for r, e := range g.eng {
		if e != nil {
			require.Equal(g.t, 0, e.Pending(), "rank %d: rendezvous requests still in the engine", r)
		}
	}
}

// golden compares the trace (after a header) with testdata/<name>.golden.
func (g *rig) golden(name, header string) {
	g.t.Helper()
	var b strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(header), "\n") {
		b.WriteString("# " + strings.TrimSpace(l) + "\n")
	}
	for _, l := range g.net.Trace() {
		b.WriteString(l + "\n")
	}
	compareGolden(g.t, name, b.String())
}

func compareGolden(t testing.TB, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		require.NoError(t, os.MkdirAll("testdata", 0o755))
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "missing golden file; run go test ./pml -run Scenario -update")
	if !bytes.Equal(want, []byte(got)) {
		t.Errorf("%s differs from the trace (go test ./pml -run Scenario -update to accept):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff shows the first differing lines.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	for i := 0; i < max(len(w), len(g)); i++ {
		var a, b string
		if i < len(w) {
			a = w[i]
		}
		if i < len(g) {
			b = g[i]
		}
		if a != b {
			return fmt.Sprintf("line %d:\n- %s\n+ %s", i+1, a, b)
		}
	}
	return "(identical lines, different bytes)"
}

// capsConfig is the fake configuration used by the scenarios: small
// limits so every protocol appears with messages of a few KiB.
//
//	eager limit 128 (eager payload <= 112), first RNDV chunk 96,
//	FRAG payload 256, RDMA pipeline PUTs of 512, tail of 256 by FRAGs,
//	RDMA directly up to 1024 bytes.
func capsConfig(c btl.Caps) fake.Config {
	cfg := fake.DefaultConfig()
	cfg.Caps = c
	cfg.Limits = btl.Limits{
		EagerLimit:             128,
		RndvEagerLimit:         1024,
		MaxSendSize:            256 + hdr.FragLen,
		RDMAPipelineFragSize:   512,
		RDMAPipelineSendLength: 256,
		MinRDMAPipelineSize:    1024,
	}
	return cfg
}

func describe(cfg fake.Config) string {
	l := cfg.Limits
	return fmt.Sprintf("caps=%s eager_limit=%d rndv_eager_limit=%d max_send_size=%d rdma_frag=%d rdma_send_length=%d min_rdma_pipeline=%d",
		cfg.Caps, l.EagerLimit, l.RndvEagerLimit, l.MaxSendSize, l.RDMAPipelineFragSize, l.RDMAPipelineSendLength, l.MinRDMAPipelineSize)
}
