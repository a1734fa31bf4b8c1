package pml_test

import (
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/fake"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/stretchr/testify/require"
)

// Limits of the selection tables: eager payload <= 1008 (1024 - MATCH
// header), RDMA used directly up to 64 KiB.
var selLimits = btl.Limits{
	EagerLimit:             1024,
	RndvEagerLimit:         512,
	MaxSendSize:            4096,
	RDMAPipelineFragSize:   8192,
	RDMAPipelineSendLength: 2048,
	MinRDMAPipelineSize:    65536,
}

const (
	eagerMax = 1024 - hdr.MatchLen
	minRDMA  = 65536
)

const (
	cFull   = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut | btl.CapGet
	cNoImm  = btl.CapSend | btl.CapSendInPlace | btl.CapPut | btl.CapGet
	cCopy   = btl.CapSend
	cInpl   = btl.CapSend | btl.CapSendInPlace
	cPut    = btl.CapSend | btl.CapSendInPlace | btl.CapPut
	cGet    = btl.CapSend | btl.CapSendInPlace | btl.CapGet
	cSendi  = btl.CapSend | btl.CapSendImmediate
	cImmPut = btl.CapSend | btl.CapSendImmediate | btl.CapPut
)

func TestSelect(t *testing.T) {
	type row struct {
		mode   pml.Mode
		size   int
		caps   btl.Caps
		nc     bool // non-contiguous
		pinned bool // pml_leave_pinned
		force  pml.Force
		lim    *btl.Limits
		want   pml.Protocol
	}
	small := selLimits
	small.EagerLimit = 100 // eager payload <= 84: below ImmediateMax
	tiny := selLimits
	tiny.EagerLimit = 8 // smaller than a MATCH header: nothing but empty messages is eager
	S, B, Y, R := pml.Standard, pml.Buffered, pml.Synchronous, pml.Ready
	rows := []row{
		// Standard: immediate up to 256 bytes, then prepared/allocated up to eager_limit - header.
		{mode: S, size: 0, caps: cFull, want: pml.EagerImmediate},
		{mode: S, size: 1, caps: cFull, want: pml.EagerImmediate},
		{mode: S, size: pml.ImmediateMax, caps: cFull, want: pml.EagerImmediate},
		{mode: S, size: pml.ImmediateMax + 1, caps: cFull, want: pml.EagerPrepared},
		{mode: S, size: eagerMax - 1, caps: cFull, want: pml.EagerPrepared},
		{mode: S, size: eagerMax, caps: cFull, want: pml.EagerPrepared},
		{mode: S, size: eagerMax + 1, caps: cFull, want: pml.RDMADirectGet},
		{mode: S, size: minRDMA, caps: cFull, want: pml.RDMADirectGet},
		{mode: S, size: minRDMA + 1, caps: cFull, want: pml.RDMAPipeline},
		{mode: S, size: minRDMA + 1, caps: cFull, pinned: true, want: pml.RDMADirectGet},
		{mode: S, size: 1 << 30, caps: cFull, want: pml.RDMAPipeline},
		{mode: S, size: 0, caps: cNoImm, want: pml.EagerAllocated}, // nothing to send in place
		{mode: S, size: 1, caps: cNoImm, want: pml.EagerPrepared},
		{mode: S, size: eagerMax, caps: cNoImm, want: pml.EagerPrepared},
		{mode: S, size: 0, caps: cCopy, want: pml.EagerAllocated},
		{mode: S, size: eagerMax, caps: cCopy, want: pml.EagerAllocated},
		{mode: S, size: eagerMax + 1, caps: cCopy, want: pml.SendPipeline},
		{mode: S, size: minRDMA + 1, caps: cCopy, want: pml.SendPipeline},
		{mode: S, size: 0, caps: cInpl, want: pml.EagerAllocated},
		{mode: S, size: eagerMax + 1, caps: cInpl, want: pml.SendPipeline},
		{mode: S, size: 100, caps: cSendi, want: pml.EagerImmediate},
		{mode: S, size: pml.ImmediateMax + 1, caps: cSendi, want: pml.EagerAllocated},
		// RDMA: put only, get only.
		{mode: S, size: eagerMax + 1, caps: cPut, want: pml.RDMADirectPut},
		{mode: S, size: minRDMA, caps: cPut, want: pml.RDMADirectPut},
		{mode: S, size: minRDMA + 1, caps: cPut, want: pml.RDMAPipeline},
		{mode: S, size: minRDMA + 1, caps: cPut, pinned: true, want: pml.RDMADirectPut},
		{mode: S, size: eagerMax + 1, caps: cGet, want: pml.RDMADirectGet},
		{mode: S, size: minRDMA + 1, caps: cGet, want: pml.RDMADirectGet}, // no put: no pipeline
		{mode: S, size: minRDMA + 1, caps: cImmPut, want: pml.RDMAPipeline},
		// Non-contiguous data: no RDMA and no in-place send.
		{mode: S, size: 100, caps: cFull, nc: true, want: pml.EagerImmediate},
		{mode: S, size: 500, caps: cFull, nc: true, want: pml.EagerAllocated},
		{mode: S, size: eagerMax + 1, caps: cFull, nc: true, want: pml.SendPipeline},
		{mode: S, size: minRDMA + 1, caps: cFull, nc: true, pinned: true, want: pml.SendPipeline},
		// A small eager limit caps the immediate send too.
		{mode: S, size: 84, caps: cFull, lim: &small, want: pml.EagerImmediate},
		{mode: S, size: 85, caps: cFull, lim: &small, want: pml.RDMADirectGet},
		{mode: S, size: 0, caps: cFull, lim: &tiny, want: pml.EagerImmediate},
		{mode: S, size: 1, caps: cCopy, lim: &tiny, want: pml.SendPipeline},
		// Ready is Standard.
		{mode: R, size: 100, caps: cFull, want: pml.EagerImmediate},
		{mode: R, size: 500, caps: cNoImm, want: pml.EagerPrepared},
		{mode: R, size: minRDMA + 1, caps: cFull, want: pml.RDMAPipeline},
		// Buffered: never in place; long messages by the buffered pipeline.
		{mode: B, size: 100, caps: cFull, want: pml.EagerImmediate},
		{mode: B, size: 100, caps: cNoImm, want: pml.EagerAllocated},
		{mode: B, size: eagerMax, caps: cFull, want: pml.EagerAllocated},
		{mode: B, size: eagerMax + 1, caps: cFull, want: pml.BufferedPipeline},
		{mode: B, size: minRDMA + 1, caps: cFull, pinned: true, want: pml.BufferedPipeline},
		{mode: B, size: eagerMax + 1, caps: cCopy, want: pml.BufferedPipeline},
		// Synchronous: never eager, never immediate.
		{mode: Y, size: 0, caps: cFull, want: pml.SendPipeline},
		{mode: Y, size: 100, caps: cFull, want: pml.SendPipeline},
		{mode: Y, size: eagerMax, caps: cFull, want: pml.SendPipeline},
		{mode: Y, size: eagerMax + 1, caps: cFull, want: pml.RDMADirectGet},
		{mode: Y, size: eagerMax + 1, caps: cPut, want: pml.RDMADirectPut},
		{mode: Y, size: minRDMA + 1, caps: cPut, want: pml.RDMAPipeline},
		{mode: Y, size: eagerMax + 1, caps: cCopy, want: pml.SendPipeline},

		// pml_force_protocol: used for every message it can carry.
		{mode: S, size: 100, caps: cFull, force: pml.ForceNone, want: pml.EagerImmediate},
		{mode: S, size: 100, caps: cFull, force: pml.ForceEager, want: pml.EagerImmediate},
		{mode: S, size: eagerMax + 1, caps: cFull, force: pml.ForceEager, want: pml.RDMADirectGet}, // too long: automatic
		{mode: Y, size: 100, caps: cFull, force: pml.ForceEager, want: pml.SendPipeline},
		{mode: S, size: 10, caps: cFull, force: pml.ForceRDMAGet, want: pml.RDMADirectGet},
		{mode: S, size: 0, caps: cFull, force: pml.ForceRDMAGet, want: pml.RDMADirectGet},
		{mode: S, size: minRDMA + 1, caps: cFull, force: pml.ForceRDMAGet, want: pml.RDMADirectGet},
		{mode: Y, size: 10, caps: cFull, force: pml.ForceRDMAGet, want: pml.RDMADirectGet},
		{mode: S, size: 10, caps: cImmPut, force: pml.ForceRDMAGet, want: pml.EagerImmediate},                 // no get
		{mode: S, size: eagerMax + 1, caps: cFull, nc: true, force: pml.ForceRDMAGet, want: pml.SendPipeline}, // not contiguous
		{mode: B, size: eagerMax + 1, caps: cFull, force: pml.ForceRDMAGet, want: pml.BufferedPipeline},
		{mode: S, size: 10, caps: cFull, force: pml.ForceRDMAPut, want: pml.RDMADirectPut},
		{mode: S, size: minRDMA + 1, caps: cFull, force: pml.ForceRDMAPut, want: pml.RDMADirectPut},
		{mode: S, size: 10, caps: cGet, force: pml.ForceRDMAPut, want: pml.EagerPrepared}, // no put
		{mode: B, size: 10, caps: cFull, force: pml.ForceRDMAPut, want: pml.EagerImmediate},
		{mode: S, size: 0, caps: cFull, force: pml.ForceSendPipeline, want: pml.SendPipeline},
		{mode: S, size: minRDMA + 1, caps: cFull, force: pml.ForceSendPipeline, want: pml.SendPipeline},
		{mode: S, size: 10, caps: cFull, nc: true, force: pml.ForceSendPipeline, want: pml.SendPipeline},
		{mode: B, size: 10, caps: cFull, force: pml.ForceSendPipeline, want: pml.BufferedPipeline},
		{mode: B, size: minRDMA + 1, caps: cFull, force: pml.ForceSendPipeline, want: pml.BufferedPipeline},
		{mode: S, size: 10, caps: cFull, force: pml.ForceRDMAPipeline, want: pml.RDMAPipeline},
		{mode: Y, size: 0, caps: cPut, force: pml.ForceRDMAPipeline, want: pml.RDMAPipeline},
		{mode: S, size: eagerMax + 1, caps: cGet, force: pml.ForceRDMAPipeline, want: pml.RDMADirectGet}, // no put
		{mode: S, size: minRDMA + 1, caps: cFull, nc: true, force: pml.ForceRDMAPipeline, want: pml.SendPipeline},
		{mode: B, size: 10, caps: cFull, force: pml.ForceRDMAPipeline, want: pml.EagerImmediate},
	}
	for i, r := range rows {
		lim := selLimits
		if r.lim != nil {
			lim = *r.lim
		}
		in := pml.SendInfo{Mode: r.mode, Size: r.size, Contiguous: !r.nc, Caps: r.caps, Limits: lim, LeavePinned: r.pinned, Force: r.force}
		name := fmt.Sprintf("%d/%s/size=%d/caps=%s/contig=%v/pinned=%v/force=%d/eager_limit=%d", i, r.mode, r.size, r.caps, !r.nc, r.pinned, r.force, lim.EagerLimit)
		t.Run(name, func(t *testing.T) {
			require.Equal(t, r.want, pml.Select(in))
		})
	}
}

