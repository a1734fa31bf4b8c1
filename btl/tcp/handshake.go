package tcp

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

// Connection handshake. The initiator (the side that dialled) and the
// acceptor each send a hello:
//
//	magic "GOMPITCP" [8], version u8, role u8 ('I' or 'A'), link u16,
//	from rank u32, to rank u32, nonce [32], job id length u16, job id
//
// The exchange is
//
//	I → A  hello_I
//	A → I  hello_A, MAC("gompi-tcp acceptor", hello_I, hello_A)
//	I → A  MAC("gompi-tcp initiator", hello_I, hello_A)
//	A → I  verdict u8
//
// where MAC is HMAC-SHA256 keyed with the job secret over the label and the
// two hellos as sent. Each side proves it holds the secret over a transcript
// that contains the other's fresh nonce, so neither a replay nor a
// reflection passes, and the secret never crosses the wire. The initiator
// checks the acceptor's MAC before it sends its own. The verdict resolves
// simultaneous connects (see endpoint.decideIncoming); frames follow it.
const (
	protoVersion = 1
	helloMagic   = "GOMPITCP"
	nonceLen     = 32
	macLen       = sha256.Size
	maxJobID     = 1024
	helloFixed   = 8 + 1 + 1 + 2 + 4 + 4 + nonceLen + 2

	roleInitiator = 'I'
	roleAcceptor  = 'A'
)

// verdict is the acceptor's decision on an authenticated connection.
type verdict uint8

const (
	verdictAccept verdict = 1 // the connection carries the link from now on
	verdictTie    verdict = 2 // both sides are connecting: the lower rank's connection wins, this one is dropped
	verdictDup    verdict = 3 // the acceptor already has a connection for this link
	verdictGone   verdict = 4 // the acceptor's endpoint failed or its module is closing
)

func (v verdict) String() string {
	switch v {
	case verdictAccept:
		return "accepted"
	case verdictTie:
		return "rejected (simultaneous connect, the lower rank's connection wins)"
	case verdictDup:
		return "rejected (already connected)"
	case verdictGone:
		return "rejected (peer closing or failed)"
	}
	return fmt.Sprintf("verdict(%d)", uint8(v))
}

// errAuth: the peer did not prove that it holds the job secret.
var errAuth = errors.New("tcp: peer failed authentication (wrong job secret?)")

// hsConfig is what a process needs to run handshakes.
type hsConfig struct {
	secret []byte
	jobID  string
	rank   int
	size   int
	links  int
	rand   io.Reader // nonces (crypto/rand.Reader outside tests)
}

type hello struct {
	version  uint8
	role     byte
	link     int
	from, to int
	nonce    [nonceLen]byte
	jobID    string
	raw      []byte // as sent or received: the transcript input
}

func (c *hsConfig) newHello(role byte, peer, link int) (*hello, error) {
	h := &hello{version: protoVersion, role: role, link: link, from: c.rank, to: peer, jobID: c.jobID}
	if _, err := io.ReadFull(c.rand, h.nonce[:]); err != nil {
		return nil, fmt.Errorf("tcp: nonce: %w", err)
	}
	b := make([]byte, helloFixed, helloFixed+len(c.jobID))
	copy(b, helloMagic)
	b[8] = h.version
	b[9] = role
	binary.LittleEndian.PutUint16(b[10:], uint16(link))
	binary.LittleEndian.PutUint32(b[12:], uint32(c.rank))
	binary.LittleEndian.PutUint32(b[16:], uint32(peer))
	copy(b[20:], h.nonce[:])
	binary.LittleEndian.PutUint16(b[20+nonceLen:], uint16(len(c.jobID)))
	h.raw = append(b, c.jobID...)
	return h, nil
}

// readHello reads and decodes one hello. Only the encoding is checked here.
func readHello(r io.Reader) (*hello, error) {
	b := make([]byte, helloFixed)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("tcp: reading hello: %w", err)
	}
	if string(b[:8]) != helloMagic {
		return nil, fmt.Errorf("tcp: not a gompi tcp peer (bad magic %q)", b[:8])
	}
	h := &hello{version: b[8], role: b[9]}
	if h.version != protoVersion {
		return nil, fmt.Errorf("tcp: peer speaks protocol version %d, this build speaks %d", h.version, protoVersion)
	}
	h.link = int(binary.LittleEndian.Uint16(b[10:]))
	h.from = int(binary.LittleEndian.Uint32(b[12:]))
	h.to = int(binary.LittleEndian.Uint32(b[16:]))
	copy(h.nonce[:], b[20:])
	n := int(binary.LittleEndian.Uint16(b[20+nonceLen:]))
	if n > maxJobID {
		return nil, fmt.Errorf("tcp: hello with a %d-byte job id", n)
	}
	b = append(b, make([]byte, n)...)
	if _, err := io.ReadFull(r, b[helloFixed:]); err != nil {
		return nil, fmt.Errorf("tcp: reading hello: %w", err)
	}
	h.jobID = string(b[helloFixed:])
	h.raw = b
	return h, nil
}

