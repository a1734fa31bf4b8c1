package store

import (
	"bufio"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// handshakeTimeout bounds how long an unauthenticated connection may take to
// finish the handshake.
const handshakeTimeout = 10 * time.Second

// EventKind says what happened to a rank.
type EventKind uint8

// The kinds of Event.
const (
	// Connected: the rank finished the handshake (once per connection).
	Connected EventKind = iota + 1
	// Finalized: the rank called Client.Finalize.
	Finalized
	// Aborted: the rank called Client.Abort; Code and Msg are its arguments.
	Aborted
	// Lost: the rank's connection ended before it called Finalize (it
	// exited, crashed or was killed). A launcher that cannot see the rank's
	// process (srun runs it) learns of its end this way.
	Lost
)

// String returns the kind in lower case ("connected", ...).
func (k EventKind) String() string {
	switch k {
	case Connected:
		return "connected"
	case Finalized:
		return "finalized"
	case Aborted:
		return "aborted"
	case Lost:
		return "lost"
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event reports a rank's change of state to the launcher.
type Event struct {
	Kind EventKind
	Rank int
	Code int    // Aborted: the exit code the rank asked for
	Msg  string // Aborted: the rank's message
}

// RankState is what the server knows of one rank.
type RankState struct {
	Connected bool // the rank completed a handshake at least once
	Finalized bool // the rank called Finalize
}

// Server is the wire-up store of one job. It holds the keys ranks set, serves
// their waits and fences, and tells the launcher when ranks connect, finalize
// or ask to abort. All methods are safe for concurrent use.
type Server struct {
	secret []byte
	size   int
	ln     net.Listener
	events *mailbox[Event]
	stop   chan struct{} // closed by Close
	wg     sync.WaitGroup
	logger atomic.Pointer[log.Logger]

	mu       sync.Mutex
	kv       map[string][]byte    // guarded by mu
	waiters  map[string][]*waiter // guarded by mu: key -> requests that wait for it
	fences   map[string]*fence    // guarded by mu
	conns    map[*serverConn]bool // guarded by mu: authenticated connections
	raw      map[net.Conn]bool    // guarded by mu: every open connection
	state    []RankState          // guarded by mu
	failed   map[int]bool         // guarded by mu
	failures []Failure            // guarded by mu: every NotifyFailure so far, for late joiners
	abort    *Event               // guarded by mu: the first abort request
	closed   bool                 // guarded by mu
	recovery bool                 // guarded by mu: fences complete without failed ranks (SetRecovery)
}

// waiter is one Get or Wait request blocked on missing keys.
type waiter struct {
	c       *serverConn
	id      uint64
	get     string // Get: the key to answer with; empty for Wait
	missing int    // keys still absent
}

// fence is one generation of a named fence.
type fence struct {
	arrived map[int]bool
	waiters []reqRef
}

type reqRef struct {
	c  *serverConn
	id uint64
}

// serverConn is one authenticated client connection.
type serverConn struct {
	rank int
	conn net.Conn
	out  *outbox
}

// NewServer starts a store for a job of size ranks (0..size-1) that
// authenticates every connection with secret. It listens on an ephemeral TCP
// port of 127.0.0.1; Addr tells which. The caller must Close it.
func NewServer(secret []byte, size int) (*Server, error) {
	return NewServerOn(secret, size, "127.0.0.1:0")
}

// NewServerOn is NewServer listening on listen (host:port; ":0" for an
// ephemeral port on every address, as gorun does for a job on several
// hosts).
func NewServerOn(secret []byte, size int, listen string) (*Server, error) {
	if len(secret) == 0 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "store: empty secret")
	}
	if size < 1 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "store: job size %d < 1", size)
	}
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("store: listen: %w", err)
	}
	s := &Server{
		secret:  append([]byte(nil), secret...),
		size:    size,
		ln:      ln,
		events:  newMailbox[Event](64),
		stop:    make(chan struct{}),
		kv:      make(map[string][]byte),
		waiters: make(map[string][]*waiter),
		fences:  make(map[string]*fence),
		conns:   make(map[*serverConn]bool),
		raw:     make(map[net.Conn]bool),
		state:   make([]RankState, size),
		failed:  make(map[int]bool),
	}
	s.logger.Store(log.New(os.Stderr, "gorun store: ", 0))
	s.wg.Add(2)
	go func() { defer s.wg.Done(); s.events.run(s.stop) }()
	go func() { defer s.wg.Done(); s.acceptLoop() }()
	return s, nil
}

