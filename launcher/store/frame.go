package store

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// Limits of the wire protocol. Larger input is refused by the sender and
// treated as a protocol violation by the receiver.
const (
	MaxKeyLen   = 1 << 10  // bytes in a key or fence name
	MaxValueLen = 16 << 20 // bytes in a value
	MaxMsgLen   = 64 << 10 // bytes in an abort message, failure cause or error text

	// maxWaitKeys bounds the keys of one Wait request so that its payload
	// stays under maxBody.
	maxWaitKeys = 4096

	frameHeaderLen = 4 + 1 + 8 // body length, op, request id
	// maxBody is the largest frame body (op + id + payload) accepted: a Set
	// of a maximal key and value.
	maxBody = 1 + 8 + 2 + MaxKeyLen + MaxValueLen
)

// op is the kind of a frame.
type op uint8

// Requests (client to server) carry a request id chosen by the client; the
// server's answer carries the same id. Pushes from the server use id 0.
const (
	opSet      op = 0x01 // payload: key (u16 length + bytes), value (rest)
	opGet      op = 0x02 // payload: key (rest); answered when the key exists
	opTryGet   op = 0x03 // payload: key (rest); answered at once
	opWait     op = 0x04 // payload: u16 count, count keys (u16 length + bytes each)
	opFence    op = 0x05 // payload: fence name (rest)
	opFinalize op = 0x06 // payload: empty
	opAbort    op = 0x07 // payload: i32 code, message (rest)
	opCancel   op = 0x08 // payload: empty; id names the request to forget

	opOK       op = 0x81 // payload: empty
	opValue    op = 0x82 // payload: value (rest)
	opNotFound op = 0x83 // payload: empty
	opError    op = 0x84 // payload: u8 error class, message (rest)
	opFailure  op = 0x85 // push, id 0; payload: i32 rank, cause (rest)
)

func (o op) valid() bool {
	return (o >= opSet && o <= opCancel) || (o >= opOK && o <= opFailure)
}

func (o op) String() string {
	switch o {
	case opSet:
		return "SET"
	case opGet:
		return "GET"
	case opTryGet:
		return "TRYGET"
	case opWait:
		return "WAIT"
	case opFence:
		return "FENCE"
	case opFinalize:
		return "FINALIZE"
	case opAbort:
		return "ABORT"
	case opCancel:
		return "CANCEL"
	case opOK:
		return "OK"
	case opValue:
		return "VALUE"
	case opNotFound:
		return "NOTFOUND"
	case opError:
		return "ERROR"
	case opFailure:
		return "FAILURE"
	}
	return fmt.Sprintf("op(%#x)", uint8(o))
}

// Error classes carried by opError frames.
const (
	classArg        uint8 = 1 // bad argument: mpierr.ErrArg
	classProcFailed uint8 = 2 // a rank failed: mpierr.ErrProcFailed
)

// errShort is returned by decoders when the input ends before the item does.
var errShort = errors.New("store: short input")

// errMalformed wraps every decoding error caused by hostile or corrupt bytes.
func errMalformed(format string, args ...any) error {
	return mpierr.Errorf(mpierr.ErrProtocol, "store: "+format, args...)
}

// frame is one decoded protocol frame. payload aliases the decoder's input.
type frame struct {
	op      op
	id      uint64
	payload []byte
}

// appendFrame appends the encoding of a frame whose payload is the
// concatenation of parts.
func appendFrame(dst []byte, o op, id uint64, parts ...[]byte) []byte {
	n := 1 + 8
	for _, p := range parts {
		n += len(p)
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(n))
	dst = append(dst, byte(o))
	dst = binary.LittleEndian.AppendUint64(dst, id)
	for _, p := range parts {
		dst = append(dst, p...)
	}
	return dst
}

// checkBodyLen validates the body length of a frame header.
func checkBodyLen(n uint32) error {
	if n < 1+8 {
		return errMalformed("frame body of %d bytes is shorter than its header", n)
	}
	if n > maxBody {
		return errMalformed("frame body of %d bytes exceeds the limit of %d", n, maxBody)
	}
	return nil
}

// decodeFrame decodes one frame from the start of b. It returns the frame,
// the bytes it used, and errShort if b holds only part of a frame. The
// payload aliases b.
func decodeFrame(b []byte) (frame, int, error) {
	if len(b) < 4 {
		return frame{}, 0, errShort
	}
	n := binary.LittleEndian.Uint32(b)
	if err := checkBodyLen(n); err != nil {
		return frame{}, 0, err
	}
	if uint64(len(b)-4) < uint64(n) {
		return frame{}, 0, errShort
	}
	body := b[4 : 4+int(n)]
	f := frame{op: op(body[0]), id: binary.LittleEndian.Uint64(body[1:9]), payload: body[9:]}
	if !f.op.valid() {
		return frame{}, 0, errMalformed("unknown frame kind %#x", uint8(f.op))
	}
	return f, 4 + int(n), nil
}

