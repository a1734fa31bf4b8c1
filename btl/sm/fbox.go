package sm

import (
	"fmt"
	"sync/atomic"

	"github.com/gompi-org/gompi/internal/atom"
)

// Fast boxes: one single-producer single-consumer byte ring per (sender,
// receiver) pair, in the sender's segment. The sender sets one up after
// btl_sm_fbox_threshold fragments to a peer and announces it on a FIFO
// fragment (flag setupFbox); from then on every fragment to that peer goes
// through the box, small ones inline and the others as a reference to a
// fragment (kind entryFrag), so the receiver sees them in send order.
//
// Ring entries start 16-byte aligned with an 8-byte header word:
//
//	bits  0-15 seq     entry count mod 2^16 (skips included)
//	bits 16-23 kind    entryInline, entrySkip or entryFrag
//	bits 24-31 tag
//	bits 32-47 hdrLen  inline: header bytes at the front of the payload
//	bits 48-63 len     inline: payload bytes; entryFrag: fragment index
//
// Publication: the producer copies the payload, writes zero into the header
// word that follows the entry, then stores the entry's header word with a
// release store (atom.StoreRel64: on amd64 a plain MOV, which unlike
// sync/atomic's XCHG does not wait for the line to arrive from the
// receiver's cache; Block covers the wake-up check it leaves unfenced).
// The consumer loads a header word atomically (acquire); zero means empty. Because the next header word is zeroed
// before an entry is published, the consumer never reads a stale header
// or payload bytes from an earlier lap as an entry (vader had to fix
// exactly this class of bug more than once: stale headers after wrap,
// header visible before the data). The seq field is a second check that
// catches a corrupted ring.
//
// The consumer publishes its position in the control line once per quarter
// ring consumed; the producer re-reads it only when the ring looks full,
// and refuses a position that moves backwards or beyond what it produced.
const (
	entryHdr    = 8
	entryAlign  = 16
	entryInline = 1
	entrySkip   = 2 // the rest of the ring is unused: continue at its start
	entryFrag   = 3 // the fragment with index len carries the payload
)

// entry is a decoded ring entry header.
type entry struct {
	kind   uint8
	tag    uint8
	hdrLen int
	n      int // inline: payload bytes; frag: fragment index
	next   int // bytes from this entry's start to the next entry's
}

func packEntry(seq uint16, kind, tag uint8, hdrLen, n int) uint64 {
	return uint64(seq) | uint64(kind)<<16 | uint64(tag)<<24 | uint64(hdrLen)<<32 | uint64(n)<<48
}

// decodeEntry decodes and validates header word w found at ring offset
// phys of a ring of size bytes whose inline entries may hold up to
// inlineLimit bytes, into *e. Any value of w yields either an entry that
// lies inside the ring or an error; it never panics. It fills *e in place
// rather than returning an entry: a five-field struct is copied through
// memory with wide loads of narrow stores, which stall (perf annotate of
// BenchmarkPMLRecvWindow put 59% of decodeEntry's samples on it).
func decodeEntry(e *entry, w uint64, phys, size, inlineLimit int, seq uint16) error {
	e.kind, e.tag, e.hdrLen, e.n = uint8(w>>16), uint8(w>>24), int(uint16(w>>32)), int(uint16(w>>48))
	if s := uint16(w); s != seq {
		return fmt.Errorf("fast box entry at %d: sequence %d, want %d", phys, s, seq)
	}
	if phys < 0 || phys%entryAlign != 0 || phys+entryHdr > size {
		return fmt.Errorf("fast box entry at bad offset %d", phys)
	}
	switch e.kind {
	case entryInline:
		if e.n > inlineLimit || e.hdrLen > e.n {
			return fmt.Errorf("fast box entry at %d: %d bytes (header %d), limit %d", phys, e.n, e.hdrLen, inlineLimit)
		}
		e.next = alignUp(entryHdr+e.n, entryAlign)
		if phys+e.next > size {
			return fmt.Errorf("fast box entry at %d: %d bytes run past the %d-byte ring", phys, e.n, size)
		}
	case entrySkip:
		if phys == 0 || w>>32 != 0 {
			return fmt.Errorf("fast box skip entry at %d (%#x)", phys, w)
		}
		e.next = size - phys
	case entryFrag:
		if e.hdrLen != 0 {
			return fmt.Errorf("fast box fragment entry at %d: header length %d", phys, e.hdrLen)
		}
		e.next = entryAlign
	default:
		return fmt.Errorf("fast box entry at %d: kind %d", phys, e.kind)
	}
	return nil
}

