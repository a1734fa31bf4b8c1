package pml_test

// The transport refuses Send, SendAlloc, Put and Get with btl.ErrWouldBlock
// (its queue to the peer full): the engine queues the operation and posts
// it again from progress, keeping each peer's operations in order.

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/stretchr/testify/require"
)

// TestWouldBlockEveryProtocol: with a fraction of the fake's Send,
// SendAlloc, Put and Get calls refused, every forced protocol delivers
// every message whole and in order (same source and tag: MPI's
// non-overtaking rule), both ways at once, and leaves nothing behind.
func TestWouldBlockEveryProtocol(t *testing.T) {
	protos := []struct {
		force string
		proto pml.Protocol
		max   int // largest message the protocol carries here
		caps  btl.Caps
	}{
		// Without SendImmediate (which the fake does not refuse) eager
		// messages go by Send and can be refused.
		{"eager", pml.EagerPrepared, 100, capsNoImm},
		{"rdma_put", pml.RDMADirectPut, 6000, capsAll},
		{"rdma_get", pml.RDMADirectGet, 6000, capsAll},
		{"send_pipeline", pml.SendPipeline, 6000, capsAll},
		{"rdma_pipeline", pml.RDMAPipeline, 6000, capsNoImm},
	}
	for _, pr := range protos {
		for _, rate := range []float64{0.25, 0.6} {
			for seed := range uint64(3) {
				t.Run(fmt.Sprintf("%s/rate=%v/seed=%d", pr.force, rate, seed), func(t *testing.T) {
					g := newRig(t, 2, capsConfig(pr.caps), [2]string{"pml_force_protocol", pr.force})
					g.net.SetTraceStarts(false)
					g.net.WouldBlockRate(rate, seed)
					const count = 12
					var sends []*tracked
					var lens []int
					for dir := range 2 {
						from, to := dir, 1-dir
						for i := range count {
							n := (i*977 + int(seed)*131 + dir*17) % (pr.max + 1)
							if i == count-1 {
								n = pr.max
							}
							data := pattern(n, byte(i+dir*50))
							g.irecv(to, from, 7, n, data)
							sends = append(sends, g.isend(from, to, 7, data, pml.Standard))
							lens = append(lens, n)
							if i%4 == 3 {
								g.net.Reorder(seed*100 + uint64(i)) // interleave links and RDMA; each link's sends keep their order
							}
						}
					}
					g.run()
					for i, s := range sends {
						requireOK(t, s, lens[i])
					}
					g.checkClean()
					refused := 0
					for _, l := range g.net.Trace() {
						if strings.Contains(l, "would block") {
							refused++
						}
					}
					require.Positive(t, refused, "the fake refused nothing")
					for r, e := range g.eng {
						require.Zero(t, e.Queued(), "rank %d: operations still queued", r)
						require.Positive(t, e.Stats.Sent[pr.proto].Load(), "rank %d sent nothing by %s", r, pr.force)
					}
				})
			}
		}
	}
}

// TestWouldBlockKeepsPeerOrder: once an operation to a peer is queued,
// later ones to that peer queue behind it, even those that would go by
// SendImmediate (which the fake does not refuse): the RNDV refused first
// goes out first.
func TestWouldBlockKeepsPeerOrder(t *testing.T) {
	g := newRig(t, 2, capsConfig(capsAll))
	g.net.WouldBlock(1)
	big, small := pattern(2000, 1), pattern(40, 2)
	rb := g.irecv(1, 0, 3, 2000, big)
	rs := g.irecv(1, 0, 4, 40, small)
	sb := g.isend(0, 1, 3, big, pml.Standard)
	require.Equal(t, 1, g.eng[0].Queued(), "the RNDV was refused and queued")
	ss, err := g.comm[0].IsendHandle(pml.Buffer{Bytes: small}, 1, 4, pml.Standard, nil)
	require.NoError(t, err)
	_, atOnce := ss.Ready() // done within the call: sent at once
	require.False(t, atOnce, "an eager send behind a queued operation must queue, not go at once")
	require.Equal(t, 0, g.net.Len(), "nothing may reach the transport before the queued RNDV")
	require.Equal(t, 2, g.eng[0].Queued())
	g.eng[0].Progress()
	ops := g.net.Pending()
	require.Len(t, ops, 2)
	require.Equal(t, hdr.TypeRndv, hdr.Type(ops[0].Tag), "the refused RNDV first")
	require.Equal(t, hdr.TypeMatch, hdr.Type(ops[1].Tag))
	g.track("rank0 small send", ss, nil, nil)
	g.run()
	requireOK(t, sb, 2000)
	requireOK(t, rb, 2000)
	requireOK(t, rs, 40)
	g.checkClean()
}

