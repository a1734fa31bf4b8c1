package sm

import (
	"os"
	"runtime"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gompi-org/gompi/internal/sys"
)

// The only unsafe code of the package: typed atomic views of the 4- and
// 8-byte words that processes share in a mapped segment, cmaCost's
// address of its own buffer, and the pinning of a buffer that another
// process writes by address (pinBytes). Everything else reads shared
// memory as bytes, through bounds-checked slices.

// word64 returns the 8-byte word of b at off. off must be 8-aligned
// relative to a page-aligned mapping, and off+8 <= len(b): it panics
// otherwise (a broken invariant: callers validate offsets read from shared
// memory first), so a bad offset can never reach outside b.
func word64(b []byte, off int) *atomic.Uint64 {
	if uint(off)+8 > uint(len(b)) || off&7 != 0 {
		panic("sm: shared word out of range or misaligned")
	}
	return (*atomic.Uint64)(unsafe.Pointer(unsafe.SliceData(b[off:])))
}

// word32 returns the 4-byte word of b at off (4-aligned, off+4 <= len(b)).
func word32(b []byte, off int) *atomic.Uint32 {
	if uint(off)+4 > uint(len(b)) || off&3 != 0 {
		panic("sm: shared word out of range or misaligned")
	}
	return (*atomic.Uint32)(unsafe.Pointer(unsafe.SliceData(b[off:])))
}

// cmaCost times a single-copy read of n bytes of own memory: the best of
// 64 after two unmeasured ones, on pages written first, so that a slow
// read (page faults, an interrupt) does not decide. 0 when a read fails.
func cmaCost(n int) time.Duration {
	src, dst := make([]byte, n), make([]byte, n)
	for i := range src {
		src[i], dst[i] = byte(i), byte(i>>8)
	}
	addr := uintptr(unsafe.Pointer(unsafe.SliceData(src)))
	best := time.Duration(0)
	for i := range 66 {
		t := time.Now()
		if err := sys.CMARead(os.Getpid(), dst, addr); err != nil {
			return 0
		}
		if d := time.Since(t); i >= 2 && (best == 0 || d < best) {
			best = d
		}
	}
	runtime.KeepAlive(src)
	return best
}

// pinBytes pins the memory under b (non-empty) with pin, so that it stays
// where it is while another process writes into it by address
// (sharedGet). Pin's argument escapes: b is in the heap, never on a
// goroutine's stack, which moves when it grows or shrinks.
func pinBytes(pin *runtime.Pinner, b []byte) {
	pin.Pin(unsafe.SliceData(b))
}
