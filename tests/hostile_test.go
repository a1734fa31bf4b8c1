package tests

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// hostile speaks to the job's wire-up store and to the ranks' TCP endpoints
// without the job secret. Every connection has a deadline.
type hostile struct {
	t            *testing.T
	store        string   // host:port of gorun's store
	eps          []string // the ranks' TCP addresses
	jobID        string
	mu           sync.Mutex
	silent       []net.Conn // connections that say nothing until the job ends
	refusedProof int        // wrong-secret proofs the store answered with "refused"
}

func (h *hostile) dial(addr string) (net.Conn, error) {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	return c, nil
}

// send opens a connection to addr, writes b, then closes it (with linger, so
// a half-read connection is not reset before the peer saw the bytes).
func (h *hostile) send(addr string, b []byte) error {
	c, err := h.dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write(b)
	if err == nil {
		c.(*net.TCPConn).CloseWrite()
		io.Copy(io.Discard, c) // until the peer drops us (or the deadline)
	}
	return nil
}

func random(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

// storeHello is a store handshake hello: magic "GMPS", version, rank, nonce.
func storeHello(version byte, rank int32) []byte {
	b := append([]byte("GMPS"), version)
	b = binary.LittleEndian.AppendUint32(b, uint32(rank))
	return append(b, random(32)...)
}

// tcpHello is a btl/tcp initiator hello.
func tcpHello(link uint16, from, to uint32, jobID string, jobIDLen int) []byte {
	b := []byte("GOMPITCP")
	b = append(b, 1, 'I')
	b = binary.LittleEndian.AppendUint16(b, link)
	b = binary.LittleEndian.AppendUint32(b, from)
	b = binary.LittleEndian.AppendUint32(b, to)
	b = append(b, random(32)...)
	b = binary.LittleEndian.AppendUint16(b, uint16(jobIDLen))
	return append(b, jobID...)
}

// attackStore runs one round of attacks on the store.
func (h *hostile) attackStore() error {
	// Garbage, a truncated hello, a wrong version.
	if err := h.send(h.store, []byte("GET / HTTP/1.0\r\nHost: gompi\r\n\r\n"+strings.Repeat("x", 4096))); err != nil {
		return err
	}
	if err := h.send(h.store, storeHello(1, 0)[:11]); err != nil {
		return err
	}
	if err := h.send(h.store, storeHello(9, 0)); err != nil {
		return err
	}
	// A full handshake for rank 0 (and an out-of-range rank) with a proof
	// made without the secret: the store must refuse.
	for _, rank := range []int32{0, 1, 77} {
		c, err := h.dial(h.store)
		if err != nil {
			return err
		}
		_, err = c.Write(storeHello(1, rank))
		challenge := make([]byte, 64)
		if err == nil {
			_, err = io.ReadFull(c, challenge)
		}
		if err == nil {
			_, err = c.Write(random(32))
		}
		verdict := make([]byte, 3)
		if err == nil {
			_, err = io.ReadFull(c, verdict)
		}
		c.Close()
		if err != nil {
			return fmt.Errorf("store handshake as rank %d: %w", rank, err)
		}
		if verdict[0] != 1 {
			return fmt.Errorf("store answered a proof made without the secret with verdict %d, not refused", verdict[0])
		}
		h.mu.Lock()
		h.refusedProof++
		h.mu.Unlock()
	}
	return nil
}

// attackTCP runs one round of attacks on the TCP endpoint of rank `to`.
func (h *hostile) attackTCP(to int) error {
	addr := h.eps[to]
	from := uint32(1 - to) // the real peer, impersonated
	if err := h.send(addr, []byte(strings.Repeat("not a gompi peer\n", 100))); err != nil {
		return err
	}
	if err := h.send(addr, tcpHello(0, from, uint32(to), h.jobID, len(h.jobID))[:30]); err != nil { // truncated
		return err
	}
	if err := h.send(addr, tcpHello(0, from, uint32(to), "0123456789abcdef", 16)); err != nil { // another job
		return err
	}
	if err := h.send(addr, tcpHello(0, from, uint32(to), "", 0xffff)); err != nil { // huge job id
		return err
	}
	if err := h.send(addr, tcpHello(9, from, uint32(to), h.jobID, len(h.jobID))); err != nil { // no such link
		return err
	}
	// The right job id and peer, then a proof made without the secret: the
	// endpoint answers with its hello and MAC, then must drop us without a verdict.
	c, err := h.dial(addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write(tcpHello(0, from, uint32(to), h.jobID, len(h.jobID))); err != nil {
		return err
	}
	reply := make([]byte, 54+len(h.jobID)+32) // hello (54 bytes + job id) and MAC
	if _, err := io.ReadFull(c, reply); err != nil {
		return fmt.Errorf("rank %d's endpoint did not answer a well-formed hello: %w", to, err)
	}
	if _, err := c.Write(random(32)); err != nil {
		return err
	}
	n, err := c.Read(make([]byte, 1))
	if n != 0 || !(errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || strings.Contains(fmt.Sprint(err), "reset")) {
		return fmt.Errorf("rank %d's endpoint answered a bad proof with %d byte(s), %v (want the connection closed)", to, n, err)
	}
	return nil
}

// holdSilent opens a connection to addr that says nothing until the end.
func (h *hostile) holdSilent(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.silent = append(h.silent, c)
	h.mu.Unlock()
	return nil
}

func (h *hostile) round() error {
	if err := h.attackStore(); err != nil {
		return err
	}
	for to := range h.eps {
		if err := h.attackTCP(to); err != nil {
			return err
		}
	}
	return nil
}

// TestHostileClients: while a real job runs over tcp, clients without the
// job secret connect to gorun's store and to both ranks' TCP endpoints and
// send garbage, truncated and oversized hellos, hellos of another job or
// link, proofs made without the secret, or nothing at all. The job must
// still complete with every byte right, and gorun (store) and the ranks
// (--verbose) must log the rejections.
func TestHostileClients(t *testing.T) {
	r := start(t, 90*time.Second, nil, "-np", "2", "--btl", "self,tcp", "--verbose", "--timeout", "60s", prog("conform"), "wait")
	store := r.await(reStore, 30*time.Second)[1]
	h := &hostile{t: t, store: store}
	for rank := range 2 {
		m := r.await(regexp.MustCompile(fmt.Sprintf(`gompi\[%d\]: tcp: rank %d listening on \[([^\],]+)`, rank, rank)), 30*time.Second)
		h.eps = append(h.eps, m[1])
	}
	r.await(regexp.MustCompile(`(?m)^conform: ready$`), 30*time.Second)
	h.jobID, _ = jobOf(t, r.output())
	defer func() {
		for _, c := range h.silent {
			c.Close()
		}
	}()

	// Before the traffic: silent connections, then a round of everything.
	require.NoError(t, h.holdSilent(h.store))
	for _, ep := range h.eps {
		require.NoError(t, h.holdSilent(ep))
	}
	require.NoError(t, h.round())

	// During the traffic: keep attacking until the job ends.
	stop := make(chan struct{})
	errc := make(chan error, 1)
	rounds := 0
	go func() {
		defer close(errc)
		for ; ; rounds++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := h.round(); err != nil {
				// Once the job ends its ports close: connection refused is expected then.
				select {
				case <-stop:
				default:
					errc <- err
				}
				return
			}
		}
	}()
	_, err := io.WriteString(r.stdin, "go\n")
	require.NoError(t, err)
	out, code := r.wait()
	close(stop)
	attackErr := <-errc
	t.Logf("%d rounds of attacks during the traffic", rounds)
	if attackErr != nil && !strings.Contains(attackErr.Error(), "refused") && !strings.Contains(attackErr.Error(), "reset") &&
		!strings.Contains(attackErr.Error(), "EOF") {
		t.Errorf("attack during the job: %v", attackErr)
	}

	require.Equal(t, 0, code, out)
	require.Contains(t, out, "conform ok")
	require.GreaterOrEqual(t, h.refusedProof, 3)
	// gorun logs what its store rejected.
	for _, why := range []string{`bad handshake magic`, `read hello: unexpected EOF`, `handshake version 9`, `authentication failed`} {
		require.Regexp(t, `gorun: store: dropped connection from 127\.0\.0\.1:\d+: handshake: .*`+regexp.QuoteMeta(why), out)
	}
	// The ranks log what their endpoints rejected.
	for rank := range 2 {
		prefix := fmt.Sprintf(`gompi\[%d\]: tcp: rank %d: dropping incoming connection from 127\.0\.0\.1:\d+: `, rank, rank)
		for _, why := range []string{`not a gompi tcp peer`, `reading hello: unexpected EOF`, `peer belongs to job`,
			`hello with a 65535-byte job id`, `asks for link 9`, `peer failed authentication`} {
			require.Regexp(t, prefix+".*"+regexp.QuoteMeta(why), out)
		}
	}
}
