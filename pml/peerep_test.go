package pml_test

// The hooks for the layers above the PML (peerep.go): their tags, sends
// and puts through the queue of refused operations, failure watches, and
// Await.

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
	"github.com/stretchr/testify/require"
)

// TestPeerPutRefusedThenRetried: a put the transport refuses
// (btl.ErrWouldBlock) is queued and posted again from progress, and an
// upper-tag fragment sent after it waits behind it: it arrives after the
// put's data is in place, and the put's completion runs once.
func TestPeerPutRefusedThenRetried(t *testing.T) {
	g := newRig(t, 2, capsConfig(capsAll))
	dest := make([]byte, 64)
	reg, err := g.net.Module(1).Register(dest, btl.AccessRemoteWrite)
	require.NoError(t, err)
	defer reg.Release()
	const tag = pml.UpperTagFirst + 1
	var got [][]byte
	var sawData []bool
	g.eng[1].SetUpperHandler(tag, func(ep btl.Endpoint, hdr, data []byte) {
		require.Equal(t, 0, ep.Peer())
		got = append(got, append(bytes.Clone(hdr), data...))
		sawData = append(sawData, bytes.Equal(dest, pattern(64, 9)))
	})

	g.net.WouldBlock(1) // the put is refused once
	var calls atomic.Int32
	var putErr error
	done, err := g.eng[0].PeerPut(1, pattern(64, 9), reg.Handle(), 0, func(err error) { calls.Add(1); putErr = err })
	require.NoError(t, err)
	require.False(t, done)
	require.Equal(t, 1, g.eng[0].Queued())
	require.True(t, g.eng[0].PeerQueued(1))
	_, err = g.eng[0].PeerSend(1, tag, []byte{1, 2}, []byte("after the put"), func(error) {})
	require.NoError(t, err)
	require.Equal(t, 2, g.eng[0].Queued(), "the send queues behind the refused put")

	g.run()
	require.Equal(t, int32(1), calls.Load())
	require.NoError(t, putErr)
	require.Equal(t, [][]byte{append([]byte{1, 2}, "after the put"...)}, got)
	require.Equal(t, []bool{true}, sawData, "the fragment arrived before the put's data")
	require.Zero(t, g.eng[0].Queued())
	require.False(t, g.eng[0].PeerQueued(1))
}

// TestUpperTagWithoutHandler: a fragment of an upper tag nobody handles
// is dropped (late traffic of a layer instance that is gone), not a
// protocol error.
func TestUpperTagWithoutHandler(t *testing.T) {
	g := newRig(t, 2, capsConfig(capsAll))
	var failed atomic.Int32
	stop := g.eng[1].WatchPeers(func(int, error) { failed.Add(1) })
	defer stop()
	_, err := g.eng[0].PeerSend(1, pml.UpperTagLast, nil, []byte("nobody listens"), func(error) {})
	require.NoError(t, err)
	g.run()
	require.Zero(t, failed.Load())
	require.Panics(t, func() { g.eng[0].SetUpperHandler(pml.UpperTagLast+1, nil) })
}

// TestWatchPeers: a watcher hears of a peer's failure (also one that
// happened before it watched) and of the engine's abort; after stop it
// hears nothing.
func TestWatchPeers(t *testing.T) {
	g := newRig(t, 3, capsConfig(capsAll))
	type note struct {
		w   int
		err error
	}
	var notes []note
	g.net.Kill(2)
	stop := g.eng[0].WatchPeers(func(w int, err error) { notes = append(notes, note{w, err}) })
	require.Len(t, notes, 1, "the failure before the watch")
	require.Equal(t, 2, notes[0].w)
	require.True(t, errors.Is(notes[0].err, mpierr.ErrProcFailed), "%v", notes[0].err)

	g.net.Kill(1)
	require.Len(t, notes, 2)
	require.Equal(t, 1, notes[1].w)

	boom := mpierr.Errorf(mpierr.ErrAborted, "boom")
	g.eng[0].Abort(boom)
	require.Len(t, notes, 3)
	require.Equal(t, -1, notes[2].w)
	require.ErrorIs(t, notes[2].err, mpierr.ErrAborted)
	g.eng[0].Abort(boom) // once only
	require.Len(t, notes, 3)

	stop()
	g.eng[1].PeerFailed(0, mpierr.Errorf(mpierr.ErrProcFailed, "gone"))
	g.eng[0].PeerFailed(1, mpierr.Errorf(mpierr.ErrProcFailed, "again"))
	require.Len(t, notes, 3)
}

// TestAttachOnce: Attach makes the value once per engine and key.
func TestAttachOnce(t *testing.T) {
	g := newRig(t, 2, capsConfig(capsAll))
	type key struct{}
	made := 0
	mk := func() any { made++; return &made }
	a := g.eng[0].Attach(key{}, mk)
	require.Same(t, a, g.eng[0].Attach(key{}, mk))
	require.Equal(t, 1, made)
	g.eng[1].Attach(key{}, mk)
	require.Equal(t, 2, made)
}

// TestAwait: Await returns once its condition holds after a wake-up, or
// with the context's error.
func TestAwait(t *testing.T) {
	g := newRig(t, 2, capsConfig(capsAll))
	wake := make(chan struct{}, 1)
	var ready atomic.Bool
	go func() {
		ready.Store(true)
		wake <- struct{}{}
	}()
	require.NoError(t, g.eng[0].Await(nil, 0, ready.Load, wake))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	never := func() bool { return false }
	require.ErrorIs(t, g.eng[0].Await(ctx, -1, never, make(chan struct{}, 1)), context.DeadlineExceeded)
}
