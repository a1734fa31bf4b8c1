package fake

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/stretchr/testify/require"
)

// got records what one rank's dispatcher received.
type got struct {
	frags  []string
	failed []string
}

func newNet(t *testing.T, ranks int, cfg Config) (*Network, []*got, []btl.Endpoint) {
	t.Helper()
	n := NewNetwork()
	gs := make([]*got, ranks)
	for r := range ranks {
		g := &got{}
		gs[r] = g
		d := &btl.Dispatcher{}
		for _, tag := range []btl.Tag{0x41, 0x42} {
			d.Register(tag, func(ep btl.Endpoint, hdr, data []byte) {
				g.frags = append(g.frags, fmt.Sprintf("%d:%#x:%s:%s", ep.Peer(), uint8(tag), hdr, data))
			})
		}
		d.OnPeerFailed(func(peer int, err error) {
			g.failed = append(g.failed, fmt.Sprintf("%d:%v", peer, errors.Is(err, btl.ErrClosed)))
		})
		n.Attach(r, d, cfg)
	}
	ep, err := n.Module(0).AddProc(1)
	require.NoError(t, err)
	back, err := n.Module(1).AddProc(0)
	require.NoError(t, err)
	return n, gs, []btl.Endpoint{ep, back}
}

func TestSendIsQueuedUntilDelivered(t *testing.T) {
	n, gs, eps := newNet(t, 2, DefaultConfig())
	var completed []error
	data := []byte("payload")
	done, err := eps[0].Send(0x41, []byte("h1"), data, func(err error) { completed = append(completed, err) })
	require.NoError(t, err)
	require.False(t, done, "Send completes on delivery")
	require.NoError(t, eps[0].SendImmediate(0x42, []byte("h2"), []byte("x")))
	require.Equal(t, 2, n.Len())
	require.Empty(t, gs[1].frags)
	require.Empty(t, completed)

	ops := n.Pending()
	require.Equal(t, KindSend, ops[0].Kind)
	require.Equal(t, []byte("payload"), ops[0].Data)
	require.Equal(t, KindSendImmediate, ops[1].Kind)

	require.True(t, n.Step())
	require.Equal(t, []string{"0:0x41:h1:payload"}, gs[1].frags)
	require.Equal(t, []error{nil}, completed)
	require.Equal(t, 1, n.DeliverAll())
	require.Equal(t, []string{"0:0x41:h1:payload", "0:0x42:h2:x"}, gs[1].frags)
	require.False(t, n.Step())
	require.Empty(t, n.Violations())
	require.Equal(t, []string{"  +#1 0->1 send tag=0x41", "  +#2 0->1 sendi tag=0x42", "#1 0->1 send tag=0x41 hdr=2B data=7B", "#2 0->1 sendi tag=0x42 hdr=2B data=1B"}, n.Trace())
}

func TestOwnershipViolationDetected(t *testing.T) {
	n, _, eps := newNet(t, 2, DefaultConfig())
	data := []byte("abc")
	_, err := eps[0].Send(0x41, nil, data, func(error) {})
	require.NoError(t, err)
	data[0] = 'X' // the module owns data until completion
	n.DeliverAll()
	require.Len(t, n.Violations(), 1)
	require.Contains(t, n.Violations()[0], "changed while the transport owned it")
}

func TestHandlerCopiesAreScribbled(t *testing.T) {
	n := NewNetwork()
	var kept []byte
	d0, d1 := &btl.Dispatcher{}, &btl.Dispatcher{}
	d1.Register(0x41, func(_ btl.Endpoint, _, data []byte) { kept = data })
	n.Attach(0, d0, DefaultConfig())
	n.Attach(1, d1, DefaultConfig())
	ep, _ := n.Module(0).AddProc(1)
	require.NoError(t, ep.SendImmediate(0x41, nil, []byte("secret")))
	n.DeliverAll()
	require.Equal(t, []byte{0xdb, 0xdb, 0xdb, 0xdb, 0xdb, 0xdb}, kept, "data is valid only during the handler")
}

