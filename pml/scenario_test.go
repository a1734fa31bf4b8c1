package pml_test

// Protocol scenarios with golden traces. Each scenario drives two or three
// engines over the fake transport one delivery at a time; the trace shows
// every fragment and RDMA operation as it is delivered (#n is the order it
// was started), every registration, and "=>" lines for request
// completions. Regenerate with: go test ./pml -run Scenario -update

import (
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/fake"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
	"github.com/stretchr/testify/require"
)

const (
	capsAll      = fake.AllCaps
	capsNoImm    = btl.CapSend | btl.CapSendInPlace | btl.CapPut | btl.CapGet
	capsCopyOnly = btl.CapSend
	capsSendOnly = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace
	capsPutOnly  = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut
)

type scenario struct {
	name  string
	doc   string
	ranks int
	caps  btl.Caps
	opts  [][2]string
	sync  bool // endpoints are btl.SyncGetters (fake.Config.SyncGet)
	run   func(t *testing.T, g *rig)
}

func TestScenario(t *testing.T) {
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			ranks := sc.ranks
			if ranks == 0 {
				ranks = 2
			}
			cfg := capsConfig(sc.caps)
			cfg.SyncGet = sc.sync
			g := newRig(t, ranks, cfg, sc.opts...)
			sc.run(t, g)
			header := sc.doc + "\n" + describe(cfg)
			for _, o := range sc.opts {
				header += "\n" + o[0] + "=" + o[1]
			}
			g.golden("scenario_"+sc.name, header)
		})
	}
}

// sendRecv posts a receive on rank 1, sends n bytes from rank 0 and
// delivers everything.
func sendRecv(g *rig, tag, n, capacity int, mode pml.Mode) (s, r *tracked) {
	data := pattern(n, byte(tag))
	r = g.irecv(1, 0, tag, capacity, data)
	s = g.isend(0, 1, tag, data, mode)
	g.run()
	return s, r
}

func requireErr(t *testing.T, tr *tracked, class error) {
	t.Helper()
	require.True(t, tr.r.Done(), "%s not done", tr.name)
	_, err := tr.r.Result()
	require.ErrorIs(t, err, class, tr.name)
}

func requireOK(t *testing.T, tr *tracked, count int) {
	t.Helper()
	require.True(t, tr.r.Done(), "%s not done", tr.name)
	st, err := tr.r.Result()
	require.NoError(t, err, tr.name)
	require.Equal(t, count, st.Count, tr.name)
}

