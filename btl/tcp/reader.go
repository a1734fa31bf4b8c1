package tcp

import (
	"errors"
	"fmt"
	"io"

	"github.com/gompi-org/gompi/btl"
)

// source is the byte stream a frameReader parses: a non-blocking socket
// (sock.read) or, in tests, any io.Reader. read follows io.Reader, except
// that it is never called with an empty p and that it may return
// errWouldBlock (with no bytes) when nothing can be read right now.
type source interface {
	read(p []byte) (int, error)
}

// frameSink receives what a frameReader parses. Its methods run on the
// reader's goroutine. An error return is a protocol violation by the peer.
type frameSink interface {
	// deliver hands over a SEND frame; hdr and data are valid during the call.
	deliver(tag btl.Tag, hdr, data []byte) error
	// putTarget returns the memory a PUT of length bytes at off of
	// registration reg writes into (exactly length bytes).
	putTarget(reg, off, length uint64) ([]byte, error)
	// putDone is called once the PUT's bytes are in place.
	putDone(length uint64)
	// getRequest serves a GETREQ.
	getRequest(reg, off, length, req uint64) error
	// getTarget returns the buffer that a GETREPLY for req fills (exactly
	// length bytes) and an opaque token for getDone.
	getTarget(req, length uint64) ([]byte, *getOp, error)
	// getDone is called once the GETREPLY's bytes are in place.
	getDone(op *getOp)
}

// errPeerClosed: the peer sent a CLOSE frame.
var errPeerClosed = errors.New("tcp: peer closed the connection")

// errWouldBlock: the source has no bytes right now (a non-blocking socket).
// The frameReader keeps its place; calling next again resumes.
var errWouldBlock = errors.New("tcp: read would block")

// protoError marks a violation of the wire protocol found by the reader.
type protoError struct{ msg string }

func (e *protoError) Error() string { return e.msg }

func protof(format string, a ...any) error { return &protoError{fmt.Sprintf(format, a...)} }

const (
	readBufInit = 64 << 10  // initial read buffer of a connection
	readBufMax  = 256 << 10 // the buffer grows up to this (or the largest SEND frame, if larger)
	directRead  = 4 << 10   // PUT/GETREPLY remainders at least this long are read straight into place
)

// frameReader parses frames from a byte stream, resuming after partial
// reads: a source may return errWouldBlock at any point, and the next call
// of next continues where it stopped (the socket sources are non-blocking,
// so that a waiting application goroutine can poll them). SEND frames are
// dispatched from its buffer without copying, once complete; PUT and
// GETREPLY payloads are copied from what is already buffered and the rest
// is read directly into the destination memory.
type frameReader struct {
	src     source
	sink    frameSink
	maxSend uint64 // largest SEND frame (header + data) accepted
	buf     []byte // buf[r:w] is read but not yet parsed
	r, w    int
	bufMax  int // len(buf) never exceeds this

	// The PUT or GETREPLY whose payload is being read (filling): dst[:k]
	// is in place.
	filling bool
	kind    frameKind
	dst     []byte
	k       int
	op      *getOp
}

func newFrameReader(src source, sink frameSink, maxSend int) *frameReader {
	return &frameReader{src: src, sink: sink, maxSend: uint64(maxSend),
		buf: make([]byte, readBufInit), bufMax: max(readBufMax, maxSend+maxFrameHeader)}
}

// need makes at least n unparsed bytes available in buf[r:w]; n is at most
// maxSend+maxFrameHeader, for which the buffer grows (at least doubling).
// What it read stays buffered when it returns an error.
func (fr *frameReader) need(n int) error {
	if fr.w-fr.r >= n {
		return nil
	}
	if len(fr.buf)-fr.r < n {
		if n > len(fr.buf) {
			nb := make([]byte, min(max(2*len(fr.buf), n), fr.bufMax))
			fr.w = copy(nb, fr.buf[fr.r:fr.w])
			fr.r, fr.buf = 0, nb
		} else {
			fr.w = copy(fr.buf, fr.buf[fr.r:fr.w])
			fr.r = 0
		}
	}
	for fr.w-fr.r < n {
		m, err := fr.src.read(fr.buf[fr.w:])
		fr.w += m
		if err != nil && fr.w-fr.r < n {
			return err
		}
	}
	return nil
}

