package sm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
)

// sharedGetJob opens two ranks that share Gets of 256 KiB and more in 64
// KiB chunks (or as overrides say); rank 1 registers size bytes of a
// pattern.
func sharedGetJob(t *testing.T, size int, overrides ...[2]string) ([]*testRank, btl.Endpoint, btl.Registration, []byte) {
	t.Helper()
	ranks := openJob(t, btltest.NewStore(), 2, append([][2]string{{paramGetSplit, "256k"}, {paramGetChunk, "64k"}}, overrides...)...)
	if ranks[0].m.Caps()&btl.CapRDMA == 0 {
		t.Skipf("cross-memory attach not permitted here: %s", Status())
	}
	src := fill(3, 1, size)
	reg, err := ranks[1].m.Register(src, btl.AccessRemoteRead)
	require.NoError(t, err)
	t.Cleanup(func() { reg.Release() })
	ep, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)
	_, err = ranks[1].m.AddProc(0) // the helper maps the reader's segment too
	require.NoError(t, err)
	return ranks, ep, reg, src
}

// An idle owner of the memory (its poller in Block) copies chunks of the
// reader's Get; the bytes are right whoever copied them.
func TestSharedGetHelped(t *testing.T) {
	ranks, ep, reg, src := sharedGetJob(t, 3<<20+4321)
	ranks[1].startPoller()
	const off = 1000
	for try := 0; try < 200 && ranks[1].m.helpBytes.Load() == 0; try++ {
		dst := make([]byte, len(src)-off)
		done, err := ep.Get(dst, reg.Handle(), off, nil)
		require.NoError(t, err)
		require.True(t, done)
		require.Equal(t, src[off:], dst)
	}
	require.NotZero(t, ranks[1].m.helpBytes.Load(), "the idle owner never helped in 200 Gets")
}

// The smallest shared Gets (the default split, 32 KiB, in halves of 16
// KiB and up) are helped too, and land whole: sizes around the split and
// the chunk, at an offset, Get after Get until the idle owner took a chunk
// (a Get of 32 KiB lasts a few microseconds: under a loaded machine's
// scheduling the owner may miss many).
func TestSharedGetSmallHelped(t *testing.T) {
	ranks, ep, reg, src := sharedGetJob(t, 100<<10, [2]string{paramGetSplit, "32k"}, [2]string{paramGetChunk, "16k"})
	ranks[1].startPoller()
	const off = 777
	get := func(n int) {
		dst := make([]byte, n)
		done, err := ep.Get(dst, reg.Handle(), off, nil)
		require.NoError(t, err)
		require.True(t, done)
		require.Equal(t, src[off:off+n], dst, "%d bytes", n)
	}
	for deadline := time.Now().Add(20 * time.Second); ranks[1].m.helpBytes.Load() == 0 && time.Now().Before(deadline); {
		get(32 << 10)
	}
	require.NotZero(t, ranks[1].m.helpBytes.Load(), "the idle owner never helped in 20 s of 32 KiB Gets")
	for _, n := range []int{32<<10 + 1, 40000, 64<<10 - 1, 96 << 10} {
		get(n)
	}
}

// An owner that never polls leaves every chunk to the reader, which does
// not wait for it.
func TestSharedGetAlone(t *testing.T) {
	ranks, ep, reg, src := sharedGetJob(t, 1<<20)
	dst := make([]byte, len(src))
	done, err := ep.Get(dst, reg.Handle(), 0, nil)
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, src, dst)
	require.Zero(t, ranks[1].m.helpBytes.Load())
}

// postHelp writes a request into the help slot of requester local rank l
// in seg, as a peer would.
func postHelp(seg []byte, l int, seq, src, dst, n, chunk uint64) helpSlot {
	s := slotOf(seg, l)
	s.claim.Store(seq<<32 | helpClosed)
	s.src.Store(src)
	s.dst.Store(dst)
	s.len.Store(n)
	s.chunk.Store(chunk)
	s.done.Store(0)
	s.fail.Store(0)
	s.claim.Store(seq << 32)
	word64(seg, offHelpPosts).Add(1)
	return s
}

// idle makes m help as an idle process does: a run of empty polls.
func idle(m *Module) {
	for range 4 * idlePolls { // the rate is looked at every 16th call
		m.Progress()
	}
}

// idleUntil is idle until cond holds, for at most 10 s: whether a run of
// polls counts as idle depends on their rate (Module.idle), which a loaded
// machine or the race detector can keep low for a while.
func idleUntil(t *testing.T, m *Module, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		require.True(t, time.Now().Before(deadline), "the idle helper did not act")
		idle(m)
	}
}