// readFrame reads one frame from r. The length is checked before the body is
// allocated, so a hostile length cannot make the reader allocate more than
// maxBody bytes. A stream that ends inside a frame gives io.ErrUnexpectedEOF.
func readFrame(r *bufio.Reader) (frame, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return frame{}, err
	}
	n := binary.LittleEndian.Uint32(hdr[:])
	if err := checkBodyLen(n); err != nil {
		return frame{}, err
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return frame{}, err
	}
	f := frame{op: op(body[0]), id: binary.LittleEndian.Uint64(body[1:9]), payload: body[9:]}
	if !f.op.valid() {
		return frame{}, errMalformed("unknown frame kind %#x", uint8(f.op))
	}
	return f, nil
}

// checkKey validates a key or fence name.
func checkKey(what string, k []byte) error {
	if len(k) == 0 {
		return mpierr.Errorf(mpierr.ErrArg, "store: empty %s", what)
	}
	if len(k) > MaxKeyLen {
		return mpierr.Errorf(mpierr.ErrArg, "store: %s of %d bytes exceeds the limit of %d", what, len(k), MaxKeyLen)
	}
	return nil
}

// appendKey appends a u16 length-prefixed key.
func appendKey(dst []byte, k string) []byte {
	dst = binary.LittleEndian.AppendUint16(dst, uint16(len(k)))
	return append(dst, k...)
}

// decodeKey decodes a u16 length-prefixed key from the start of b and
// returns it and the bytes used.
func decodeKey(b []byte) (string, int, error) {
	if len(b) < 2 {
		return "", 0, errShort
	}
	n := int(binary.LittleEndian.Uint16(b))
	if n == 0 || n > MaxKeyLen {
		return "", 0, errMalformed("key length %d out of range 1..%d", n, MaxKeyLen)
	}
	if len(b) < 2+n {
		return "", 0, errShort
	}
	return string(b[2 : 2+n]), 2 + n, nil
}

// decodeSet decodes the payload of a SET frame. The value aliases p.
func decodeSet(p []byte) (key string, value []byte, err error) {
	k, n, err := decodeKey(p)
	if err != nil {
		return "", nil, wrapShort(err, "SET")
	}
	if len(p)-n > MaxValueLen {
		return "", nil, errMalformed("value of %d bytes exceeds the limit of %d", len(p)-n, MaxValueLen)
	}
	return k, p[n:], nil
}

// decodeName decodes a payload that is one key (GET, TRYGET, FENCE).
func decodeName(p []byte) (string, error) {
	if len(p) == 0 || len(p) > MaxKeyLen {
		return "", errMalformed("key length %d out of range 1..%d", len(p), MaxKeyLen)
	}
	return string(p), nil
}

// decodeWait decodes the payload of a WAIT frame.
func decodeWait(p []byte) ([]string, error) {
	if len(p) < 2 {
		return nil, errMalformed("WAIT payload of %d bytes", len(p))
	}
	count := int(binary.LittleEndian.Uint16(p))
	if count == 0 || count > maxWaitKeys {
		return nil, errMalformed("WAIT of %d keys out of range 1..%d", count, maxWaitKeys)
	}
	keys := make([]string, 0, count)
	off := 2
	for range count {
		k, n, err := decodeKey(p[off:])
		if err != nil {
			return nil, wrapShort(err, "WAIT")
		}
		keys = append(keys, k)
		off += n
	}
	if off != len(p) {
		return nil, errMalformed("WAIT payload has %d trailing bytes", len(p)-off)
	}
	return keys, nil
}

// appendCodeMsg appends an i32 code (or rank) followed by a message cut to
// MaxMsgLen bytes.
func appendCodeMsg(dst []byte, code int32, msg string) []byte {
	if len(msg) > MaxMsgLen {
		msg = msg[:MaxMsgLen]
	}
	dst = binary.LittleEndian.AppendUint32(dst, uint32(code))
	return append(dst, msg...)
}

// decodeCodeMsg decodes the payload of ABORT and FAILURE frames.
func decodeCodeMsg(p []byte) (int32, string, error) {
	if len(p) < 4 {
		return 0, "", errMalformed("payload of %d bytes lacks its code", len(p))
	}
	if len(p)-4 > MaxMsgLen {
		return 0, "", errMalformed("message of %d bytes exceeds the limit of %d", len(p)-4, MaxMsgLen)
	}
	return int32(binary.LittleEndian.Uint32(p)), string(p[4:]), nil
}

// decodeError decodes the payload of an ERROR frame into an error of the
// class it names.
func decodeError(p []byte) error {
	if len(p) < 1 || len(p)-1 > MaxMsgLen {
		return errMalformed("ERROR payload of %d bytes", len(p))
	}
	class := mpierr.ErrProtocol
	switch p[0] {
	case classArg:
		class = mpierr.ErrArg
	case classProcFailed:
		class = mpierr.ErrProcFailed
	}
	return mpierr.Errorf(class, "store: %s", p[1:])
}

// errorPayload encodes an ERROR frame payload.
func errorPayload(class uint8, msg string) []byte {
	if len(msg) > MaxMsgLen {
		msg = msg[:MaxMsgLen]
	}
	return append([]byte{class}, msg...)
}

func wrapShort(err error, what string) error {
	if errors.Is(err, errShort) {
		return errMalformed("truncated %s payload", what)
	}
	return err
}
