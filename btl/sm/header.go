package sm

// header is the header part of a fragment: bytes (SendImmediate, Send) or
// a 16-byte header as two little-endian words (SendImmediateHeader). The
// words are written with 8-byte stores: copying a [16]byte built by
// narrower stores loads it 16 bytes at a time, and that load waits for the
// stores to retire instead of taking their data (a failed store forward).
type header struct {
	b        []byte
	w0, w1   uint64
	useWords bool
}

func bytesHeader(b []byte) header { return header{b: b} }

func (h *header) len() int {
	if h.useWords {
		return 16
	}
	return len(h.b)
}

// putAll writes the whole header at the start of dst: put(dst, 0, len),
// small enough to be inlined into putInline for an entry within one line.
func (h *header) putAll(dst []byte) {
	if h.useWords {
		le.PutUint64(dst, h.w0)
		le.PutUint64(dst[8:], h.w1)
		return
	}
	copy(dst, h.b)
}

// put writes header bytes [lo, hi) at the start of dst. For words, lo and
// hi are multiples of 8 (entries and their payloads are 8-aligned).
func (h *header) put(dst []byte, lo, hi int) {
	if !h.useWords {
		copy(dst, h.b[lo:hi])
		return
	}
	if lo%8 != 0 || hi%8 != 0 {
		var b [16]byte
		le.PutUint64(b[:], h.w0)
		le.PutUint64(b[8:], h.w1)
		copy(dst, b[lo:hi])
		return
	}
	if lo == 0 && hi >= 8 {
		le.PutUint64(dst, h.w0)
	}
	if lo <= 8 && hi == 16 {
		le.PutUint64(dst[8-lo:], h.w1)
	}
}
