// Package hdr defines the PML's wire headers: MATCH, RNDV, RGET, ACK, FRAG,
// PUT and FIN (Open MPI ob1's seven kinds), as fixed little-endian layouts
// with 64-bit request ids where ob1 ships pointers.
//
// Each kind has a struct with Encode (into a caller's buffer, returning the
// bytes written) and a Decode function returning (value, bytes used, error).
// Decoders never panic: short or inconsistent input is an error wrapping
// ErrMalformed. The header type byte doubles as the BTL tag.
package hdr

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Type is the first byte of every header and the BTL tag it travels under.
type Type uint8

// Header types (BTL tags 0x41-0x49 as in ob1).
const (
	TypeMatch Type = 0x41
	TypeRndv  Type = 0x42
	TypeRget  Type = 0x43
	TypeAck   Type = 0x44
	TypeFrag  Type = 0x46
	TypePut   Type = 0x48
	TypeFin   Type = 0x49
)

func (t Type) String() string {
	switch t {
	case TypeMatch:
		return "MATCH"
	case TypeRndv:
		return "RNDV"
	case TypeRget:
		return "RGET"
	case TypeAck:
		return "ACK"
	case TypeFrag:
		return "FRAG"
	case TypePut:
		return "PUT"
	case TypeFin:
		return "FIN"
	case TypeCredit:
		return "CREDIT"
	}
	return fmt.Sprintf("type(%#x)", uint8(t))
}

// Flags of the common header.
const (
	FlagAck    uint8 = 0x01 // PUT: this PUT stands for the ACK (RDMA direct put)
	FlagPin    uint8 = 0x04 // RNDV: the sender registered its whole buffer (receiver may ask for puts)
	FlagContig uint8 = 0x08 // RNDV/RGET: the sender's data is contiguous memory
	FlagNoRDMA uint8 = 0x10 // ACK: the rest comes by copy (send/receive pipeline)
	FlagSync   uint8 = 0x20 // RNDV: synchronous send (informational; every RNDV is answered)
)

// Sizes of the fixed parts.
const (
	MatchLen = 16
	RndvLen  = 32
	RgetLen  = 40 // + handle bytes
	AckLen   = 40
	FragLen  = 32
	PutLen   = 48 // + handle bytes
	FinLen   = 32
	// MaxLen bounds every header including a registration handle.
	MaxLen = PutLen + MaxHandle
	// MaxHandle bounds registration handles (Open MPI: 256).
	MaxHandle = 256
)

// ErrMalformed is wrapped by every decode error.
var ErrMalformed = errors.New("malformed header")

var le = binary.LittleEndian

func short(t Type, need, have int) error {
	return fmt.Errorf("%w: %v needs %d bytes, got %d", ErrMalformed, t, need, have)
}

func check(b []byte, t Type, n int) error {
	if len(b) < n {
		return short(t, n, len(b))
	}
	if Type(b[0]) != t {
		return fmt.Errorf("%w: type byte %#x, want %v", ErrMalformed, b[0], t)
	}
	return nil
}

// Peek returns the type of an encoded header.
func Peek(b []byte) (Type, error) {
	if len(b) < 2 {
		return 0, fmt.Errorf("%w: %d bytes", ErrMalformed, len(b))
	}
	return Type(b[0]), nil
}

// Match starts every eager message and is the prefix of RNDV and RGET.
// Layout: type u8, flags u8, seq u16, ctx u32, src i32, tag i32.
type Match struct {
	Flags uint8
	Seq   uint16 // per (communicator, sender, receiver) sequence number
	Ctx   uint32 // communicator context id
	Src   int32  // sender's rank in the communicator
	Tag   int32
}

func (h *Match) put(b []byte, t Type) {
	b[0], b[1] = byte(t), h.Flags
	le.PutUint16(b[2:], h.Seq)
	le.PutUint32(b[4:], h.Ctx)
	le.PutUint32(b[8:], uint32(h.Src))
	le.PutUint32(b[12:], uint32(h.Tag))
}

func (h *Match) get(b []byte) {
	h.Flags = b[1]
	h.Seq = le.Uint16(b[2:])
	h.Ctx = le.Uint32(b[4:])
	h.Src = int32(le.Uint32(b[8:]))
	h.Tag = int32(le.Uint32(b[12:]))
}

// Words returns h encoded as a MATCH header in two little-endian words,
// the bytes Encode writes: b[0:8] and b[8:16]. Computed in registers, they
// reach a transport without the 16-byte load of byte-wise stores that a
// [16]byte header costs (a stalled store forward).
func (h *Match) Words() (w0, w1 uint64) {
	w0 = uint64(TypeMatch) | uint64(h.Flags)<<8 | uint64(h.Seq)<<16 | uint64(h.Ctx)<<32
	w1 = uint64(uint32(h.Src)) | uint64(uint32(h.Tag))<<32
	return w0, w1
}

