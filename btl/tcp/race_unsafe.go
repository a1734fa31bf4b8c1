//go:build linux && race

package tcp

import (
	"runtime"
	"unsafe"
)

// The raw reads and writes of sock_unsafe.go are invisible to the race
// detector. These tell it what unix.Read and unix.Writev tell it: the
// bytes a read stored, the bytes a write loaded, and an ordering from
// every write to every later read (a peer in the same process reads what
// was written only through the kernel).
var ioSync int64

func raceRead(p []byte, n int) {
	if n > 0 {
		runtime.RaceWriteRange(unsafe.Pointer(&p[0]), n)
	}
	runtime.RaceAcquire(unsafe.Pointer(&ioSync))
}

func raceWrite(iov [][]byte) {
	runtime.RaceReleaseMerge(unsafe.Pointer(&ioSync))
	for _, b := range iov {
		if len(b) > 0 {
			runtime.RaceReadRange(unsafe.Pointer(&b[0]), len(b))
		}
	}
}
