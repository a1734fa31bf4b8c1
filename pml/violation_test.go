package pml_test

// Protocol violations: rank 2 has no engine; the test speaks for it and
// injects malformed or inconsistent fragments into rank 0's dispatcher.
// Every case must end with rank 2 treated as failed (ErrProtocol together
// with ErrProcFailed) for every request involving it, never a panic and
// never a byte written outside a buffer, while rank 1 still communicates
// with rank 0. The traces of all cases go into testdata/violations.golden.

import (
	"fmt"
	"math"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/stretchr/testify/require"
)

const victim, good, bad = 0, 1, 2

// vrig is the violation set-up on rank 0: a pending receive from the bad
// peer, one from the good peer, and a rendezvous send (RDMA direct put,
// its RNDV still queued) to the bad peer.
type vrig struct {
	*rig
	fromBad, fromGood, toBad *tracked
	goodData                 []byte
}

func newVrig(t *testing.T) *vrig {
	g := newRigRaw(t, 3, capsConfig(capsPutOnly), bad)
	v := &vrig{rig: g, goodData: pattern(40, 99)}
	v.fromBad = g.irecv(victim, bad, 1, 1000, nil)
	v.fromGood = g.irecv(victim, good, 1, 64, v.goodData)
	v.toBad = g.isend(victim, bad, 3, pattern(1000, 98), pml.Standard)
	return v
}

// inject hands a fragment from the bad peer to the victim.
func (v *vrig) inject(t hdr.Type, h, data []byte) {
	v.t.Helper()
	require.NoError(v.t, v.net.Inject(bad, victim, btl.Tag(t), h, data))
	v.poll()
}

// sendReq is the request id of the victim's rendezvous to the bad peer
// (from its queued RNDV).
func (v *vrig) sendReq() uint64 {
	i := v.find(victim, bad, hdr.TypeRndv)
	require.GreaterOrEqual(v.t, i, 0)
	h, _, err := hdr.DecodeRndv(v.net.Pending()[i].Hdr)
	require.NoError(v.t, err)
	return h.SrcReq
}

// matchRndv makes fromBad match a rendezvous of 1000 bytes announced by
// the bad peer (96 bytes inline, sender request 77) and returns the
// victim's receive request id from its ACK.
func (v *vrig) matchRndv() uint64 {
	h := hdr.Rndv{Match: hdr.Match{Ctx: 0, Src: bad, Tag: 1, Seq: 0}, MsgLen: 1000, SrcReq: 77}
	v.inject(hdr.TypeRndv, enc(&h), pattern(96, 50))
	i := v.find(victim, bad, hdr.TypeAck)
	require.GreaterOrEqual(v.t, i, 0, "the victim ACKs the rendezvous")
	a, _, err := hdr.DecodeAck(v.net.Pending()[i].Hdr)
	require.NoError(v.t, err)
	require.Equal(v.t, uint64(77), a.SrcReq)
	return a.DstReq
}

type encoder interface{ Encode([]byte) int }

func enc(h encoder) []byte {
	b := make([]byte, hdr.MaxLen)
	return b[:h.Encode(b)]
}

// finish checks the outcome of a violation: every request involving the
// bad peer failed with ErrProtocol, the good peer still gets through, no
// guard byte was touched, and later operations towards the bad peer fail.
func (v *vrig) finish(t *testing.T) {
	t.Helper()
	for _, tr := range []*tracked{v.fromBad, v.toBad} {
		require.True(t, tr.r.Done(), "%s must fail", tr.name)
		_, err := tr.r.Result()
		require.ErrorIs(t, err, mpierr.ErrProtocol, tr.name)
		require.ErrorIs(t, err, mpierr.ErrProcFailed, tr.name)
	}
	_, err := v.comm[victim].IrecvHandle(pml.Buffer{Bytes: make([]byte, 8)}, bad, 4)
	require.ErrorIs(t, err, mpierr.ErrProtocol, "receive from the failed peer")
	v.note("-- the good peer sends")
	v.isend(good, victim, 1, v.goodData, pml.Standard)
	v.run()
	requireOK(t, v.fromGood, len(v.goodData))
	v.checkData()
	require.Empty(t, v.net.Violations())
}

