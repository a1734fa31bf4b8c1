package sys

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Futex operations (linux/futex.h). The shared (not _PRIVATE) variants: the
// word lives in memory mapped by several processes, and the kernel keys
// the wait queue on the backing file and offset, not on the address.
const (
	futexWait = 0
	futexWake = 1
)

// FutexWait sleeps while *addr holds val, for at most timeout (no limit
// when timeout <= 0). It returns nil when woken, when *addr did not hold val
// on entry, or on a signal (callers re-check their condition in all these
// cases), and an error wrapping os.ErrDeadlineExceeded when the timeout
// expired. addr must be 4-byte aligned and mapped (MAP_SHARED for waking
// across processes).
//
// The calling goroutine's thread blocks in the kernel; the runtime hands
// its processor to other goroutines meanwhile.
func FutexWait(addr *atomic.Uint32, val uint32, timeout time.Duration) error {
	var ts *unix.Timespec
	if timeout > 0 {
		t := unix.NsecToTimespec(int64(timeout))
		ts = &t
	}
	_, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWait, uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
	switch e {
	case 0, unix.EAGAIN, unix.EINTR:
		return nil
	case unix.ETIMEDOUT:
		return fmt.Errorf("futex wait: %w", os.ErrDeadlineExceeded)
	}
	return os.NewSyscallError("futex wait", syscall.Errno(e))
}

// FutexWake wakes up to n waiters sleeping on addr (in any process that maps
// the same memory) and returns how many it woke.
func FutexWake(addr *atomic.Uint32, n int) (int, error) {
	r, _, e := unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), futexWake, uintptr(n), 0, 0, 0)
	if e != 0 {
		return 0, os.NewSyscallError("futex wake", syscall.Errno(e))
	}
	return int(r), nil
}