// SetLogger directs the server's log lines (dropped connections and their
// reasons) to l; by default they go to standard error. A nil l discards them.
func (s *Server) SetLogger(l *log.Logger) {
	if l == nil {
		l = log.New(io.Discard, "", 0)
	}
	s.logger.Store(l)
}

func (s *Server) logf(format string, args ...any) {
	s.logger.Load().Printf(format, args...)
}

// Addr returns the address ranks dial ("127.0.0.1:port"): the value of
// GOMPI_STORE.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Events delivers rank events in the order the server saw them. The channel
// never blocks the server (events queue without bound until read) and is
// closed by Close; events not yet read then are dropped.
func (s *Server) Events() <-chan Event { return s.events.out }

// State returns what the server knows of rank. It is exact at the moment of
// the call: a rank whose Finalize returned is reported Finalized, whatever is
// still queued on Events. Out-of-range ranks report the zero RankState.
func (s *Server) State(rank int) RankState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if rank < 0 || rank >= s.size {
		return RankState{}
	}
	return s.state[rank]
}

// AbortRequest returns the first abort request of the job, if any. Like
// State it is exact when Client.Abort has returned in the rank.
func (s *Server) AbortRequest() (Event, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abort == nil {
		return Event{}, false
	}
	return *s.abort, true
}

// NotifyFailure tells every connected client (and every client that connects
// later) that rank failed, with a one-line cause; each receives it on its
// Failures channel. Fences that rank has not reached fail with
// mpierr.ErrProcFailed, now and later (in recovery mode, SetRecovery,
// they complete without it instead). Repeated notices for a rank are sent
// again.
func (s *Server) NotifyFailure(rank int, cause string) {
	push := appendFrame(nil, opFailure, 0, appendCodeMsg(nil, int32(rank), cause))
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.failed[rank] = true
	s.failures = append(s.failures, Failure{Rank: rank, Cause: cause})
	for c := range s.conns {
		c.out.send(push)
	}
	for name, f := range s.fences {
		if !f.arrived[rank] {
			s.settleFenceLocked(name, f)
		}
	}
}

// SetRecovery sets how fences treat failed ranks (gorun
// --enable-recovery): on, a fence completes once every rank that has not
// failed reached it, so the survivors of a failure can still finalize;
// off (the default), a fence that a failed rank did not reach fails.
func (s *Server) SetRecovery(on bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recovery = on
}

// settleFenceLocked completes or fails fence f (name) if it can: done when
// every rank arrived, or in recovery mode every live one; failed when a
// failed rank did not arrive and recovery is off. Otherwise it waits.
func (s *Server) settleFenceLocked(name string, f *fence) {
	n := len(f.arrived)
	for r := range s.failed {
		if !f.arrived[r] {
			if !s.recovery {
				s.failFenceLocked(name, f)
				return
			}
			n++
		}
	}
	if n == s.size {
		for _, w := range f.waiters {
			w.c.out.send(appendFrame(nil, opOK, w.id))
		}
		delete(s.fences, name) // the name may be used again for a new fence
	}
}

// Close stops the server: it closes the listener and every connection (the
// clients then report Failure{Rank: -1}), waits for the server's goroutines,
// and closes Events. Close is idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	raw := s.raw
	s.raw = map[net.Conn]bool{}
	s.conns = map[*serverConn]bool{}
	s.mu.Unlock()
	err := s.ln.Close()
	for c := range raw {
		c.Close()
	}
	close(s.stop)
	s.wg.Wait()
	return err
}