// noPanic runs f, turning a panic into a test failure with its stack.
func noPanic(t *testing.T, f func()) {
	t.Helper()
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("panic: %v\n%s", p, debug.Stack())
		}
	}()
	f()
}

type violation struct {
	name   string
	inject func(v *vrig)
	check  func(t *testing.T, v *vrig) // extra checks (optional)
}

func truncated(h encoder, cut int) []byte {
	b := enc(h)
	return b[:len(b)-cut]
}

var handle16 = make([]byte, 16)

var violations = []violation{
	{name: "frag_for_unknown_request", inject: func(v *vrig) {
		v.inject(hdr.TypeFrag, enc(&hdr.Frag{Offset: 0, SrcReq: 77, DstReq: 999}), pattern(10, 1))
	}},
	{name: "frag_offset_beyond_message", inject: func(v *vrig) {
		dst := v.matchRndv()
		v.inject(hdr.TypeFrag, enc(&hdr.Frag{Offset: 950, SrcReq: 77, DstReq: dst}), pattern(100, 2))
	}, check: func(t *testing.T, v *vrig) {
		b := v.fromBad.g.buf()
		require.Equal(t, pattern(96, 50), b[:96], "the RNDV's bytes are stored")
		for i := 96; i < len(b); i++ {
			require.Equal(t, byte(0xee), b[i], "byte %d written by a rejected FRAG", i)
		}
	}},
	{name: "frag_offset_overflow", inject: func(v *vrig) {
		dst := v.matchRndv()
		v.inject(hdr.TypeFrag, enc(&hdr.Frag{Offset: math.MaxUint64 - 5, SrcReq: 77, DstReq: dst}), pattern(10, 3))
	}},
	{name: "frag_wrong_source_request", inject: func(v *vrig) {
		dst := v.matchRndv()
		v.inject(hdr.TypeFrag, enc(&hdr.Frag{Offset: 96, SrcReq: 78, DstReq: dst}), pattern(10, 3))
	}},
	{name: "put_offset_beyond_message", inject: func(v *vrig) {
		v.inject(hdr.TypePut, enc(&hdr.Put{SrcReq: v.sendReq(), DstReq: 5, Offset: 900, Size: 200, Handle: handle16}), nil)
	}},
	{name: "put_size_overflow", inject: func(v *vrig) {
		v.inject(hdr.TypePut, enc(&hdr.Put{SrcReq: v.sendReq(), DstReq: 5, Offset: 10, Size: math.MaxUint64 - 5, Handle: handle16}), nil)
	}},
	{name: "put_for_unknown_request", inject: func(v *vrig) {
		v.inject(hdr.TypePut, enc(&hdr.Put{SrcReq: 4242, DstReq: 5, Offset: 0, Size: 10, Handle: handle16}), nil)
	}},
	{name: "ack_offset_beyond_message", inject: func(v *vrig) {
		v.inject(hdr.TypeAck, enc(&hdr.Ack{SrcReq: v.sendReq(), DstReq: 5, SendOffset: 2000}), nil)
	}},
	{name: "ack_range_beyond_message", inject: func(v *vrig) {
		v.inject(hdr.TypeAck, enc(&hdr.Ack{SrcReq: v.sendReq(), DstReq: 5, SendOffset: 500, SendSize: 600}), nil)
	}},
	{name: "ack_size_overflow", inject: func(v *vrig) {
		v.inject(hdr.TypeAck, enc(&hdr.Ack{SrcReq: v.sendReq(), DstReq: 5, SendOffset: 1, SendSize: math.MaxUint64}), nil)
	}},
	{name: "ack_for_a_receive", inject: func(v *vrig) {
		dst := v.matchRndv()
		v.inject(hdr.TypeAck, enc(&hdr.Ack{SrcReq: dst, DstReq: 5}), nil)
	}},
	{name: "fin_for_unknown_request", inject: func(v *vrig) {
		v.inject(hdr.TypeFin, enc(&hdr.Fin{Req: 999, Offset: 0, Size: 10}), nil)
	}},
	{name: "truncated_match", inject: func(v *vrig) {
		v.inject(hdr.TypeMatch, truncated(&hdr.Match{Src: bad, Tag: 1}, 1), nil)
	}},
	{name: "match_type_byte_only", inject: func(v *vrig) {
		v.inject(hdr.TypeMatch, []byte{byte(hdr.TypeMatch)}, nil)
	}},
	{name: "truncated_rndv", inject: func(v *vrig) {
		v.inject(hdr.TypeRndv, truncated(&hdr.Rndv{Match: hdr.Match{Src: bad, Tag: 1}, MsgLen: 10}, 1), nil)
	}},
	{name: "truncated_rget_handle", inject: func(v *vrig) {
		v.inject(hdr.TypeRget, truncated(&hdr.Rget{Match: hdr.Match{Src: bad, Tag: 1}, MsgLen: 10, Handle: handle16}, 1), nil)
	}},
	{name: "truncated_ack", inject: func(v *vrig) {
		v.inject(hdr.TypeAck, truncated(&hdr.Ack{SrcReq: 1}, 1), nil)
	}},
	{name: "truncated_frag", inject: func(v *vrig) {
		v.inject(hdr.TypeFrag, truncated(&hdr.Frag{DstReq: 1}, 1), nil)
	}},
	{name: "truncated_put_handle", inject: func(v *vrig) {
		v.inject(hdr.TypePut, truncated(&hdr.Put{SrcReq: 1, Handle: handle16}, 1), nil)
	}},
	{name: "empty_fin", inject: func(v *vrig) {
		v.inject(hdr.TypeFin, nil, nil)
	}},
	{name: "source_outside_communicator", inject: func(v *vrig) {
		v.inject(hdr.TypeMatch, enc(&hdr.Match{Ctx: 0, Src: 7, Tag: 1}), pattern(10, 4))
	}},
	{name: "negative_source", inject: func(v *vrig) {
		v.inject(hdr.TypeMatch, enc(&hdr.Match{Ctx: 0, Src: -3, Tag: 1}), pattern(10, 4))
	}},
	{name: "source_of_another_rank", inject: func(v *vrig) {
		// Rank 2 claims to be communicator rank 1: must not match the
		// receive from rank 1.
		v.inject(hdr.TypeMatch, enc(&hdr.Match{Ctx: 0, Src: good, Tag: 1}), pattern(40, 5))
	}},
	{name: "rndv_data_beyond_length", inject: func(v *vrig) {
		v.inject(hdr.TypeRndv, enc(&hdr.Rndv{Match: hdr.Match{Src: bad, Tag: 1}, MsgLen: 10, SrcReq: 1}), pattern(20, 6))
	}},
	{name: "rget_with_data", inject: func(v *vrig) {
		v.inject(hdr.TypeRget, enc(&hdr.Rget{Match: hdr.Match{Src: bad, Tag: 1}, MsgLen: 10, SrcReq: 1, Handle: handle16}), pattern(5, 7))
	}},
	{name: "unknown_tag", inject: func(v *vrig) {
		v.inject(hdr.Type(0x45), make([]byte, 16), nil)
	}},
}

func TestScenarioViolations(t *testing.T) {
	var all strings.Builder
	all.WriteString("# Protocol violations from rank 2 (a raw endpoint) to rank 0. Rank 0 has\n")
	all.WriteString("# a receive from 2 (tag 1), a receive from 1 (tag 1) and a 1000-byte RDMA\n")
	all.WriteString("# direct put to 2 in flight. Each case: the violation fails rank 2 with\n")
	all.WriteString("# ErrProtocol; then rank 1's message still arrives.\n")
	all.WriteString("# " + describe(capsConfig(capsPutOnly)) + "\n")
	ran := 0
	for _, vc := range violations {
		t.Run(vc.name, func(t *testing.T) {
			ran++
			v := newVrig(t)
			noPanic(t, func() { vc.inject(v) })
			if vc.check != nil {
				vc.check(t, v)
			}
			noPanic(t, func() { v.finish(t) })
			fmt.Fprintf(&all, "\n== %s\n", vc.name)
			for _, l := range v.net.Trace() {
				all.WriteString(l + "\n")
			}
		})
	}
	if ran == len(violations) && !t.Failed() { // not when -run selected some cases
		compareGolden(t, "violations", all.String())
	}
}
