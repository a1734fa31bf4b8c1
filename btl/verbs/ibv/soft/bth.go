package soft

import (
	"encoding/binary"
	"errors"
)

// Decoding errors. Packets that fail to decode are dropped and counted.
var (
	errShort    = errors.New("soft: packet too short")
	errOpcode   = errors.New("soft: unknown or unsupported opcode")
	errVersion  = errors.New("soft: unsupported transport header version")
	errICRC     = errors.New("soft: ICRC mismatch")
	errPad      = errors.New("soft: pad count larger than the payload")
	errLength   = errors.New("soft: payload length inconsistent with opcode")
	errReserved = errors.New("soft: reserved field set")
)

// bthLen is the size of the base transport header.
const bthLen = 12

// psnMask keeps the 24 bits of a PSN, QPN or MSN.
const psnMask = 0xffffff

// defaultPKey is the full-member default partition key.
const defaultPKey = 0xffff

// bth is the base transport header of every packet.
//
//	byte 0      opcode
//	byte 1      SE(1) M(1) PadCnt(2) TVer(4)
//	bytes 2-3   P_Key
//	byte 4      FECN(1) BECN(1) reserved(6)
//	bytes 5-7   destination QP
//	byte 8      AckReq(1) reserved(7)
//	bytes 9-11  PSN
type bth struct {
	opcode uint8
	se     bool // solicited event
	mig    bool
	padCnt uint8 // 0..3 pad bytes after the payload
	tver   uint8
	pkey   uint16
	fecn   bool
	becn   bool
	destQP uint32
	ackReq bool
	psn    uint32
}

// encode writes h into b[:bthLen] and returns bthLen.
func (h *bth) encode(b []byte) int {
	_ = b[bthLen-1]
	b[0] = h.opcode
	x := h.padCnt&3<<4 | h.tver&0xf
	if h.se {
		x |= 0x80
	}
	if h.mig {
		x |= 0x40
	}
	b[1] = x
	binary.BigEndian.PutUint16(b[2:], h.pkey)
	binary.BigEndian.PutUint32(b[4:], h.destQP&psnMask)
	if h.fecn {
		b[4] |= 0x80
	}
	if h.becn {
		b[4] |= 0x40
	}
	binary.BigEndian.PutUint32(b[8:], h.psn&psnMask)
	if h.ackReq {
		b[8] |= 0x80
	}
	return bthLen
}

// decodeBTH reads a base transport header. It checks the length and the
// transport version only; the opcode is checked by decodePacket.
func decodeBTH(b []byte) (bth, int, error) {
	if len(b) < bthLen {
		return bth{}, 0, errShort
	}
	h := bth{
		opcode: b[0],
		se:     b[1]&0x80 != 0,
		mig:    b[1]&0x40 != 0,
		padCnt: b[1] >> 4 & 3,
		tver:   b[1] & 0xf,
		pkey:   binary.BigEndian.Uint16(b[2:]),
		fecn:   b[4]&0x80 != 0,
		becn:   b[4]&0x40 != 0,
		destQP: binary.BigEndian.Uint32(b[4:]) & psnMask,
		ackReq: b[8]&0x80 != 0,
		psn:    binary.BigEndian.Uint32(b[8:]) & psnMask,
	}
	if h.tver != 0 {
		return bth{}, 0, errVersion
	}
	return h, bthLen, nil
}