// fill continues reading the current PUT or GETREPLY payload into fr.dst
// and completes the frame when it is all there.
func (fr *frameReader) fill() error {
	dst := fr.dst
	c := copy(dst[fr.k:], fr.buf[fr.r:fr.w])
	fr.k += c
	fr.r += c
	for rest := len(dst) - fr.k; rest > 0; rest = len(dst) - fr.k {
		if rest < directRead {
			if err := fr.need(rest); err != nil {
				return unexpected(err)
			}
			fr.r += copy(dst[fr.k:], fr.buf[fr.r:fr.r+rest])
			fr.k = len(dst)
			break
		}
		m, err := fr.src.read(dst[fr.k:])
		fr.k += m
		if err != nil && fr.k < len(dst) {
			return unexpected(err)
		}
	}
	kind, op, n := fr.kind, fr.op, uint64(len(dst))
	fr.filling, fr.dst, fr.k, fr.op = false, nil, 0, nil
	if kind == framePut {
		fr.sink.putDone(n)
	} else {
		fr.sink.getDone(op)
	}
	return nil
}

// idle reports whether everything read so far is parsed and handled (the
// reader is at a frame boundary with an empty buffer).
func (fr *frameReader) idle() bool { return !fr.filling && fr.r == fr.w }

// next parses and handles one frame. It returns errWouldBlock when the
// source ran dry first (call again to resume), errPeerClosed after a CLOSE
// frame, a *protoError for a protocol violation, or the source's error
// (io.EOF at a frame boundary, io.ErrUnexpectedEOF inside a frame). After
// an error other than errWouldBlock the reader must not be used again.
func (fr *frameReader) next() error {
	if fr.filling {
		return fr.fill()
	}
	if fr.r == fr.w {
		fr.r, fr.w = 0, 0
	}
	if err := fr.need(1); err != nil {
		return err
	}
	h, n, err := decodeFrameHeader(fr.buf[fr.r:fr.w])
	if err == errShortFrame {
		if err = fr.need(n); err != nil {
			return unexpected(err)
		}
		h, n, err = decodeFrameHeader(fr.buf[fr.r:fr.w])
	}
	if err != nil {
		return protof("%v", err)
	}
	switch h.kind {
	case frameSend:
		if h.length > fr.maxSend || h.payload() > fr.maxSend {
			return protof("SEND frame of %d+%d bytes exceeds the %d-byte limit (btl_tcp_max_send_size and btl_tcp_eager_limit must match on every rank)", h.hdrLen, h.length, fr.maxSend)
		}
		// The header stays unparsed until the whole frame is buffered.
		total := n + int(h.payload())
		if err := fr.need(total); err != nil {
			return unexpected(err)
		}
		a, b, c := fr.r+n, fr.r+n+int(h.hdrLen), fr.r+total
		fr.r = c
		return fr.sink.deliver(h.tag, fr.buf[a:b:b], fr.buf[b:c:c])
	case framePut:
		fr.r += n
		dst, err := fr.sink.putTarget(h.reg, h.off, h.length)
		if err != nil {
			return err
		}
		if uint64(len(dst)) != h.length {
			panic("tcp: putTarget returned a buffer of the wrong length")
		}
		fr.filling, fr.kind, fr.dst, fr.op = true, framePut, dst, nil
		return fr.fill()
	case frameGetReq:
		fr.r += n
		return fr.sink.getRequest(h.reg, h.off, h.length, h.req)
	case frameGetReply:
		fr.r += n
		dst, op, err := fr.sink.getTarget(h.req, h.length)
		if err != nil {
			return err
		}
		if uint64(len(dst)) != h.length {
			panic("tcp: getTarget returned a buffer of the wrong length")
		}
		fr.filling, fr.kind, fr.dst, fr.op = true, frameGetReply, dst, op
		return fr.fill()
	case frameClose:
		fr.r += n
		return errPeerClosed
	}
	panic("tcp: decodeFrameHeader accepted kind " + h.kind.String())
}

// unexpected turns an EOF inside a frame into io.ErrUnexpectedEOF.
func unexpected(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
