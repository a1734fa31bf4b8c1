package soft

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// icrcLen is the size of the invariant CRC that ends every packet.
const icrcLen = 4

// flow is what the ICRC covers of a packet's IP and UDP headers: the
// addresses and ports. The kernel builds those headers, so both ends
// rebuild them here as the IBA annex for RoCEv2 describes, with the
// variant fields masked to ones (IPv4 TOS, TTL and checksum; IPv6 traffic
// class, flow label and hop limit; the UDP checksum).
//
// The IPv4 identification field is not masked by the annex. This device
// sends with DF set on an unconnected socket, for which Linux writes an
// identification of zero, so the rebuilt header uses zero.
type flow struct {
	src, dst     netip.Addr
	sport, dport uint16
}

var ones8 = [8]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// icrcScratch computes the start of packets' ICRCs: the masked IP and UDP
// headers depend only on the flow and the UDP length, so the CRC state
// after them is kept for the last few (flow, length) pairs (most packets
// of a transfer are full-MTU packets of one flow) and only the BTH is
// added per packet. Its owner reuses it so that no packet allocates.
type icrcScratch struct {
	ph    [40 + 8]byte // the masked IP and UDP headers, laid out on a miss
	cache [icrcCacheLen]icrcHead
	next  int // the entry a miss replaces
	last  int // the entry the last packet used, looked at first
}

// icrcCacheLen is how many (flow, UDP length) pairs an icrcScratch keeps.
const icrcCacheLen = 4

// icrcHead is the CRC state after ones8, the IP header and the UDP header
// of packets of one flow and UDP length.
type icrcHead struct {
	f      flow
	udpLen int
	crc    uint32
	valid  bool
}

// start returns the CRC state after the masked pseudo-LRH, IP header,
// UDP header and BTH of a packet whose UDP payload (BTH to ICRC) is
// udpLen bytes. hdr starts with the BTH.
func (s *icrcScratch) start(f *flow, udpLen int, hdr []byte) uint32 {
	if e := &s.cache[s.last%icrcCacheLen]; e.matches(f, udpLen) {
		return crcBTH(e.crc, hdr)
	}
	var c uint32
	hit := false
	for i := range s.cache {
		if e := &s.cache[i]; e.matches(f, udpLen) {
			c, hit, s.last = e.crc, true, i
			break
		}
	}
	if !hit {
		c = s.head(f, udpLen)
		s.cache[s.next] = icrcHead{f: *f, udpLen: udpLen, crc: c, valid: true}
		s.last = s.next
		s.next = (s.next + 1) % icrcCacheLen
	}
	return crcBTH(c, hdr)
}

// matches reports whether e holds the state for f and udpLen: the
// lengths and ports first, which are cheap to compare and differ first.
func (e *icrcHead) matches(f *flow, udpLen int) bool {
	return e.valid && e.udpLen == udpLen && e.f.sport == f.sport && e.f.dport == f.dport &&
		e.f.src == f.src && e.f.dst == f.dst
}

// crcBTH continues a CRC over the BTH at the start of b, with byte 4
// (FECN, BECN and the six reserved bits) masked to ones, without writing
// to b: three four-byte steps.
func crcBTH(c uint32, b []byte) uint32 {
	_ = b[bthLen-1]
	c = crcWord(^c ^ binary.LittleEndian.Uint32(b))
	c = crcWord(c ^ (binary.LittleEndian.Uint32(b[4:]) | 0xff))
	c = crcWord(c ^ binary.LittleEndian.Uint32(b[8:]))
	return ^c
}

// crcBytes continues a CRC over b with the same result as crc32.Update,
// four bytes a step. It is for headers and pads of a few bytes, for which
// crc32.Update's dispatch (a once-check, then its table-driven code for
// inputs under 64 bytes) costs more than the table walk itself.
func crcBytes(c uint32, b []byte) uint32 {
	c = ^c
	for len(b) >= 4 {
		c = crcWord(c ^ binary.LittleEndian.Uint32(b))
		b = b[4:]
	}
	for _, v := range b {
		c = crcTab4[0][byte(c)^v] ^ c>>8
	}
	return ^c
}

