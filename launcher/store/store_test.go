package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/internal/mpierr"
)

var testSecret = []byte("0123456789abcdef0123456789abcdef")

// lineLog is a log writer whose lines a test can wait for.
type lineLog struct{ lines chan string }

func (l *lineLog) Write(p []byte) (int, error) {
	for _, ln := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		select {
		case l.lines <- ln:
		default: // a test that does not read the log must not block the server
		}
	}
	return len(p), nil
}

// waitLog waits for a log line containing all of want.
func (l *lineLog) waitLog(t *testing.T, ctx context.Context, want ...string) string {
	t.Helper()
	for {
		select {
		case ln := <-l.lines:
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(ln, w)
			}
			if ok {
				return ln
			}
		case <-ctx.Done():
			t.Fatalf("no log line containing %q", want)
		}
	}
}

func newTestServer(t *testing.T, size int) (*Server, *lineLog) {
	t.Helper()
	s, err := NewServer(testSecret, size)
	if err != nil {
		t.Fatal(err)
	}
	ll := &lineLog{lines: make(chan string, 256)}
	s.SetLogger(log.New(ll, "", 0))
	t.Cleanup(func() { s.Close() })
	return s, ll
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func dial(t *testing.T, ctx context.Context, s *Server, rank int) *Client {
	t.Helper()
	c, err := Dial(ctx, s.Addr(), testSecret, rank)
	if err != nil {
		t.Fatalf("dial rank %d: %v", rank, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestSetGetFenceAcrossClients(t *testing.T) {
	const n = 16
	ctx := testCtx(t)
	s, _ := newTestServer(t, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for r := range n {
		wg.Go(func() {
			c, err := Dial(ctx, s.Addr(), testSecret, r)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			for round := range 3 {
				// Ask for the neighbour's key before it may exist: the
				// server must hold the Get until the Set arrives.
				next := (r + 1) % n
				got := make(chan []byte, 1)
				go func() {
					v, err := c.Get(ctx, fmt.Sprintf("addr/%d/%d", round, next))
					if err != nil {
						errs <- err
					}
					got <- v
				}()
				if err := c.Set(fmt.Sprintf("addr/%d/%d", round, r), []byte(fmt.Sprintf("rank-%d-%d", r, round))); err != nil {
					errs <- err
					return
				}
				if want, v := fmt.Sprintf("rank-%d-%d", next, round), <-got; string(v) != want {
					errs <- fmt.Errorf("rank %d round %d: got %q, want %q", r, round, v, want)
				}
				// All ranks wait for every key of the round, then fence with
				// a reused name.
				keys := make([]string, n)
				for i := range keys {
					keys[i] = fmt.Sprintf("addr/%d/%d", round, i)
				}
				if err := c.Wait(ctx, keys...); err != nil {
					errs <- err
				}
				if err := c.Fence(ctx, "round"); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestFenceWaitsForEveryRank(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 3)
	c0, c1, c2 := dial(t, ctx, s, 0), dial(t, ctx, s, 1), dial(t, ctx, s, 2)
	done := make(chan error, 2)
	go func() { done <- c0.Fence(ctx, "f") }()
	go func() { done <- c1.Fence(ctx, "f") }()
	// Only two of three have arrived: a TryGet round trip on each
	// connection proves their fence requests reached the server, and the
	// fences must still be pending.
	for _, c := range []*Client{c0, c1} {
		if _, _, err := c.TryGet("sync"); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-done:
		t.Fatalf("fence returned before rank 2 arrived: %v", err)
	default:
	}
	if err := c2.Fence(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

func TestGetDoesNotBlockSetOfSameClient(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 1)
	c := dial(t, ctx, s, 0)
	got := make(chan []byte, 1)
	go func() {
		v, err := c.Get(ctx, "k")
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	if err := c.Set("k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v := <-got; string(v) != "v" {
		t.Fatalf("Get = %q, want %q", v, "v")
	}
	v, ok, err := c.TryGet("k")
	if err != nil || !ok || string(v) != "v" {
		t.Fatalf("TryGet = %q, %v, %v", v, ok, err)
	}
	if _, ok, err := c.TryGet("absent"); err != nil || ok {
		t.Fatalf("TryGet(absent) = %v, %v", ok, err)
	}
	if err := c.Set("k", []byte("w")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "k"); err != nil || string(v) != "w" {
		t.Fatalf("Get after overwrite = %q, %v", v, err)
	}
}

func TestCancelledGetIsWithdrawn(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 1)
	c := dial(t, ctx, s, 0)
	short, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Get(short, "never")
		errc <- err
	}()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Get after cancel: %v, want context.Canceled", err)
	}
	// Requests of one connection are served in order: once this answer is
	// back, the server has processed the GET and its CANCEL.
	if _, _, err := c.TryGet("sync"); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	n := len(s.waiters)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d keys still have waiters after cancel", n)
	}
	if err := c.Set("never", nil); err != nil {
		t.Fatal(err)
	}
}

func TestLimits(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 1)
	c := dial(t, ctx, s, 0)
	big := bytes.Repeat([]byte{0xab}, MaxValueLen)
	if err := c.Set("big", big); err != nil {
		t.Fatalf("set a value of exactly MaxValueLen: %v", err)
	}
	if v, err := c.Get(ctx, "big"); err != nil || !bytes.Equal(v, big) {
		t.Fatalf("get big: %d bytes, %v", len(v), err)
	}
	for name, err := range map[string]error{
		"long key":    c.Set(strings.Repeat("k", MaxKeyLen+1), nil),
		"empty key":   c.Set("", nil),
		"long value":  c.Set("v", make([]byte, MaxValueLen+1)),
		"long fence":  c.Fence(ctx, strings.Repeat("f", MaxKeyLen+1)),
		"long getkey": func() error { _, err := c.Get(ctx, strings.Repeat("k", MaxKeyLen+1)); return err }(),
	} {
		if !errors.Is(err, mpierr.ErrArg) {
			t.Errorf("%s: %v, want ErrArg", name, err)
		}
	}
	// The connection is still good.
	if err := c.Set(strings.Repeat("k", MaxKeyLen), []byte("x")); err != nil {
		t.Fatal(err)
	}
}

func TestWrongSecretIsRefused(t *testing.T) {
	ctx := testCtx(t)
	s, ll := newTestServer(t, 2)
	_, err := Dial(ctx, s.Addr(), []byte("not the secret"), 0)
	if err == nil || !strings.Contains(err.Error(), "authentication failed") {
		t.Fatalf("dial with a wrong secret: %v", err)
	}
	ll.waitLog(t, ctx, "dropped connection", "handshake")

	// A client that knows the secret but claims a rank outside the job.
	if _, err := Dial(ctx, s.Addr(), testSecret, 2); !errors.Is(err, mpierr.ErrArg) {
		t.Fatalf("dial as rank 2 of 2: %v, want ErrArg", err)
	}
	// A fake server that does not know the secret is refused by the client.
	fake, err := NewServer([]byte("another secret"), 2)
	if err != nil {
		t.Fatal(err)
	}
	fake.SetLogger(nil)
	if _, err := Dial(ctx, fake.Addr(), testSecret, 0); err == nil || !strings.Contains(err.Error(), "server: store: authentication failed") {
		t.Fatalf("dial a server with another secret: %v", err)
	}
	fake.Close()
	for e := range fake.Events() {
		t.Fatalf("fake server saw %+v", e)
	}
}

// rawAuth opens a connection and completes the handshake by hand, so that
// the test can then send arbitrary bytes as an authenticated client.
func rawAuth(t *testing.T, s *Server, rank int) net.Conn {
	t.Helper()
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := clientHandshake(conn, testSecret, zeroReader{}, rank); err != nil {
		t.Fatal(err)
	}
	return conn
}

// expectClosed waits for the server to close conn.
func expectClosed(t *testing.T, conn net.Conn) {
	t.Helper()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	var b [64]byte
	for {
		_, err := conn.Read(b[:])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("server did not drop the connection")
			}
			return
		}
	}
}

func TestGarbageClientsAreDropped(t *testing.T) {
	ctx := testCtx(t)
	s, ll := newTestServer(t, 4)
	good := dial(t, ctx, s, 0)
	pending := make(chan []byte, 1)
	go func() {
		v, err := good.Get(ctx, "after")
		if err != nil {
			t.Error(err)
		}
		pending <- v
	}()

	hdr := func(n uint32) []byte { return binary.LittleEndian.AppendUint32(nil, n) }
	cases := []struct {
		name  string
		auth  bool
		bytes []byte
		log   string
	}{
		{"garbage before handshake", false, []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\nmore bytes to fill a hello"), "bad handshake magic"},
		{"truncated hello", false, []byte("GMPS\x01\x00"), "handshake"},
		{"unknown frame kind", true, appendFrame(nil, op(0x42), 1), "unknown frame kind"},
		{"huge length", true, hdr(maxBody + 1), "exceeds the limit"},
		{"length below header", true, hdr(3), "shorter than its header"},
		{"truncated frame", true, append(hdr(100), 1, 2, 3), "unexpected EOF"},
		{"server frame from client", true, appendFrame(nil, opValue, 1), "unexpected VALUE"},
		{"bad set payload", true, appendFrame(nil, opSet, 1, []byte{0xff, 0xff}), "key length"},
		{"empty get key", true, appendFrame(nil, opGet, 1), "key length"},
		{"bad wait", true, appendFrame(nil, opWait, 1, []byte{1, 0, 5, 0, 'a'}), "truncated WAIT"},
		{"short abort", true, appendFrame(nil, opAbort, 1, []byte{1}), "lacks its code"},
	}
	for i, tc := range cases {
		var conn net.Conn
		if tc.auth {
			conn = rawAuth(t, s, 1+i%3)
		} else {
			var err error
			if conn, err = net.Dial("tcp", s.Addr()); err != nil {
				t.Fatal(err)
			}
		}
		conn.Write(tc.bytes)
		if tc.name == "truncated frame" || tc.name == "truncated hello" {
			conn.(*net.TCPConn).CloseWrite()
		}
		expectClosed(t, conn)
		conn.Close()
		ll.waitLog(t, ctx, "dropped", tc.log)

		// The server and the good client carry on.
		key := fmt.Sprintf("k%d", i)
		if err := good.Set(key, []byte(tc.name)); err != nil {
			t.Fatalf("after %s: %v", tc.name, err)
		}
		if v, err := good.Get(ctx, key); err != nil || string(v) != tc.name {
			t.Fatalf("after %s: %q, %v", tc.name, v, err)
		}
	}
	other := dial(t, ctx, s, 3)
	if err := other.Set("after", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	if v := <-pending; string(v) != "ok" {
		t.Fatalf("pending Get = %q", v)
	}
}

func TestFailuresAreDelivered(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 3)
	c0, c1 := dial(t, ctx, s, 0), dial(t, ctx, s, 1)
	fenceErr := make(chan error, 1)
	go func() { fenceErr <- c0.Fence(ctx, "f") }()
	if _, _, err := c0.TryGet("sync"); err != nil { // the FENCE has reached the server
		t.Fatal(err)
	}
	s.NotifyFailure(2, "exited with status 3")
	want := Failure{Rank: 2, Cause: "exited with status 3"}
	for _, c := range []*Client{c0, c1} {
		select {
		case f := <-c.Failures():
			if f != want {
				t.Fatalf("rank %d got %+v, want %+v", c.Rank(), f, want)
			}
		case <-ctx.Done():
			t.Fatal("no failure delivered")
		}
	}
	if err := <-fenceErr; !errors.Is(err, mpierr.ErrProcFailed) {
		t.Fatalf("fence with a failed rank: %v, want ErrProcFailed", err)
	}
	if err := c1.Fence(ctx, "later"); !errors.Is(err, mpierr.ErrProcFailed) {
		t.Fatalf("new fence with a failed rank: %v, want ErrProcFailed", err)
	}
	// A client that connects later hears of it too.
	late := dial(t, ctx, s, 2)
	if f := <-late.Failures(); f != want {
		t.Fatalf("late client got %+v", f)
	}
}

func TestServerCloseReportsLostStore(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 2)
	c := dial(t, ctx, s, 0)
	getErr := make(chan error, 1)
	go func() {
		_, err := c.Get(ctx, "never")
		getErr <- err
	}()
	if _, _, err := c.TryGet("sync"); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case f := <-c.Failures():
		if f.Rank != -1 || !strings.Contains(f.Cause, "lost") {
			t.Fatalf("got %+v, want Rank -1", f)
		}
	case <-ctx.Done():
		t.Fatal("no Failure{Rank: -1} after the server closed")
	}
	if _, ok := <-c.Failures(); ok {
		t.Fatal("Failures not closed after the connection ended")
	}
	if err := <-getErr; !errors.Is(err, mpierr.ErrProcFailed) {
		t.Fatalf("pending Get: %v, want ErrProcFailed", err)
	}
	if err := c.Set("x", nil); !errors.Is(err, mpierr.ErrProcFailed) {
		t.Fatalf("Set after loss: %v, want ErrProcFailed", err)
	}
}

func TestEventsAndState(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 2)
	c0, c1 := dial(t, ctx, s, 0), dial(t, ctx, s, 1)
	if err := c0.Finalize(); err != nil {
		t.Fatal(err)
	}
	if st := s.State(0); !st.Connected || !st.Finalized {
		t.Fatalf("State(0) after Finalize = %+v", st)
	}
	if err := c0.Set("x", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Set after Finalize: %v, want ErrClosed", err)
	}
	if err := c1.Abort(7, "giving up"); err != nil {
		t.Fatal(err)
	}
	if ev, ok := s.AbortRequest(); !ok || ev != (Event{Kind: Aborted, Rank: 1, Code: 7, Msg: "giving up"}) {
		t.Fatalf("AbortRequest = %+v, %v", ev, ok)
	}
	if st := s.State(1); !st.Connected || st.Finalized {
		t.Fatalf("State(1) = %+v", st)
	}
	var got []Event
	for len(got) < 4 {
		select {
		case ev := <-s.Events():
			got = append(got, ev)
		case <-ctx.Done():
			t.Fatalf("events so far: %+v", got)
		}
	}
	counts := map[Event]int{}
	for _, ev := range got {
		counts[ev]++
	}
	for _, want := range []Event{{Kind: Connected, Rank: 0}, {Kind: Connected, Rank: 1}, {Kind: Finalized, Rank: 0}, {Kind: Aborted, Rank: 1, Code: 7, Msg: "giving up"}} {
		if counts[want] != 1 {
			t.Errorf("event %+v seen %d times in %+v", want, counts[want], got)
		}
	}
	// No Failure{-1} for a client closed by its owner.
	c1.Close()
	for f := range c1.Failures() {
		t.Fatalf("closed client reported %+v", f)
	}
}

func TestCloseWithUnauthenticatedConnection(t *testing.T) {
	s, _ := newTestServer(t, 1)
	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("GM")) // half a hello: the server waits for more
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close hung on a connection in its handshake")
	}
}

type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
