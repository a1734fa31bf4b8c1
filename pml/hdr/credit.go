package hdr

// TypeCredit is the receiver's flow-control message (not in ob1).
const TypeCredit Type = 0x4A

// CreditLen is the size of a CREDIT header.
const CreditLen = 16

// Credit extends a sender's eager window (pml flow control): on
// communicator Ctx, the receiver (rank Dst there) accepts the sender's
// messages with sequence numbers below Grant (modulo 2^16) eagerly; later
// ones go as rendezvous announcements without data.
// Layout: type u8, flags u8, grant u16, ctx u32, dst i32, pad u32.
type Credit struct {
	Flags uint8
	Grant uint16
	Ctx   uint32
	Dst   int32
}

// Encode writes h into b (len >= CreditLen) and returns CreditLen.
func (h *Credit) Encode(b []byte) int {
	b = b[:CreditLen]
	b[0], b[1] = byte(TypeCredit), h.Flags
	le.PutUint16(b[2:], h.Grant)
	le.PutUint32(b[4:], h.Ctx)
	le.PutUint32(b[8:], uint32(h.Dst))
	clear(b[12:16])
	return CreditLen
}

// DecodeCredit decodes a CREDIT header.
func DecodeCredit(b []byte) (Credit, int, error) {
	var h Credit
	if err := check(b, TypeCredit, CreditLen); err != nil {
		return h, 0, err
	}
	h.Flags = b[1]
	h.Grant = le.Uint16(b[2:])
	h.Ctx = le.Uint32(b[4:])
	h.Dst = int32(le.Uint32(b[8:]))
	return h, CreditLen, nil
}