// TestSelectInvariants sweeps every mode, capability set, force value,
// layout and pinning over sizes around each threshold and checks what
// must hold whatever the choice; every protocol must be reachable.
func TestSelectInvariants(t *testing.T) {
	limits := []btl.Limits{selLimits, {EagerLimit: 100, RndvEagerLimit: 50, MaxSendSize: 200, MinRDMAPipelineSize: 300}}
	seen := map[pml.Protocol]bool{}
	forces := []pml.Force{pml.ForceNone, pml.ForceEager, pml.ForceRDMAPut, pml.ForceRDMAGet, pml.ForceSendPipeline, pml.ForceRDMAPipeline}
	for _, lim := range limits {
		em := pml.EagerMax(lim)
		sizes := []int{0, 1, pml.ImmediateMax - 1, pml.ImmediateMax, pml.ImmediateMax + 1, em - 1, em, em + 1,
			lim.MinRDMAPipelineSize - 1, lim.MinRDMAPipelineSize, lim.MinRDMAPipelineSize + 1, 1 << 24}
		for caps := btl.Caps(0); caps <= cFull; caps++ {
			if caps&btl.CapSend == 0 {
				continue // every transport sends
			}
			for _, mode := range []pml.Mode{pml.Standard, pml.Buffered, pml.Synchronous, pml.Ready} {
				for _, force := range forces {
					for _, size := range sizes {
						if size < 0 {
							continue
						}
						for _, contig := range []bool{true, false} {
							for _, pinned := range []bool{false, true} {
								in := pml.SendInfo{Mode: mode, Size: size, Contiguous: contig, Caps: caps, Limits: lim, LeavePinned: pinned, Force: force}
								p := pml.Select(in)
								seen[p] = true
								checkSelect(t, in, p)
							}
						}
					}
				}
			}
		}
	}
	for p := pml.EagerImmediate; p <= pml.BufferedPipeline; p++ {
		require.True(t, seen[p], "%v never selected", p)
	}
}