func TestReorderKeepsLinkOrder(t *testing.T) {
	n, gs, eps := newNet(t, 2, DefaultConfig())
	for i := range 20 {
		require.NoError(t, eps[i%2].SendImmediate(0x41, nil, []byte{byte('a' + i)}))
	}
	n.Reorder(7)
	ops := n.Pending()
	last := map[int]int{}
	interleaved := false
	for i, op := range ops {
		require.Greater(t, op.ID, last[op.From], "link %d->%d reordered", op.From, op.To)
		last[op.From] = op.ID
		if i > 0 && op.From != ops[i-1].From && op.ID < ops[i-1].ID {
			interleaved = true
		}
	}
	require.True(t, interleaved, "links interleave differently than sent")

	// Same seed, same permutation.
	n2, _, eps2 := newNet(t, 2, DefaultConfig())
	for i := range 20 {
		require.NoError(t, eps2[i%2].SendImmediate(0x41, nil, []byte{byte('a' + i)}))
	}
	n2.Reorder(7)
	ids := func(ops []Op) (s []int) {
		for _, o := range ops {
			s = append(s, o.ID)
		}
		return
	}
	require.Equal(t, ids(ops), ids(n2.Pending()))
	n.DeliverAll()
	require.Len(t, gs[1].frags, 10)
}

func TestReorderUnordered(t *testing.T) {
	n, gs, eps := newNet(t, 2, DefaultConfig())
	n.SetUnordered(true)
	for i := range 10 {
		require.NoError(t, eps[0].SendImmediate(0x41, nil, []byte{byte('a' + i)}))
	}
	n.Reorder(1)
	n.DeliverAll()
	var s string
	for _, f := range gs[1].frags {
		s += f[len(f)-1:]
	}
	require.NotEqual(t, "abcdefghij", s)
	require.ElementsMatch(t, []byte("abcdefghij"), []byte(s))
}

