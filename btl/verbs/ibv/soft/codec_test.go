package soft

import (
	"bytes"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"
)

var testFlow = flow{src: netip.MustParseAddr("127.1.2.3"), dst: netip.MustParseAddr("127.4.5.6"), sport: 4791, dport: 4791}

// buildPacket encodes p with payload into a whole UDP payload with its
// ICRC.
func buildPacket(p packet, payload []byte, f *flow) []byte {
	p.flags, _ = opInfo(p.bth.opcode)
	p.bth.padCnt = uint8(padLen(len(payload)))
	hl := headerLen(p.bth.opcode)
	b := make([]byte, hl+len(payload)+padLen(len(payload))+icrcLen)
	p.encodeHeaders(b)
	copy(b[hl:], payload)
	sealICRC(f, b)
	return b
}

// samplePackets is a valid packet of every opcode.
func samplePackets() [][]byte {
	var out [][]byte
	for op := uint8(0); op < numOpcodes; op++ {
		f, _ := opInfo(op)
		p := packet{bth: bth{opcode: op, pkey: defaultPKey, destQP: 0x123456, psn: 0xabcdef, ackReq: f&fLast != 0, se: op == opSendOnly}}
		p.reth = reth{va: 0x7f0000001000, rkey: 0xdeadbeef, dmaLen: 5000}
		p.aeth = aeth{syndrome: synACK | creditsInvalid, msn: 77}
		p.atomic = atomicETH{va: 0x1000, rkey: 9, swapAdd: 1, compare: 2}
		p.orig = 0x1122334455667788
		p.imm = 0xcafef00d
		var payload []byte
		if f&fPayload != 0 {
			payload = bytes.Repeat([]byte{byte(op)}, 13+int(op))
		}
		out = append(out, buildPacket(p, payload, &testFlow))
	}
	return out
}

func TestHeaderRoundTrip(t *testing.T) {
	h := bth{opcode: opWriteFirst, se: true, mig: true, padCnt: 3, pkey: 0xffff, fecn: true, becn: true,
		destQP: 0xfedcba, ackReq: true, psn: 0x123456}
	b := make([]byte, bthLen)
	h.encode(b)
	g, n, err := decodeBTH(b)
	require.NoError(t, err)
	require.Equal(t, bthLen, n)
	require.Equal(t, h, g)

	r := reth{va: 1<<63 | 5, rkey: 0x01020304, dmaLen: 1 << 31}
	b = make([]byte, rethLen)
	r.encode(b)
	gr, n, err := decodeRETH(b)
	require.NoError(t, err)
	require.Equal(t, rethLen, n)
	require.Equal(t, r, gr)

	a := aeth{syndrome: synNAK | nakRemAccess, msn: 0xabcdef}
	b = make([]byte, aethLen)
	a.encode(b)
	ga, _, err := decodeAETH(b)
	require.NoError(t, err)
	require.Equal(t, a, ga)

	b = make([]byte, immLen)
	encodeImm(b, 0x01020304)
	require.Equal(t, []byte{1, 2, 3, 4}, b, "immediate data is big-endian on the wire")
	v, _, err := decodeImm(b)
	require.NoError(t, err)
	require.Equal(t, uint32(0x01020304), v)

	at := atomicETH{va: 8, rkey: 7, swapAdd: 6, compare: 5}
	b = make([]byte, atomicETHLen)
	at.encode(b)
	gat, _, err := decodeAtomicETH(b)
	require.NoError(t, err)
	require.Equal(t, at, gat)

	for _, dec := range []func([]byte) error{
		func(b []byte) error { _, _, err := decodeBTH(b); return err },
		func(b []byte) error { _, _, err := decodeRETH(b); return err },
		func(b []byte) error { _, _, err := decodeAETH(b); return err },
		func(b []byte) error { _, _, err := decodeImm(b); return err },
		func(b []byte) error { _, _, err := decodeAtomicETH(b); return err },
		func(b []byte) error { _, _, err := decodeAtomicAck(b); return err },
	} {
		require.ErrorIs(t, dec([]byte{1, 2, 3}), errShort)
	}
}