// Encode writes h into b (len >= MatchLen) and returns MatchLen.
func (h *Match) Encode(b []byte) int { h.put(b[:MatchLen], TypeMatch); return MatchLen }

// DecodeMatch decodes the MATCH prefix of a MATCH, RNDV or RGET header.
func DecodeMatch(b []byte) (Match, int, error) {
	var h Match
	if err := h.Decode(b); err != nil {
		return h, 0, err
	}
	return h, MatchLen, nil
}

// Decode decodes the MATCH prefix of a MATCH, RNDV or RGET header into h
// (h is unchanged on error). The receive path decodes in place: a Match
// has five fields, one more than the compiler keeps in registers, so a
// Match returned by value is copied through memory with a 16-byte load of
// narrower stores, which stalls (perf annotate of BenchmarkPMLRecvWindow in
// btl/sm put 73% of DecodeMatch's samples, 6% of the benchmark's, on it).
func (h *Match) Decode(b []byte) error {
	if len(b) < MatchLen {
		return short(TypeMatch, MatchLen, len(b))
	}
	switch Type(b[0]) {
	case TypeMatch, TypeRndv, TypeRget:
	default:
		return notMatching(b[0])
	}
	h.get(b)
	return nil
}

// DecodeMatch decodes b into h when b is a MATCH header (at least
// MatchLen bytes of type MATCH) and reports whether it was; it is small
// enough to be inlined into a receive loop. Decode says what is wrong
// with anything else.
func (h *Match) DecodeMatch(b []byte) bool {
	if len(b) < MatchLen || Type(b[0]) != TypeMatch {
		return false
	}
	h.get(b)
	return true
}

func notMatching(t byte) error {
	return fmt.Errorf("%w: type byte %#x is not a matching header", ErrMalformed, t)
}

// Rndv is the first fragment of a rendezvous (ready-to-send).
// Layout: Match(16), msgLen u64, srcReq u64.
type Rndv struct {
	Match
	MsgLen uint64 // total packed bytes of the message
	SrcReq uint64 // sender's request id, echoed in ACK and FRAG
}

// Encode writes h into b (len >= RndvLen).
func (h *Rndv) Encode(b []byte) int {
	h.Match.put(b[:RndvLen], TypeRndv)
	le.PutUint64(b[16:], h.MsgLen)
	le.PutUint64(b[24:], h.SrcReq)
	return RndvLen
}

// DecodeRndv decodes a RNDV header.
func DecodeRndv(b []byte) (Rndv, int, error) {
	var h Rndv
	if err := check(b, TypeRndv, RndvLen); err != nil {
		return h, 0, err
	}
	h.Match.get(b)
	h.MsgLen = le.Uint64(b[16:])
	h.SrcReq = le.Uint64(b[24:])
	return h, RndvLen, nil
}

// Rget invites the receiver to read the whole message with RDMA get.
// Layout: Match(16), msgLen u64, srcReq u64, handleLen u32, pad u32, handle.
type Rget struct {
	Match
	MsgLen uint64
	SrcReq uint64
	Handle []byte // sender's registration of its buffer (aliases the input on decode)
}

// Len is the encoded size.
func (h *Rget) Len() int { return RgetLen + len(h.Handle) }

// Encode writes h into b (len >= h.Len()).
func (h *Rget) Encode(b []byte) int {
	h.Match.put(b[:RgetLen], TypeRget)
	le.PutUint64(b[16:], h.MsgLen)
	le.PutUint64(b[24:], h.SrcReq)
	le.PutUint32(b[32:], uint32(len(h.Handle)))
	le.PutUint32(b[36:], 0)
	return RgetLen + copy(b[RgetLen:], h.Handle)
}

// DecodeRget decodes a RGET header; Handle aliases b.
func DecodeRget(b []byte) (Rget, int, error) {
	var h Rget
	if err := check(b, TypeRget, RgetLen); err != nil {
		return h, 0, err
	}
	h.Match.get(b)
	h.MsgLen = le.Uint64(b[16:])
	h.SrcReq = le.Uint64(b[24:])
	n := le.Uint32(b[32:])
	if n > MaxHandle || int(n) > len(b)-RgetLen {
		return h, 0, fmt.Errorf("%w: RGET handle of %d bytes in %d", ErrMalformed, n, len(b))
	}
	h.Handle = b[RgetLen : RgetLen+int(n)]
	return h, RgetLen + int(n), nil
}

// Ack is the receiver's clear-to-send: the sender copies [SendOffset,
// SendOffset+SendSize) by FRAGs (SendSize 0 = up to the end).
// Layout: type, flags, pad[6], srcReq u64, dstReq u64, sendOffset u64, sendSize u64.
type Ack struct {
	Flags      uint8
	SrcReq     uint64
	DstReq     uint64
	SendOffset uint64
	SendSize   uint64
}

