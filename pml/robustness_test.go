package pml_test

// Robustness tests that pinned engine bugs (see the doc comment of each).
// They use the same rigs as the scenarios and violations.

import (
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/stretchr/testify/require"
)

func requireProtocolFailure(t *testing.T, tr *tracked) {
	t.Helper()
	require.True(t, tr.r.Done(), "%s must fail with ErrProtocol", tr.name)
	_, err := tr.r.Result()
	require.ErrorIs(t, err, mpierr.ErrProtocol, tr.name)
	require.ErrorIs(t, err, mpierr.ErrProcFailed, tr.name)
}

// An empty header on a matching tag (MATCH, RNDV, RGET) must be a protocol
// error. onMatching read b[0] before any length check: index out of range.
func TestViolationEmptyMatchingHeader(t *testing.T) {
	for _, typ := range []hdr.Type{hdr.TypeMatch, hdr.TypeRndv, hdr.TypeRget} {
		t.Run(typ.String(), func(t *testing.T) {
			v := newVrig(t)
			noPanic(t, func() { v.inject(typ, nil, nil) })
			v.finish(t)
		})
	}
}

// A fragment on a matching tag whose header is of another type (an ACK,
// or garbage) must be a protocol error. onMatching switched on the header's
// type byte with no default case, so such a fragment became a zero-valued
// MATCH (context 0, source 0, tag 0, seq 0) and, coming from world rank 0,
// was received as an empty message.
func TestViolationForeignHeaderOnMatchingTag(t *testing.T) {
	for name, h := range map[string][]byte{
		"ack_header": enc(&hdr.Ack{SrcReq: 1, DstReq: 2}),
		"zero_bytes": make([]byte, hdr.MatchLen),
	} {
		t.Run(name, func(t *testing.T) {
			g := newRigRaw(t, 2, capsConfig(capsAll), 0) // rank 0 is the raw peer
			r := g.irecv(1, 0, pml.AnyTag, 64, nil)
			noPanic(t, func() {
				require.NoError(t, g.net.Inject(0, 1, btl.Tag(hdr.TypeMatch), h, nil))
			})
			g.poll()
			requireProtocolFailure(t, r)
		})
	}
}

// A fragment that arrives for a communicator not created yet is parked
// and replayed by NewComm, which did not validate its source: a source
// outside the group panicked (index out of range in c.seqs), and a source
// naming another rank was matched as if that rank had sent it.
func TestViolationParkedFragmentSource(t *testing.T) {
	group := []int{0, 1, 2}
	t.Run("outside_group", func(t *testing.T) {
		v := newVrig(t)
		v.inject(hdr.TypeMatch, enc(&hdr.Match{Ctx: 7, Src: 9, Tag: 1}), pattern(10, 1))
		var c *pml.Comm
		noPanic(t, func() {
			var err error
			c, err = v.eng[victim].NewComm(7, victim, group)
			require.NoError(t, err)
		})
		v.poll()
		_, err := c.IrecvHandle(pml.Buffer{Bytes: make([]byte, 8)}, bad, 1)
		require.ErrorIs(t, err, mpierr.ErrProtocol, "rank 2 broke the protocol")
		v.finish(t)
	})
	t.Run("spoofed_source", func(t *testing.T) {
		v := newVrig(t)
		v.inject(hdr.TypeMatch, enc(&hdr.Match{Ctx: 8, Src: good, Tag: 1}), pattern(10, 2))
		var c *pml.Comm
		noPanic(t, func() {
			var err error
			c, err = v.eng[victim].NewComm(8, victim, group)
			require.NoError(t, err)
		})
		r, err := c.IrecvHandle(pml.Buffer{Bytes: make([]byte, 64)}, good, 1)
		require.NoError(t, err)
		require.False(t, r.Done(), "rank 2's fragment claiming to come from rank 1 was received")
		v.poll()
		requireProtocolFailure(t, v.fromBad)
	})
}

// RDMA direct get whose GET fails, over a synchronous transport (inline:
// like btl/self, or any transport whose reply can be handled before the
// completion callback returns): the receive never completed. getAll's
// failure path sends the ACK while the GET is still counted in flight, the
// FRAGs arrive and find inflight == 1, and the later inflight-- did not
// re-check completion.
func TestGetFailureOnSynchronousTransport(t *testing.T) {
	g := newRig(t, 2, capsConfig(capsAll))
	g.net.SetInline(true)
	g.net.FailNextGet()
	data := pattern(1000, 3)
	r := g.irecv(1, 0, 5, 1000, data)
	s := g.isend(0, 1, 5, data, pml.Standard)
	requireOK(t, s, 1000)
	requireOK(t, r, 1000)
	g.checkClean()
}