// txBox is the producer side of a fast box, in this process's segment.
// Guarded by the owning endpoint's send lock.
type txBox struct {
	index    int
	ring     []byte         // fboxSize bytes
	ctrl     *atomic.Uint64 // consumed position, written by the receiver
	size     uint64         // a power of two
	pos      uint64         // next entry position (monotonic; the offset is pos % size)
	seq      uint16
	consumed uint64 // last consumed position read from ctrl
}

func newTxBox(seg []byte, l *layout, index int) *txBox {
	off := l.fbox(index)
	return &txBox{index: index, ring: seg[off+line : off+line+l.fboxSize : off+line+l.fboxSize],
		ctrl: word64(seg, off), size: uint64(l.fboxSize)}
}

// errBoxFull: the ring has no room now; retry after the receiver polls.
var errBoxFull = fmt.Errorf("fast box full")

// reserve makes room for an entry of need bytes (aligned) and returns its
// ring offset, first writing a skip entry when the entry would not fit
// before the end of the ring. An error other than errBoxFull means the
// receiver published a consumed position that cannot be right.
func (b *txBox) reserve(need uint64) (int, error) {
	phys := b.pos & (b.size - 1)
	skip := uint64(0)
	if phys+need > b.size {
		skip = b.size - phys
	}
	total := skip + need + entryHdr // + the zeroed header word after the entry
	if b.pos+total-b.consumed > b.size {
		c := b.ctrl.Load()
		if c < b.consumed || c > b.pos {
			return 0, fmt.Errorf("fast box %d: receiver reports consumed position %d outside [%d,%d]", b.index, c, b.consumed, b.pos)
		}
		b.consumed = c
		if b.pos+total-b.consumed > b.size {
			return 0, errBoxFull
		}
	}
	if skip > 0 {
		putZero(b.ring, 0)
		word64(b.ring, int(phys)).Store(packEntry(b.seq, entrySkip, 0, 0, 0))
		b.seq++
		b.pos += skip
		phys = 0
	}
	return int(phys), nil
}

// fits returns the ring offset of an entry of need bytes when it fits
// before the ring's end in room known to be consumed: reserve's common
// case, tested inline by the callers (reserve is a call; with fits at its
// top and the rest in a second function it still costs 118 against the
// inliner's budget of 80).
func (b *txBox) fits(need uint64) (int, bool) {
	phys := b.pos & (b.size - 1)
	return int(phys), phys+need <= b.size && b.pos+need+entryHdr-b.consumed <= b.size
}

// publish ends the entry reserved at phys: zero the next header word, then
// store the header (release). With sync/atomic's Store here (an XCHG,
// which waits for the ring's line to come over from the receiving core)
// rate 8 B was 8.56 against 10.1 M/s with this one, 25 alternated runs.
func (b *txBox) publish(phys int, need uint64, w uint64) {
	b.pos += need
	putZero(b.ring, int(b.pos&(b.size-1)))
	atom.StoreRel64(word64(b.ring, phys), w)
	b.seq++
}

