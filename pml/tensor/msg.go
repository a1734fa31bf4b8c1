package tensor

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// Control messages travel as btl fragments (wire.go). Every message
// starts with two bytes, the wire version and the kind; the body of each
// kind is a sequence of unsigned varints (u), zig-zag varints (s), single
// bytes (b), fixed little-endian words (u32) and length-prefixed byte
// strings (str: u length, bytes), as the kind's file describes. Fields are
// never raw in-memory object bytes (TensorFlow's verbs path copied a C++
// TensorShape into its messages): a decoder checks every length against
// what is left and every value against the limits, and returns an error,
// never panics. Version 2: requests carry releases and may ask to pull,
// NOTIFY may answer with a handle to read, ERROR_STATUS has a class,
// RELEASE.
const wireVersion = 2

// kind is a control message's kind.
type kind uint8

const (
	kindRequest   kind = 1  // TENSOR_REQUEST: receiver -> sender (msg_request.go)
	kindReRequest kind = 2  // TENSOR_RE_REQUEST: receiver -> sender (msg_request.go)
	kindMeta      kind = 3  // META_DATA_RESPONSE: sender -> receiver (msg_meta.go)
	kindNotify    kind = 4  // content written: sender -> receiver (msg_notify.go)
	kindError     kind = 5  // ERROR_STATUS: sender -> receiver (msg_error.go)
	kindCancel    kind = 6  // receiver -> sender: drop these requests (msg_cancel.go)
	kindCancelled kind = 7  // sender -> receiver: dropped, nothing will be written (msg_cancel.go)
	kindAbort     kind = 8  // any -> all: the rendezvous is aborted (msg_abort.go)
	kindClosed    kind = 9  // any -> all: this rank closed its rendezvous (msg_abort.go)
	kindRelease   kind = 10 // receiver -> sender: contents read, release them (msg_cancel.go)
)

var kindNames = map[kind]string{kindRequest: "TENSOR_REQUEST", kindReRequest: "TENSOR_RE_REQUEST", kindMeta: "META_DATA_RESPONSE",
	kindNotify: "NOTIFY", kindError: "ERROR_STATUS", kindCancel: "CANCEL", kindCancelled: "CANCELLED", kindAbort: "ABORT", kindClosed: "CLOSED", kindRelease: "RELEASE"}

func (k kind) String() string {
	if s, ok := kindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// maxMessage is the largest control message: a receiver reassembles parts
// up to this size, and encoders split batches to stay within it (and
// within one fragment of the transport, when they can).
const maxMessage = 64 << 10

// maxHandle bounds a registration handle (transports use 16-32 bytes).
const maxHandle = 1024

// maxErrorText bounds an ERROR_STATUS or ABORT message's text; longer
// texts are cut (TensorFlow cut its status at 4096 bytes with the rest of
// the record).
const maxErrorText = 2048

// ErrBadMessage is wrapped by every decoding error: bytes from a peer that
// are not a valid control message.
var ErrBadMessage = errors.New("tensor: malformed control message")

// message is one decoded control message.
type message interface {
	kind() kind
	appendBody(b []byte) []byte
}

// recycle gives a single-entry message from newNotifyMsg or newRequestMsg
// back for reuse; the caller has sent or handled it and nothing refers
// to it any more. Others are left to the collector. (few, in outbox.go,
// says what an allocation costs on the path of a Recv.)
func recycle(m message) {
	switch m := m.(type) {
	case *notifyMsg:
		if o := m.one; o != nil {
			*o = notifyOne{}
			notifyOnes.Put(o)
		}
	case *requestMsg:
		if o := m.one; o != nil {
			*o = requestOne{}
			requestOnes.Put(o)
		}
	}
}

// encodeTo appends m's bytes to b.
func encodeTo(b []byte, m message) []byte {
	b = append(b, wireVersion, byte(m.kind()))
	return m.appendBody(b)
}

// decode parses one control message that fills b. It returns the message
// and the bytes used (all of b), or an error wrapping ErrBadMessage.
func decode(b []byte) (message, int, error) {
	if len(b) < 2 {
		return nil, 0, fmt.Errorf("%w: %d bytes", ErrBadMessage, len(b))
	}
	if b[0] != wireVersion {
		return nil, 0, fmt.Errorf("%w: wire version %d (want %d)", ErrBadMessage, b[0], wireVersion)
	}
	r := &reader{b: b, off: 2}
	var m message
	switch k := kind(b[1]); k {
	case kindRequest, kindReRequest:
		m = decodeRequest(r, k == kindReRequest)
	case kindMeta:
		m = decodeMeta(r)
	case kindNotify:
		m = decodeNotify(r)
	case kindError:
		m = decodeError(r)
	case kindCancel, kindCancelled:
		m = decodeCancel(r, k == kindCancelled)
	case kindAbort, kindClosed:
		m = decodeAbort(r, k == kindClosed)
	case kindRelease:
		m = decodeRelease(r)
	default:
		return nil, 0, fmt.Errorf("%w: unknown kind %d", ErrBadMessage, b[1])
	}
	if r.err != nil {
		return nil, 0, fmt.Errorf("%w: %v: %v", ErrBadMessage, kind(b[1]), r.err)
	}
	if r.off != len(b) {
		return nil, 0, fmt.Errorf("%w: %v: %d bytes after the body", ErrBadMessage, kind(b[1]), len(b)-r.off)
	}
	return m, r.off, nil
}

// reader parses a body; the first error sticks and later reads return zero
// values.
type reader struct {
	b   []byte
	off int
	err error
}

func (r *reader) fail(format string, a ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, a...)
	}
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) u8() uint8 {
	if r.err != nil {
		return 0
	}
	if r.left() < 1 {
		r.fail("short at byte %d", r.off)
		return 0
	}
	v := r.b[r.off]
	r.off++
	return v
}

