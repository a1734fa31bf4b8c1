//go:build amd64 || arm64 || 386 || ppc64le || ppc64 || s390x || loong64

package convertor

import "unsafe"

// The block copies of the walker. On these architectures unaligned loads and
// stores are allowed, so blocks of 1 to 16 bytes are moved with single
// integer loads and stores instead of a call to memmove per block. Every
// call checks its whole range against the slices first (the walker keeps
// within them by construction; the check makes a broken invariant a panic
// instead of a stray write), so the loops themselves need no bounds checks.

// pageWalkBound reports whether a gather of n blocks stride bytes apart
// touches more 4 KiB pages than a second-level TLB holds (1.5-2K entries on
// current x86 cores; 1024 leaves room for the stream and the rest). Such a
// gather is bound by page walks, and there the tight unsafe loop, which puts
// many more loads in flight, measured 20-40% slower on the reference machine
// (a KVM guest, where a page walk is two-dimensional) than the safe
// bounds-checked loop, which matches a hand-written Go loop. With fewer
// pages the tight loop is up to 2.4x faster than the safe one.
func pageWalkBound(stride, n int) bool {
	const page, tlb = 4096, 1024
	if stride < 0 {
		stride = -stride
	}
	pages := n
	if stride < page {
		pages = n / (page / max(stride, 1))
	}
	return pages > tlb
}

// gather copies n blocks of blen bytes, block k from mem[off+k*stride:],
// into out[:n*blen].
func gather(out, mem []byte, off, stride, blen, n int) {
	checkRun(len(out), len(mem), off, stride, blen, n)
	// Blocks other than 1, 2, 4, 8 or 16 bytes: one memmove each, as in
	// gatherSafe's default case, but written here: a call to gatherSafe
	// (its switch) measured 2-3 ns more on the halo-north pack (two 8160-
	// byte blocks, ~128 ns; six alternated runs of each test binary).
	if blen > 16 || blen&(blen-1) != 0 {
		o := 0
		for range n {
			copy(out[o:o+blen], mem[off:off+blen])
			o += blen
			off += stride
		}
		return
	}
	if pageWalkBound(stride, n) {
		gatherSafe(out, mem, off, stride, blen, n)
		return
	}
	q := unsafe.Pointer(unsafe.SliceData(out))
	p := unsafe.Pointer(unsafe.SliceData(mem))
	switch blen {
	case 1:
		for i := range n {
			*(*uint8)(unsafe.Add(q, i)) = *(*uint8)(unsafe.Add(p, off))
			off += stride
		}
	case 2:
		for i := range n {
			*(*uint16)(unsafe.Add(q, 2*i)) = *(*uint16)(unsafe.Add(p, off))
			off += stride
		}
	case 4:
		for i := range n {
			*(*uint32)(unsafe.Add(q, 4*i)) = *(*uint32)(unsafe.Add(p, off))
			off += stride
		}
	case 8:
		for i := range n {
			*(*uint64)(unsafe.Add(q, 8*i)) = *(*uint64)(unsafe.Add(p, off))
			off += stride
		}
	case 16:
		for i := range n {
			a := *(*uint64)(unsafe.Add(p, off))
			b := *(*uint64)(unsafe.Add(p, off+8))
			*(*uint64)(unsafe.Add(q, 16*i)) = a
			*(*uint64)(unsafe.Add(q, 16*i+8)) = b
			off += stride
		}
	}
}

// scatter copies in[:n*blen] into n blocks of blen bytes, block k at
// mem[off+k*stride:].
func scatter(mem, in []byte, off, stride, blen, n int) {
	checkRun(len(in), len(mem), off, stride, blen, n)
	q := unsafe.Pointer(unsafe.SliceData(in))
	p := unsafe.Pointer(unsafe.SliceData(mem))
	switch blen {
	case 1:
		for i := range n {
			*(*uint8)(unsafe.Add(p, off)) = *(*uint8)(unsafe.Add(q, i))
			off += stride
		}
	case 2:
		for i := range n {
			*(*uint16)(unsafe.Add(p, off)) = *(*uint16)(unsafe.Add(q, 2*i))
			off += stride
		}
	case 4:
		for i := range n {
			*(*uint32)(unsafe.Add(p, off)) = *(*uint32)(unsafe.Add(q, 4*i))
			off += stride
		}
	case 8:
		for i := range n {
			*(*uint64)(unsafe.Add(p, off)) = *(*uint64)(unsafe.Add(q, 8*i))
			off += stride
		}
	case 16:
		for i := range n {
			a := *(*uint64)(unsafe.Add(q, 16*i))
			b := *(*uint64)(unsafe.Add(q, 16*i+8))
			*(*uint64)(unsafe.Add(p, off)) = a
			*(*uint64)(unsafe.Add(p, off+8)) = b
			off += stride
		}
	default:
		o := 0
		for range n {
			copy(mem[off:off+blen], in[o:o+blen])
			o += blen
			off += stride
		}
	}
}
