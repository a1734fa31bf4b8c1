package store

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// validFrames holds one valid instance of every frame kind.
func validFrames() [][]byte {
	wait := binary.LittleEndian.AppendUint16(nil, 2)
	wait = appendKey(wait, "a")
	wait = appendKey(wait, "bb")
	return [][]byte{
		appendFrame(nil, opSet, 1, appendKey(nil, "addr/0"), []byte("127.0.0.1:5000")),
		appendFrame(nil, opGet, 2, []byte("addr/1")),
		appendFrame(nil, opTryGet, 3, []byte("addr/2")),
		appendFrame(nil, opWait, 4, wait),
		appendFrame(nil, opFence, 5, []byte("init")),
		appendFrame(nil, opFinalize, 6),
		appendFrame(nil, opAbort, 7, appendCodeMsg(nil, 7, "giving up")),
		appendFrame(nil, opCancel, 2),
		appendFrame(nil, opOK, 1),
		appendFrame(nil, opValue, 2, []byte("value")),
		appendFrame(nil, opNotFound, 3),
		appendFrame(nil, opError, 5, errorPayload(classProcFailed, "rank 1 failed")),
		appendFrame(nil, opFailure, 0, appendCodeMsg(nil, 1, "exited with status 3")),
	}
}

// decodePayload runs the payload decoder of f's kind.
func decodePayload(f frame) error {
	switch f.op {
	case opSet:
		_, _, err := decodeSet(f.payload)
		return err
	case opGet, opTryGet, opFence:
		_, err := decodeName(f.payload)
		return err
	case opWait:
		_, err := decodeWait(f.payload)
		return err
	case opAbort, opFailure:
		_, _, err := decodeCodeMsg(f.payload)
		return err
	case opError:
		err := decodeError(f.payload)
		if errors.Is(err, errShort) {
			return err
		}
		return nil
	}
	return nil
}

func TestFrameRoundTrip(t *testing.T) {
	for _, b := range validFrames() {
		f, n, err := decodeFrame(b)
		if err != nil || n != len(b) {
			t.Fatalf("decode %x: n=%d err=%v", b, n, err)
		}
		if err := decodePayload(f); err != nil {
			t.Fatalf("%v payload: %v", f.op, err)
		}
		if again := appendFrame(nil, f.op, f.id, f.payload); !bytes.Equal(again, b) {
			t.Fatalf("%v: re-encoded %x, want %x", f.op, again, b)
		}
		// Every proper prefix is short, never an error or a panic.
		for i := range len(b) {
			if _, _, err := decodeFrame(b[:i]); err != errShort {
				t.Fatalf("%v prefix of %d bytes: %v, want errShort", f.op, i, err)
			}
		}
	}
	// Payload round trips.
	k, v, err := decodeSet(append(appendKey(nil, "key"), "val"...))
	if err != nil || k != "key" || string(v) != "val" {
		t.Fatalf("set: %q %q %v", k, v, err)
	}
	keys, err := decodeWait(appendKey(appendKey(binary.LittleEndian.AppendUint16(nil, 2), "x"), "yz"))
	if err != nil || len(keys) != 2 || keys[0] != "x" || keys[1] != "yz" {
		t.Fatalf("wait: %q %v", keys, err)
	}
	code, msg, err := decodeCodeMsg(appendCodeMsg(nil, -1, "m"))
	if err != nil || code != -1 || msg != "m" {
		t.Fatalf("code/msg: %d %q %v", code, msg, err)
	}
	h := hello{version: handshakeVersion, rank: 12, nonce: [nonceLen]byte{1, 2, 3}}
	if got, n, err := decodeHello(h.encode()); err != nil || n != helloLen || got != h {
		t.Fatalf("hello: %+v %d %v", got, n, err)
	}
}

// FuzzDecodeFrame feeds arbitrary bytes to the frame decoder, the stream
// reader and every payload decoder: none may panic, and whatever decodes must
// re-encode to the same bytes.
func FuzzDecodeFrame(f *testing.F) {
	for _, b := range validFrames() {
		f.Add(b)
	}
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 1})
	f.Add([]byte{3, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		fr, n, err := decodeFrame(b)
		if err != nil {
			if n != 0 {
				t.Fatalf("error %v with n=%d", err, n)
			}
		} else {
			if n < frameHeaderLen || n > len(b) {
				t.Fatalf("n=%d of %d bytes", n, len(b))
			}
			if again := appendFrame(nil, fr.op, fr.id, fr.payload); !bytes.Equal(again, b[:n]) {
				t.Fatalf("re-encoded %x, want %x", again, b[:n])
			}
			decodePayload(fr)
		}
		// The stream reader agrees with the buffer decoder.
		sf, serr := readFrame(bufioReader(b))
		if (err == nil) != (serr == nil) {
			if !(errors.Is(err, errShort) && (serr == io.EOF || serr == io.ErrUnexpectedEOF)) {
				t.Fatalf("decodeFrame err %v, readFrame err %v", err, serr)
			}
		}
		if err == nil && (sf.op != fr.op || sf.id != fr.id || !bytes.Equal(sf.payload, fr.payload)) {
			t.Fatalf("readFrame %+v, decodeFrame %+v", sf, fr)
		}
		decodeHello(b)
		decodeWait(b)
		decodeSet(b)
		decodeCodeMsg(b)
		decodeError(b)
	})
}

