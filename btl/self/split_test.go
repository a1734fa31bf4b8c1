package self

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
)

// splitWorld is world with btl_self_split and btl_self_split_chunk set.
func splitWorld(t *testing.T, split, chunk string) []*Module {
	t.Helper()
	w := NewWorld()
	w.procs = 2
	mods := make([]*Module, 2)
	for i := range mods {
		env, _ := btltest.Env(t, nil, "", i, 2, [2]string{paramSplit, split}, [2]string{paramSplitChunk, chunk})
		m, err := w.Attach(env)
		require.NoError(t, err)
		m.Enable()
		mods[i] = m
		t.Cleanup(func() { m.Close() })
	}
	return mods
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + seed + i>>13)
	}
	return b
}

// A rank that polls while another copies takes part in the copy: every
// byte of a Put and of a Get lands where it belongs, whether or not the
// poller got a chunk, in copies that are not a multiple of the chunk.
func TestSharedCopyWithPoller(t *testing.T) {
	mods := splitWorld(t, "64k", "64k")
	ep, err := mods[0].AddProc(1)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			default:
				mods[1].Poll()
			}
		}
	}()
	defer func() { close(stop); <-polled }()
	const n = 1<<20 + 123
	for k := range 8 {
		require.NoError(t, ctx.Err())
		remote := make([]byte, n)
		reg, err := mods[1].Register(remote, btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		want := pattern(n, k)
		done, err := ep.Put(want, reg.Handle(), 0, nil)
		require.NoError(t, err)
		require.True(t, done)
		require.Equal(t, want, remote, "put %d", k)

		got := make([]byte, n-5)
		done, err = ep.Get(got, reg.Handle(), 5, nil)
		require.NoError(t, err)
		require.True(t, done)
		require.Equal(t, want[5:], got, "get %d", k)
		require.NoError(t, reg.Release())
	}
	require.Nil(t, mods[0].w.job.Load(), "a job left posted")
}

// A rank that polls copies the chunks of a posted job that nobody took:
// the copy is complete without the asker.
func TestPollTakesPostedChunks(t *testing.T) {
	mods := splitWorld(t, "64k", "64k")
	src := pattern(300<<10, 3)
	dst := make([]byte, len(src))
	j := &copyJob{dst: dst, src: src, chunk: 64 << 10, chunks: 5}
	j.left.Store(5)
	mods[0].w.job.Store(j)
	require.Zero(t, mods[1].Poll(), "chunks copied are not fragments")
	require.Zero(t, j.left.Load())
	require.Equal(t, src, dst)
	require.False(t, j.take(), "a job with every chunk taken offers none")
}

// Below btl_self_split, with it 0, or in a world that does not spin, a
// copy is made alone: no job is posted.
func TestSharedCopyOnlyWhenSplit(t *testing.T) {
	for _, c := range []struct {
		split string
		procs int32
		n     int
	}{{"64k", 2, 64<<10 - 1}, {"0", 2, 1 << 20}, {"64k", 1, 1 << 20}} {
		mods := splitWorld(t, c.split, "64k")
		mods[0].w.procs = c.procs
		j := &copyJob{} // occupies the slot: a job posted would fail the swap
		mods[0].w.job.Store(j)
		src := pattern(c.n, 1)
		dst := make([]byte, c.n)
		mods[0].copyShared(dst, src)
		require.Equal(t, src, dst)
		require.Same(t, j, mods[0].w.job.Load())
	}
}