func (s *Server) acceptLoop() {
	for {
		conn, err := s.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			s.logf("accept: %v", err)
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			conn.Close()
			return
		}
		s.raw[conn] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serve(conn)
			conn.Close()
			s.mu.Lock()
			delete(s.raw, conn)
			s.mu.Unlock()
		}()
	}
}

// admit accepts an authenticated rank.
func (s *Server) admit(rank int) error {
	if rank < 0 || rank >= s.size {
		return mpierr.Errorf(mpierr.ErrArg, "rank %d out of range 0..%d", rank, s.size-1)
	}
	return nil
}

// serve runs one connection: handshake, then the reader loop. It returns with
// the connection closed and its writer stopped.
func (s *Server) serve(conn net.Conn) {
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	conn.SetDeadline(time.Now().Add(handshakeTimeout))
	rank, err := serverHandshake(conn, s.secret, rand.Reader, s.admit)
	if err != nil {
		if errors.Is(err, io.EOF) && strings.HasPrefix(err.Error(), "read hello: ") {
			// Closed before sending a byte (io.ReadFull's EOF; a
			// partial hello is ErrUnexpectedEOF): a probe, such as a
			// host daemon checking that it can reach the store.
			return
		}
		s.logf("dropped connection from %s: handshake: %v", conn.RemoteAddr(), err)
		return
	}
	conn.SetDeadline(time.Time{})
	c := &serverConn{rank: rank, conn: conn, out: newOutbox(conn)}
	writerDone := make(chan struct{})
	go func() { defer close(writerDone); c.out.run() }()
	defer func() {
		conn.Close() // first: it unblocks a writer stuck on a client that does not read
		c.out.close()
		<-writerDone
	}()

	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.conns[c] = true
	s.state[rank].Connected = true
	for _, f := range s.failures {
		c.out.send(appendFrame(nil, opFailure, 0, appendCodeMsg(nil, int32(f.Rank), f.Cause)))
	}
	s.mu.Unlock()
	s.events.put(Event{Kind: Connected, Rank: rank})

	r := bufio.NewReaderSize(conn, 64<<10)
	for {
		f, err := readFrame(r)
		if err == nil {
			err = s.handle(c, f)
		}
		if err != nil {
			// A rank that ends closes (or, killed, resets) its connection:
			// not worth a log line. Bad or truncated frames are.
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, syscall.ECONNRESET) {
				s.logf("dropped rank %d (%s): %v", rank, conn.RemoteAddr(), err)
			}
			break
		}
	}
	s.mu.Lock()
	s.dropLocked(c)
	lost := !s.state[rank].Finalized && !s.closed
	s.mu.Unlock()
	if lost {
		s.events.put(Event{Kind: Lost, Rank: rank})
	}
}

// dropLocked forgets a connection and every request it left pending.
func (s *Server) dropLocked(c *serverConn) {
	delete(s.conns, c)
	for key, ws := range s.waiters {
		kept := ws[:0]
		for _, w := range ws {
			if w.c != c {
				kept = append(kept, w)
			}
		}
		if len(kept) == 0 {
			delete(s.waiters, key)
		} else {
			s.waiters[key] = kept
		}
	}
	for _, f := range s.fences {
		kept := f.waiters[:0]
		for _, w := range f.waiters {
			if w.c != c {
				kept = append(kept, w)
			}
		}
		f.waiters = kept
	}
}

