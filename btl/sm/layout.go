package sm

import (
	"encoding/binary"
	"fmt"
	"math/bits"
)

// Segment layout. Every process owns one segment; offsets are from its
// start (page aligned), all regions 64-byte (cache line) aligned:
//
//	0       header page (4 KiB)
//	          line 0: identity (magic, version, pid, ranks, nonce, size)
//	          line 1: layout (region offsets and counts, below)
//	          line 2: state<<32 | sleepers       read by every sender on every send
//	          line 3: futex word (wake sequence) written by senders waking a sleeper
//	          line 4: FIFO tail                  contended by the producers
//	          line 5: fast boxes still available to senders
//	          line 6: help posts (shared Get, help.go)
//	          lines 8-63: help slots, one per requesting local rank (help.go)
//	fifoOff FIFO: fifoSlots 8-byte slot words (multi-producer, this process consumes)
//	fboxOff fboxCount fast boxes this process sends through: each a 64-byte
//	        control line (the receiver's consumed position) and a ring of
//	        fboxSize bytes
//	smallOff smallCount fragments of 64+smallCap bytes (eager sends)
//	largeOff largeCount fragments of 64+largeCap bytes (max_send_size sends)
//
// The owner writes the header once before it publishes the segment; a
// peer reads it once when it maps the segment, validates it against the
// mapping (layout.check) and from then on uses only its own copy.
const (
	headerSize = 4096
	line       = 64

	offMagic   = 0  // u64
	offVersion = 8  // u32
	offPid     = 12 // u32
	offRank    = 16 // u32 world rank
	offLocal   = 20 // u32 local rank
	offNonce   = 24 // u64
	offSize    = 32 // u64 segment size
	offLayout  = 64 // layout, 11 u32

	offState     = 128 // u64: state<<32 | sleepers
	offSeq       = 192 // u32 futex word
	offTail      = 256 // u64 FIFO tail position
	offFboxAvail = 320 // u64 (int64) fast boxes senders may still set up to this process

	segMagic   = 0x31534d4f504d4f47 // "GOMPOMS1"
	segVersion = 2

	fragHdr = 64 // fragment header bytes, before the payload
)

// Segment states (high half of the state word).
const (
	stateAlive  = 0
	stateClosed = 1 // the owner closed its module: sends to it fail with ErrClosed
	stateDead   = 2 // the owner was killed (test hook; real deaths are seen by pidfd)
	// stateUnmapped is never in a segment: it is the state a peer's
	// segment has for this process until it maps it (unmappedState).
	stateUnmapped = 3
)

// Limits that keep every index in its bit field (FIFO slot words and fast
// box entry headers carry them).
const (
	maxLocal     = 1 << 15 // local ranks (15 bits in a FIFO slot)
	maxFrags     = 1 << 15 // per class: small and large indexes share 16 bits
	maxFifoSlots = 1 << 20
	minFboxSize  = 256
	maxFboxSize  = 1 << 20
	maxSegment   = 1 << 31
)

// layout is where the regions of one segment are.
type layout struct {
	size                     int
	fifoOff, fifoSlots       int
	fboxOff, fboxCount       int
	fboxSize                 int
	smallOff, smallCount     int
	smallCap                 int
	largeOff, largeCount     int
	largeCap                 int
	fboxStride, smallStride  int
	largeStride, inlineLimit int // derived
}

func alignUp(n, a int) int { return (n + a - 1) &^ (a - 1) }

// plan computes the layout of a segment of size bytes for a process with
// nPeers local peers, given the fast box and fragment sizes.
func plan(size, fifoSlots, nPeers, fboxSize, fboxMax, smallCap, largeCap int) (layout, error) {
	l := layout{size: size, fifoSlots: fifoSlots, fboxSize: fboxSize,
		smallCap: alignUp(smallCap, line), largeCap: alignUp(largeCap, line)}
	off := headerSize
	l.fifoOff = off
	off = alignUp(off+8*fifoSlots, line)
	// A sender needs at most one fast box per peer; never more than a
	// quarter of the segment.
	stride := line + fboxSize
	l.fboxCount = min(nPeers, (size/4)/stride)
	if fboxMax <= 0 {
		l.fboxCount = 0
	}
	l.fboxOff = off
	off += l.fboxCount * stride
	rest := size - off
	if rest <= 0 {
		return l, fmt.Errorf("segment of %d bytes holds no fragments", size)
	}
	l.smallOff = off
	l.smallCount = min(maxFrags-1, rest/8/(fragHdr+l.smallCap))
	off += l.smallCount * (fragHdr + l.smallCap)
	l.largeOff = off
	l.largeCount = min(maxFrags-1, (size-off)/(fragHdr+l.largeCap))
	if l.smallCount < 4 || l.largeCount < 4 {
		return l, fmt.Errorf("segment of %d bytes holds %d eager and %d max-size fragments; want at least 4 of each", size, l.smallCount, l.largeCount)
	}
	return l, l.derive()
}