// putInline copies h and data into the ring as one inline entry.
func (b *txBox) putInline(tag uint8, h *header, data []byte) error {
	hn := h.len()
	n := hn + len(data)
	need := uint64(alignUp(entryHdr+n, entryAlign))
	phys, ok := b.fits(need)
	if !ok {
		var err error
		if phys, err = b.reserve(need); err != nil {
			return err
		}
	}
	p := phys + entryHdr
	// The receiver spins on the entry's first cache line (its header
	// word): write that line last, so that it is taken from the
	// receiver's cache once per entry rather than once for the bytes
	// that start the payload and again for the header. With the PML's
	// receive free list, which made the receiver fast enough to spin on
	// that line while the sender wrote it (rate 512 B 2.68 -> 2.03 M/s),
	// both together gave 512 B latency 0.517 -> 0.447 us and rate 2.73 ->
	// 2.81 M/s (bench/ab.sh). The ring starts on a line.
	cut := (phys | (line - 1)) + 1
	if k := cut - p; p+n > cut && k >= hn {
		copy(b.ring[cut:], data[k-hn:])
		h.put(b.ring[p:], 0, hn)
		copy(b.ring[p+hn:cut], data[:k-hn])
	} else if p+n > cut {
		h.put(b.ring[cut:], k, hn)
		copy(b.ring[cut+hn-k:], data)
		h.put(b.ring[p:cut], 0, k)
	} else {
		h.putAll(b.ring[p:])
		copy(b.ring[p+hn:], data)
	}
	b.publish(phys, need, packEntry(b.seq, entryInline, tag, hn, n))
	return nil
}

// putWords is putInline for a 16-byte header given as two words whose
// entry fits in room known to be free and within one cache line (data up
// to 40 bytes, within the inline limit of the smallest box): false, with
// nothing written, otherwise. With SendImmediateHeader's short path, 169
// fewer instructions a message than putInline's (bench/instr.sh).
//
// It is written out rather than built on fits and publish, with every
// check and computation ahead of its first store into the ring: it is on
// the critical path of a ping-pong, where the receiver polls the entry's
// line, and the stores then follow one another with no call between them
// but the copy of a payload other than one word.
func (b *txBox) putWords(tag uint8, h0, h1 uint64, data []byte) bool {
	n := 16 + len(data)
	need := uint64(alignUp(entryHdr+n, entryAlign))
	pos := b.pos
	phys := pos & (b.size - 1)
	// Within the line (the ring, a power of two of at least 256 bytes,
	// is made of whole lines, so the entry is within the ring too), and
	// the entry with the zeroed header word after it within consumed room.
	if phys&(line-1)+need > line || pos+need+entryHdr-b.consumed > b.size {
		return false
	}
	next := pos + need
	ent := b.ring[phys : phys+entryHdr+uint64(n)]
	zero := b.ring[next&(b.size-1):]
	hw := word64(ent, 0)
	w := packEntry(b.seq, entryInline, tag, 16, n)
	b.pos, b.seq = next, b.seq+1
	if phys&(line-1) == 0 {
		// The ring's next line was last read by the receiver: ask for it
		// now, so that it is here by the time a send writes it (rate 8 B
		// 6.93 -> 8.23 M/s, 25 alternated runs). Before the entry's
		// stores: after them, the 8 B ping-pong measured 3 ns slower.
		atom.PrefetchW(&b.ring[(phys+line)&(b.size-1)])
	}
	le.PutUint64(ent[entryHdr:], h0)
	le.PutUint64(ent[entryHdr+8:], h1)
	if len(data) == 8 { // one word (a float64, a count): no call
		le.PutUint64(ent[entryHdr+16:], le.Uint64(data))
	} else {
		copy(ent[entryHdr+16:], data)
	}
	clear(zero[:entryHdr])
	atom.StoreRel64(hw, w)
	return true
}

// putLine is putInline for a header given as bytes (the PML's RNDV, ACK
// and other control headers) on its common path: an entry within the
// box's inline limit and before the ring's end, in room known to be free:
// false, with nothing written, otherwise. Like putInline it writes the
// lines after the entry's first before the first, so that the receiver,
// spinning on the first line's header word, takes that line once.
// Against putInline behind sendImmediate's general checks, a synchronous
// send's RNDV and ACK cost 263 fewer instructions a message (bench/instr.sh's
// ssend ping-pong with both RNDVs finding their receive posted: 4705.7 ->
// 4442.4).
func (b *txBox) putLine(tag uint8, hdr, data []byte) bool {
	hn := len(hdr)
	n := hn + len(data)
	need := uint64(alignUp(entryHdr+n, entryAlign))
	pos := b.pos
	phys := pos & (b.size - 1)
	if phys+need > b.size || pos+need+entryHdr-b.consumed > b.size {
		return false
	}
	next := pos + need
	ent := b.ring[phys : phys+entryHdr+uint64(n)]
	zero := b.ring[next&(b.size-1):]
	hw := word64(ent, 0)
	w := packEntry(b.seq, entryInline, tag, hn, n)
	b.pos, b.seq = next, b.seq+1
	first := int(line - phys&(line-1)) // the entry's bytes in its first line
	switch k := first - entryHdr; {    // of which header and data
	case first >= len(ent):
		copy(ent[entryHdr:], hdr)
		copy(ent[entryHdr+hn:], data)
	case k >= hn:
		copy(ent[first:], data[k-hn:])
		copy(ent[entryHdr:], hdr)
		copy(ent[entryHdr+hn:first], data[:k-hn])
	default:
		copy(ent[first:], hdr[k:])
		copy(ent[first+hn-k:], data)
		copy(ent[entryHdr:first], hdr[:k])
	}
	clear(zero[:entryHdr])
	atom.StoreRel64(hw, w)
	return true
}