var scenarios = []scenario{
	{
		name: "eager_immediate",
		doc: `Eager send (immediate): 40 bytes go as one MATCH through SendImmediate;
the send completes during Isend, before delivery. Then SendImmediate
refuses once: the same message falls back to a prepared (in-place) send,
which completes when delivered.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			data := pattern(40, 1)
			r := g.irecv(1, 0, 5, 64, data)
			s := g.isend(0, 1, 5, data, pml.Standard)
			require.True(t, s.r.Done(), "immediate send completes at once")
			g.run()
			requireOK(t, r, 40)

			g.note("-- SendImmediate refuses once")
			g.net.RefuseImmediate(1)
			s2, r2 := sendRecv(g, 6, 40, 64, pml.Standard)
			requireOK(t, s2, 40)
			requireOK(t, r2, 40)
			g.checkClean()
		},
	},
	{
		name: "eager_prepared",
		doc: `Eager send (prepared): no SendImmediate; 40 bytes go in place from the
user buffer with Send; the send completes when the fragment is delivered.`,
		caps: capsNoImm,
		run: func(t *testing.T, g *rig) {
			data := pattern(40, 2)
			r := g.irecv(1, 0, 5, 64, data)
			s := g.isend(0, 1, 5, data, pml.Standard)
			require.False(t, s.r.Done(), "prepared send completes on delivery")
			g.run()
			requireOK(t, s, 40)
			requireOK(t, r, 40)
			g.checkClean()
		},
	},
	{
		name: "eager_allocated",
		doc: `Eager send (allocated): a transport without send-in-place; the MATCH and
40 bytes are packed into an Alloc buffer (SendAlloc). Then Alloc refuses
once: the engine packs into memory of its own and uses Send. Then an empty
message.`,
		caps: capsCopyOnly,
		run: func(t *testing.T, g *rig) {
			_, r := sendRecv(g, 5, 40, 64, pml.Standard)
			requireOK(t, r, 40)
			g.note("-- Alloc refuses once")
			g.net.RefuseAlloc(1)
			_, r = sendRecv(g, 6, 40, 64, pml.Standard)
			requireOK(t, r, 40)
			g.note("-- empty message")
			_, r = sendRecv(g, 7, 0, 0, pml.Standard)
			requireOK(t, r, 0)
			g.checkClean()
		},
	},
	{
		name: "rdma_get",
		doc: `RDMA direct get: 1000 bytes (above the eager limit, below
min_rdma_pipeline_size) with put+get: the sender registers its buffer and
sends RGET; the receiver GETs everything and sends FIN; the FIN completes
the send and releases the registration.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			s, r := sendRecv(g, 5, 1000, 1000, pml.Standard)
			requireOK(t, s, 1000)
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "rdma_put",
		doc: `RDMA direct put: 1000 bytes over a transport with put but no get: RNDV
(contig|pin, no data); the receiver registers its buffer and sends one PUT
(flag ack, standing for the ACK); the sender writes everything and sends
FIN.`,
		caps: capsPutOnly,
		run: func(t *testing.T, g *rig) {
			s, r := sendRecv(g, 5, 1000, 1000, pml.Standard)
			requireOK(t, s, 1000)
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "send_pipeline",
		doc: `Send/receive pipeline: 1000 bytes without RDMA: RNDV with the first 96
bytes, ACK(nordma) from offset 96, then FRAGs of 256 bytes, at most 3 in
flight (pml_send_pipeline_depth): the 4th FRAG leaves only when the first
one completes.`,
		caps: capsSendOnly,
		run: func(t *testing.T, g *rig) {
			data := pattern(1000, 3)
			r := g.irecv(1, 0, 5, 1000, data)
			s := g.isend(0, 1, 5, data, pml.Standard)
			g.step() // RNDV
			g.step() // ACK: 3 FRAGs go out
			require.Equal(t, 3, g.net.Len(), "send_pipeline_depth FRAGs in flight")
			g.run()
			requireOK(t, s, 1000)
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "rdma_pipeline",
		doc: `RDMA pipeline: 3000 bytes (above min_rdma_pipeline_size) with put: RNDV
with 96 bytes (contig); the receiver ACKs the tail [2744,3000) for FRAGs and
PUT-pipelines [96,2744) in registrations of at most 512 bytes, at most 4 in
flight (pml_recv_pipeline_depth); each FIN releases one registration and
lets the next PUT go.`,
		caps: capsPutOnly,
		run: func(t *testing.T, g *rig) {
			s, r := sendRecv(g, 5, 3000, 3000, pml.Standard)
			requireOK(t, s, 3000)
			requireOK(t, r, 3000)
			g.checkClean()
		},
	},
	{
		name: "buffered_pipeline",
		doc: `Buffered pipeline: a 1000-byte Bsend (the buffer is the packed copy in
the attached buffer): the request completes during Isend, the protocol
runs as a send pipeline, and release is called once the last FRAG is
delivered.`,
		caps: capsSendOnly,
		run: func(t *testing.T, g *rig) {
			data := pattern(1000, 4)
			r := g.irecv(1, 0, 5, 1000, data)
			s := g.isend(0, 1, 5, data, pml.Buffered)
			require.True(t, s.r.Done(), "buffered send completes at once")
			require.Equal(t, 0, *s.rel)
			g.run()
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "synchronous",
		doc: `Synchronous send of 40 bytes: a RNDV carrying all the data. It arrives
before the receive is posted (unexpected): the send stays incomplete until
the receive is posted and its ACK arrives. The ACK carries no receive id:
the whole message came with the RNDV, nothing more will.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			data := pattern(40, 5)
			s := g.isend(0, 1, 5, data, pml.Synchronous)
			g.run()
			require.False(t, s.r.Done(), "ssend completes only after the match")
			g.note("-- receive posted")
			r := g.irecv(1, 0, 5, 64, data)
			requireOK(t, r, 40)
			require.False(t, s.r.Done(), "ssend waits for the ACK")
			g.run()
			requireOK(t, s, 40)
			g.checkClean()
		},
	},
	{
		name: "unexpected",
		doc: `Unexpected messages: an eager message and a rendezvous (RGET) arrive
before any receive. Posting the rendezvous receive starts the GET; posting
the eager receive completes at once from the stored copy.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			small, big := pattern(40, 6), pattern(1000, 7)
			s1 := g.isend(0, 1, 1, small, pml.Standard)
			s2 := g.isend(0, 1, 2, big, pml.Standard)
			g.run()
			g.note("-- receives posted")
			r2 := g.irecv(1, 0, 2, 1000, big)
			r1 := g.irecv(1, 0, 1, 64, small)
			requireOK(t, r1, 40)
			g.run()
			requireOK(t, r2, 1000)
			requireOK(t, s1, 40)
			requireOK(t, s2, 1000)
			g.checkClean()
		},
	},
	{
		name: "probe",
		doc: `Probe and matched probe: Iprobe sees nothing, then an eager (tag 3) and
a rendezvous (tag 4) message arrive. Iprobe reports the first; Improbe
takes the rendezvous out of matching (Iprobe no longer sees it); Mrecv
receives it (the GET starts then); Improbe/Mrecv the eager one.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			c := g.comm[1]
			_, ok, err := c.Iprobe(pml.AnySource, pml.AnyTag)
			require.NoError(t, err)
			require.False(t, ok)
			g.note("iprobe(any,any): none")
			small, big := pattern(40, 8), pattern(1000, 9)
			g.isend(0, 1, 3, small, pml.Standard)
			g.isend(0, 1, 4, big, pml.Standard)
			g.run()

			st, ok, err := c.Iprobe(pml.AnySource, pml.AnyTag)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, pml.Status{Source: 0, Tag: 3, Count: 40}, st)
			g.note("iprobe(any,any): src=%d tag=%d count=%d", st.Source, st.Tag, st.Count)

			m, st, ok, err := c.Improbe(0, 4)
			require.NoError(t, err)
			require.True(t, ok)
			require.Equal(t, pml.Status{Source: 0, Tag: 4, Count: 1000}, st)
			g.note("improbe(0,4): src=%d tag=%d count=%d", st.Source, st.Tag, st.Count)
			_, ok, _ = c.Iprobe(0, 4)
			require.False(t, ok, "a matched probe removes the message")
			g.note("iprobe(0,4): none")

			gb := newGuarded(1000)
			mr, err := c.Mrecv(&m, pml.Buffer{Bytes: gb.buf()})
			require.NoError(t, err)
			rb := g.track("rank1 mrecv(tag 4)", mr, gb, big)
			_, err = c.Mrecv(&m, pml.Buffer{Bytes: gb.buf()})
			require.Error(t, err, "a message is received once")
			g.run()
			requireOK(t, rb, 1000)

			m2, st, ok, err := c.Improbe(pml.AnySource, pml.AnyTag)
			require.NoError(t, err)
			require.True(t, ok)
			g.note("improbe(any,any): src=%d tag=%d count=%d", st.Source, st.Tag, st.Count)
			gs := newGuarded(64)
			mr2, err := c.Mrecv(&m2, pml.Buffer{Bytes: gs.buf()})
			require.NoError(t, err)
			rs := g.track("rank1 mrecv(tag 3)", mr2, gs, small)
			requireOK(t, rs, 40)
			_, ok, _ = c.Iprobe(pml.AnySource, pml.AnyTag)
			require.False(t, ok)
			g.checkClean()
		},
	},
	{
		name: "cancel",
		doc: `Cancel: a receive cancelled before any match completes as cancelled. A
receive whose rendezvous already matched cannot be cancelled: it completes
normally. Sends are never cancelled.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			c := g.comm[1]
			a := g.irecv(1, 0, 1, 64, nil)
			ok := cancel(c, a.r)
			g.note("cancel %s: %v", a.name, ok)
			g.poll()
			require.True(t, ok)
			st, err := a.r.Result()
			require.NoError(t, err)
			require.True(t, st.Cancelled)
			require.False(t, cancel(c, a.r), "cancel twice")

			big := pattern(1000, 10)
			b := g.irecv(1, 0, 2, 1000, big)
			s := g.isend(0, 1, 2, big, pml.Standard)
			g.step() // RGET matches b
			ok = cancel(c, b.r)
			g.note("cancel %s after its match: %v", b.name, ok)
			require.False(t, ok)
			require.False(t, cancel(g.comm[0], s.r), "sends are not cancelled")
			g.run()
			requireOK(t, b, 1000)
			st, _ = b.r.Result()
			require.False(t, st.Cancelled)

			g.note("-- a message for the cancelled receive's tag stays unexpected")
			g.isend(0, 1, 1, pattern(8, 11), pml.Standard)
			g.run()
			_, ok, _ = c.Iprobe(0, 1)
			require.True(t, ok)
			r := g.irecv(1, 0, 1, 64, pattern(8, 11))
			requireOK(t, r, 8)
			g.checkClean()
		},
	},
	{
		name: "out_of_order",
		doc: `Non-overtaking under reordering: three MATCHes (tags 1, 2, 3; seq 0, 1,
2) to three AnyTag receives, delivered seq 2, 0, 1 by a transport that
reorders one link. Seq 2 waits in the out-of-order list; seq 0 matches the
first receive; seq 1 unblocks itself and seq 2: receives get tags 1, 2, 3.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			g.net.SetUnordered(true)
			var rs []*tracked
			for i := range 3 {
				rs = append(rs, g.irecv(1, 0, pml.AnyTag, 64, pattern(10, byte(20+i))))
			}
			for i := range 3 {
				g.isend(0, 1, i+1, pattern(10, byte(20+i)), pml.Standard)
			}
			g.deliver(2)
			for _, r := range rs {
				require.False(t, r.r.Done(), "seq 2 must wait for seq 0 and 1")
			}
			g.deliver(0)
			require.True(t, rs[0].r.Done())
			require.False(t, rs[1].r.Done())
			g.deliver(0)
			for i, r := range rs {
				st, err := r.r.Result()
				require.NoError(t, err)
				require.Equal(t, i+1, st.Tag)
			}
			g.checkClean()
		},
	},
	{
		name: "put_failure",
		doc: `RDMA direct put whose PUT fails: the sender sends FIN(size -1) so the
receiver drops that registration, then sends the range by FRAGs.`,
		caps: capsPutOnly,
		run: func(t *testing.T, g *rig) {
			g.net.FailNextPut()
			s, r := sendRecv(g, 5, 1000, 1000, pml.Standard)
			requireOK(t, s, 1000)
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "put_failure_pipeline",
		doc: `RDMA pipeline (3000 bytes) whose first PUT fails: that 512-byte range
comes by FRAGs, the other PUTs and the FRAG tail are unaffected.`,
		caps: capsPutOnly,
		run: func(t *testing.T, g *rig) {
			g.net.FailNextPut()
			s, r := sendRecv(g, 5, 3000, 3000, pml.Standard)
			requireOK(t, s, 3000)
			requireOK(t, r, 3000)
			g.checkClean()
		},
	},
	{
		name: "get_failure",
		doc: `RDMA direct get whose GET fails: the receiver sends FIN(size -1) and an
ACK(nordma) for the whole range; the sender sends it by FRAGs.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			g.net.FailNextGet()
			s, r := sendRecv(g, 5, 1000, 1000, pml.Standard)
			requireOK(t, s, 1000)
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "truncate_eager",
		doc: `Truncated eager receive: 40 bytes into a 20-byte buffer: the prefix is
stored, the receive fails with ErrTruncate and count 20, and nothing past
the buffer is written. The next message on the pair is unaffected.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			s, r := sendRecv(g, 5, 40, 20, pml.Standard)
			requireOK(t, s, 40)
			requireErr(t, r, mpierr.ErrTruncate)
			st, _ := r.r.Result()
			require.Equal(t, 20, st.Count)
			_, r2 := sendRecv(g, 6, 30, 64, pml.Standard)
			requireOK(t, r2, 30)
			g.checkClean()
		},
	},
	{
		name: "truncate_rndv",
		doc: `Truncated rendezvous: a 1000-byte RGET into a 600-byte buffer. The
receiver declines the GET (its buffer cannot take the message) and ACKs
everything by copy; FRAGs fill the prefix, the rest is discarded;
ErrTruncate with count 600. Then a 3000-byte RDMA-pipeline message into
1000 bytes (copy fallback), then a full-size message: unaffected.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			s, r := sendRecv(g, 5, 1000, 600, pml.Standard)
			requireOK(t, s, 1000)
			requireErr(t, r, mpierr.ErrTruncate)
			st, _ := r.r.Result()
			require.Equal(t, 600, st.Count)
			g.note("-- rdma pipeline into a short buffer")
			s, r = sendRecv(g, 6, 3000, 1000, pml.Standard)
			requireOK(t, s, 3000)
			requireErr(t, r, mpierr.ErrTruncate)
			g.note("-- full size")
			_, r = sendRecv(g, 7, 1000, 1000, pml.Standard)
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "peer_cut",
		doc: `Peer link cut mid-rendezvous: rank 0 sends 1000 bytes to rank 1 by the
send pipeline; after the RNDV, the ACK and one FRAG the link 0-1 dies.
Both engines hear PeerFailed: the send, the matched receive and other
posted receives involving the peer fail with ErrProcFailed; new
operations towards the peer fail at once; rank 2 is unaffected.`,
		ranks: 3,
		caps:  capsSendOnly,
		run: func(t *testing.T, g *rig) {
			data := pattern(1000, 12)
			r := g.irecv(1, 0, 5, 1000, data)
			other := g.irecv(1, 0, 9, 64, nil)
			back := g.irecv(0, 1, 3, 64, nil)
			any := g.irecv(1, pml.AnySource, 4, 64, nil)
			s := g.isend(0, 1, 5, data, pml.Standard)
			g.step() // RNDV
			g.step() // ACK
			g.step() // FRAG 1
			g.note("-- cut 0-1")
			g.net.Cut(0, 1)
			g.poll()
			for _, tr := range []*tracked{r, other, back, s, any} {
				requireErr(t, tr, mpierr.ErrProcFailed)
			}
			_, err := g.comm[0].IsendHandle(pml.Buffer{Bytes: data}, 1, 6, pml.Standard, nil)
			require.ErrorIs(t, err, mpierr.ErrProcFailed)
			g.note("isend 0->1 after the cut: %s", errString(err))
			_, err = g.comm[1].IrecvHandle(pml.Buffer{Bytes: make([]byte, 8)}, 0, 6)
			require.ErrorIs(t, err, mpierr.ErrProcFailed)
			g.note("irecv 1<-0 after the cut: %s", errString(err))
			g.run()

			g.note("-- rank 2 still talks to rank 1")
			d2 := pattern(500, 13)
			r2 := g.irecv(1, 2, 7, 500, d2)
			s2 := g.isend(2, 1, 7, d2, pml.Standard)
			g.run()
			requireOK(t, r2, 500)
			requireOK(t, s2, 500)
			g.checkData()
			require.Empty(t, g.net.Violations())
		},
	},
	{
		name: "forced_protocols",
		doc: `pml_force_protocol=send_pipeline over a transport with RDMA: even a
40-byte message goes by RNDV+ACK, and a 3000-byte one by FRAGs only (the
receiver declines RDMA too).`,
		caps: capsAll,
		opts: [][2]string{{"pml_force_protocol", "send_pipeline"}},
		run: func(t *testing.T, g *rig) {
			_, r := sendRecv(g, 5, 40, 64, pml.Standard)
			requireOK(t, r, 40)
			_, r = sendRecv(g, 6, 3000, 3000, pml.Standard)
			requireOK(t, r, 3000)
			g.checkClean()
		},
	},
	{
		name: "inline_blocking",
		doc: `A synchronous (inline) transport like btl/self and the blocking calls:
Send of 40 bytes is immediate and allocation-free, Recv takes it from the
unexpected queue; a 1000-byte Send to a posted Irecv runs the whole RDMA
get inside the call.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			g.net.SetInline(true)
			small := pattern(40, 14)
			require.NoError(t, g.comm[0].Send(pml.Buffer{Bytes: small}, 1, 5, pml.Standard))
			g.note("blocking send 0->1 tag 5 returned")
			gb := newGuarded(64)
			st, err := g.comm[1].Recv(pml.Buffer{Bytes: gb.buf()}, 0, 5)
			require.NoError(t, err)
			require.Equal(t, small, gb.buf()[:40])
			g.note("blocking recv: src=%d tag=%d count=%d", st.Source, st.Tag, st.Count)

			big := pattern(1000, 15)
			r := g.irecv(1, 0, 6, 1000, big)
			require.NoError(t, g.comm[0].Send(pml.Buffer{Bytes: big}, 1, 6, pml.Standard))
			g.note("blocking send 0->1 tag 6 returned")
			g.poll()
			requireOK(t, r, 1000)
			g.checkClean()
		},
	},
	{
		name: "sync_get",
		doc: `A transport whose Get finishes before it returns (btl.SyncGetter, as sm
and self): the receiver's GETs need no completion. The first RDMA get
fails: FIN(size -1) and ACK(nordma), the sender copies by FRAGs; the
second succeeds. Both messages arrive whole.`,
		caps: capsAll,
		sync: true,
		run: func(t *testing.T, g *rig) {
			g.net.SetInline(true)
			for i, fail := range []bool{true, false} {
				if fail {
					g.net.FailNextGet()
				}
				data := pattern(1000, byte(20+i))
				r := g.irecv(1, 0, 20+i, 1000, data)
				require.NoError(t, g.comm[0].Send(pml.Buffer{Bytes: data}, 1, 20+i, pml.Standard))
				g.note("blocking send 0->1 tag %d returned", 20+i)
				g.poll()
				requireOK(t, r, 1000)
			}
			g.checkClean()
		},
	},
}

// strided is a test convertor: a packed stream of n bytes stored at every
// stride-th byte of mem (the bytes between belong to someone else).
type strided struct {
	mem       []byte
	n, stride int
	pos       int
}

func newStrided(n, stride int) *strided {
	s := &strided{mem: make([]byte, n*stride), n: n, stride: stride}
	for i := range s.mem {
		s.mem[i] = 0x77
	}
	return s
}

func stridedFrom(data []byte, stride int) *strided {
	s := newStrided(len(data), stride)
	for i, b := range data {
		s.mem[i*stride] = b
	}
	return s
}

func (s *strided) Size() int             { return s.n }
func (s *strided) Position() int         { return s.pos }
func (s *strided) SetPosition(p int) int { s.pos = min(max(p, 0), s.n); return s.pos }
func (s *strided) Pack(dst []byte) int {
	k := 0
	for ; k < len(dst) && s.pos < s.n; k++ {
		dst[k] = s.mem[s.pos*s.stride]
		s.pos++
	}
	return k
}
func (s *strided) Unpack(src []byte) int {
	k := 0
	for ; k < len(src) && s.pos < s.n; k++ {
		s.mem[s.pos*s.stride] = src[k]
		s.pos++
	}
	return k
}

// packed returns the stream and checks that no byte between elements changed.
func (s *strided) packed(t *testing.T) []byte {
	t.Helper()
	out := make([]byte, s.n)
	for i := range s.mem {
		if i%s.stride == 0 {
			out[i/s.stride] = s.mem[i]
		} else {
			require.Equal(t, byte(0x77), s.mem[i], "byte %d between elements written", i)
		}
	}
	return out
}

func init() {
	scenarios = append(scenarios, scenario{
		name: "noncontiguous",
		doc: `Non-contiguous buffers (a strided convertor, every 2nd byte): 100 bytes
go immediate (packed into a temporary); 1000 strided bytes go by the send
pipeline (packed into Alloc buffers); a contiguous 1000-byte RGET and a
3000-byte RDMA-pipeline RNDV into strided receive buffers are declined by
the receiver and arrive by FRAGs. No byte between elements is touched.`,
		caps: capsAll,
		run: func(t *testing.T, g *rig) {
			type msg struct {
				n         int
				stridedTx bool
			}
			for i, m := range []msg{{100, true}, {1000, true}, {1000, false}, {3000, false}} {
				g.note("-- %d bytes, strided sender: %v, strided receiver", m.n, m.stridedTx)
				data := pattern(m.n, byte(60+i))
				rx := newStrided(m.n, 2)
				rr, err := g.comm[1].IrecvHandle(pml.Buffer{Conv: rx}, 0, i)
				require.NoError(t, err)
				r := g.track(fmt.Sprintf("rank1 recv(tag %d, strided)", i), rr, nil, nil)
				buf := pml.Buffer{Bytes: data}
				if m.stridedTx {
					buf = pml.Buffer{Conv: stridedFrom(data, 2)}
				}
				sr, err := g.comm[0].IsendHandle(buf, 1, i, pml.Standard, nil)
				require.NoError(t, err)
				s := g.track(fmt.Sprintf("rank0 send(tag %d)", i), sr, nil, nil)
				g.run()
				requireOK(t, r, m.n)
				requireOK(t, s, m.n)
				require.Equal(t, data, rx.packed(t))
			}
			g.checkClean()
		},
	})
}
