package sys

// cachedChunk is the largest piece CopyCached hands to copy(): below 1 MiB
// the runtime's memmove on amd64 writes through the cache, from 1 MiB on it
// uses non-temporal stores, which send the destination to memory.
const cachedChunk = 512 << 10

// cachedMax is the largest copy CopyCached keeps in the cache: two buffers
// of this size (a ping-pong's) fit in the last-level cache of the
// machines gompi is measured on (32 MiB or more). Larger copies stream as
// copy() does.
const cachedMax = 8 << 20

// CopyCached is copy(dst, src) that leaves the destination in the cache for
// copies of up to 8 MiB. A message copied into a receiver's buffer is
// usually read (or sent back) soon after; the runtime's copy of 1 MiB or
// more bypasses the cache, so the next copy of those bytes reads them from
// memory: two 4 MiB copies back and forth run at about half the speed of
// one repeated copy (BenchmarkCopyBackAndForth in this package).
func CopyCached(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < 1<<20 || n > cachedMax {
		return copy(dst, src)
	}
	for off := 0; off < n; off += cachedChunk {
		e := min(off+cachedChunk, n)
		copy(dst[off:e], src[off:e])
	}
	return n
}