// Encode writes h into b (len >= AckLen).
func (h *Ack) Encode(b []byte) int {
	b = b[:AckLen]
	b[0], b[1] = byte(TypeAck), h.Flags
	clear(b[2:8])
	le.PutUint64(b[8:], h.SrcReq)
	le.PutUint64(b[16:], h.DstReq)
	le.PutUint64(b[24:], h.SendOffset)
	le.PutUint64(b[32:], h.SendSize)
	return AckLen
}

// DecodeAck decodes an ACK header.
func DecodeAck(b []byte) (Ack, int, error) {
	var h Ack
	if err := check(b, TypeAck, AckLen); err != nil {
		return h, 0, err
	}
	h.Flags = b[1]
	h.SrcReq = le.Uint64(b[8:])
	h.DstReq = le.Uint64(b[16:])
	h.SendOffset = le.Uint64(b[24:])
	h.SendSize = le.Uint64(b[32:])
	return h, AckLen, nil
}

// Frag carries bytes [Offset, Offset+len(payload)) of a message.
// Layout: type, flags, pad[6], offset u64, srcReq u64, dstReq u64.
type Frag struct {
	Flags  uint8
	Offset uint64
	SrcReq uint64
	DstReq uint64
}

// Encode writes h into b (len >= FragLen).
func (h *Frag) Encode(b []byte) int {
	b = b[:FragLen]
	b[0], b[1] = byte(TypeFrag), h.Flags
	clear(b[2:8])
	le.PutUint64(b[8:], h.Offset)
	le.PutUint64(b[16:], h.SrcReq)
	le.PutUint64(b[24:], h.DstReq)
	return FragLen
}

// DecodeFrag decodes a FRAG header.
func DecodeFrag(b []byte) (Frag, int, error) {
	var h Frag
	if err := check(b, TypeFrag, FragLen); err != nil {
		return h, 0, err
	}
	h.Flags = b[1]
	h.Offset = le.Uint64(b[8:])
	h.SrcReq = le.Uint64(b[16:])
	h.DstReq = le.Uint64(b[24:])
	return h, FragLen, nil
}

// Put asks the sender to RDMA-write message bytes [Offset, Offset+Size)
// into the receiver's registration Handle (at handle offset 0).
// Layout: type, flags, pad[2], handleLen u32, srcReq u64, dstReq u64,
// offset u64, size u64, pad u64, handle.
type Put struct {
	Flags  uint8
	SrcReq uint64
	DstReq uint64
	Offset uint64
	Size   uint64
	Handle []byte
}

// Len is the encoded size.
func (h *Put) Len() int { return PutLen + len(h.Handle) }

// Encode writes h into b (len >= h.Len()).
func (h *Put) Encode(b []byte) int {
	b[0], b[1] = byte(TypePut), h.Flags
	clear(b[2:4])
	le.PutUint32(b[4:], uint32(len(h.Handle)))
	le.PutUint64(b[8:], h.SrcReq)
	le.PutUint64(b[16:], h.DstReq)
	le.PutUint64(b[24:], h.Offset)
	le.PutUint64(b[32:], h.Size)
	le.PutUint64(b[40:], 0)
	return PutLen + copy(b[PutLen:], h.Handle)
}

// DecodePut decodes a PUT header; Handle aliases b.
func DecodePut(b []byte) (Put, int, error) {
	var h Put
	if err := check(b, TypePut, PutLen); err != nil {
		return h, 0, err
	}
	h.Flags = b[1]
	n := le.Uint32(b[4:])
	h.SrcReq = le.Uint64(b[8:])
	h.DstReq = le.Uint64(b[16:])
	h.Offset = le.Uint64(b[24:])
	h.Size = le.Uint64(b[32:])
	if n > MaxHandle || int(n) > len(b)-PutLen {
		return h, 0, fmt.Errorf("%w: PUT handle of %d bytes in %d", ErrMalformed, n, len(b))
	}
	h.Handle = b[PutLen : PutLen+int(n)]
	return h, PutLen + int(n), nil
}

// Fin reports that an RDMA operation on the receiver of the FIN's memory
// finished: Size bytes at Offset of request Req (Size < 0: it failed).
// Layout: type, flags, pad[6], req u64, offset u64, size i64.
type Fin struct {
	Flags  uint8
	Req    uint64
	Offset uint64
	Size   int64
}

// Encode writes h into b (len >= FinLen).
func (h *Fin) Encode(b []byte) int {
	b = b[:FinLen]
	b[0], b[1] = byte(TypeFin), h.Flags
	clear(b[2:8])
	le.PutUint64(b[8:], h.Req)
	le.PutUint64(b[16:], h.Offset)
	le.PutUint64(b[24:], uint64(h.Size))
	return FinLen
}

// DecodeFin decodes a FIN header.
func DecodeFin(b []byte) (Fin, int, error) {
	var h Fin
	if err := check(b, TypeFin, FinLen); err != nil {
		return h, 0, err
	}
	h.Flags = b[1]
	h.Req = le.Uint64(b[8:])
	h.Offset = le.Uint64(b[16:])
	h.Size = int64(le.Uint64(b[24:]))
	return h, FinLen, nil
}
