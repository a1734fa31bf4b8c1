package sys

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// A memfd mapped twice (once through /proc/self/fd, as a peer process
// would) is one memory.
func TestMemfdShared(t *testing.T) {
	f, err := MemfdCreate("gompi-sys-test")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, Ftruncate(int(f.Fd()), 1<<16))
	a, err := MapShared(f, 1<<16)
	require.NoError(t, err)
	defer Unmap(a)
	g, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", f.Fd()), os.O_RDWR, 0)
	require.NoError(t, err)
	b, err := MapShared(g, 1<<16)
	require.NoError(t, err)
	g.Close()
	copy(a[100:], "hello")
	require.Equal(t, "hello", string(b[100:105]))
	require.NoError(t, Unmap(b))
	_, err = MapShared(f, 0)
	require.Error(t, err)
}

func TestFutex(t *testing.T) {
	f, err := MemfdCreate("gompi-futex-test")
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, Ftruncate(int(f.Fd()), 4096))
	m, err := MapShared(f, 4096)
	require.NoError(t, err)
	defer Unmap(m)
	w := (*atomic.Uint32)(unsafe.Pointer(&m[64]))

	// Value differs: returns at once.
	require.NoError(t, FutexWait(w, 1, time.Second))
	// Timeout.
	t0 := time.Now()
	err = FutexWait(w, 0, 20*time.Millisecond)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.GreaterOrEqual(t, time.Since(t0), 15*time.Millisecond)
	// Wake from another goroutine.
	done := make(chan error, 1)
	go func() { done <- FutexWait(w, 0, 10*time.Second) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.Store(1)
		n, err := FutexWake(w, 1)
		require.NoError(t, err)
		if n == 1 || time.Now().After(deadline) {
			break
		}
		w.Store(0)
		time.Sleep(time.Millisecond)
	}
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("waiter not woken")
	}
}

func TestCMASelf(t *testing.T) {
	require.NoError(t, CMAPermitted(os.Getpid()))
	src := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	dst := make([]byte, len(src))
	require.NoError(t, CMARead(os.Getpid(), dst, uintptr(unsafe.Pointer(&src[0]))))
	require.Equal(t, src, dst)
	clear(dst)
	require.NoError(t, CMAWrite(os.Getpid(), src, uintptr(unsafe.Pointer(&dst[0]))))
	require.Equal(t, src, dst)

	// Lists with different splits on both sides, more than one call's worth
	// of iovecs.
	remote := make([]RemoteIOV, 0, 3000)
	for off := 0; off < len(src); off += 333 {
		remote = append(remote, RemoteIOV{Addr: uintptr(unsafe.Pointer(&src[off])), Len: min(333, len(src)-off)})
	}
	clear(dst)
	var local [][]byte
	for off := 0; off < len(dst); off += 1000 {
		local = append(local, dst[off:min(off+1000, len(dst))])
	}
	n, err := ProcessVMReadv(os.Getpid(), local, remote)
	require.NoError(t, err)
	require.Equal(t, len(src), n)
	require.Equal(t, src, dst)
	n, err = ProcessVMWritev(os.Getpid(), [][]byte{src[:10], nil, src[10:20]}, []RemoteIOV{{Addr: uintptr(unsafe.Pointer(&dst[5])), Len: 15}})
	require.NoError(t, err)
	require.Equal(t, 15, n)

	err = CMARead(os.Getpid(), dst[:8], 8) // unmapped address
	require.ErrorIs(t, err, ErrFault)
}

func TestCMAPeers(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	if err := CMAPermitted(cmd.Process.Pid); err != nil {
		require.ErrorIs(t, err, mpierr.ErrNotSupported)
		t.Skipf("cross-memory attach to another process not permitted here: %v", err)
	}
	cmd.Process.Kill()
	cmd.Wait()
	err := CMAPermitted(cmd.Process.Pid)
	require.ErrorIs(t, err, mpierr.ErrProcFailed)
}

func TestPidWatch(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	require.NoError(t, cmd.Start())
	defer cmd.Process.Kill()
	w, err := WatchPid(cmd.Process.Pid)
	require.NoError(t, err)
	defer w.Close()
	done := make(chan error, 1)
	go func() { done <- w.Wait() }()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v before the process exited", err)
	case <-time.After(50 * time.Millisecond):
	}
	require.NoError(t, cmd.Process.Kill())
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("exit not seen")
	}
	cmd.Wait()

	// Close ends a Wait.
	self, err := WatchPid(os.Getpid())
	require.NoError(t, err)
	go func() { done <- self.Wait() }()
	time.Sleep(10 * time.Millisecond)
	require.NoError(t, self.Close())
	select {
	case err := <-done:
		require.True(t, errors.Is(err, ErrWatchClosed), "%v", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end Wait")
	}
	require.True(t, ProcessExists(os.Getpid()))
}