// TestWouldBlockPeerDies: a blocking Send whose fragment the transport
// keeps refusing ends with ErrProcFailed when the peer dies (the queued
// operation fails), instead of retrying for ever.
func TestWouldBlockPeerDies(t *testing.T) {
	for _, n := range []int{40, 3000} { // eager, rendezvous
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			g := newRig(t, 2, capsConfig(capsNoImm))
			g.net.WouldBlock(-1)
			res := make(chan error, 1)
			go func() { res <- g.comm[0].Send(pml.Buffer{Bytes: pattern(n, 1)}, 1, 5, pml.Standard) }()
			deadline := time.Now().Add(10 * time.Second)
			for g.eng[0].Queued() == 0 {
				require.True(t, time.Now().Before(deadline), "the send was never queued")
				time.Sleep(time.Millisecond)
			}
			g.net.Kill(1)
			select {
			case err := <-res:
				require.ErrorIs(t, err, mpierr.ErrProcFailed)
			case <-time.After(10 * time.Second):
				t.Fatal("Send still blocked after the peer died")
			}
			require.Zero(t, g.eng[0].Queued())
			// Later sends to the dead peer fail at once.
			require.ErrorIs(t, g.comm[0].Send(pml.Buffer{Bytes: pattern(n, 2)}, 1, 5, pml.Standard), mpierr.ErrProcFailed)
		})
	}
}

// sleepyPoller is a polled transport with nothing to poll whose Block
// returns only when woken: a waiter or background poller that slept in
// it while operations are queued would never retry them.
type sleepyPoller struct{}

func (sleepyPoller) Progress() int { return 0 }
func (sleepyPoller) Block(wake <-chan struct{}) {
	<-wake
}

// TestWouldBlockRetriedByPollers: an engine with a polled transport and
// its background poller retries refused operations itself: a blocking
// rendezvous Send completes while a goroutine only delivers what reaches
// the fake (and has the receiver retry its own).
func TestWouldBlockRetriedByPollers(t *testing.T) {
	g := newRig(t, 2, capsConfig(capsNoImm))
	g.eng[0].AddPoller(sleepyPoller{})
	g.eng[0].Start()
	t.Cleanup(func() { g.eng[0].Close(nil) })
	g.net.WouldBlock(6)
	data := pattern(3000, 9)
	got := make([]byte, 3000)
	rr, err := g.comm[1].IrecvHandle(pml.Buffer{Bytes: got}, 0, 2)
	require.NoError(t, err)
	stop := make(chan struct{})
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !g.net.Step() && g.eng[1].Progress() == 0 {
				time.Sleep(10 * time.Microsecond)
			}
		}
	}()
	res := make(chan error, 1)
	go func() { res <- g.comm[0].Send(pml.Buffer{Bytes: data}, 1, 2, pml.Standard) }()
	select {
	case err := <-res:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("blocking Send never completed")
	}
	st, err := rr.Wait(nil)
	require.NoError(t, err)
	close(stop)
	<-pumped
	require.Equal(t, 3000, st.Count)
	require.Equal(t, data, got)
	require.Zero(t, g.eng[0].Queued())
}
