package verbs

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// addr is what one side of a pair publishes for the other under
// pairKey(from, to) (Gloo's address blob, extended with the control ring):
// where its QP for that peer is (lid, port, gid, qpn, first PSN, path MTU)
// and the ring of registered memory the peer writes its control messages
// into.
type addr struct {
	LID      uint16
	Port     uint8
	MTU      ibv.MTU // the publishing port's active MTU; the pair uses the smaller
	QPN      uint32  // 24 bits
	PSN      uint32  // 24 bits: the first PSN the publisher sends with
	GID      ibv.GID
	RingAddr uint64 // I/O virtual address of the control ring
	RingKey  uint32 // its rkey
	RingSize uint32 // bytes, a multiple of frameAlign
	Credits  uint32 // control messages the publisher accepts in flight
}

// addrLen is the encoded size; the layout is little-endian:
//
//	0  magic "GVB1"   4 lid u16   6 port u8   7 mtu u8
//	8  qpn u32        12 psn u32  16 gid [16]
//	32 ring addr u64  40 rkey u32 44 ring size u32  48 credits u32
const addrLen = 52

var addrMagic = [4]byte{'G', 'V', 'B', '1'}

// Bounds a decoded address must respect.
const (
	maxRingSize = 1 << 30
	minRingSize = 4 * frameAlign
	maxCredits  = 1 << 16
)

func (a addr) encode() []byte {
	b := make([]byte, addrLen)
	copy(b, addrMagic[:])
	le := binary.LittleEndian
	le.PutUint16(b[4:], a.LID)
	b[6] = a.Port
	b[7] = uint8(a.MTU)
	le.PutUint32(b[8:], a.QPN)
	le.PutUint32(b[12:], a.PSN)
	copy(b[16:32], a.GID[:])
	le.PutUint64(b[32:], a.RingAddr)
	le.PutUint32(b[40:], a.RingKey)
	le.PutUint32(b[44:], a.RingSize)
	le.PutUint32(b[48:], a.Credits)
	return b
}

// decodeAddr parses a published address. Anything malformed (another
// gompi version, a truncated value, fields out of range) is an error
// wrapping mpierr.ErrProtocol.
func decodeAddr(b []byte) (addr, error) {
	var a addr
	if len(b) != addrLen || [4]byte(b[:4]) != addrMagic {
		return a, mpierr.Errorf(mpierr.ErrProtocol, "verbs: malformed %d-byte address blob (another gompi version?)", len(b))
	}
	le := binary.LittleEndian
	a.LID = le.Uint16(b[4:])
	a.Port = b[6]
	a.MTU = ibv.MTU(b[7])
	a.QPN = le.Uint32(b[8:])
	a.PSN = le.Uint32(b[12:])
	a.GID = ibv.GID(b[16:32])
	a.RingAddr = le.Uint64(b[32:])
	a.RingKey = le.Uint32(b[40:])
	a.RingSize = le.Uint32(b[44:])
	a.Credits = le.Uint32(b[48:])
	switch {
	case a.MTU.Bytes() == 0:
		return a, mpierr.Errorf(mpierr.ErrProtocol, "verbs: address blob with MTU code %d", a.MTU)
	case a.QPN > 0xFFFFFF || a.PSN > 0xFFFFFF:
		return a, mpierr.Errorf(mpierr.ErrProtocol, "verbs: address blob with QPN %#x or PSN %#x beyond 24 bits", a.QPN, a.PSN)
	case a.RingSize < minRingSize || a.RingSize > maxRingSize || a.RingSize%frameAlign != 0:
		return a, mpierr.Errorf(mpierr.ErrProtocol, "verbs: address blob with a %d-byte control ring", a.RingSize)
	case a.RingAddr > math.MaxUint64-uint64(a.RingSize):
		return a, mpierr.Errorf(mpierr.ErrProtocol, "verbs: address blob with a ring at %#x wrapping the address space", a.RingAddr)
	case a.Credits < 1 || a.Credits > maxCredits:
		return a, mpierr.Errorf(mpierr.ErrProtocol, "verbs: address blob with %d credits", a.Credits)
	}
	return a, nil
}

func (a addr) String() string {
	return fmt.Sprintf("lid %d port %d gid %v qpn %#x psn %#x mtu %d ring %#x+%d rkey %#x credits %d",
		a.LID, a.Port, a.GID, a.QPN, a.PSN, a.MTU.Bytes(), a.RingAddr, a.RingSize, a.RingKey, a.Credits)
}