func checkSelect(t *testing.T, in pml.SendInfo, p pml.Protocol) {
	t.Helper()
	fail := func(why string) { t.Fatalf("Select(%+v) = %v: %s", in, p, why) }
	if p.Eager() && in.Size > pml.EagerMax(in.Limits) {
		fail("an eager fragment must fit the eager limit")
	}
	if in.Mode == pml.Synchronous && p.Eager() {
		fail("a synchronous send needs the receiver's answer")
	}
	if (p == pml.BufferedPipeline) != (in.Mode == pml.Buffered && !p.Eager()) {
		fail("the buffered pipeline is for long buffered sends only")
	}
	if in.Mode == pml.Buffered && p == pml.EagerPrepared {
		fail("buffered sends pack")
	}
	switch p {
	case pml.EagerImmediate:
		if in.Caps&btl.CapSendImmediate == 0 || in.Size > pml.ImmediateMax {
			fail("immediate needs sendi and at most ImmediateMax bytes")
		}
	case pml.EagerPrepared:
		if in.Caps&btl.CapSendInPlace == 0 || !in.Contiguous || in.Size == 0 {
			fail("prepared needs in-place sends of contiguous, non-empty data")
		}
	case pml.RDMADirectGet:
		if in.Caps&btl.CapGet == 0 || !in.Contiguous {
			fail("get needs CapGet and contiguous data")
		}
	case pml.RDMADirectPut, pml.RDMAPipeline:
		if in.Caps&btl.CapPut == 0 || !in.Contiguous {
			fail("put needs CapPut and contiguous data")
		}
	}
	// A forced protocol is used whenever it can carry the message.
	canRDMA := in.Contiguous && in.Mode != pml.Buffered
	switch {
	case in.Force == pml.ForceRDMAGet && canRDMA && in.Caps&btl.CapGet != 0 && p != pml.RDMADirectGet,
		in.Force == pml.ForceRDMAPut && canRDMA && in.Caps&btl.CapPut != 0 && p != pml.RDMADirectPut,
		in.Force == pml.ForceRDMAPipeline && canRDMA && in.Caps&btl.CapPut != 0 && p != pml.RDMAPipeline,
		in.Force == pml.ForceSendPipeline && p != pml.SendPipeline && p != pml.BufferedPipeline:
		fail("the forced protocol could carry it")
	}
	if in.Force == pml.ForceNone || in.Force == pml.ForceEager {
		// Automatic: eager exactly when it fits (and is allowed).
		fits := in.Size <= pml.EagerMax(in.Limits) && in.Mode != pml.Synchronous
		if p.Eager() != fits {
			fail("automatic selection is eager exactly when the message fits")
		}
	}
}