func TestPutGetCopyAndValidate(t *testing.T) {
	n, _, eps := newNet(t, 2, DefaultConfig())
	mem1 := make([]byte, 8)
	reg, err := n.Module(1).Register(mem1, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	require.NoError(t, err)

	var res []error
	cb := func(err error) { res = append(res, err) }
	done, err := eps[0].Put([]byte("wxyz"), reg.Handle(), 2, cb)
	require.NoError(t, err)
	require.False(t, done)
	require.Equal(t, make([]byte, 8), mem1, "nothing written before delivery")
	n.DeliverAll()
	require.Equal(t, []byte{0, 0, 'w', 'x', 'y', 'z', 0, 0}, mem1)
	require.Equal(t, []error{nil}, res)

	dst := make([]byte, 3)
	_, err = eps[0].Get(dst, reg.Handle(), 3, cb)
	require.NoError(t, err)
	n.DeliverAll()
	require.Equal(t, []byte("xyz"), dst)

	// Range outside the registration, wrong owner, short handle.
	_, err = eps[0].Put(make([]byte, 4), reg.Handle(), 5, cb)
	require.ErrorIs(t, err, btl.ErrBadHandle)
	_, err = eps[1].Put(make([]byte, 1), reg.Handle(), 0, cb) // reg belongs to rank 1, not the peer 0
	require.ErrorIs(t, err, btl.ErrBadHandle)
	_, err = eps[0].Get(make([]byte, 1), []byte{1, 2}, 0, cb)
	require.ErrorIs(t, err, btl.ErrBadHandle)

	// Access: a read-only registration refuses puts.
	ro, _ := n.Module(1).Register(make([]byte, 4), btl.AccessRemoteRead)
	_, err = eps[0].Put(make([]byte, 1), ro.Handle(), 0, cb)
	require.ErrorIs(t, err, btl.ErrBadHandle)

	// Release while an op is pending: the op fails and it is a violation.
	_, err = eps[0].Put([]byte("q"), reg.Handle(), 0, cb)
	require.NoError(t, err)
	require.NoError(t, reg.Release())
	n.DeliverAll()
	require.ErrorIs(t, res[len(res)-1], btl.ErrBadHandle)
	require.Len(t, n.Violations(), 1)
	require.Error(t, reg.Release(), "double release")
	require.NoError(t, ro.Release())
	require.Equal(t, 0, n.LiveRegistrations())
}

func TestInjectedRDMAFailures(t *testing.T) {
	n, _, eps := newNet(t, 2, DefaultConfig())
	mem := []byte("abcd")
	reg, _ := n.Module(1).Register(mem, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	var res []error
	cb := func(err error) { res = append(res, err) }
	n.FailNextPut()
	n.FailNextGet()
	_, err := eps[0].Put([]byte("zz"), reg.Handle(), 0, cb)
	require.NoError(t, err)
	dst := make([]byte, 2)
	_, err = eps[0].Get(dst, reg.Handle(), 0, cb)
	require.NoError(t, err)
	_, err = eps[0].Put([]byte("ok"), reg.Handle(), 2, cb)
	require.NoError(t, err)
	n.DeliverAll()
	require.Len(t, res, 3)
	require.ErrorIs(t, res[0], ErrInjected)
	require.ErrorIs(t, res[1], ErrInjected)
	require.NoError(t, res[2])
	require.Equal(t, []byte("abok"), mem)
	require.Equal(t, []byte{0, 0}, dst)
}

func TestDrop(t *testing.T) {
	n, gs, eps := newNet(t, 2, DefaultConfig())
	var res []error
	_, err := eps[0].Send(0x41, []byte("a"), nil, func(err error) { res = append(res, err) })
	require.NoError(t, err)
	reg, _ := n.Module(1).Register(make([]byte, 1), btl.AccessRemoteWrite)
	_, err = eps[0].Put([]byte{1}, reg.Handle(), 0, func(err error) { res = append(res, err) })
	require.NoError(t, err)
	require.NoError(t, n.Drop(0))
	require.NoError(t, n.Drop(0))
	require.Error(t, n.Drop(0))
	require.Empty(t, gs[1].frags)
	require.Len(t, res, 2)
	require.NoError(t, res[0], "a lost fragment completed locally")
	require.ErrorIs(t, res[1], ErrDropped)
}

func TestCut(t *testing.T) {
	n, gs, eps := newNet(t, 2, DefaultConfig())
	var res []error
	_, err := eps[0].Send(0x41, []byte("a"), nil, func(err error) { res = append(res, err) })
	require.NoError(t, err)
	n.Cut(0, 1)
	require.Equal(t, 0, n.Len())
	require.Equal(t, []string{"1:true"}, gs[0].failed)
	require.Equal(t, []string{"0:true"}, gs[1].failed)
	require.Len(t, res, 1)
	require.ErrorIs(t, res[0], btl.ErrClosed)
	_, err = eps[0].Send(0x41, nil, nil, func(error) {})
	require.ErrorIs(t, err, btl.ErrClosed)
	require.ErrorIs(t, eps[1].SendImmediate(0x41, nil, nil), btl.ErrClosed)
}

func TestKillTellsOnlySurvivors(t *testing.T) {
	n, gs, _ := newNet(t, 3, DefaultConfig())
	n.Kill(2)
	require.Empty(t, gs[2].failed)
	require.Equal(t, []string{"2:true"}, gs[0].failed)
	require.Equal(t, []string{"2:true"}, gs[1].failed)
}

func TestRefusals(t *testing.T) {
	n, _, eps := newNet(t, 2, DefaultConfig())
	n.RefuseImmediate(1)
	require.ErrorIs(t, eps[0].SendImmediate(0x41, nil, nil), btl.ErrWouldBlock)
	require.NoError(t, eps[0].SendImmediate(0x41, nil, nil))
	n.RefuseAlloc(1)
	_, err := eps[0].Alloc(10)
	require.ErrorIs(t, err, btl.ErrWouldBlock)
	b, err := eps[0].Alloc(10)
	require.NoError(t, err)
	require.Equal(t, 1, n.OutstandingAllocs())
	_, err = eps[0].SendAlloc(0x41, b, 4, func(error) {})
	require.NoError(t, err)
	require.Equal(t, 0, n.OutstandingAllocs())

	cfg := DefaultConfig()
	cfg.Caps &^= btl.CapSendImmediate
	_, _, eps2 := newNet(t, 2, cfg)
	require.ErrorIs(t, eps2[0].SendImmediate(0x41, nil, nil), btl.ErrWouldBlock)
}

func TestSizeLimitViolation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Limits.EagerLimit, cfg.Limits.MaxSendSize = 8, 16
	n, _, eps := newNet(t, 2, cfg)
	require.NoError(t, eps[0].SendImmediate(0x41, make([]byte, 8), make([]byte, 8)))
	require.Empty(t, n.Violations())
	require.NoError(t, eps[0].SendImmediate(0x41, make([]byte, 8), make([]byte, 9)))
	require.Len(t, n.Violations(), 1)
}

func TestInline(t *testing.T) {
	n, gs, eps := newNet(t, 2, DefaultConfig())
	n.SetInline(true)
	called := false
	done, err := eps[0].Send(0x41, []byte("h"), []byte("d"), func(error) { called = true })
	require.NoError(t, err)
	require.True(t, done)
	require.False(t, called, "done == true: no callback")
	require.Equal(t, []string{"0:0x41:h:d"}, gs[1].frags)
	require.Equal(t, 0, n.Len())

	mem := make([]byte, 2)
	reg, _ := n.Module(1).Register(mem, btl.AccessRemoteWrite)
	done, err = eps[0].Put([]byte("pq"), reg.Handle(), 0, func(error) { called = true })
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, []byte("pq"), mem)
	n.FailNextPut()
	_, err = eps[0].Put([]byte("zz"), reg.Handle(), 0, func(error) { called = true })
	require.ErrorIs(t, err, ErrInjected)
	require.False(t, called)
	require.Equal(t, []byte("pq"), mem)
}