// transcript is an io.ReadWriter that reads a scripted peer and records what
// is written to it.
type transcript struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (t *transcript) Read(p []byte) (int, error)  { return t.in.Read(p) }
func (t *transcript) Write(p []byte) (int, error) { return t.out.Write(p) }

// Fixed nonces make a valid transcript computable.
var (
	fuzzClientNonce = [nonceLen]byte{'c'}
	fuzzServerNonce = [nonceLen]byte{'s'}
)

// validClientSide is what an honest client of rank sends.
func validClientSide(rank int32) []byte {
	h := hello{version: handshakeVersion, rank: rank, nonce: fuzzClientNonce}
	b := h.encode()
	return append(b, handshakeMAC(testSecret, labelClient, &fuzzClientNonce, &fuzzServerNonce, rank)...)
}

// validServerSide is what an honest server sends to a client of rank.
func validServerSide(rank int32) []byte {
	b := append([]byte(nil), fuzzServerNonce[:]...)
	b = append(b, handshakeMAC(testSecret, labelServer, &fuzzClientNonce, &fuzzServerNonce, rank)...)
	return append(b, verdictAccepted, 0, 0)
}

func admitBelow(n int) func(int) error {
	return func(r int) error {
		if r < 0 || r >= n {
			return errors.New("out of range")
		}
		return nil
	}
}

func TestHandshakeTranscripts(t *testing.T) {
	tr := &transcript{in: bytes.NewReader(validClientSide(3))}
	rank, err := serverHandshake(tr, testSecret, bytes.NewReader(fuzzServerNonce[:]), admitBelow(4))
	if err != nil || rank != 3 {
		t.Fatalf("server side: rank %d, %v", rank, err)
	}
	tr = &transcript{in: bytes.NewReader(validServerSide(3))}
	if err := clientHandshake(tr, testSecret, bytes.NewReader(fuzzClientNonce[:]), 3); err != nil {
		t.Fatalf("client side: %v", err)
	}
	// A transcript for one rank does not authenticate another.
	bad := validClientSide(3)
	bad[5] = 2
	tr = &transcript{in: bytes.NewReader(bad)}
	if _, err := serverHandshake(tr, testSecret, bytes.NewReader(fuzzServerNonce[:]), admitBelow(4)); !errors.Is(err, errAuth) {
		t.Fatalf("altered rank: %v, want errAuth", err)
	}
	// The secret never appears in what either side writes.
	for _, side := range [][]byte{validClientSide(3), validServerSide(3)} {
		if bytes.Contains(side, testSecret) {
			t.Fatal("secret on the wire")
		}
	}
}

// FuzzServerHandshake plays arbitrary client bytes against the server side of
// the handshake: it must not panic, and it may only accept the one valid
// proof.
func FuzzServerHandshake(f *testing.F) {
	f.Add(validClientSide(0))
	f.Add(validClientSide(9))
	f.Add(validClientSide(-1))
	f.Add(validClientSide(1)[:helloLen])
	f.Add([]byte("GMPS"))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr := &transcript{in: bytes.NewReader(b)}
		rank, err := serverHandshake(tr, testSecret, bytes.NewReader(fuzzServerNonce[:]), admitBelow(4))
		if err != nil {
			return
		}
		if rank < 0 || rank >= 4 {
			t.Fatalf("admitted rank %d", rank)
		}
		if want := validClientSide(int32(rank)); len(b) < len(want) || !bytes.Equal(b[:len(want)], want) {
			t.Fatalf("accepted a transcript other than the valid one: %x", b)
		}
	})
}

// FuzzClientHandshake plays arbitrary server bytes against the client side.
func FuzzClientHandshake(f *testing.F) {
	f.Add(validServerSide(2))
	f.Add(append(validServerSide(2)[:challengeLen], verdictRefused, 3, 0, 'b', 'a', 'd'))
	f.Add(append(validServerSide(2)[:challengeLen], 9, 0, 0))
	f.Add(validServerSide(2)[:challengeLen+1])
	f.Add(validServerSide(1))
	f.Fuzz(func(t *testing.T, b []byte) {
		tr := &transcript{in: bytes.NewReader(b)}
		err := clientHandshake(tr, testSecret, bytes.NewReader(fuzzClientNonce[:]), 2)
		if err == nil && !bytes.Equal(b[:challengeLen], validServerSide(2)[:challengeLen]) {
			t.Fatalf("accepted a server that did not prove the secret: %x", b)
		}
		// The client's proof is only written after the server's was checked.
		if len(tr.out.Bytes()) > helloLen && !bytes.Equal(b[:challengeLen], validServerSide(2)[:challengeLen]) {
			t.Fatal("client sent its proof to an unauthenticated server")
		}
	})
}

func bufioReader(b []byte) *bufio.Reader { return bufio.NewReader(bytes.NewReader(b)) }
