package tcp

import (
	"bytes"
	"errors"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
)

func TestFrameHeaderRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, k := range []frameKind{frameSend, framePut, frameGetReq, frameGetReply, frameClose} {
		for range 100 {
			h := frameHeader{kind: k}
			switch k {
			case frameSend:
				h.tag, h.hdrLen, h.length = btl.Tag(r.Uint32()), r.Uint32(), r.Uint64()
			case framePut:
				h.length, h.reg, h.off = r.Uint64(), r.Uint64(), r.Uint64()
			case frameGetReq:
				h.length, h.reg, h.off, h.req = r.Uint64(), r.Uint64(), r.Uint64(), r.Uint64()
			case frameGetReply:
				h.length, h.req = r.Uint64(), r.Uint64()
			}
			b := make([]byte, maxFrameHeader)
			n := h.encode(b)
			want, _ := headerLen(k)
			require.Equal(t, want, n, "%v", k)
			got, m, err := decodeFrameHeader(b[:n])
			require.NoError(t, err, "%v", k)
			require.Equal(t, n, m)
			require.Equal(t, h, got)
			for short := range n {
				_, need, err := decodeFrameHeader(b[:short])
				require.ErrorIs(t, err, errShortFrame)
				require.Greater(t, need, short)
			}
		}
	}
}

// chunkSource feeds a byte string in reads of at most chunk bytes, as a
// socket delivering partial reads; with stall, every other read finds the
// socket empty (errWouldBlock), as a non-blocking socket between packets.
type chunkSource struct {
	b       []byte
	chunk   int
	stall   bool
	stalled bool
}

func (s *chunkSource) read(p []byte) (int, error) {
	if s.stall {
		if s.stalled = !s.stalled; s.stalled {
			return 0, errWouldBlock
		}
	}
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(s.b), s.chunk)
	copy(p, s.b[:n])
	s.b = s.b[n:]
	return n, nil
}

// fakeSink records parsed frames; it owns one registration (id 1, 64 bytes,
// read-write) and one pending Get (request 5, 16 bytes).
type fakeSink struct {
	regs    regTable
	mem     []byte
	get     *getOp
	getBuf  []byte
	sends   [][2][]byte
	puts    int
	getReqs int
	gotGet  bool
}

func newFakeSink() *fakeSink {
	s := &fakeSink{mem: make([]byte, 64)}
	s.regs.m = map[uint64]*registration{1: {t: &s.regs, id: 1, mem: s.mem, access: btl.AccessRemoteRead | btl.AccessRemoteWrite}}
	s.getBuf = make([]byte, 16)
	s.get = &getOp{local: s.getBuf}
	return s
}

func (s *fakeSink) deliver(tag btl.Tag, hdr, data []byte) error {
	s.sends = append(s.sends, [2][]byte{bytes.Clone(hdr), bytes.Clone(data)})
	return nil
}
func (s *fakeSink) putTarget(reg, off, length uint64) ([]byte, error) {
	return s.regs.lookup(reg, off, length, btl.AccessRemoteWrite)
}
func (s *fakeSink) putDone(uint64) { s.puts++ }
func (s *fakeSink) getRequest(reg, off, length, req uint64) error {
	_, err := s.regs.lookup(reg, off, length, btl.AccessRemoteRead)
	s.getReqs++
	return err
}
func (s *fakeSink) getTarget(req, length uint64) ([]byte, *getOp, error) {
	if req != 5 || s.get == nil {
		return nil, nil, protof("GETREPLY for unknown request %d", req)
	}
	op := s.get
	s.get = nil
	if uint64(len(op.local)) != length {
		return nil, nil, protof("GETREPLY of %d bytes for a %d-byte Get", length, len(op.local))
	}
	return op.local, op, nil
}
func (s *fakeSink) getDone(*getOp) { s.gotGet = true }

func frame(h frameHeader, payload []byte) []byte { return encodeFrame(h, payload) }

// nextFrame calls fr.next until it returns something other than
// errWouldBlock (a poller coming back to a socket).
func nextFrame(fr *frameReader) error {
	for {
		if err := fr.next(); err != errWouldBlock {
			return err
		}
	}
}

// validStream is one frame of every kind.
func validStream() []byte {
	var b []byte
	b = append(b, frame(frameHeader{kind: frameSend, tag: 0x41, hdrLen: 3, length: 5}, []byte("hdrdata!"))...)
	b = append(b, frame(frameHeader{kind: frameSend, tag: 0x42}, nil)...)
	b = append(b, frame(frameHeader{kind: framePut, length: 10, reg: 1, off: 54}, bytes.Repeat([]byte{7}, 10))...)
	b = append(b, frame(frameHeader{kind: frameGetReq, length: 64, reg: 1, req: 9}, nil)...)
	b = append(b, frame(frameHeader{kind: frameGetReply, length: 16, req: 5}, bytes.Repeat([]byte{9}, 16))...)
	b = append(b, frame(frameHeader{kind: frameClose}, nil)...)
	return b
}

