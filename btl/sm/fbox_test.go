package sm

import (
	"bytes"
	"testing"
)

// TestPutLineWritesWhatPutInlineWrites: the fast path for byte headers
// leaves the ring exactly as the general one would (header word, header,
// payload, the zeroed word after the entry), for every start within a
// cache line, and so for every split of the entry across its first line;
// and it refuses, writing nothing, what it cannot place in one piece.
func TestPutLineWritesWhatPutInlineWrites(t *testing.T) {
	const size = 1024
	lay := layout{fboxOff: 0, fboxSize: size, fboxCount: 1, fboxStride: line + size}
	pattern := func(n int, base byte) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = base + byte(i)
		}
		return b
	}
	for start := 0; start < 2*line; start += entryAlign {
		for _, hn := range []int{0, 8, 16, 32, 40, 48} {
			for _, dn := range []int{0, 1, 8, 13, 40, 64, 100} {
				hdr, data := pattern(hn, 0x10), pattern(dn, 0x80)
				var rings [2][]byte
				for i := range rings {
					seg := bytes.Repeat([]byte{0xEE}, line+size)
					tx := newTxBox(seg, &lay, 0)
					tx.pos, tx.consumed, tx.seq = uint64(start), uint64(start), 7
					if i == 0 {
						h := bytesHeader(hdr)
						if err := tx.putInline(0x41, &h, data); err != nil {
							t.Fatalf("putInline start %d hdr %d data %d: %v", start, hn, dn, err)
						}
					} else if !tx.putLine(0x41, hdr, data) {
						t.Fatalf("putLine start %d hdr %d data %d: refused", start, hn, dn)
					}
					rings[i] = tx.ring
				}
				if !bytes.Equal(rings[0], rings[1]) {
					t.Fatalf("start %d hdr %d data %d: putLine's ring differs from putInline's", start, hn, dn)
				}
			}
		}
	}
	// No room before the ring's end (that needs a skip entry), or none
	// consumed: refused, nothing written.
	for _, c := range []struct{ pos, consumed uint64 }{{size - 16, size - 16}, {size, 8}} {
		seg := bytes.Repeat([]byte{0xEE}, line+size)
		tx := newTxBox(seg, &lay, 0)
		tx.pos, tx.consumed = c.pos, c.consumed
		if tx.putLine(0x41, make([]byte, 32), make([]byte, 8)) {
			t.Fatalf("putLine at %d with %d consumed: accepted", c.pos, c.consumed)
		}
		if !bytes.Equal(seg, bytes.Repeat([]byte{0xEE}, line+size)) || tx.pos != c.pos {
			t.Fatalf("putLine at %d with %d consumed: refused but wrote", c.pos, c.consumed)
		}
	}
}
