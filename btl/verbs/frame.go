package verbs

import (
	"encoding/binary"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// A control message occupies a run of bytes of the receiver's control ring
// starting at a multiple of frameAlign. It begins with a 16-byte frame
// header, little-endian:
//
//	0  length u32  frame bytes, header included
//	4  kind u8     frameMsg, framePad or frameClose
//	5  tag u8      the btl.Tag of a frameMsg
//	6  zero u16
//	8  hdrLen u32  bytes of the fragment's header after the frame header
//	12 seq u32     the sender's message number on this pair (wrapping)
//
// then the fragment's header and data. The frame takes align(length)
// bytes of the ring. A message that does not fit before the ring's end is
// preceded by a framePad filling the rest of the ring, and starts at 0.
const (
	frameHdrLen = 16
	frameAlign  = 64
)

type frameKind uint8

const (
	frameMsg   frameKind = 1 // a fragment for the Dispatcher
	framePad   frameKind = 2 // skip to the ring's start (written without an immediate)
	frameClose frameKind = 3 // the sender closes the pair in order
)

type frameHdr struct {
	length uint32
	kind   frameKind
	tag    btl.Tag
	hdrLen uint32
	seq    uint32
}

func alignUp(n int) int { return (n + frameAlign - 1) &^ (frameAlign - 1) }

func (h *frameHdr) put(b []byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], h.length)
	b[4] = uint8(h.kind)
	b[5] = uint8(h.tag)
	b[6], b[7] = 0, 0
	le.PutUint32(b[8:], h.hdrLen)
	le.PutUint32(b[12:], h.seq)
}

// decodeFrame reads the frame header at the start of b, which holds the
// ring's bytes from the frame's position to the ring's end, and checks it
// against them: the frame must lie within b, its header within the frame,
// its kind known and its sequence number seq. Returns the header or an
// error wrapping mpierr.ErrProtocol; it never reads outside b.
func decodeFrame(b []byte, seq uint32) (frameHdr, error) {
	var h frameHdr
	if len(b) < frameHdrLen {
		return h, mpierr.Errorf(mpierr.ErrProtocol, "verbs: control frame at %d bytes from the ring's end", len(b))
	}
	le := binary.LittleEndian
	h.length = le.Uint32(b[0:])
	h.kind = frameKind(b[4])
	h.tag = btl.Tag(b[5])
	h.hdrLen = le.Uint32(b[8:])
	h.seq = le.Uint32(b[12:])
	switch {
	case h.kind != frameMsg && h.kind != framePad && h.kind != frameClose:
		return h, mpierr.Errorf(mpierr.ErrProtocol, "verbs: control frame of unknown kind %d", h.kind)
	case b[6] != 0 || b[7] != 0:
		return h, mpierr.Errorf(mpierr.ErrProtocol, "verbs: control frame with nonzero reserved bytes")
	case h.seq != seq:
		return h, mpierr.Errorf(mpierr.ErrProtocol, "verbs: control frame number %d where %d was due (lost, repeated or garbage)", h.seq, seq)
	case h.length < frameHdrLen || uint64(h.length) > uint64(len(b)):
		return h, mpierr.Errorf(mpierr.ErrProtocol, "verbs: %d-byte control frame with %d bytes left in the ring", h.length, len(b))
	case h.kind == framePad && int(h.length) != len(b):
		return h, mpierr.Errorf(mpierr.ErrProtocol, "verbs: %d-byte pad frame with %d bytes left in the ring", h.length, len(b))
	case uint64(h.hdrLen) > uint64(h.length-frameHdrLen):
		return h, mpierr.Errorf(mpierr.ErrProtocol, "verbs: control frame header of %d bytes in a %d-byte frame", h.hdrLen, h.length)
	}
	return h, nil
}