// putWordsLong is putWords for an entry that goes on past its first
// cache line (a payload of 41 bytes or more), within the box's inline
// limit and before the ring's end, with the entry's three words in its
// first line: false, with nothing written, otherwise. The lines after the
// first are written first, as putInline does, so that the receiver takes
// the first line from this core once, with the entry complete. A function
// of its own so that putWords, the 8-byte ping-pong's, keeps its
// instructions (bench/instr.sh). Against putInline: latency 64 B 0.154
// -> 0.145 us, 512 B 0.238 -> 0.229, rate 64 B 10.9 -> 11.6 M/s
// (bench/ab.sh, QUIET_NS=60, 6-8 alternated rounds).
func (b *txBox) putWordsLong(tag uint8, h0, h1 uint64, data []byte) bool {
	n := 16 + len(data)
	need := uint64(alignUp(entryHdr+n, entryAlign))
	pos := b.pos
	phys := pos & (b.size - 1)
	off := phys & (line - 1)
	if off+entryHdr+16 > line || phys+need > b.size || uint64(n) > min(b.size/4-entryHdr, 0xFFFF) || pos+need+entryHdr-b.consumed > b.size {
		return false
	}
	next := pos + need
	ent := b.ring[phys : phys+entryHdr+uint64(n)]
	zero := b.ring[next&(b.size-1):]
	hw := word64(ent, 0)
	w := packEntry(b.seq, entryInline, tag, 16, n)
	b.pos, b.seq = next, b.seq+1
	k := min(line-off-entryHdr-16, uint64(len(data))) // payload bytes in the first line
	copy(ent[line-off:], data[k:])
	le.PutUint64(ent[entryHdr:], h0)
	le.PutUint64(ent[entryHdr+8:], h1)
	copy(ent[entryHdr+16:], data[:k])
	clear(zero[:entryHdr])
	atom.StoreRel64(hw, w)
	return true
}

// putFrag queues a reference to fragment idx.
func (b *txBox) putFrag(idx int) error {
	phys, err := b.reserve(entryAlign)
	if err != nil {
		return err
	}
	b.publish(phys, entryAlign, packEntry(b.seq, entryFrag, 0, 0, idx))
	return nil
}

// putZero writes a zero header word at off with a plain store: it is
// ordered before the atomic store that publishes the entry in front of it.
func putZero(ring []byte, off int) {
	clear(ring[off : off+entryHdr])
}

// rxBox is the consumer side of a peer's fast box: the ring lives in the
// peer's segment. Guarded by the module's poll lock.
type rxBox struct {
	p            *peer
	index        int
	ring         []byte
	ctrl         *atomic.Uint64
	size         int
	mask         uint64 // size-1 (size is a power of two)
	inlineLimit  int
	pos          uint64
	seq          uint16
	published    uint64 // last position stored in ctrl
	publishEvery uint64 // size/4
}

func newRxBox(p *peer, index int) *rxBox {
	off := p.lay.fbox(index)
	return &rxBox{p: p, index: index, ring: p.seg[off+line : off+line+p.lay.fboxSize : off+line+p.lay.fboxSize],
		ctrl: word64(p.seg, off), size: p.lay.fboxSize, mask: uint64(p.lay.fboxSize - 1),
		inlineLimit: p.lay.inlineLimit, publishEvery: uint64(p.lay.fboxSize / 4)}
}