// crcWord advances an inverted CRC state whose low four bytes have been
// XORed with the next four message bytes past them (slicing-by-4).
func crcWord(c uint32) uint32 {
	t := &crcTab4
	return t[3][byte(c)] ^ t[2][byte(c>>8)] ^ t[1][byte(c>>16)] ^ t[0][c>>24]
}

// crcTab4 extends the IEEE table to four bytes a step: crcTab4[k][v] is
// the state change of byte v followed by k zero bytes.
var crcTab4 = func() (t [4][256]uint32) {
	t[0] = *crc32.IEEETable
	for v := range 256 {
		c := t[0][v]
		for k := 1; k < 4; k++ {
			c = t[0][byte(c)] ^ c>>8
			t[k][v] = c
		}
	}
	return t
}()

// head is the CRC state after ones8 (the masked pseudo-LRH) and the masked
// IP and UDP headers.
func (s *icrcScratch) head(f *flow, udpLen int) uint32 {
	ph := &s.ph
	clear(ph[:])
	n := 0
	if f.src.Is4() && f.dst.Is4() {
		ph[0] = 0x45
		ph[1] = 0xff // TOS
		binary.BigEndian.PutUint16(ph[2:], uint16(20+8+udpLen))
		// ph[4:6] identification 0
		ph[6] = 0x40 // DF
		ph[8] = 0xff // TTL
		ph[9] = 17   // UDP
		ph[10], ph[11] = 0xff, 0xff
		sa, da := f.src.As4(), f.dst.As4()
		copy(ph[12:], sa[:])
		copy(ph[16:], da[:])
		n = 20
	} else {
		ph[0], ph[1], ph[2], ph[3] = 0x6f, 0xff, 0xff, 0xff
		binary.BigEndian.PutUint16(ph[4:], uint16(8+udpLen))
		ph[6] = 17
		ph[7] = 0xff // hop limit
		sa, da := f.src.As16(), f.dst.As16()
		copy(ph[8:], sa[:])
		copy(ph[24:], da[:])
		n = 40
	}
	binary.BigEndian.PutUint16(ph[n:], f.sport)
	binary.BigEndian.PutUint16(ph[n+2:], f.dport)
	binary.BigEndian.PutUint16(ph[n+4:], uint16(8+udpLen))
	ph[n+6], ph[n+7] = 0xff, 0xff
	n += 8
	c := crc32.Update(0, crc32.IEEETable, ones8[:])
	return crc32.Update(c, crc32.IEEETable, ph[:n])
}

// icrcUpdate continues a CRC over b (a payload: the CPU's carry-less
// multiply does most of it).
func icrcUpdate(c uint32, b []byte) uint32 { return crc32.Update(c, crc32.IEEETable, b) }

// putICRC stores a finished CRC in the packet's trailing four bytes (least
// significant byte first, as the Ethernet FCS).
func putICRC(b []byte, c uint32) { binary.LittleEndian.PutUint32(b[:icrcLen], c) }

// checkICRC verifies the ICRC of a whole UDP payload pkt received on f.
func checkICRC(f *flow, pkt []byte) error {
	var s icrcScratch
	return s.check(f, pkt)
}

func (s *icrcScratch) check(f *flow, pkt []byte) error {
	if len(pkt) < bthLen+icrcLen {
		return errShort
	}
	end := len(pkt) - icrcLen
	c := s.start(f, len(pkt), pkt)
	c = icrcUpdate(c, pkt[bthLen:end])
	if binary.LittleEndian.Uint32(pkt[end:]) != c {
		return errICRC
	}
	return nil
}

// sealICRC computes and stores the ICRC of a contiguous packet whose last
// four bytes are reserved for it.
func sealICRC(f *flow, pkt []byte) {
	var s icrcScratch
	end := len(pkt) - icrcLen
	c := s.start(f, len(pkt), pkt)
	c = icrcUpdate(c, pkt[bthLen:end])
	putICRC(pkt[end:], c)
}