func TestLocalCompletion(t *testing.T) {
	n, gs, eps := newNet(t, 2, DefaultConfig())
	n.SetLocalCompletion(true)
	data := []byte("d")
	done, err := eps[0].Send(0x41, nil, data, func(error) { t.Fatal("no callback after done") })
	require.NoError(t, err)
	require.True(t, done)
	data[0] = 'X' // ours again: the fake copied it
	n.DeliverAll()
	require.Equal(t, []string{"0:0x41::d"}, gs[1].frags)
	require.Empty(t, n.Violations())
}

func TestUnreachableAndParams(t *testing.T) {
	n := NewNetwork()
	m := n.Attach(0, &btl.Dispatcher{}, DefaultConfig())
	_, err := m.AddProc(3)
	require.ErrorIs(t, err, btl.ErrUnreachable)

	p, err := params.NewSet([][2]string{{"btl_fake_flags", "send,put"}, {"btl_fake_eager_limit", "4k"}})
	require.NoError(t, err)
	cfg, err := ConfigFromParams(p)
	require.NoError(t, err)
	require.Equal(t, btl.CapSend|btl.CapPut, cfg.Caps)
	require.Equal(t, 4096, cfg.Limits.EagerLimit)
	require.Equal(t, 4096+DefaultLimits.RDMAPipelineSendLength, cfg.Limits.MinRDMAPipelineSize, "raised as Open MPI does")

	mods, err := Component{Net: n}.Open(&btl.Env{Rank: 1, Params: p, Dispatch: &btl.Dispatcher{}})
	require.NoError(t, err)
	require.Len(t, mods, 1)
	require.Equal(t, "fake", mods[0].Name())
	_, err = m.AddProc(1)
	require.NoError(t, err)
}

func TestWouldBlockRateIsSeeded(t *testing.T) {
	refusals := func(seed uint64) []bool {
		n, _, eps := newNet(t, 2, DefaultConfig())
		n.WouldBlockRate(0.5, seed)
		var out []bool
		for range 64 {
			_, err := eps[0].Send(0x41, nil, nil, func(error) {})
			if err != nil {
				require.ErrorIs(t, err, btl.ErrWouldBlock)
			}
			out = append(out, err != nil)
		}
		refused := 0
		for _, r := range out {
			if r {
				refused++
			}
		}
		require.Equal(t, 64-refused, n.Len(), "a refused Send was queued")
		require.Positive(t, refused)
		require.Less(t, refused, 64)
		return out
	}
	require.Equal(t, refusals(7), refusals(7))
	require.NotEqual(t, refusals(7), refusals(8))
}

func TestFlushWaitsForQueuedOperations(t *testing.T) {
	n, _, eps := newNet(t, 2, DefaultConfig())
	var order []string
	note := func(s string) btl.Completion {
		return func(err error) { order = append(order, fmt.Sprintf("%s:%v", s, err)) }
	}
	done, err := eps[0].Flush(note("early flush"))
	require.NoError(t, err)
	require.True(t, done, "nothing started")
	_, err = eps[0].Send(0x41, nil, []byte("a"), note("send a"))
	require.NoError(t, err)
	_, err = eps[1].Send(0x41, nil, []byte("b"), note("send b")) // other direction: not waited for
	require.NoError(t, err)
	_, err = eps[0].Send(0x41, nil, []byte("c"), note("send c"))
	require.NoError(t, err)
	done, err = eps[0].Flush(note("flush"))
	require.NoError(t, err)
	require.False(t, done)
	_, err = eps[0].Send(0x41, nil, []byte("d"), note("send d")) // after the Flush: not waited for
	require.NoError(t, err)
	require.NoError(t, n.Deliver(2)) // c
	require.NoError(t, n.Drop(0))    // a: lost in flight, completes
	require.Equal(t, []string{"send c:<nil>", "send a:<nil>", "flush:<nil>"}, order)
	n.DeliverAll()
	require.Len(t, order, 5)
}