func TestPacketRoundTrip(t *testing.T) {
	for _, b := range samplePackets() {
		require.NoError(t, checkICRC(&testFlow, b))
		p, n, err := decodePacket(b)
		require.NoError(t, err, opName(b[0]))
		require.Equal(t, len(b), n)
		again := buildPacket(p, p.payload, &testFlow)
		require.Equal(t, b, again, opName(b[0]))
		// Any flipped bit fails the ICRC (unless it is in a masked field).
		c := bytes.Clone(b)
		c[len(c)/2] ^= 0x10
		require.ErrorIs(t, checkICRC(&testFlow, c), errICRC)
		// The ICRC covers the addresses.
		other := testFlow
		other.src = netip.MustParseAddr("127.1.2.4")
		require.ErrorIs(t, checkICRC(&other, b), errICRC)
	}
	// FECN/BECN are outside the ICRC (the network may set them).
	b := samplePackets()[opSendOnly]
	b[4] |= 0xc0
	require.NoError(t, checkICRC(&testFlow, b))
}

func TestDecodeRejects(t *testing.T) {
	good := samplePackets()[opSendOnly]
	bad := map[string][]byte{
		"empty":          nil,
		"short":          good[:10],
		"no room":        good[:bthLen+2],
		"unknown opcode": append([]byte{0x15}, good[1:]...),
		"UD opcode":      append([]byte{0x64}, good[1:]...),
		"version":        func() []byte { c := bytes.Clone(good); c[1] |= 1; return c }(),
		"pad too large": func() []byte {
			c := buildPacket(packet{bth: bth{opcode: opSendOnly}}, nil, &testFlow)
			c[1] |= 3 << 4
			return c
		}(),
		"payload on ACK": func() []byte {
			return buildPacket(packet{bth: bth{opcode: opAck}, aeth: aeth{syndrome: creditsInvalid}}, []byte{1, 2, 3, 4}, &testFlow)
		}(),
		"reserved syndrome": buildPacket(packet{bth: bth{opcode: opAck}, aeth: aeth{syndrome: 0x40}}, nil, &testFlow),
	}
	for name, b := range bad {
		_, _, err := decodePacket(b)
		require.Error(t, err, name)
	}
}

// FuzzPacket feeds arbitrary bytes to the decoder and the ICRC check:
// they return errors, never panic; what decodes encodes back the same.
func FuzzPacket(f *testing.F) {
	for _, b := range samplePackets() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		_ = checkICRC(&testFlow, b)
		p, n, err := decodePacket(b)
		if err != nil {
			return
		}
		if n != len(b) {
			t.Fatalf("used %d of %d bytes", n, len(b))
		}
		hl := headerLen(p.bth.opcode)
		h := make([]byte, hl)
		p.encodeHeaders(h)
		if !bytes.Equal(h, maskReserved(b[:hl])) {
			t.Fatalf("headers re-encode differently:\n%x\n%x", h, b[:hl])
		}
		if len(p.payload) > len(b)-hl {
			t.Fatal("payload beyond the packet")
		}
	})
}

// maskReserved clears the reserved BTH bits, which the decoder drops.
func maskReserved(b []byte) []byte {
	c := bytes.Clone(b)
	c[4] &= 0xc0
	c[8] &= 0x80
	return c
}

// The UDP source port of a QP pair is the same from both ends and lies in
// RoCEv2's range for it (0xC000 and up).
func TestRoCESourcePort(t *testing.T) {
	for _, p := range [][2]uint32{{0x11, 0x12}, {0x123, 0xabcdef}, {0xffffff, 0xffffff}, {2, 3}} {
		s := roceSport(p[0], p[1])
		require.Equal(t, s, roceSport(p[1], p[0]), "QPNs %#x", p)
		require.GreaterOrEqual(t, s, uint16(0xc000), "QPNs %#x", p)
	}
	require.NotEqual(t, roceSport(0x11, 0x12), roceSport(0x11, 0x13))
}