func (c *hsConfig) mac(label string, hi, ha *hello) []byte {
	m := hmac.New(sha256.New, c.secret)
	m.Write([]byte(label))
	m.Write(hi.raw)
	m.Write(ha.raw)
	return m.Sum(nil)
}

const (
	labelAcceptor  = "gompi-tcp acceptor"
	labelInitiator = "gompi-tcp initiator"
)

// initiate runs the dialling side of the handshake with rank peer for link.
// rw should carry a deadline. It returns the acceptor's verdict, or an error
// (errAuth when the peer could not prove it holds the secret).
func initiate(rw io.ReadWriter, c *hsConfig, peer, link int) (verdict, error) {
	hi, err := c.newHello(roleInitiator, peer, link)
	if err != nil {
		return 0, err
	}
	if _, err := rw.Write(hi.raw); err != nil {
		return 0, fmt.Errorf("tcp: sending hello: %w", err)
	}
	ha, err := readHello(rw)
	if err != nil {
		return 0, err
	}
	switch {
	case ha.role != roleAcceptor:
		return 0, fmt.Errorf("tcp: acceptor hello with role %q", ha.role)
	case ha.jobID != c.jobID:
		return 0, fmt.Errorf("tcp: peer belongs to job %q, not %q", ha.jobID, c.jobID)
	case ha.from != peer || ha.to != c.rank || ha.link != link:
		return 0, fmt.Errorf("tcp: expected rank %d (to %d, link %d), peer says it is rank %d (to %d, link %d)",
			peer, c.rank, link, ha.from, ha.to, ha.link)
	}
	got := make([]byte, macLen)
	if _, err := io.ReadFull(rw, got); err != nil {
		return 0, fmt.Errorf("tcp: reading acceptor proof: %w", err)
	}
	if !hmac.Equal(got, c.mac(labelAcceptor, hi, ha)) {
		return 0, errAuth
	}
	if _, err := rw.Write(c.mac(labelInitiator, hi, ha)); err != nil {
		return 0, fmt.Errorf("tcp: sending proof: %w", err)
	}
	var v [1]byte
	if _, err := io.ReadFull(rw, v[:]); err != nil {
		return 0, fmt.Errorf("tcp: reading verdict: %w", err)
	}
	switch verdict(v[0]) {
	case verdictAccept, verdictTie, verdictDup, verdictGone:
		return verdict(v[0]), nil
	}
	return 0, fmt.Errorf("tcp: unknown verdict %d", v[0])
}

// accept runs the accepting side of the handshake. Once the initiator has
// proved it holds the secret, decide chooses the verdict, which is then
// sent. It returns the initiator's hello and the verdict; a non-nil error
// with verdictAccept means decide accepted but the verdict could not be
// sent (the caller must undo the acceptance).
func accept(rw io.ReadWriter, c *hsConfig, decide func(hi *hello) verdict) (*hello, verdict, error) {
	hi, err := readHello(rw)
	if err != nil {
		return nil, 0, err
	}
	switch {
	case hi.role != roleInitiator:
		return nil, 0, fmt.Errorf("tcp: initiator hello with role %q", hi.role)
	case hi.jobID != c.jobID:
		return nil, 0, fmt.Errorf("tcp: peer belongs to job %q, not %q", hi.jobID, c.jobID)
	case hi.to != c.rank:
		return nil, 0, fmt.Errorf("tcp: peer wants rank %d, this is rank %d", hi.to, c.rank)
	case hi.from < 0 || hi.from >= c.size || hi.from == c.rank:
		return nil, 0, fmt.Errorf("tcp: peer claims rank %d (world size %d)", hi.from, c.size)
	case hi.link >= c.links:
		return nil, 0, fmt.Errorf("tcp: rank %d asks for link %d, this rank has btl_tcp_links=%d", hi.from, hi.link, c.links)
	}
	ha, err := c.newHello(roleAcceptor, hi.from, hi.link)
	if err != nil {
		return nil, 0, err
	}
	if _, err := rw.Write(append(ha.raw, c.mac(labelAcceptor, hi, ha)...)); err != nil {
		return nil, 0, fmt.Errorf("tcp: sending hello: %w", err)
	}
	got := make([]byte, macLen)
	if _, err := io.ReadFull(rw, got); err != nil {
		return nil, 0, fmt.Errorf("tcp: reading initiator proof: %w", err)
	}
	if !hmac.Equal(got, c.mac(labelInitiator, hi, ha)) {
		return nil, 0, errAuth
	}
	v := decide(hi)
	if _, err := rw.Write([]byte{byte(v)}); err != nil {
		return hi, v, fmt.Errorf("tcp: sending verdict: %w", err)
	}
	return hi, v, nil
}