func TestFrameReaderPartialReads(t *testing.T) {
	for i := 2; i < 140; i++ {
		chunk, stall := i/2, i%2 == 1
		s := newFakeSink()
		fr := newFrameReader(&chunkSource{b: validStream(), chunk: chunk, stall: stall}, s, 1024)
		var err error
		for err == nil {
			err = nextFrame(fr)
		}
		require.ErrorIs(t, err, errPeerClosed, "chunk %d stall %v", chunk, stall)
		require.Equal(t, [][2][]byte{{[]byte("hdr"), []byte("data!")}, {{}, {}}}, s.sends)
		require.Equal(t, 1, s.puts)
		require.Equal(t, bytes.Repeat([]byte{7}, 10), s.mem[54:])
		require.Equal(t, 1, s.getReqs)
		require.True(t, s.gotGet)
		require.Equal(t, bytes.Repeat([]byte{9}, 16), s.getBuf)
	}
}

// SEND frames larger than the initial buffer grow it; the split survives.
func TestFrameReaderGrow(t *testing.T) {
	const maxSend = 300 << 10
	var stream []byte
	var want [][2][]byte
	for i, n := range []int{10, 100 << 10, 7, maxSend - 5, 64 << 10, 0} {
		hdr := bytes.Repeat([]byte{byte(i)}, min(n, 5))
		data := bytes.Repeat([]byte{byte(i + 100)}, n-len(hdr))
		want = append(want, [2][]byte{hdr, data})
		stream = append(stream, frame(frameHeader{kind: frameSend, tag: 1, hdrLen: uint32(len(hdr)), length: uint64(len(data))}, append(bytes.Clone(hdr), data...))...)
	}
	for _, chunk := range []int{1000, 65536, 1 << 20} {
		s := newFakeSink()
		fr := newFrameReader(&chunkSource{b: stream, chunk: chunk, stall: chunk == 1000}, s, maxSend)
		var err error
		for err == nil {
			err = nextFrame(fr)
		}
		require.ErrorIs(t, err, io.EOF)
		require.Len(t, s.sends, len(want))
		for i := range want {
			require.Equal(t, len(want[i][0]), len(s.sends[i][0]), "frame %d hdr", i)
			require.True(t, bytes.Equal(want[i][0], s.sends[i][0]) && bytes.Equal(want[i][1], s.sends[i][1]), "frame %d", i)
		}
		require.LessOrEqual(t, len(fr.buf), maxSend+maxFrameHeader)
	}
}

// A PUT larger than directRead is read straight into the registration.
func TestFrameReaderDirectPut(t *testing.T) {
	s := newFakeSink()
	s.mem = make([]byte, 1<<20)
	s.regs.m[1].mem = s.mem
	data := bytes.Repeat([]byte("0123456789abcdef"), (1<<20)/16)
	stream := append(frame(frameHeader{kind: framePut, length: uint64(len(data)), reg: 1}, data), frame(frameHeader{kind: frameClose}, nil)...)
	for _, chunk := range []int{100, 4096, 5000, 1 << 20} {
		for _, stall := range []bool{false, true} {
			clear(s.mem)
			fr := newFrameReader(&chunkSource{b: stream, chunk: chunk, stall: stall}, s, 1024)
			require.NoError(t, nextFrame(fr))
			require.Equal(t, data, s.mem)
			require.ErrorIs(t, nextFrame(fr), errPeerClosed)
		}
	}
}

// FuzzFrameReader feeds arbitrary byte streams, in arbitrary read sizes, to
// the frame parser: it must never panic nor write outside the
// registration, and must stop with an error on anything malformed.
func FuzzFrameReader(f *testing.F) {
	v := validStream()
	f.Add(v, uint8(7))
	f.Add(v[:40], uint8(1))
	f.Add(frame(frameHeader{kind: frameSend, tag: 1, hdrLen: 1 << 20}, nil), uint8(16))
	f.Add(frame(frameHeader{kind: framePut, length: 65, reg: 1}, make([]byte, 65)), uint8(255))
	f.Add(frame(frameHeader{kind: framePut, length: 1, reg: 2}, []byte{1}), uint8(3))
	f.Add(frame(frameHeader{kind: frameGetReply, length: 15, req: 5}, make([]byte, 15)), uint8(3))
	f.Fuzz(func(t *testing.T, b []byte, chunk uint8) {
		s := newFakeSink()
		// Odd chunk values also make every other read find nothing.
		fr := newFrameReader(&chunkSource{b: b, chunk: int(chunk)/2 + 1, stall: chunk%2 == 1}, s, 1024)
		fr.buf = make([]byte, 48) // exercise compaction and growth
		var err error
		for i := 0; err == nil || err == errWouldBlock; i++ {
			if i > 4*len(b)+4 {
				t.Fatal("parser does not progress")
			}
			err = fr.next()
		}
		var pe *protoError
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && err != errPeerClosed && !errors.As(err, &pe) {
			t.Fatalf("unexpected error type %T: %v", err, err)
		}
		if err == io.EOF && fr.r != fr.w {
			t.Fatal("EOF inside a frame reported as a clean EOF")
		}
		for _, sd := range s.sends {
			if len(sd[0])+len(sd[1]) > 1024 {
				t.Fatalf("delivered a %d-byte SEND over the limit", len(sd[0])+len(sd[1]))
			}
		}
	})
}
