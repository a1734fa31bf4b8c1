package tcp

import (
	"encoding/binary"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// Deadlines on the wall clock: synctest cannot apply while goroutines
// block in poll(2) on real sockets. The tests wait for conditions, never
// for time to pass.

// backlog sends frames of 120 KiB from rank 0 to rank 1 while rank 1's
// handler holds its first delivery until release is closed, so that rank
// 0's socket fills and its frames queue. A goroutine of rank 0 calls
// Progress all along (a PML spinning in a wait) while the writer goroutine
// writes the queue.
func backlog(t *testing.T, frames int) (r0, r1 *rank, ep btl.Endpoint, got *atomic.Int64, release chan struct{}, stopPoll func(), seq func() []uint32) {
	ranks := openJob(t, btltest.NewStore(), 2)
	r0, r1 = ranks[0], ranks[1]
	release = make(chan struct{})
	got = new(atomic.Int64)
	var mu sync.Mutex
	var order []uint32
	var once sync.Once
	r1.env.Dispatch.Register(0x50, func(_ btl.Endpoint, hdr, data []byte) {
		once.Do(func() { <-release })
		i := binary.LittleEndian.Uint32(hdr)
		for j, b := range data {
			if b != byte(int(i)+j) {
				panic("tcp test: payload corrupted")
			}
		}
		mu.Lock()
		order = append(order, i)
		mu.Unlock()
		got.Add(1)
	})
	_, err := r1.mods[0].AddProc(0)
	require.NoError(t, err)
	ep, err = r0.mods[0].AddProc(1)
	require.NoError(t, err)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			r0.mods[0].Progress()
		}
	}()
	var so sync.Once
	stopPoll = func() { so.Do(func() { close(stop); wg.Wait() }) }
	t.Cleanup(stopPoll)
	seq = func() []uint32 {
		mu.Lock()
		defer mu.Unlock()
		return append([]uint32(nil), order...)
	}
	return
}

func sendBacklog(t *testing.T, ep btl.Endpoint, frames int, done *atomic.Int64, errs chan error) {
	for i := range frames {
		data := make([]byte, 120<<10)
		for j := range data {
			data[j] = byte(i + j)
		}
		var hdr [4]byte
		binary.LittleEndian.PutUint32(hdr[:], uint32(i))
		var called atomic.Bool
		fin, err := ep.Send(0x50, hdr[:], data, func(err error) {
			if called.Swap(true) {
				panic("tcp test: completion called twice")
			}
			done.Add(1)
			if err != nil {
				errs <- err
			}
		})
		if err != nil {
			errs <- err
			done.Add(1)
			continue
		}
		if fin {
			done.Add(1)
		}
	}
}

// TestPolledFlushBacklog: frames queued behind a full socket, while rank 0
// polls and then without polling, all arrive once, in order, intact, and
// complete once.
func TestPolledFlushBacklog(t *testing.T) {
	const frames = 200
	_, _, ep, got, release, stopPoll, seq := backlog(t, frames)
	var done atomic.Int64
	errs := make(chan error, frames)
	sendBacklog(t, ep, frames, &done, errs)
	// 24 MiB is more than the sockets hold while the receiver's handler
	// holds its first delivery: frames queue behind them.
	require.Less(t, done.Load(), int64(frames), "every frame completed while the receiver held: nothing queued")
	close(release)
	require.Eventually(t, func() bool { return got.Load() == frames && done.Load() == frames }, 20*time.Second, time.Millisecond)
	// Half-way, stop polling: the writer goroutine alone must finish
	// what is queued (checked by the second batch below).
	stopPoll()
	sendBacklog(t, ep, frames, &done, errs)
	require.Eventually(t, func() bool { return got.Load() == 2*frames && done.Load() == 2*frames }, 20*time.Second, time.Millisecond)
	select {
	case err := <-errs:
		t.Fatalf("send failed: %v", err)
	default:
	}
	s := seq()
	for i, v := range s {
		require.Equal(t, uint32(i%frames), v, "frame %d out of order", i)
	}
}