func (r *reader) u32() uint32 {
	if r.err != nil {
		return 0
	}
	if r.left() < 4 {
		r.fail("short at byte %d", r.off)
		return 0
	}
	v := binary.LittleEndian.Uint32(r.b[r.off:])
	r.off += 4
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b[r.off:])
	if n <= 0 {
		r.fail("bad varint at byte %d", r.off)
		return 0
	}
	r.off += n
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b[r.off:])
	if n <= 0 {
		r.fail("bad varint at byte %d", r.off)
		return 0
	}
	r.off += n
	return v
}

// index reads a request index (a u32 as a uvarint).
func (r *reader) index() uint32 {
	v := r.uvarint()
	if v > 0xffffffff {
		r.fail("request index %d beyond 32 bits", v)
		return 0
	}
	return uint32(v)
}

// bytes reads a length-prefixed byte string of at most max bytes; the
// result aliases the input.
func (r *reader) bytes(max int) []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(max) || n > uint64(r.left()) {
		r.fail("%d-byte field at byte %d (at most %d, %d left)", n, r.off, max, r.left())
		return nil
	}
	v := r.b[r.off : r.off+int(n)]
	r.off += int(n)
	return v
}

func (r *reader) str(max int) string { return string(r.bytes(max)) }

// count reads an entry count; every entry takes at least min bytes, so a
// count beyond what is left is an error before anything is allocated.
func (r *reader) count(min int) int {
	n := r.uvarint()
	if r.err != nil {
		return 0
	}
	if n > uint64(r.left()/min) {
		r.fail("%d entries in %d bytes", n, r.left())
		return 0
	}
	return int(n)
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b, s []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// Meta-data layout (in TENSOR_REQUEST, TENSOR_RE_REQUEST and
// META_DATA_RESPONSE): b dtype, b is_dead, u rank, rank x s dimension,
// u byte size.
func appendMeta(b []byte, m meta) []byte {
	b = append(b, byte(m.dtype), boolByte(m.dead))
	b = binary.AppendUvarint(b, uint64(len(m.shape)))
	for _, d := range m.shape {
		b = binary.AppendVarint(b, d)
	}
	return binary.AppendUvarint(b, m.bytes)
}

func (r *reader) meta() meta { return r.metaInto(nil) }

// metaInto is meta with the shape in buf when it has room (its length is
// ignored).
func (r *reader) metaInto(buf []int64) meta {
	var m meta
	m.dtype = DType(r.u8())
	switch r.u8() {
	case 0:
	case 1:
		m.dead = true
	default:
		r.fail("is_dead is neither 0 nor 1")
	}
	n := r.uvarint()
	if r.err != nil {
		return m
	}
	if n > MaxRank || n > uint64(r.left()) {
		r.fail("shape of rank %d", n)
		return m
	}
	if n <= uint64(cap(buf)) {
		m.shape = buf[:n:n]
	} else {
		m.shape = make([]int64, n)
	}
	for i := range m.shape {
		m.shape[i] = r.varint()
	}
	m.bytes = r.uvarint()
	if r.err == nil {
		if err := m.check(); err != nil {
			r.fail("meta-data: %v", err)
		}
	}
	return m
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// cut shortens an error text to maxErrorText bytes.
func cut(s string) string {
	if len(s) <= maxErrorText {
		return s
	}
	return s[:maxErrorText-3] + "..."
}