// derive fills the derived fields and checks the layout fits its segment:
// every region lies in [headerSize, size), counts and sizes are in range.
// It is what makes a peer's header safe to use.
func (l *layout) derive() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("segment layout: "+f, a...) }
	within := func(name string, off, n, stride int) error {
		if off < headerSize || off%line != 0 || n < 0 || stride <= 0 {
			return bad("%s at %d (count %d)", name, off, n)
		}
		if end := uint64(off) + uint64(n)*uint64(stride); end > uint64(l.size) {
			return bad("%s [%d,%d) beyond the %d-byte segment", name, off, end, l.size)
		}
		return nil
	}
	if l.size < headerSize || l.size > maxSegment {
		return bad("size %d", l.size)
	}
	if l.fifoSlots < 2 || l.fifoSlots > maxFifoSlots || bits.OnesCount(uint(l.fifoSlots)) != 1 {
		return bad("FIFO of %d slots", l.fifoSlots)
	}
	if err := within("FIFO", l.fifoOff, l.fifoSlots, 8); err != nil {
		return err
	}
	if l.fboxCount > 0 && (l.fboxSize < minFboxSize || l.fboxSize > maxFboxSize || bits.OnesCount(uint(l.fboxSize)) != 1) {
		return bad("fast box size %d", l.fboxSize)
	}
	if l.fboxCount > maxLocal {
		return bad("%d fast boxes", l.fboxCount)
	}
	l.fboxStride = line + l.fboxSize
	if err := within("fast boxes", l.fboxOff, l.fboxCount, l.fboxStride); err != nil {
		return err
	}
	for _, c := range []struct {
		name       string
		off, n, cp int
	}{{"eager fragments", l.smallOff, l.smallCount, l.smallCap}, {"max-size fragments", l.largeOff, l.largeCount, l.largeCap}} {
		if c.n >= maxFrags || c.cp <= 0 || c.cp%line != 0 || c.cp > 1<<30 {
			return bad("%s: %d of %d bytes", c.name, c.n, c.cp)
		}
		if err := within(c.name, c.off, c.n, fragHdr+c.cp); err != nil {
			return err
		}
	}
	l.smallStride = fragHdr + l.smallCap
	l.largeStride = fragHdr + l.largeCap
	// Inline fast-box entries: at most a quarter of the ring (as vader),
	// and what the 16-bit length fields can say.
	l.inlineLimit = min(l.fboxSize/4-entryHdr, 0xFFFF)
	return nil
}

// nfrags is the number of fragments, small ones first: index i < smallCount
// is small, the rest large.
func (l *layout) nfrags() int { return l.smallCount + l.largeCount }

// frag returns the offset and payload capacity of fragment i (i must be
// < nfrags()).
func (l *layout) frag(i int) (off, capacity int) {
	if i < l.smallCount {
		return l.smallOff + i*l.smallStride, l.smallCap
	}
	return l.largeOff + (i-l.smallCount)*l.largeStride, l.largeCap
}

// fbox returns the offset of fast box i's control line; its ring follows.
func (l *layout) fbox(i int) int { return l.fboxOff + i*l.fboxStride }

// writeHeader writes the identity and layout into the header page of seg.
func (l *layout) writeHeader(seg []byte, pid, rank, local int, nonce uint64) {
	le := binary.LittleEndian
	le.PutUint64(seg[offMagic:], segMagic)
	le.PutUint32(seg[offVersion:], segVersion)
	le.PutUint32(seg[offPid:], uint32(pid))
	le.PutUint32(seg[offRank:], uint32(rank))
	le.PutUint32(seg[offLocal:], uint32(local))
	le.PutUint64(seg[offNonce:], nonce)
	le.PutUint64(seg[offSize:], uint64(l.size))
	for i, v := range []int{l.fifoOff, l.fifoSlots, l.fboxOff, l.fboxCount, l.fboxSize,
		l.smallOff, l.smallCount, l.smallCap, l.largeOff, l.largeCount, l.largeCap} {
		le.PutUint32(seg[offLayout+4*i:], uint32(v))
	}
}

// segIdentity is what a segment's header says about its owner.
type segIdentity struct {
	pid, rank, local int
	nonce            uint64
}

// readHeader decodes and validates a peer's segment header against the
// mapping seg. It reads each shared field once.
func readHeader(seg []byte) (layout, segIdentity, error) {
	var l layout
	var id segIdentity
	if len(seg) < headerSize {
		return l, id, fmt.Errorf("segment of %d bytes", len(seg))
	}
	var h [offLayout + 4*11]byte
	copy(h[:], seg) // one read of the shared header
	le := binary.LittleEndian
	if m := le.Uint64(h[offMagic:]); m != segMagic {
		return l, id, fmt.Errorf("segment magic %#x", m)
	}
	if v := le.Uint32(h[offVersion:]); v != segVersion {
		return l, id, fmt.Errorf("segment version %d, want %d", v, segVersion)
	}
	id = segIdentity{pid: int(le.Uint32(h[offPid:])), rank: int(le.Uint32(h[offRank:])),
		local: int(le.Uint32(h[offLocal:])), nonce: le.Uint64(h[offNonce:])}
	if sz := le.Uint64(h[offSize:]); sz != uint64(len(seg)) {
		return l, id, fmt.Errorf("segment header says %d bytes, mapping has %d", sz, len(seg))
	}
	l.size = len(seg)
	f := func(i int) int { return int(le.Uint32(h[offLayout+4*i:])) }
	l.fifoOff, l.fifoSlots, l.fboxOff, l.fboxCount, l.fboxSize = f(0), f(1), f(2), f(3), f(4)
	l.smallOff, l.smallCount, l.smallCap = f(5), f(6), f(7)
	l.largeOff, l.largeCount, l.largeCap = f(8), f(9), f(10)
	return l, id, l.derive()
}
