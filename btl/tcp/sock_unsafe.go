//go:build linux

package tcp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// The raw system calls of sock_linux.go, which hand Go memory to the kernel
// by address.

// sysRead is read(2) into p (len(p) > 0). It and sysWritev are raw system
// calls, without telling the scheduler: the descriptor is non-blocking, so
// they return as soon as the kernel has copied what fits, and the copy is
// this rank's work anyway. Through the scheduler, a call longer than 20 us
// (a 4 MiB write into loopback) had its P handed to another thread, which
// then competed for a core with the peer (4 MiB bw 4.7 -> 6.3-6.6 GB/s,
// 1 MiB 5.4 -> 7.1 GB/s with raw calls, three alternated runs of
// gompi-bench bw; docs/PERFORMANCE.md); a short call saves
// entersyscall/exitsyscall. poll(2), which sleeps, still goes through the
// scheduler.
func sysRead(fd int, p []byte) (int, error) {
	// (The pointer conversion stays inside the call: unsafe.Pointer rule 4.)
	r, _, e := unix.RawSyscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(unsafe.SliceData(p))), uintptr(len(p)))
	if e != 0 {
		return 0, e
	}
	raceRead(p, int(r))
	return int(r), nil
}

// sysWritev writes part (at most iovMax slices) with one writev(2).
func (s *sock) sysWritev(part [][]byte) (int, error) {
	raceWrite(part)
	for i, b := range part {
		s.wiov[i] = unix.Iovec{Base: unsafe.SliceData(b)}
		s.wiov[i].SetLen(len(b))
	}
	r, _, e := unix.RawSyscall(unix.SYS_WRITEV, uintptr(s.fd), uintptr(unsafe.Pointer(&s.wiov[0])), uintptr(len(part)))
	clear(s.wiov[:len(part)]) // drop the references to the caller's buffers
	if e != 0 {
		return 0, e
	}
	return int(r), nil
}

// sysPeek is a non-blocking recv(2) of one byte with MSG_PEEK, consuming
// nothing: whether a read would not block. Raw like sysRead: through the
// scheduler, each call woke sysmon when every P of the rank had been idle
// (entersyscall does), one more thread to run per message when ranks
// outnumber cores.
func (s *sock) sysPeek() unix.Errno {
	_, _, e := unix.RawSyscall6(unix.SYS_RECVFROM, uintptr(s.fd), uintptr(unsafe.Pointer(&s.peek[0])), 1, unix.MSG_PEEK|unix.MSG_DONTWAIT, 0, 0)
	return e
}