func TestChoose(t *testing.T) {
	contigPin := hdr.FlagContig | hdr.FlagPin
	type row struct {
		name string
		in   pml.RecvInfo
		want pml.RecvChoice
	}
	base := func(msg, got int, flags uint8, caps btl.Caps, force pml.Force) pml.RecvInfo {
		return pml.RecvInfo{MsgLen: msg, Received: got, Flags: flags, Contiguous: true, Caps: caps, Limits: selLimits, Force: force}
	}
	nc := base(minRDMA+1, 512, hdr.FlagContig, cFull, 0)
	nc.Contiguous = false
	rows := []row{
		{"everything arrived", base(500, 500, contigPin, cFull, 0), pml.RecvCopy},
		{"empty message", base(0, 0, contigPin, cFull, 0), pml.RecvCopy},
		{"receive buffer not contiguous", nc, pml.RecvCopy},
		{"sender not contiguous", base(minRDMA+1, 512, 0, cFull, 0), pml.RecvCopy},
		{"sender pinned but not contiguous", base(minRDMA+1, 512, hdr.FlagPin, cFull, 0), pml.RecvCopy},
		{"no put", base(minRDMA+1, 512, contigPin, cGet, 0), pml.RecvCopy},
		{"pinned: direct put", base(2000, 0, contigPin, cFull, 0), pml.RecvDirectPut},
		{"pinned, small: direct put", base(10, 0, contigPin, cPut, 0), pml.RecvDirectPut},
		{"pinned, long: direct put", base(1<<30, 0, contigPin, cPut, 0), pml.RecvDirectPut},
		{"contig at min_rdma_pipeline_size: copy", base(minRDMA, 512, hdr.FlagContig, cFull, 0), pml.RecvCopy},
		{"contig above min_rdma_pipeline_size: pipeline", base(minRDMA+1, 512, hdr.FlagContig, cFull, 0), pml.RecvRDMAPipeline},
		{"force send_pipeline beats pin", base(2000, 0, contigPin, cFull, pml.ForceSendPipeline), pml.RecvCopy},
		{"force send_pipeline beats size", base(minRDMA+1, 512, hdr.FlagContig, cFull, pml.ForceSendPipeline), pml.RecvCopy},
		{"force rdma_pipeline, short", base(2000, 512, hdr.FlagContig, cPut, pml.ForceRDMAPipeline), pml.RecvRDMAPipeline},
		{"force rdma_pipeline, no put", base(2000, 512, hdr.FlagContig, cGet, pml.ForceRDMAPipeline), pml.RecvCopy},
		{"force rdma_get: automatic", base(2000, 512, hdr.FlagContig, cFull, pml.ForceRDMAGet), pml.RecvCopy},
		{"force rdma_put: automatic", base(minRDMA+1, 512, hdr.FlagContig, cFull, pml.ForceRDMAPut), pml.RecvRDMAPipeline},
		{"force eager: automatic", base(2000, 0, contigPin, cFull, pml.ForceEager), pml.RecvDirectPut},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			require.Equal(t, r.want, pml.Choose(r.in))
		})
	}
}