// A peer failure (or Close) must give back what the failed requests hold:
// registrations and the attached-buffer space of a buffered send.
// PeerFailed and Abort only completed the requests at MPI level, so a
// Bsend's release never ran (BufferDetach would wait forever) and RDMA
// registrations stayed pinned.
func TestPeerFailureReleasesResources(t *testing.T) {
	t.Run("bsend_release", func(t *testing.T) {
		g := newRig(t, 2, capsConfig(capsSendOnly))
		s := g.isend(0, 1, 5, pattern(1000, 4), pml.Buffered)
		g.step() // the RNDV is delivered: waiting for the ACK
		g.net.Cut(0, 1)
		g.run()
		require.Equal(t, 1, *s.rel, "release of the attached-buffer space")
	})
	t.Run("rget_registration_matched", func(t *testing.T) {
		g := newRig(t, 2, capsConfig(capsAll))
		g.irecv(1, 0, 5, 1000, nil)
		g.isend(0, 1, 5, pattern(1000, 5), pml.Standard)
		g.step() // RGET: the receiver's GET is pending
		g.net.Cut(0, 1)
		g.run()
		require.Equal(t, 0, g.net.LiveRegistrations())
	})
	t.Run("rget_registration_unexpected", func(t *testing.T) {
		g := newRig(t, 2, capsConfig(capsAll))
		g.isend(0, 1, 5, pattern(1000, 6), pml.Standard)
		g.run()
		g.net.Cut(0, 1)
		g.run()
		require.Equal(t, 0, g.net.LiveRegistrations())
	})
	t.Run("rdma_pipeline_registrations", func(t *testing.T) {
		g := newRig(t, 2, capsConfig(capsPutOnly))
		g.irecv(1, 0, 5, 3000, nil)
		g.isend(0, 1, 5, pattern(3000, 7), pml.Standard)
		g.step() // RNDV: the receiver registered 4 PUT ranges
		g.net.Cut(0, 1)
		g.run()
		require.Equal(t, 0, g.net.LiveRegistrations())
	})
	t.Run("close", func(t *testing.T) {
		g := newRig(t, 2, capsConfig(capsAll))
		g.irecv(1, 0, 5, 1000, nil)
		s := g.isend(0, 1, 5, pattern(1000, 8), pml.Standard)
		b := g.isend(0, 1, 6, pattern(1000, 9), pml.Buffered)
		g.step()
		g.eng[0].Close(nil)
		g.eng[1].Close(nil)
		g.run()
		requireErr(t, s, mpierr.ErrNotInit)
		require.Equal(t, 1, *b.rel, "release of the attached-buffer space")
		require.Equal(t, 0, g.net.LiveRegistrations())
	})
}

// A FIN must answer an RDMA operation: for a receive, a PUT it asked for
// (a registration at that offset); for a send, an RGET. A FIN at an
// offset with no PUT drove the receive's in-flight count negative, so the
// receive never completed (nor failed); a FIN for a send that is not an
// RGET counted bytes as delivered and completed the send without the
// receiver ever getting them.
func TestViolationFinWithoutRDMA(t *testing.T) {
	t.Run("receive", func(t *testing.T) {
		v := newVrig(t)
		h := hdr.Rndv{Match: hdr.Match{Src: bad, Tag: 1, Flags: hdr.FlagContig | hdr.FlagPin}, MsgLen: 1000, SrcReq: 77}
		v.inject(hdr.TypeRndv, enc(&h), nil)
		i := v.find(victim, bad, hdr.TypePut)
		require.GreaterOrEqual(t, i, 0, "the victim asks for a PUT")
		p, _, err := hdr.DecodePut(v.net.Pending()[i].Hdr)
		require.NoError(t, err)
		v.inject(hdr.TypeFin, enc(&hdr.Fin{Req: p.DstReq, Offset: 5, Size: 10}), nil)
		v.finish(t)
	})
	t.Run("send", func(t *testing.T) {
		v := newVrig(t)
		v.inject(hdr.TypeFin, enc(&hdr.Fin{Req: v.sendReq(), Offset: 0, Size: 1000}), nil)
		v.finish(t)
	})
}

// Isend in buffered mode documents that the request "completes at once"
// (its data is the packed copy in the attached buffer; mpi.Ibsend promises
// an already complete request). For an eager message it completed only
// when the transport completed the send.
func TestBufferedEagerCompletesAtOnce(t *testing.T) {
	for name, caps := range map[string]btl.Caps{"prepared_caps": capsNoImm, "allocated_caps": capsCopyOnly} {
		t.Run(name, func(t *testing.T) {
			g := newRig(t, 2, capsConfig(caps))
			data := pattern(40, 10)
			r := g.irecv(1, 0, 5, 64, data)
			s := g.isend(0, 1, 5, data, pml.Buffered)
			require.True(t, s.r.Done(), "a buffered send completes at once")
			g.run()
			requireOK(t, r, 40)
			require.Equal(t, 1, *s.rel)
			g.checkClean()
		})
	}
}
