package tcp

import (
	"errors"
	"fmt"
	"io"

	"github.com/gompi-org/gompi/btl"
)

// source is the byte stream a frameReader parses: a socket (sock.read, with
// busy polling) or, in tests, any io.Reader. read follows io.Reader, except
// that it is never called with an empty p.
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
// reads. SEND frames are dispatched from its buffer without copying; PUT
// and GETREPLY payloads are copied from what is already buffered and the
// rest is read directly into the destination memory.
type frameReader struct {
	src     source
	sink    frameSink
	maxSend uint64 // largest SEND frame (header + data) accepted
	buf     []byte // buf[r:w] is read but not yet parsed
	r, w    int
	bufMax  int // len(buf) never exceeds this
}

func newFrameReader(src source, sink frameSink, maxSend int) *frameReader {
	return &frameReader{src: src, sink: sink, maxSend: uint64(maxSend),
		buf: make([]byte, readBufInit), bufMax: max(readBufMax, maxSend+maxFrameHeader)}
}

// need makes at least n unparsed bytes available in buf[r:w]; n is at most
// maxSend+maxFrameHeader, for which the buffer grows (at least doubling).
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

// fill puts the payload of the current frame (length bytes, of which some
// may be buffered) into dst.
func (fr *frameReader) fill(dst []byte) error {
	k := copy(dst, fr.buf[fr.r:fr.w])
	fr.r += k
	for rest := len(dst) - k; rest > 0; rest = len(dst) - k {
		if rest < directRead {
			if err := fr.need(rest); err != nil {
				return err
			}
			fr.r += copy(dst[k:], fr.buf[fr.r:fr.r+rest])
			return nil
		}
		m, err := fr.src.read(dst[k:])
		k += m
		if err != nil && k < len(dst) {
			return err
		}
	}
	return nil
}

// next parses and handles one frame. It returns errPeerClosed after a
// CLOSE frame, a *protoError for a protocol violation, or the source's
// error (io.EOF at a frame boundary, io.ErrUnexpectedEOF inside a frame).
func (fr *frameReader) next() error {
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
	fr.r += n
	switch h.kind {
	case frameSend:
		if h.length > fr.maxSend || h.payload() > fr.maxSend {
			return protof("SEND frame of %d+%d bytes exceeds the %d-byte limit (btl_tcp_max_send_size and btl_tcp_eager_limit must match on every rank)", h.hdrLen, h.length, fr.maxSend)
		}
		total := int(h.payload())
		if err := fr.need(total); err != nil {
			return unexpected(err)
		}
		a, b, c := fr.r, fr.r+int(h.hdrLen), fr.r+total
		fr.r = c
		return fr.sink.deliver(h.tag, fr.buf[a:b:b], fr.buf[b:c:c])
	case framePut:
		dst, err := fr.sink.putTarget(h.reg, h.off, h.length)
		if err != nil {
			return err
		}
		if uint64(len(dst)) != h.length {
			panic("tcp: putTarget returned a buffer of the wrong length")
		}
		if err := fr.fill(dst); err != nil {
			return unexpected(err)
		}
		fr.sink.putDone(h.length)
		return nil
	case frameGetReq:
		return fr.sink.getRequest(h.reg, h.off, h.length, h.req)
	case frameGetReply:
		dst, op, err := fr.sink.getTarget(h.req, h.length)
		if err != nil {
			return err
		}
		if uint64(len(dst)) != h.length {
			panic("tcp: getTarget returned a buffer of the wrong length")
		}
		if err := fr.fill(dst); err != nil {
			return unexpected(err)
		}
		fr.sink.getDone(op)
		return nil
	case frameClose:
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
