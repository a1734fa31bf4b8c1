package convertor

import "fmt"

// The block copies under the walker: gather (pack) and scatter (unpack) move
// n blocks of blen bytes, block k at mem[off+k*stride:], from or to the
// packed side. copy_unsafe.go has the fast versions for architectures that
// allow unaligned loads; this file the portable ones.

// checkRun panics unless n blocks of blen bytes, the first at off and each
// next stride bytes further, lie within a memory slice of memLen bytes, and
// the packed side has at least n*blen bytes. The blocks lie on a line, so
// checking the first and the last suffices. The walker keeps within its
// memory by construction: a failure is a broken invariant.
func checkRun(streamLen, memLen, off, stride, blen, n int) {
	// The unsigned comparisons also refuse negative offsets.
	room := uint(memLen - blen)
	if n <= 0 || blen <= 0 || blen > memLen || streamLen < n*blen ||
		uint(off) > room || uint(off+(n-1)*stride) > room {
		badRun(streamLen, memLen, off, stride, blen, n)
	}
}

func badRun(streamLen, memLen, off, stride, blen, n int) {
	panic(fmt.Sprintf("convertor: invariant broken: %d blocks of %d bytes at %d step %d outside memory of %d bytes or stream of %d",
		n, blen, off, stride, memLen, streamLen))
}

// gatherSafe is gather in safe Go: fixed-size array copies for the small
// block sizes, copy() for the others.
func gatherSafe(out, mem []byte, off, stride, blen, n int) {
	out = out[:n*blen]
	switch blen {
	case 1:
		for i := range out {
			out[i] = mem[off]
			off += stride
		}
	case 2:
		for i := 0; i < len(out); i += 2 {
			*(*[2]byte)(out[i:]) = *(*[2]byte)(mem[off:])
			off += stride
		}
	case 4:
		for i := 0; i < len(out); i += 4 {
			*(*[4]byte)(out[i:]) = *(*[4]byte)(mem[off:])
			off += stride
		}
	case 8:
		for i := 0; i < len(out); i += 8 {
			*(*[8]byte)(out[i:]) = *(*[8]byte)(mem[off:])
			off += stride
		}
	case 16:
		for i := 0; i < len(out); i += 16 {
			*(*[16]byte)(out[i:]) = *(*[16]byte)(mem[off:])
			off += stride
		}
	default:
		for i := 0; i < len(out); i += blen {
			copy(out[i:i+blen], mem[off:off+blen])
			off += stride
		}
	}
}

// scatterSafe is scatter in safe Go.
func scatterSafe(mem, in []byte, off, stride, blen, n int) {
	in = in[:n*blen]
	switch blen {
	case 1:
		for _, b := range in {
			mem[off] = b
			off += stride
		}
	case 2:
		for i := 0; i < len(in); i += 2 {
			*(*[2]byte)(mem[off:]) = *(*[2]byte)(in[i:])
			off += stride
		}
	case 4:
		for i := 0; i < len(in); i += 4 {
			*(*[4]byte)(mem[off:]) = *(*[4]byte)(in[i:])
			off += stride
		}
	case 8:
		for i := 0; i < len(in); i += 8 {
			*(*[8]byte)(mem[off:]) = *(*[8]byte)(in[i:])
			off += stride
		}
	case 16:
		for i := 0; i < len(in); i += 16 {
			*(*[16]byte)(mem[off:]) = *(*[16]byte)(in[i:])
			off += stride
		}
	default:
		for i := 0; i < len(in); i += blen {
			copy(mem[off:off+blen], in[i:i+blen])
			off += stride
		}
	}
}