func TestParseForce(t *testing.T) {
	for s, want := range map[string]pml.Force{"": pml.ForceNone, "auto": pml.ForceNone, "none": pml.ForceNone,
		"eager": pml.ForceEager, "rdma_put": pml.ForceRDMAPut, "rdma_get": pml.ForceRDMAGet,
		"send_pipeline": pml.ForceSendPipeline, "rdma_pipeline": pml.ForceRDMAPipeline} {
		got, ok := pml.ParseForce(s)
		require.True(t, ok, s)
		require.Equal(t, want, got, s)
	}
	for _, s := range []string{"RDMA_GET", "buffered_pipeline", "eager_immediate", "x"} {
		_, ok := pml.ParseForce(s)
		require.False(t, ok, s)
	}
	ps, err := params.NewSet(append(append([][2]string(nil), baseParams...), [2]string{"pml_force_protocol", "bogus"}))
	require.NoError(t, err)
	_, err = pml.New(pml.Config{Rank: 0, Size: 1, Params: ps, Dispatch: &btl.Dispatcher{}})
	require.ErrorIs(t, err, mpierr.ErrArg)
}

func TestThresholdHelpers(t *testing.T) {
	require.Equal(t, 1024-hdr.MatchLen, pml.EagerMax(selLimits))
	require.Equal(t, 0, pml.EagerMax(btl.Limits{EagerLimit: 4}))
	require.Equal(t, 512, pml.FirstChunk(selLimits), "rndv_eager_limit binds")
	require.Equal(t, 1024-hdr.RndvLen, pml.FirstChunk(btl.Limits{EagerLimit: 1024, RndvEagerLimit: 1 << 20}), "eager_limit - RNDV header binds")
	require.Equal(t, 0, pml.FirstChunk(btl.Limits{EagerLimit: 16, RndvEagerLimit: 100}))
}

// TestForcedProtocolEndToEnd runs every pml_force_protocol value over the
// fake transport with messages around the thresholds and checks the
// protocol counters and the bytes.
func TestForcedProtocolEndToEnd(t *testing.T) {
	sizes := []int{0, 1, 112, 113, 1000, 1024, 1025, 3000}
	for _, force := range []string{"", "eager", "rdma_put", "rdma_get", "send_pipeline", "rdma_pipeline"} {
		for _, leave := range []string{"false", "true"} {
			t.Run("force="+force+"/leave_pinned="+leave, func(t *testing.T) {
				cfg := capsConfig(fake.AllCaps)
				g := newRig(t, 2, cfg, [2]string{"pml_force_protocol", force}, [2]string{"pml_leave_pinned", leave})
				f, _ := pml.ParseForce(force)
				want := map[pml.Protocol]int64{}
				for i, n := range sizes {
					for _, mode := range []pml.Mode{pml.Standard, pml.Synchronous} {
						data := pattern(n, byte(i))
						r := g.irecv(1, 0, i, n, data)
						g.isend(0, 1, i, data, mode)
						g.run()
						requireOK(t, r, n)
						want[pml.Select(pml.SendInfo{Mode: mode, Size: n, Contiguous: true, Caps: cfg.Caps, Limits: cfg.Limits, LeavePinned: leave == "true", Force: f})]++
					}
				}
				for p := pml.EagerImmediate; p <= pml.BufferedPipeline; p++ {
					require.Equal(t, want[p], g.eng[0].Stats.Sent[p].Load(), "%v messages", p)
				}
				g.checkClean()
			})
		}
	}
}
