package sys

import (
	"golang.org/x/sys/unix"
)

// HugePage is the size of a transparent huge page on the platforms gompi
// runs on (x86-64, arm64 with 4 KiB pages).
const HugePage = 2 << 20

// HugeRegions appends to dst the addresses of the HugePage-aligned regions
// that b overlaps, and returns it.
func HugeRegions(dst []uintptr, b []byte) []uintptr {
	if len(b) == 0 {
		return dst
	}
	base := Addr(b)
	end := base + uintptr(len(b))
	for r := base &^ (HugePage - 1); r < end; r += HugePage {
		dst = append(dst, r)
	}
	return dst
}

// HugeCover returns how many bytes of the HugePage-aligned region at r
// lie inside b.
func HugeCover(r uintptr, b []byte) int {
	base := Addr(b)
	end := base + uintptr(len(b))
	lo, hi := max(base, r), min(end, r+HugePage)
	if hi <= lo {
		return 0
	}
	return int(hi - lo)
}

// Collapse asks the kernel to back the HugePage-aligned region at addr of
// this process's anonymous memory with a transparent huge page (madvise
// MADV_COLLAPSE, Linux 6.1 and later). The contents stay as they are
// (pages not populated yet read zero, as before, but take memory now);
// other threads may use the memory meanwhile. It takes the time of
// allocating a huge page and copying the region (4.6-6.3 ms on this
// project's machine, more when memory must be compacted; 1-95 µs for a
// region that is huge already). EINVAL:
// not possible here (an older kernel, huge pages disabled, the region not
// in one anonymous mapping or marked MADV_NOHUGEPAGE); EAGAIN, ENOMEM: not
// now. The address is passed as a number: the region may extend beyond
// the Go object it was found from.
func Collapse(addr uintptr) error {
	if _, _, e := unix.Syscall(unix.SYS_MADVISE, addr, HugePage, unix.MADV_COLLAPSE); e != 0 {
		return e
	}
	return nil
}
