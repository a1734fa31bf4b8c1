package launcher

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gompi-org/gompi/launcher/store"
)

// Standard input of a job on several hosts. As on one host, it goes to
// rank 0 only (Open MPI's default); the other ranks read /dev/null. The
// daemon of rank 0's host connects back to gorun (the addresses are those
// of the store's host, with a port of the relay's own), sends the token it
// got in its job description, and hands the socket to rank 0 as its
// standard input. gorun copies its input into the socket and shuts down
// its sending side at end of input. The input has a connection of its
// own, not the daemon's control pipe: a rank 0 that does not read its
// input holds up only the copy (TCP flow control), never the signals that
// go through the pipe.

// stdinTimeout bounds a connection's wait for its token and the daemon's
// dial of each address.
const stdinTimeout = 10 * time.Second

// stdinRelay is gorun's end: a listener that admits the one connection
// that shows the token, then copies the input into it.
type stdinRelay struct {
	ln    net.Listener
	token string
	in    io.Reader

	mu     sync.Mutex
	taken  bool       // guarded by mu: a connection was admitted
	closed bool       // guarded by mu
	conns  []net.Conn // guarded by mu: open connections, closed by Close
}

// newStdinRelay listens on every address of this host for the daemon of
// rank 0's host.
func newStdinRelay(in io.Reader) (*stdinRelay, error) {
	ln, err := net.Listen("tcp", ":0")
	if err != nil {
		return nil, fmt.Errorf("standard input relay: %w", err)
	}
	var tok [32]byte
	rand.Read(tok[:])
	r := &stdinRelay{ln: ln, token: hex.EncodeToString(tok[:]), in: in}
	go r.serve()
	return r, nil
}

// addrs are the addresses a daemon tries, in order (as the store's).
func (r *stdinRelay) addrs() ([]string, error) {
	return store.ReachableAddrs(r.ln.Addr().String())
}

func (r *stdinRelay) serve() {
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return // closed
		}
		if !r.track(c) {
			c.Close()
			return
		}
		go r.admit(c) // one that never sends its token holds up nobody
	}
}

// track records c for Close; false once closed.
func (r *stdinRelay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns = append(r.conns, c)
	return true
}

// admit reads c's token; the first connection that shows it gets the
// input, every other is closed.
func (r *stdinRelay) admit(c net.Conn) {
	c.SetReadDeadline(time.Now().Add(stdinTimeout))
	got := make([]byte, len(r.token)+1)
	_, err := io.ReadFull(c, got)
	ok := err == nil && subtle.ConstantTimeCompare(got, []byte(r.token+"\n")) == 1
	r.mu.Lock()
	ok = ok && !r.taken && !r.closed
	if ok {
		r.taken = true
	}
	r.mu.Unlock()
	if !ok {
		c.Close()
		return
	}
	r.ln.Close()
	io.Copy(c, r.in) // ends at end of input, or when rank 0 or Close closes the socket
	if tc, ok := c.(*net.TCPConn); ok {
		tc.CloseWrite() // rank 0 reads end of input
	}
}

// Close stops the relay: the listener and every connection. A copy
// waiting in a Read of the input stays there until the input gives
// something (a Read cannot be interrupted), as on one host.
func (r *stdinRelay) Close() {
	r.mu.Lock()
	r.closed = true
	conns := r.conns
	r.conns = nil
	r.mu.Unlock()
	r.ln.Close()
	for _, c := range conns {
		c.Close()
	}
}

// dialStdin is the daemon's end: it connects to the first of addrs that
// answers, shows token, and returns the socket as a file for rank 0's
// standard input (in blocking mode once exec hands it over).
func dialStdin(addrs []string, token string) (*os.File, error) {
	var errs []string
	for _, a := range addrs {
		ctx, cancel := context.WithTimeout(context.Background(), stdinTimeout)
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
		cancel()
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		tc, ok := c.(*net.TCPConn)
		if !ok {
			c.Close()
			return nil, errors.New("standard input relay: not a TCP connection")
		}
		if _, err := tc.Write([]byte(token + "\n")); err != nil {
			tc.Close()
			errs = append(errs, err.Error())
			continue
		}
		f, err := tc.File() // a descriptor of its own: closing tc leaves the socket to f
		tc.Close()
		if err != nil {
			return nil, err
		}
		return f, nil
	}
	return nil, fmt.Errorf("gorun's standard input relay is not reachable from here: %s", strings.Join(errs, "; "))
}
