package soft

// packet is a decoded RoCEv2 packet (the UDP payload). payload aliases
// the buffer it was decoded from and excludes the pad bytes.
type packet struct {
	bth     bth
	flags   opFlags
	reth    reth
	aeth    aeth
	atomic  atomicETH
	orig    uint64 // AtomicAckETH
	imm     uint32
	payload []byte
}

// decodePacket parses a whole UDP payload (BTH to ICRC) without checking
// the ICRC. It returns the bytes used (all of b) or an error for a short,
// inconsistent or unknown packet; it never reads outside b.
func decodePacket(b []byte) (packet, int, error) {
	var p packet
	n, err := p.decode(b)
	return p, n, err
}

// decode is decodePacket into p, which it overwrites: the receive path
// decodes into a packet of its own instead of copying one back.
func (p *packet) decode(b []byte) (int, error) {
	*p = packet{}
	h, n, err := decodeBTH(b)
	if err != nil {
		return 0, err
	}
	f, ok := opInfo(h.opcode)
	if !ok {
		return 0, errOpcode
	}
	p.bth, p.flags = h, f
	if len(b) < n+extLen(f)+icrcLen {
		return 0, errShort
	}
	if f&fRETH != 0 {
		r, k, _ := decodeRETH(b[n:])
		p.reth, n = r, n+k
	}
	if f&fAtomicETH != 0 {
		a, k, _ := decodeAtomicETH(b[n:])
		p.atomic, n = a, n+k
	}
	if f&fAETH != 0 {
		a, k, _ := decodeAETH(b[n:])
		if !validSyndrome(a.syndrome) {
			return 0, errReserved
		}
		p.aeth, n = a, n+k
	}
	if f&fAtomicAckETH != 0 {
		o, k, _ := decodeAtomicAck(b[n:])
		p.orig, n = o, n+k
	}
	if f&fImm != 0 {
		v, k, _ := decodeImm(b[n:])
		p.imm, n = v, n+k
	}
	body := b[n : len(b)-icrcLen]
	if f&fPayload == 0 {
		if len(body) != 0 || h.padCnt != 0 {
			return 0, errLength
		}
		return len(b), nil
	}
	if int(h.padCnt) > len(body) || (len(body))%4 != 0 {
		return 0, errPad
	}
	p.payload = body[:len(body)-int(h.padCnt)]
	return len(b), nil
}

// headerLen returns the bytes of BTH and extension headers of op.
func headerLen(op uint8) int {
	f, _ := opInfo(op)
	return bthLen + extLen(f)
}

// encodeHeaders writes the BTH and the extension headers p.flags names
// into b and returns their length. b must hold headerLen(p.bth.opcode).
func (p *packet) encodeHeaders(b []byte) int {
	n := p.bth.encode(b)
	f := p.flags
	if f&fRETH != 0 {
		n += p.reth.encode(b[n:])
	}
	if f&fAtomicETH != 0 {
		n += p.atomic.encode(b[n:])
	}
	if f&fAETH != 0 {
		n += p.aeth.encode(b[n:])
	}
	if f&fAtomicAckETH != 0 {
		n += encodeAtomicAck(b[n:], p.orig)
	}
	if f&fImm != 0 {
		n += encodeImm(b[n:], p.imm)
	}
	return n
}

// padLen is the number of bytes that round n up to a multiple of four.
func padLen(n int) int { return -n & 3 }
