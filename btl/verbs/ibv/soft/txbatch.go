package soft

import "net/netip"

// txBatch collects packets for one destination before they go to the
// socket in as few system calls as the platform allows. A packet is a run
// of parts: its headers (in the arena), its payload (slices of registered
// memory, copied by the kernel straight from there) and its tail (pad and
// ICRC, in the arena). The owner builds packets, hands the batch to
// sock.send, then resets it; a batch is used by one goroutine at a time.
type txBatch struct {
	dst   netip.AddrPort
	arena []byte // fixed capacity: parts point into it until reset
	parts [][]byte
	pkts  []txPkt
	max   int // most packets per batch
	icrc  icrcScratch
}

// txPkt is one packet: parts[first:first+n], size bytes in all.
type txPkt struct {
	first, n int
	size     int
}

// maxHdr bounds a packet's headers; maxTail its pad and ICRC.
const (
	maxHdr  = bthLen + rethLen + aethLen + atomicETHLen + atomicAckLen + immLen
	maxTail = 3 + icrcLen
)

func newTxBatch(maxPkts int) *txBatch {
	return &txBatch{
		arena: make([]byte, 0, maxPkts*(maxHdr+maxTail+8)),
		parts: make([][]byte, 0, maxPkts*4),
		pkts:  make([]txPkt, 0, maxPkts),
		max:   maxPkts,
	}
}

func (b *txBatch) reset() {
	b.arena = b.arena[:0]
	clear(b.parts)
	b.parts = b.parts[:0]
	b.pkts = b.pkts[:0]
}

func (b *txBatch) full() bool { return len(b.pkts) >= b.max }

func (b *txBatch) empty() bool { return len(b.pkts) == 0 }

// alloc returns n zeroed bytes of the arena. The caller checked full()
// first; the arena holds max packets of headers and tails.
func (b *txBatch) alloc(n int) []byte {
	l := len(b.arena)
	if l+n > cap(b.arena) {
		panic("soft: txBatch arena overflow")
	}
	b.arena = b.arena[:l+n]
	s := b.arena[l : l+n : l+n]
	clear(s)
	return s
}

// begin starts a packet; part adds bytes to it; end closes it.
func (b *txBatch) begin() { b.pkts = append(b.pkts, txPkt{first: len(b.parts)}) }

func (b *txBatch) part(p []byte) {
	if len(p) == 0 {
		return
	}
	b.parts = append(b.parts, p)
	k := &b.pkts[len(b.pkts)-1]
	k.n++
	k.size += len(p)
}

// packetParts returns the parts of packet i.
func (b *txBatch) packetParts(i int) [][]byte {
	k := b.pkts[i]
	return b.parts[k.first : k.first+k.n]
}
