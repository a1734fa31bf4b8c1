package soft

import "encoding/binary"

// aethLen is the size of the ACK extended transport header.
const aethLen = 4

// AETH syndromes: the top three bits say ACK, RNR NAK or NAK; the low five
// bits are a credit count (ACK), a timer code (RNR NAK) or a NAK code.
const (
	synACK     uint8 = 0x00
	synRNR     uint8 = 0x20
	synNAK     uint8 = 0x60
	synKindMsk uint8 = 0xe0
	synValMsk  uint8 = 0x1f

	// creditsInvalid says "no end-to-end credit information": the
	// requester ignores flow-control credits (this device sends no
	// others).
	creditsInvalid uint8 = 0x1f

	nakPSNSeq    uint8 = 0 // PSN sequence error
	nakInvReq    uint8 = 1 // invalid request
	nakRemAccess uint8 = 2 // remote access error
	nakRemOp     uint8 = 3 // remote operational error
	nakInvRDReq  uint8 = 4 // invalid RD request
)

// aeth is an ACK extended transport header: syndrome and the responder's
// message sequence number.
type aeth struct {
	syndrome uint8
	msn      uint32
}

func (a *aeth) encode(b []byte) int {
	_ = b[aethLen-1]
	binary.BigEndian.PutUint32(b, a.msn&psnMask)
	b[0] = a.syndrome
	return aethLen
}

func decodeAETH(b []byte) (aeth, int, error) {
	if len(b) < aethLen {
		return aeth{}, 0, errShort
	}
	return aeth{syndrome: b[0], msn: binary.BigEndian.Uint32(b) & psnMask}, aethLen, nil
}

// validSyndrome reports whether s is an ACK, an RNR NAK or a NAK with a
// defined code (the reserved kinds 010 and 1xx are not).
func validSyndrome(s uint8) bool {
	switch s & synKindMsk {
	case synACK, synRNR:
		return true
	case synNAK:
		return s&synValMsk <= nakInvRDReq
	}
	return false
}