// handle serves one request frame. An error drops the connection.
func (s *Server) handle(c *serverConn, f frame) error {
	reply := func(o op, parts ...[]byte) { c.out.send(appendFrame(nil, o, f.id, parts...)) }
	switch f.op {
	case opSet:
		key, val, err := decodeSet(f.payload)
		if err != nil {
			return err
		}
		s.set(key, val)
		reply(opOK)
	case opGet:
		key, err := decodeName(f.payload)
		if err != nil {
			return err
		}
		s.mu.Lock()
		if v, ok := s.kv[key]; ok {
			s.mu.Unlock()
			reply(opValue, v)
			return nil
		}
		s.waiters[key] = append(s.waiters[key], &waiter{c: c, id: f.id, get: key, missing: 1})
		s.mu.Unlock()
	case opTryGet:
		key, err := decodeName(f.payload)
		if err != nil {
			return err
		}
		s.mu.Lock()
		v, ok := s.kv[key]
		s.mu.Unlock()
		if ok {
			reply(opValue, v)
		} else {
			reply(opNotFound)
		}
	case opWait:
		keys, err := decodeWait(f.payload)
		if err != nil {
			return err
		}
		s.wait(c, f.id, keys)
	case opFence:
		name, err := decodeName(f.payload)
		if err != nil {
			return err
		}
		s.fence(c, f.id, name)
	case opFinalize:
		s.mu.Lock()
		s.state[c.rank].Finalized = true
		s.mu.Unlock()
		s.events.put(Event{Kind: Finalized, Rank: c.rank})
		reply(opOK)
	case opAbort:
		code, msg, err := decodeCodeMsg(f.payload)
		if err != nil {
			return err
		}
		ev := Event{Kind: Aborted, Rank: c.rank, Code: int(code), Msg: msg}
		s.mu.Lock()
		if s.abort == nil {
			s.abort = &ev
		}
		s.mu.Unlock()
		s.events.put(ev)
		reply(opOK)
	case opCancel:
		s.cancel(c, f.id)
	default:
		return errMalformed("unexpected %v frame from a client", f.op)
	}
	return nil
}

// set stores a value and wakes its waiters. val aliases the frame it came in,
// which readFrame allocated for this frame alone.
func (s *Server) set(key string, val []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, existed := s.kv[key]
	s.kv[key] = val
	if existed {
		return // waiters of a key only exist while it is absent
	}
	for _, w := range s.waiters[key] {
		w.missing--
		if w.missing > 0 {
			continue
		}
		if w.get != "" {
			w.c.out.send(appendFrame(nil, opValue, w.id, s.kv[w.get]))
		} else {
			w.c.out.send(appendFrame(nil, opOK, w.id))
		}
	}
	delete(s.waiters, key)
}

func (s *Server) wait(c *serverConn, id uint64, keys []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := &waiter{c: c, id: id}
	seen := make(map[string]bool, len(keys))
	for _, k := range keys {
		if _, ok := s.kv[k]; ok || seen[k] {
			continue
		}
		seen[k] = true
		w.missing++
		s.waiters[k] = append(s.waiters[k], w)
	}
	if w.missing == 0 {
		c.out.send(appendFrame(nil, opOK, id))
	}
}

func (s *Server) fence(c *serverConn, id uint64, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.fences[name]
	if f == nil {
		f = &fence{arrived: make(map[int]bool)}
		s.fences[name] = f
	}
	f.arrived[c.rank] = true
	f.waiters = append(f.waiters, reqRef{c, id})
	s.settleFenceLocked(name, f)
}

func (s *Server) failFenceLocked(name string, f *fence) {
	var missing []int
	for r := range s.failed {
		if !f.arrived[r] {
			missing = append(missing, r)
		}
	}
	msg := errorPayload(classProcFailed, fmt.Sprintf("fence %q cannot complete: failed rank(s) %v", name, missing))
	for _, w := range f.waiters {
		w.c.out.send(appendFrame(nil, opError, w.id, msg))
	}
	delete(s.fences, name)
}

// cancel forgets the pending Get or Wait of connection c with request id. A
// cancelled Fence stays counted as arrived: the rank did reach it.
func (s *Server) cancel(c *serverConn, id uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for key, ws := range s.waiters {
		kept := ws[:0]
		for _, w := range ws {
			if w.c != c || w.id != id {
				kept = append(kept, w)
			}
		}
		if len(kept) == 0 {
			delete(s.waiters, key)
		} else {
			s.waiters[key] = kept
		}
	}
	for _, f := range s.fences {
		kept := f.waiters[:0]
		for _, w := range f.waiters {
			if w.c != c || w.id != id {
				kept = append(kept, w)
			}
		}
		f.waiters = kept
	}
}