// TestPolledFlushPeerDies: the receiver dies while frames are queued and
// rank 0 polls: every completion runs once, with ErrProcFailed, and
// nothing hangs.
func TestPolledFlushPeerDies(t *testing.T) {
	const frames = 200
	_, r1, ep, _, release, _, _ := backlog(t, frames)
	var done atomic.Int64
	errs := make(chan error, 2*frames)
	sendBacklog(t, ep, frames, &done, errs)
	go r1.kill() // waits for its reader, which the handler holds until release
	// The killed rank's socket closes while its handler still holds:
	// rank 0's queued sends start failing before the handler lets go.
	require.Eventually(t, func() bool { return len(errs) > 0 }, 20*time.Second, time.Millisecond, "no queued send failed once the peer was killed")
	close(release)
	require.Eventually(t, func() bool { return done.Load() == frames }, 20*time.Second, time.Millisecond)
	n := 0
	for len(errs) > 0 {
		err := <-errs
		require.True(t, errors.Is(err, mpierr.ErrProcFailed), "error %v", err)
		n++
	}
	require.Positive(t, n, "no send failed, though the peer died with frames queued")
}

// TestFlushWaitsForBacklog: a Flush behind frames queued at a full socket
// (the receiver's handler holds its first delivery) does not complete
// before them: its completion finds every Send before it completed.
func TestFlushWaitsForBacklog(t *testing.T) {
	const frames = 200 // 24 MiB: more than the socket buffers hold
	_, _, ep, got, release, _, _ := backlog(t, frames)
	var done atomic.Int64
	errs := make(chan error, frames)
	sendBacklog(t, ep, frames, &done, errs)
	seen := make(chan int64, 2)
	fin, err := ep.Flush(func(err error) {
		if err != nil {
			errs <- err
		}
		seen <- done.Load()
	})
	require.NoError(t, err)
	require.False(t, fin, "Flush done at once while frames wait for a held receiver")
	close(release)
	select {
	case n := <-seen:
		require.Equal(t, int64(frames), n, "Flush completed before the sends queued ahead of it")
	case <-time.After(20 * time.Second):
		t.Fatal("Flush did not complete")
	}
	require.Eventually(t, func() bool { return got.Load() == frames }, 20*time.Second, time.Millisecond)
	require.Empty(t, errs)
	require.Empty(t, seen, "Flush completed twice")
}

// TestFlushWaitsForGetReply: a Flush called while the reply of a Get
// posted before it is being read (its Get already out of the endpoint's
// map of Gets in flight) completes only after the Get: when the Flush's
// completion runs, the Get's has, and its bytes are in place.
func TestFlushWaitsForGetReply(t *testing.T) {
	taken, resume := make(chan struct{}), make(chan struct{})
	testGetReplyTaken = func() {
		taken <- struct{}{}
		<-resume
	}
	t.Cleanup(func() { testGetReplyTaken = nil })
	ranks := openJob(t, btltest.NewStore(), 2, [2]string{"btl_tcp_flags", "send,put,get"})
	var once sync.Once
	release := func() { once.Do(func() { close(resume) }) }
	t.Cleanup(release) // before the job's close, which waits for the reader
	_, err := ranks[1].mods[0].AddProc(0)
	require.NoError(t, err)
	ep, err := ranks[0].mods[0].AddProc(1)
	require.NoError(t, err)
	src := make([]byte, 64<<10)
	for i := range src {
		src[i] = byte(i * 7)
	}
	reg, err := ranks[1].mods[0].Register(src, btl.AccessRemoteRead)
	require.NoError(t, err)
	defer reg.Release()

	local := make([]byte, len(src))
	var getDone atomic.Bool
	fin, err := ep.Get(local, reg.Handle(), 0, func(err error) {
		if err != nil {
			t.Errorf("Get: %v", err)
		}
		getDone.Store(true)
	})
	require.NoError(t, err)
	require.False(t, fin, "a Get over tcp completes when its reply arrives")
	select {
	case <-taken: // the reader holds the reply: nobody polls here
	case <-time.After(20 * time.Second):
		t.Fatal("no GETREPLY arrived")
	}
	flushed := make(chan bool, 2)
	fin, err = ep.Flush(func(err error) {
		require.NoError(t, err)
		flushed <- getDone.Load()
	})
	require.NoError(t, err)
	require.False(t, fin, "Flush done at once while the reply of a Get before it is being read")
	select {
	case <-flushed:
		t.Fatal("Flush completed while the reply of a Get before it was being read")
	default:
	}
	release()
	select {
	case ok := <-flushed:
		require.True(t, ok, "Flush completed before the Get's completion")
	case <-time.After(20 * time.Second):
		t.Fatal("Flush did not complete")
	}
	require.Equal(t, src, local, "Get's bytes when the Flush completed")
}
