package tcp

import (
	"bytes"
	"io"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// fixedRand is a deterministic nonce source.
type fixedRand byte

func (r fixedRand) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(r) + byte(i)
	}
	return len(p), nil
}

var fuzzSecret = []byte("fuzz secret")

func acceptorCfg() *hsConfig {
	return &hsConfig{secret: fuzzSecret, jobID: "fuzz-job", rank: 0, size: 4, links: 2, rand: fixedRand(0xA0)}
}

func initiatorCfg() *hsConfig {
	return &hsConfig{secret: fuzzSecret, jobID: "fuzz-job", rank: 1, size: 4, links: 2, rand: fixedRand(0x10)}
}

// transcript returns what a genuine initiator (rank 1, link 1) and the
// acceptor (rank 0) send each other with the fixed nonces.
func transcript(t testing.TB) (fromI, fromA []byte) {
	hi, err := initiatorCfg().newHello(roleInitiator, 0, 1)
	require.NoError(t, err)
	ha, err := acceptorCfg().newHello(roleAcceptor, 1, 1)
	require.NoError(t, err)
	c := acceptorCfg()
	fromI = append(bytes.Clone(hi.raw), c.mac(labelInitiator, hi, ha)...)
	fromA = append(append(bytes.Clone(ha.raw), c.mac(labelAcceptor, hi, ha)...), byte(verdictAccept))
	return
}

// script is a connection whose peer's bytes are given in advance.
type script struct {
	in  io.Reader
	out bytes.Buffer
}

func (s *script) Read(p []byte) (int, error)  { return s.in.Read(p) }
func (s *script) Write(p []byte) (int, error) { return s.out.Write(p) }

func TestHandshakePipe(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	type res struct {
		hi  *hello
		v   verdict
		err error
	}
	ch := make(chan res, 1)
	go func() {
		hi, v, err := accept(b, acceptorCfg(), func(*hello) verdict { return verdictTie })
		ch <- res{hi, v, err}
	}()
	v, err := initiate(a, initiatorCfg(), 0, 1)
	require.NoError(t, err)
	require.Equal(t, verdictTie, v)
	r := <-ch
	require.NoError(t, r.err)
	require.Equal(t, 1, r.hi.from)
	require.Equal(t, 1, r.hi.link)
}

func TestHandshakeTranscript(t *testing.T) {
	fromI, fromA := transcript(t)
	s := &script{in: bytes.NewReader(fromI)}
	_, v, err := accept(s, acceptorCfg(), func(*hello) verdict { return verdictAccept })
	require.NoError(t, err)
	require.Equal(t, verdictAccept, v)
	require.Equal(t, fromA, s.out.Bytes())

	s = &script{in: bytes.NewReader(fromA)}
	v, err = initiate(s, initiatorCfg(), 0, 1)
	require.NoError(t, err)
	require.Equal(t, verdictAccept, v)
	require.Equal(t, fromI, s.out.Bytes())

	// Any flipped bit in a proof fails authentication.
	for _, i := range []int{len(fromI) - 1, len(fromI) - macLen} {
		bad := bytes.Clone(fromI)
		bad[i] ^= 1
		_, _, err := accept(&script{in: bytes.NewReader(bad)}, acceptorCfg(), func(*hello) verdict { return verdictAccept })
		require.ErrorIs(t, err, errAuth)
	}
	bad := bytes.Clone(fromA)
	bad[len(bad)-2] ^= 1
	s = &script{in: bytes.NewReader(bad)}
	_, err = initiate(s, initiatorCfg(), 0, 1)
	require.ErrorIs(t, err, errAuth)
	hi, _ := initiatorCfg().newHello(roleInitiator, 0, 1)
	require.Equal(t, hi.raw, s.out.Bytes(), "the initiator sent its proof to an acceptor that failed authentication")
}

// FuzzAccept: whatever an initiator sends, the acceptor never panics, and it
// accepts only the genuine transcript (a forged proof must not pass).
func FuzzAccept(f *testing.F) {
	fromI, _ := transcript(f)
	f.Add(fromI)
	f.Add(fromI[:helloFixed])
	f.Add(append(bytes.Clone(fromI[:len(fromI)-macLen]), make([]byte, macLen)...))
	f.Fuzz(func(t *testing.T, in []byte) {
		decided := false
		_, v, err := accept(&script{in: bytes.NewReader(in)}, acceptorCfg(), func(*hello) verdict {
			decided = true
			return verdictAccept
		})
		if err != nil {
			return
		}
		if !decided || v != verdictAccept {
			t.Fatal("accepted without a decision")
		}
		if !bytes.HasPrefix(in, fromI) {
			t.Fatalf("accepted a transcript other than the genuine one: %x", in)
		}
	})
}

// FuzzInitiate: whatever an acceptor answers, the initiator never panics,
// accepts only the genuine acceptor, and never sends its proof otherwise.
func FuzzInitiate(f *testing.F) {
	fromI, fromA := transcript(f)
	f.Add(fromA)
	f.Add(fromA[:len(fromA)-1])
	f.Add(append(bytes.Clone(fromA[:len(fromA)-1]), 9))
	hiLen := len(fromI) - macLen
	f.Fuzz(func(t *testing.T, in []byte) {
		s := &script{in: bytes.NewReader(in)}
		_, err := initiate(s, initiatorCfg(), 0, 1)
		genuine := bytes.HasPrefix(in, fromA[:len(fromA)-1])
		if err == nil && !genuine {
			t.Fatalf("authenticated a forged acceptor: %x", in)
		}
		if !genuine && s.out.Len() != hiLen {
			t.Fatalf("sent %d bytes (the proof) to a forged acceptor", s.out.Len())
		}
	})
}
