package btltest

import (
	"bytes"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/stretchr/testify/require"
)

// Subtests of the end of a module: Close, and a peer killed before or
// after it connected.

func testClose(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	m := j.peers[0].Module
	ep := j.ep(0, 1)
	back := j.ep(1, 0)
	j.marker(0, 1)
	j.marker(1, 0)
	var reg btl.Registration
	if m.Caps()&btl.CapRDMA != 0 {
		var err error
		reg, err = j.peers[1].Module.Register(make([]byte, 64), btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		defer reg.Release()
	}
	require.NoError(t, m.Close())

	never := func(err error) { t.Errorf("completion called for an operation on a closed module (%v)", err) }
	_, err := m.AddProc(1)
	require.ErrorIs(t, err, btl.ErrClosed, "AddProc after Close")
	_, err = ep.Send(TagData, []byte("h"), []byte("d"), never)
	require.ErrorIs(t, err, btl.ErrClosed, "Send after Close")
	require.ErrorIs(t, ep.SendImmediate(TagData, []byte("h"), nil), btl.ErrClosed, "SendImmediate after Close")
	_, err = ep.Alloc(8)
	require.ErrorIs(t, err, btl.ErrClosed, "Alloc after Close")
	_, err = m.Register(make([]byte, 8), btl.AccessRemoteWrite)
	require.ErrorIs(t, err, btl.ErrClosed, "Register after Close")
	if m.Caps()&btl.CapPut != 0 {
		_, err = ep.Put(make([]byte, 8), reg.Handle(), 0, never)
		require.ErrorIs(t, err, btl.ErrClosed, "Put after Close")
	}
	if m.Caps()&btl.CapGet != 0 {
		_, err = ep.Get(make([]byte, 8), reg.Handle(), 0, never)
		require.ErrorIs(t, err, btl.ErrClosed, "Get after Close")
	}
	// The survivor's sends to the closed rank resolve (fail or complete);
	// none hangs.
	var c completions
	for range 10 {
		c.send(back, TagData, dataHdr(1, 0, 0, 0), nil)
	}
	c.settle(t)
}

// killedJob starts n ranks, connects rank 0 with every other, and
// registers memory at rank 1 for Puts.
func killedJob(t *testing.T, mk func(*testing.T, int) []Peer, n int) (*job, []byte) {
	j := start(t, mk, n)
	if j.peers[1].Kill == nil {
		t.Skip("Peer.Kill not provided")
	}
	var h []byte
	if j.peers[0].Module.Caps()&btl.CapPut != 0 {
		reg, err := j.peers[1].Module.Register(make([]byte, 1<<20), btl.AccessRemoteWrite)
		require.NoError(t, err)
		h = bytes.Clone(reg.Handle())
	}
	return j, h
}

// expectFailure waits for rank's report that peer failed.
func (j *job) expectFailure(rank, peer int) {
	j.t.Helper()
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for {
		select {
		case f := <-j.fails[rank]:
			if f.peer != peer {
				j.t.Fatalf("rank %d: PeerFailed(%d, %v), expected rank %d only", rank, f.peer, f.err, peer)
			}
			require.ErrorIs(j.t, f.err, mpierr.ErrProcFailed, "rank %d: PeerFailed error", rank)
			return
		case <-timer.C:
			j.t.Fatalf("rank %d: no PeerFailed for rank %d within %v", rank, peer, Timeout)
		}
	}
}

// sendFails checks that a send from rank 0 to a failed peer fails: at once
// or through its completion.
func (j *job) sendFails(ep btl.Endpoint, h []byte) {
	t := j.t
	t.Helper()
	var c completions
	err := c.send(ep, TagData, dataHdr(0, 0, 0, 8), payload(0, 0, 8))
	errs := c.settle(t)
	require.True(t, err != nil || len(errs) > 0, "Send to a failed peer succeeded")
	if h != nil {
		var c completions
		cb, finish := c.cb()
		done, err := retry(ep, func() (bool, error) { return ep.Put(payload(0, 0, 64), h, 0, cb) })
		if done || err != nil {
			finish()
		}
		errs := c.settle(t)
		require.True(t, err != nil || len(errs) > 0, "Put to a failed peer succeeded")
	}
}

func testPeerKilled(t *testing.T, mk func(*testing.T, int) []Peer) {
	j, h := killedJob(t, mk, 3)
	ep := j.ep(0, 1)
	j.marker(0, 1)
	j.marker(1, 0)
	j.marker(0, 2)
	j.marker(2, 0)

	// A flood towards the victim is in flight when it dies: every send
	// resolves.
	var c completions
	stop := make(chan struct{})
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		size := j.limit() - 16
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			if c.send(ep, TagData, dataHdr(0, 0, seq, size), payload(0, seq, size)) != nil {
				return
			}
		}
	}()
	j.in[1].wait(t, "flood", countData(0, 10))
	j.peers[1].Kill()
	j.expectFailure(0, 1)
	close(stop)
	<-flood
	c.settle(t)
	j.sendFails(ep, h)

	// The other peer is unaffected.
	j.marker(0, 2)
	j.marker(2, 0)
	for len(j.fails[0]) > 0 {
		f := <-j.fails[0]
		require.Failf(t, "extra failure report", "PeerFailed(%d, %v) reported again", f.peer, f.err)
	}
}

func testKilledBeforeConnect(t *testing.T, mk func(*testing.T, int) []Peer) {
	j, h := killedJob(t, mk, 2)
	j.peers[1].Kill()
	ep := j.ep(0, 1)
	var c completions
	c.send(ep, TagData, dataHdr(0, 0, 0, 8), payload(0, 0, 8))
	j.expectFailure(0, 1)
	c.settle(t)
	j.sendFails(ep, h)
}
