package store

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// The handshake that opens every connection. Both sides prove that they know
// the job secret without sending it:
//
//	client -> server  hello:     magic "GMPS", version, rank (i32), client nonce (32 bytes)
//	server -> client  challenge: server nonce (32 bytes), HMAC(secret, "server" | cn | sn | rank)
//	client -> server  proof:     HMAC(secret, "client" | cn | sn | rank)
//	server -> client  verdict:   status (0 accepted, 1 refused), u16 length, reason
//
// The two MACs carry different labels so that neither can be replayed as the
// other, and each covers both fresh nonces so that neither can be replayed on
// another connection. The client checks the server's MAC before it sends its
// own, so a fake server learns nothing it could use.
const (
	handshakeMagic   = "GMPS"
	handshakeVersion = 1
	nonceLen         = 32
	macLen           = sha256.Size
	helloLen         = 4 + 1 + 4 + nonceLen
	challengeLen     = nonceLen + macLen

	verdictAccepted = 0
	verdictRefused  = 1
)

var (
	labelServer = []byte("gompi-store server v1")
	labelClient = []byte("gompi-store client v1")
)

// errAuth reports a peer that failed to prove it knows the secret.
var errAuth = errors.New("store: authentication failed (wrong job secret?)")

// hello is the client's opening message.
type hello struct {
	version uint8
	rank    int32
	nonce   [nonceLen]byte
}

func (h hello) encode() []byte {
	b := make([]byte, 0, helloLen)
	b = append(b, handshakeMagic...)
	b = append(b, h.version)
	b = binary.LittleEndian.AppendUint32(b, uint32(h.rank))
	return append(b, h.nonce[:]...)
}

// decodeHello decodes a hello from the start of b and returns it and the
// bytes used.
func decodeHello(b []byte) (hello, int, error) {
	if len(b) < helloLen {
		return hello{}, 0, errShort
	}
	if string(b[:4]) != handshakeMagic {
		return hello{}, 0, errMalformed("bad handshake magic %q", b[:4])
	}
	h := hello{version: b[4], rank: int32(binary.LittleEndian.Uint32(b[5:9]))}
	if h.version != handshakeVersion {
		return hello{}, 0, errMalformed("handshake version %d, want %d", h.version, handshakeVersion)
	}
	copy(h.nonce[:], b[9:helloLen])
	return h, helloLen, nil
}

// handshakeMAC computes the MAC of one side of the handshake.
func handshakeMAC(secret, label []byte, cn, sn *[nonceLen]byte, rank int32) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write(label)
	m.Write(cn[:])
	m.Write(sn[:])
	var r [4]byte
	binary.LittleEndian.PutUint32(r[:], uint32(rank))
	m.Write(r[:])
	return m.Sum(nil)
}

// serverHandshake runs the server's side over rw. rand supplies the server
// nonce. admit decides, once the client is authenticated, whether its rank is
// accepted; a non-nil error refuses it with that reason. It returns the
// client's rank.
func serverHandshake(rw io.ReadWriter, secret []byte, rand io.Reader, admit func(rank int) error) (int, error) {
	var buf [helloLen]byte
	if _, err := io.ReadFull(rw, buf[:]); err != nil {
		return 0, fmt.Errorf("read hello: %w", err)
	}
	h, _, err := decodeHello(buf[:])
	if err != nil {
		return 0, err
	}
	var sn [nonceLen]byte
	if _, err := io.ReadFull(rand, sn[:]); err != nil {
		return 0, fmt.Errorf("server nonce: %w", err)
	}
	ch := make([]byte, 0, challengeLen)
	ch = append(ch, sn[:]...)
	ch = append(ch, handshakeMAC(secret, labelServer, &h.nonce, &sn, h.rank)...)
	if _, err := rw.Write(ch); err != nil {
		return 0, fmt.Errorf("write challenge: %w", err)
	}
	var proof [macLen]byte
	if _, err := io.ReadFull(rw, proof[:]); err != nil {
		return 0, fmt.Errorf("read proof: %w", err)
	}
	if !hmac.Equal(proof[:], handshakeMAC(secret, labelClient, &h.nonce, &sn, h.rank)) {
		writeVerdict(rw, verdictRefused, "authentication failed")
		return 0, fmt.Errorf("rank %d: %w", h.rank, errAuth)
	}
	if err := admit(int(h.rank)); err != nil {
		writeVerdict(rw, verdictRefused, err.Error())
		return 0, err
	}
	if err := writeVerdict(rw, verdictAccepted, ""); err != nil {
		return 0, fmt.Errorf("write verdict: %w", err)
	}
	return int(h.rank), nil
}

func writeVerdict(w io.Writer, status uint8, reason string) error {
	if len(reason) > MaxMsgLen {
		reason = reason[:MaxMsgLen]
	}
	b := []byte{status}
	b = binary.LittleEndian.AppendUint16(b, uint16(len(reason)))
	_, err := w.Write(append(b, reason...))
	return err
}

// clientHandshake runs the client's side over rw for the given rank; rand
// supplies the client nonce.
func clientHandshake(rw io.ReadWriter, secret []byte, rand io.Reader, rank int) error {
	h := hello{version: handshakeVersion, rank: int32(rank)}
	if _, err := io.ReadFull(rand, h.nonce[:]); err != nil {
		return fmt.Errorf("client nonce: %w", err)
	}
	if _, err := rw.Write(h.encode()); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	var ch [challengeLen]byte
	if _, err := io.ReadFull(rw, ch[:]); err != nil {
		return fmt.Errorf("read challenge: %w", err)
	}
	var sn [nonceLen]byte
	copy(sn[:], ch[:nonceLen])
	if !hmac.Equal(ch[nonceLen:], handshakeMAC(secret, labelServer, &h.nonce, &sn, h.rank)) {
		return fmt.Errorf("server: %w", errAuth)
	}
	if _, err := rw.Write(handshakeMAC(secret, labelClient, &h.nonce, &sn, h.rank)); err != nil {
		return fmt.Errorf("write proof: %w", err)
	}
	var v [3]byte
	if _, err := io.ReadFull(rw, v[:]); err != nil {
		return fmt.Errorf("read verdict: %w", err)
	}
	reason := make([]byte, binary.LittleEndian.Uint16(v[1:]))
	if _, err := io.ReadFull(rw, reason); err != nil {
		return fmt.Errorf("read verdict: %w", err)
	}
	switch v[0] {
	case verdictAccepted:
		return nil
	case verdictRefused:
		return mpierr.Errorf(mpierr.ErrArg, "store: server refused rank %d: %s", rank, reason)
	}
	return errMalformed("handshake verdict %d", v[0])
}