// Garbage in a help slot (memory the helper never registered, chunks too
// small, a destination that is not mapped) is ignored or fails that chunk:
// no panic, no byte of unregistered memory copied.
func TestHelpSlotGarbage(t *testing.T) {
	ranks, _, reg, src := sharedGetJob(t, 1<<20)
	h := ranks[1].m
	dst := make([]byte, len(src))
	dstAddr := uint64(sys.Addr(dst))
	srcAddr := uint64(sys.Addr(src))

	s := postHelp(h.seg, 0, 1, srcAddr+uint64(len(src)), dstAddr, 1<<20, 64<<10) // beyond the registration
	idleUntil(t, h, func() bool { return !h.helpPosted() })                      // it looked
	require.Equal(t, uint64(1)<<32, s.claim.Load(), "a chunk of unregistered memory was claimed")
	require.Zero(t, s.done.Load())

	s = postHelp(h.seg, 0, 2, srcAddr, dstAddr, 1<<20, 4096) // chunks below the minimum
	idleUntil(t, h, func() bool { return !h.helpPosted() })
	require.Equal(t, uint64(2)<<32, s.claim.Load())

	s = postHelp(h.seg, 0, 3, srcAddr, 16, 1<<20, 64<<10)          // destination not mapped in the reader
	idleUntil(t, h, func() bool { return s.done.Load() == 1<<20 }) // every chunk is accounted for
	require.NotZero(t, s.fail.Load(), "the failed copies are reported")
	require.Zero(t, h.helpBytes.Load())

	s = postHelp(h.seg, 0, 4, srcAddr, dstAddr, 1<<20, 64<<10) // a good one
	idleUntil(t, h, func() bool { return s.done.Load() == 1<<20 })
	require.Zero(t, s.fail.Load())
	require.Equal(t, src, dst)
	_ = reg
}

// A helper that dies holding a chunk does not hang the reader: its Get
// fails with ErrProcFailed.
func TestSharedGetHelperDies(t *testing.T) {
	ranks, ep, reg, src := sharedGetJob(t, 2<<20)
	claimed, release := make(chan struct{}), make(chan struct{})
	hook := func() {
		select {
		case claimed <- struct{}{}:
			<-release // hold the chunk until the test lets go
		default:
		}
	}
	helpClaimedHook.Store(&hook)
	defer helpClaimedHook.Store(nil)
	defer close(release) // before the cleanup stops the poller
	ranks[1].startPoller()
	dst := make([]byte, len(src))
	errc := make(chan error, 1)
	for try := 0; ; try++ {
		require.Less(t, try, 100, "the idle helper never took a chunk")
		go func() {
			_, err := ep.Get(dst, reg.Handle(), 0, nil)
			errc <- err
		}()
		select {
		case <-claimed:
		case err := <-errc: // the reader took every chunk: again
			require.NoError(t, err)
			continue
		case <-time.After(10 * time.Second):
			t.Fatal("Get hangs")
		}
		break
	}
	// The helper's process "dies" holding the chunk: its segment says so,
	// as after a crash.
	st := ranks[1].m.state
	for old := st.Load(); !st.CompareAndSwap(old, stateDead<<32|old&0xFFFFFFFF); old = st.Load() {
	}
	select {
	case err := <-errc:
		require.ErrorIs(t, err, mpierr.ErrProcFailed)
	case <-time.After(10 * time.Second):
		t.Fatal("the reader hangs on a dead helper's chunk")
	}
}

// A reader with large sends of its own in flight (registered memory) does
// not ask for help: traffic flows both ways and the peer reads too.
func TestSharedGetNotWhileSending(t *testing.T) {
	ranks, ep, reg, src := sharedGetJob(t, 1<<20)
	own, err := ranks[0].m.Register(make([]byte, 4096), btl.AccessRemoteRead)
	require.NoError(t, err)
	ranks[1].startPoller()
	dst := make([]byte, len(src))
	for range 50 {
		_, err := ep.Get(dst, reg.Handle(), 0, nil)
		require.NoError(t, err)
		require.Equal(t, src, dst)
	}
	require.Zero(t, ranks[1].m.helpBytes.Load(), "asked for help while sending")
	require.NoError(t, own.Release())
	for try := 0; try < 200 && ranks[1].m.helpBytes.Load() == 0; try++ {
		_, err := ep.Get(dst, reg.Handle(), 0, nil)
		require.NoError(t, err)
	}
	require.NotZero(t, ranks[1].m.helpBytes.Load(), "no help once the send is done")
}

// A process that polls only now and then (the PML's background goroutine
// while the application computes) does not help: that would take the
// application's core. A waiter polling in a loop does.
func TestHelpOnlyWhenIdle(t *testing.T) {
	ranks, _, _, src := sharedGetJob(t, 1<<20)
	h := ranks[1].m
	dst := make([]byte, len(src))
	s := postHelp(h.seg, 0, 1, uint64(sys.Addr(src)), uint64(sys.Addr(dst)), 1<<20, 64<<10)
	for range 50 { // 200 polls in 50+ ms
		for range 4 {
			h.Progress()
		}
		time.Sleep(time.Millisecond)
	}
	require.Zero(t, s.done.Load(), "helped from occasional polls")
	idleUntil(t, h, func() bool { return s.done.Load() == 1<<20 })
	require.Equal(t, src, dst)
}
