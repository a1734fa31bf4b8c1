package convertor

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// TestKernels compares the block copies, fast and safe, with a byte loop for
// every block size with a special case and strides near, far, negative and
// zero.
func TestKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	kernels := []struct {
		name            string
		gather, scatter func(a, b []byte, off, stride, blen, n int)
	}{
		{"fast", gather, scatter},
		{"safe", gatherSafe, scatterSafe},
	}
	for _, k := range kernels {
		for _, blen := range []int{1, 2, 3, 4, 8, 16, 24, 100} {
			for _, stride := range []int{0, blen, blen + 3, 2 * blen, 2048, 4104, 5000, -blen, -4097} {
				n := 1 + r.IntN(9)
				if r.IntN(3) == 0 {
					n = 1025 + r.IntN(50) // a page-walk-bound run when stride ≥ 4 KiB
				}
				span := (n-1)*abs(stride) + blen
				mem := randBytes(r, span+7)
				off := 3
				if stride < 0 {
					off += (n - 1) * -stride
				}
				want := make([]byte, 0, n*blen)
				for i := range n {
					at := off + i*stride
					want = append(want, mem[at:at+blen]...)
				}
				out := make([]byte, n*blen)
				k.gather(out, mem, off, stride, blen, n)
				if !bytes.Equal(out, want) {
					t.Fatalf("%s gather blen %d stride %d n %d: %x, want %x", k.name, blen, stride, n, out, want)
				}
				if stride == 0 && n > 1 {
					continue // scatter onto one block: last write wins
				}
				back := make([]byte, len(mem))
				k.scatter(back, out, off, stride, blen, n)
				for i := range n {
					at := off + i*stride
					if !bytes.Equal(back[at:at+blen], mem[at:at+blen]) {
						t.Fatalf("%s scatter blen %d stride %d: block %d wrong", k.name, blen, stride, i)
					}
				}
			}
		}
	}
	// A run outside the memory is a broken invariant, reported by a panic
	// before any byte moves.
	defer func() {
		if recover() == nil {
			t.Fatal("gather outside memory did not panic")
		}
	}()
	gather(make([]byte, 16), make([]byte, 19), 4, 8, 8, 2) // the second block ends at 20
}

func abs(x int) int {
	if x < 0 {
		return -x
	}
	return x
}
