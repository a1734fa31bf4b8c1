package sm

import (
	"encoding/binary"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/sys"
)

// FuzzDecodeEntry: any header word at any offset either decodes to an
// entry that lies inside the ring or is refused; nothing panics.
func FuzzDecodeEntry(f *testing.F) {
	const size, limit = 4096, 4096/4 - entryHdr
	f.Add(packEntry(0, entryInline, 0x41, 16, 24), 0, uint16(0))
	f.Add(packEntry(7, entryInline, 0x41, 0, limit), 4096-1024, uint16(7))
	f.Add(packEntry(3, entrySkip, 0, 0, 0), 4000, uint16(3))
	f.Add(packEntry(9, entryFrag, 0, 0, 12), 16, uint16(9))
	f.Add(^uint64(0), 4080, uint16(0xFFFF))
	f.Fuzz(func(t *testing.T, w uint64, phys int, seq uint16) {
		var e entry
		err := decodeEntry(&e, w, phys, size, limit, seq)
		if err != nil {
			return
		}
		if phys < 0 || phys%entryAlign != 0 || e.next <= 0 || phys+e.next > size {
			t.Fatalf("entry %+v at %d accepted outside a %d-byte ring", e, phys, size)
		}
		if e.kind == entryInline && (e.hdrLen > e.n || phys+entryHdr+e.n > size) {
			t.Fatalf("inline entry %+v at %d overflows", e, phys)
		}
	})
}

// fuzzPeer is a sender's segment in Go memory, seen by a receiver module
// that has no segment of its own: enough for pollBox and recvFrag.
type fuzzPeer struct {
	m   *Module
	p   *peer
	box *rxBox
	seg []byte
}

func newFuzzPeer(t testing.TB) *fuzzPeer {
	lay, err := plan(1<<20, 64, 1, 256, 1, 4096, 32768)
	if err != nil {
		t.Fatal(err)
	}
	seg := make([]byte, lay.size)
	lay.writeHeader(seg, 1, 1, 1, 1)
	d := &btl.Dispatcher{}
	m := &Module{local: 0, env: &btl.Env{Dispatch: d, Logf: func(string, ...any) {}}}
	p := &peer{m: m, local: 1, rank: 1, seg: seg, lay: lay}
	p.ep = &endpoint{m: m, p: p}
	lo, hi := sys.Addr(seg), sys.Addr(seg)+uintptr(len(seg))
	inside := func(b []byte) bool {
		return len(b) == 0 || (sys.Addr(b) >= lo && sys.Addr(b)+uintptr(len(b)) <= hi)
	}
	for tag := range 256 {
		d.Register(btl.Tag(tag), func(_ btl.Endpoint, hdr, data []byte) {
			if !inside(hdr) || !inside(data) {
				t.Fatalf("dispatched bytes outside the sender's segment")
			}
			for range hdr { // touch every byte
			}
			_ = append([]byte(nil), data...)
		})
	}
	return &fuzzPeer{m: m, p: p, box: newRxBox(p, 0), seg: seg}
}

// reset clears the ring and the fragment headers between inputs.
func (fp *fuzzPeer) reset(seq uint16) {
	clear(fp.box.ring)
	for i := range fp.p.lay.nfrags() {
		off, _ := fp.p.lay.frag(i)
		clear(fp.seg[off : off+fragHdr])
	}
	fp.p.failed.Store(nil)
	fp.box.pos, fp.box.seq = 0, seq
}

// FuzzFastBoxRing feeds arbitrary ring contents (and fragment headers) to
// the receiver: it dispatches only bytes inside the sender's segment,
// fails the peer on garbage, and never panics.
func FuzzFastBoxRing(f *testing.F) {
	// Seed: a ring written by the real producer, with every entry kind.
	{
		seg := make([]byte, 1<<16)
		lay := layout{fboxOff: 0, fboxSize: 256, fboxCount: 1, fboxStride: line + 256}
		tx := newTxBox(seg, &lay, 0)
		h1 := bytesHeader([]byte("header"))
		tx.putInline(0x41, &h1, []byte("data"))
		tx.putFrag(3)
		h2 := bytesHeader(nil)
		tx.putInline(0x42, &h2, make([]byte, 40))
		h3 := bytesHeader(make([]byte, 16))
		tx.putInline(0x43, &h3, make([]byte, 100)) // wraps: skip entry
		frag := make([]byte, 24)
		binary.LittleEndian.PutUint64(frag[8:], packFragMeta(0x41, 0, 4, 100))
		binary.LittleEndian.PutUint64(frag[16:], 0)
		f.Add(append([]byte(nil), tx.ring...), frag, uint16(0))
	}
	f.Add(make([]byte, 256), make([]byte, 24), uint16(0))
	fp := newFuzzPeer(f)
	f.Fuzz(func(t *testing.T, ring, frag []byte, seq uint16) {
		fp.reset(seq)
		copy(fp.box.ring, ring)
		// The fuzzer's fragment header goes to every fragment.
		for i := range fp.p.lay.nfrags() {
			off, _ := fp.p.lay.frag(i)
			copy(fp.seg[off:off+24], frag)
		}
		for range 4 {
			fp.m.pollBox(fp.box, 64)
			if fp.p.failed.Load() != nil {
				break
			}
		}
	})
}

// FuzzReadHeader: a peer's segment header either validates to a layout
// whose regions all lie inside the mapping, or is refused.
func FuzzReadHeader(f *testing.F) {
	lay, err := plan(1<<20, 4096, 3, 4096, 32, 4096, 32768)
	if err != nil {
		f.Fatal(err)
	}
	seg := make([]byte, lay.size)
	lay.writeHeader(seg, 100, 2, 1, 42)
	f.Add(append([]byte(nil), seg[:offLayout+44]...))
	f.Fuzz(func(t *testing.T, hdr []byte) {
		clear(seg[:headerSize])
		copy(seg, hdr)
		l, _, err := readHeader(seg)
		if err != nil {
			return
		}
		if end := l.fifoOff + 8*l.fifoSlots; end > len(seg) {
			t.Fatalf("FIFO ends at %d", end)
		}
		if l.fboxCount > 0 && l.fbox(l.fboxCount-1)+l.fboxStride > len(seg) {
			t.Fatal("fast boxes past the end")
		}
		if n := l.nfrags(); n > 0 {
			off, c := l.frag(n - 1)
			if off+fragHdr+c > len(seg) {
				t.Fatal("fragments past the end")
			}
		}
	})
}
