package tcp

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gompi-org/gompi/btl"
)

// Wire format of one frame (all integers little-endian). Every frame starts
// with a 16-byte prefix:
//
//	0  kind    u8   frameSend .. frameClose
//	1  tag     u8   SEND only (0 otherwise)
//	2  zero    u16  reserved, must be 0
//	4  hdrLen  u32  SEND only: bytes of the sender's header that follow
//	8  length  u64  payload bytes that follow (GETREQ: bytes requested, none follow)
//
// followed by a kind-specific extension:
//
//	PUT      reg u64, off u64           (16 bytes)
//	GETREQ   reg u64, off u64, req u64  (24 bytes)
//	GETREPLY req u64                    (8 bytes)
//
// and then hdrLen+length bytes (SEND: header then data) or length bytes
// (PUT, GETREPLY). The receiver hands SEND's header and data to the
// dispatcher with the sender's split; PUT and GETREPLY payloads are read
// straight into the destination memory.
type frameKind uint8

const (
	frameSend     frameKind = 1 // active message: tag, header, data
	framePut      frameKind = 2 // data for the receiver's registration reg at off
	frameGetReq   frameKind = 3 // asks for length bytes of the receiver's registration reg at off
	frameGetReply frameKind = 4 // the data answering GETREQ req
	frameClose    frameKind = 5 // orderly close: nothing follows on this connection
)

func (k frameKind) String() string {
	switch k {
	case frameSend:
		return "SEND"
	case framePut:
		return "PUT"
	case frameGetReq:
		return "GETREQ"
	case frameGetReply:
		return "GETREPLY"
	case frameClose:
		return "CLOSE"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

const (
	prefixLen      = 16
	maxFrameHeader = prefixLen + 24
)

// headerLen returns the encoded size of a frame header of kind k, and false
// for an unknown kind.
func headerLen(k frameKind) (int, bool) {
	switch k {
	case frameSend, frameClose:
		return prefixLen, true
	case framePut:
		return prefixLen + 16, true
	case frameGetReq:
		return prefixLen + 24, true
	case frameGetReply:
		return prefixLen + 8, true
	}
	return 0, false
}

// frameHeader is a decoded frame header.
type frameHeader struct {
	kind   frameKind
	tag    btl.Tag
	hdrLen uint32
	length uint64
	reg    uint64 // PUT, GETREQ
	off    uint64 // PUT, GETREQ
	req    uint64 // GETREQ, GETREPLY
}

// payload returns the number of bytes that follow the header on the wire.
func (h *frameHeader) payload() uint64 {
	switch h.kind {
	case frameSend:
		return uint64(h.hdrLen) + h.length
	case framePut, frameGetReply:
		return h.length
	}
	return 0
}

// encode writes h into b, which must hold maxFrameHeader bytes, and returns
// the encoded length.
func (h *frameHeader) encode(b []byte) int {
	n, ok := headerLen(h.kind)
	if !ok {
		panic("tcp: encoding a frame of unknown kind " + h.kind.String())
	}
	b = b[:n]
	b[0] = byte(h.kind)
	b[1] = byte(h.tag)
	b[2], b[3] = 0, 0
	binary.LittleEndian.PutUint32(b[4:], h.hdrLen)
	binary.LittleEndian.PutUint64(b[8:], h.length)
	switch h.kind {
	case framePut:
		binary.LittleEndian.PutUint64(b[16:], h.reg)
		binary.LittleEndian.PutUint64(b[24:], h.off)
	case frameGetReq:
		binary.LittleEndian.PutUint64(b[16:], h.reg)
		binary.LittleEndian.PutUint64(b[24:], h.off)
		binary.LittleEndian.PutUint64(b[32:], h.req)
	case frameGetReply:
		binary.LittleEndian.PutUint64(b[16:], h.req)
	}
	return n
}

// errShortFrame: decodeFrameHeader needs more bytes (the count it returns).
var errShortFrame = errors.New("tcp: short frame header")

// decodeFrameHeader decodes the frame header at the start of b. It returns
// the header and its encoded length; with errShortFrame the length is how
// many bytes it needs (b holds fewer). Any other error is a protocol
// violation: an unknown kind, non-zero reserved bits, or fields that the
// kind does not use set. Limits that depend on the receiver (frame size,
// registrations) are the reader's to check.
func decodeFrameHeader(b []byte) (frameHeader, int, error) {
	var h frameHeader
	if len(b) < 1 {
		return h, prefixLen, errShortFrame
	}
	h.kind = frameKind(b[0])
	n, ok := headerLen(h.kind)
	if !ok {
		return h, 0, fmt.Errorf("unknown frame kind %d", b[0])
	}
	if len(b) < n {
		return h, n, errShortFrame
	}
	if b[2] != 0 || b[3] != 0 {
		return h, 0, fmt.Errorf("%v frame with reserved bits %#02x%02x set", h.kind, b[3], b[2])
	}
	h.tag = btl.Tag(b[1])
	h.hdrLen = binary.LittleEndian.Uint32(b[4:])
	h.length = binary.LittleEndian.Uint64(b[8:])
	switch h.kind {
	case framePut:
		h.reg = binary.LittleEndian.Uint64(b[16:])
		h.off = binary.LittleEndian.Uint64(b[24:])
	case frameGetReq:
		h.reg = binary.LittleEndian.Uint64(b[16:])
		h.off = binary.LittleEndian.Uint64(b[24:])
		h.req = binary.LittleEndian.Uint64(b[32:])
	case frameGetReply:
		h.req = binary.LittleEndian.Uint64(b[16:])
	}
	if h.kind != frameSend && (h.tag != 0 || h.hdrLen != 0) {
		return h, 0, fmt.Errorf("%v frame with tag %#x and header length %d (SEND only)", h.kind, uint8(h.tag), h.hdrLen)
	}
	if h.kind == frameClose && h.length != 0 {
		return h, 0, fmt.Errorf("CLOSE frame with length %d", h.length)
	}
	return h, n, nil
}
