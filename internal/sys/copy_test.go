package sys

import (
	"bytes"
	"fmt"
	"testing"
)

func TestCopyCached(t *testing.T) {
	for _, n := range []int{0, 1, 4096, 1<<20 - 1, 1 << 20, 3<<20 + 17, 8 << 20, 8<<20 + 1} {
		src := make([]byte, n)
		for i := range src {
			src[i] = byte(i*7 + i>>11)
		}
		for _, dn := range []int{n, n / 2, n + 5} {
			dst := make([]byte, dn)
			want := make([]byte, dn)
			wn := copy(want, src)
			if got := CopyCached(dst, src); got != wn || !bytes.Equal(dst, want) {
				t.Fatalf("n=%d dst=%d: copied %d (want %d), bytes equal %v", n, dn, got, wn, bytes.Equal(dst, want))
			}
		}
	}
}

// BenchmarkCopyBackAndForth copies a buffer to another and back, as a
// ping-pong does: one op is both copies.
func BenchmarkCopyBackAndForth(b *testing.B) {
	for _, n := range []int{1 << 20, 4 << 20} {
		for _, f := range []struct {
			name string
			fn   func(dst, src []byte) int
		}{{"copy", func(d, s []byte) int { return copy(d, s) }}, {"CopyCached", CopyCached}} {
			b.Run(fmt.Sprintf("%s/size=%dMiB", f.name, n>>20), func(b *testing.B) {
				x, y := make([]byte, n), make([]byte, n)
				b.SetBytes(2 * int64(n))
				for b.Loop() {
					f.fn(y, x)
					f.fn(x, y)
				}
			})
		}
	}
}
