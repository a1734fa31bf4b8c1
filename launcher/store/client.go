package store

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// ErrClosed is returned by the methods of a Client after Close or Finalize.
var ErrClosed = errors.New("store: client closed")

// Failure reports a failed rank. Rank is -1 when the connection to the store
// itself was lost (gorun is gone).
type Failure struct {
	Rank  int
	Cause string
}

// Client is one rank's connection to the store. Every method is safe for
// concurrent use; requests are multiplexed over the connection by id, so a
// Get that waits does not hold up a Set from another goroutine.
//
// Errors: a lost connection gives errors wrapping mpierr.ErrProcFailed;
// over-long keys and values give mpierr.ErrArg; use after Close gives
// ErrClosed.
type Client struct {
	rank     int
	conn     net.Conn
	out      *outbox
	failures *mailbox[Failure]
	nextID   atomic.Uint64
	done     chan struct{} // closed when the reader loop ends
	stop     chan struct{} // closed by Close: stops the failure mailbox
	wg       sync.WaitGroup

	mu        sync.Mutex
	pending   map[uint64]chan frame // guarded by mu
	closed    bool                  // guarded by mu: Close was called
	lostCause error                 // guarded by mu: why the connection ended
}

// Dial connects to the store at addr as rank, and authenticates with the job
// secret in both directions. ctx bounds the connection and the handshake only.
// A wrong secret, a rank outside the job, or a server that fails to prove it
// knows the secret give an error and no Client.
func Dial(ctx context.Context, addr string, secret []byte, rank int) (*Client, error) {
	if len(secret) == 0 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "store: empty secret")
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("store: dial %s: %w", addr, err)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	} else {
		conn.SetDeadline(time.Now().Add(handshakeTimeout))
	}
	stopWatch := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	err = clientHandshake(conn, secret, rand.Reader, rank)
	if !stopWatch() || err != nil {
		conn.Close()
		if err == nil || ctx.Err() != nil {
			err = errors.Join(ctx.Err(), err)
		}
		return nil, fmt.Errorf("store: handshake with %s: %w", addr, err)
	}
	conn.SetDeadline(time.Time{})

	c := &Client{
		rank:     rank,
		conn:     conn,
		out:      newOutbox(conn),
		failures: newMailbox[Failure](16),
		done:     make(chan struct{}),
		stop:     make(chan struct{}),
		pending:  make(map[uint64]chan frame),
	}
	c.wg.Add(3)
	go func() { defer c.wg.Done(); c.out.run() }()
	go func() { defer c.wg.Done(); c.failures.run(c.stop) }()
	go func() { defer c.wg.Done(); c.readLoop() }()
	return c, nil
}

// Rank returns the rank this client connected as.
func (c *Client) Rank() int { return c.rank }

func (c *Client) readLoop() {
	r := bufio.NewReaderSize(c.conn, 64<<10)
	var err error
	for {
		var f frame
		f, err = readFrame(r)
		if err != nil {
			break
		}
		if f.op == opFailure {
			rank, cause, derr := decodeCodeMsg(f.payload)
			if derr != nil {
				err = derr
				break
			}
			c.failures.put(Failure{Rank: int(rank), Cause: cause})
			continue
		}
		if f.op < opOK {
			err = errMalformed("unexpected %v frame from the server", f.op)
			break
		}
		c.mu.Lock()
		ch := c.pending[f.id]
		delete(c.pending, f.id)
		c.mu.Unlock()
		if ch != nil {
			ch <- f // capacity 1, one answer per id
		}
	}
	c.conn.Close()
	c.out.close()
	c.mu.Lock()
	userClosed := c.closed
	if userClosed {
		c.lostCause = ErrClosed
	} else {
		c.lostCause = mpierr.Errorf(mpierr.ErrProcFailed, "store: connection to gorun lost: %v", err)
	}
	c.pending = nil
	c.mu.Unlock()
	if !userClosed {
		c.failures.put(Failure{Rank: -1, Cause: fmt.Sprintf("connection to the store lost: %v", err)})
	}
	c.failures.close()
	close(c.done)
}

// request sends one request and waits for its answer. ctx cancellation
// withdraws the request at the server too.
func (c *Client) request(ctx context.Context, o op, parts ...[]byte) (frame, error) {
	ch := make(chan frame, 1)
	id := c.nextID.Add(1)
	c.mu.Lock()
	if c.pending == nil {
		err := c.lostCause
		c.mu.Unlock()
		return frame{}, err
	}
	if c.closed {
		c.mu.Unlock()
		return frame{}, ErrClosed
	}
	c.pending[id] = ch
	c.mu.Unlock()
	c.out.send(appendFrame(nil, o, id, parts...))
	select {
	case f := <-ch:
		if f.op == opError {
			return frame{}, decodeError(f.payload)
		}
		return f, nil
	case <-c.done:
		select {
		case f := <-ch: // answered just before the end
			if f.op == opError {
				return frame{}, decodeError(f.payload)
			}
			return f, nil
		default:
		}
		c.mu.Lock()
		err := c.lostCause
		c.mu.Unlock()
		return frame{}, err
	case <-ctx.Done():
		c.mu.Lock()
		if c.pending != nil {
			delete(c.pending, id)
		}
		c.mu.Unlock()
		c.out.send(appendFrame(nil, opCancel, id))
		return frame{}, ctx.Err()
	}
}

func expect(f frame, want ...op) error {
	for _, o := range want {
		if f.op == o {
			return nil
		}
	}
	return errMalformed("answer %v, want %v", f.op, want)
}

// Set stores value under key, replacing any earlier value, and returns once
// the store holds it. value is copied before Set returns; the caller keeps
// ownership. Keys are 1..MaxKeyLen bytes and values at most MaxValueLen.
func (c *Client) Set(key string, value []byte) error {
	if err := checkKey("key", []byte(key)); err != nil {
		return err
	}
	if len(value) > MaxValueLen {
		return mpierr.Errorf(mpierr.ErrArg, "store: value of %d bytes exceeds the limit of %d", len(value), MaxValueLen)
	}
	f, err := c.request(context.Background(), opSet, appendKey(nil, key), value)
	if err != nil {
		return fmt.Errorf("store: set %q: %w", key, err)
	}
	return expect(f, opOK)
}

// Get returns the value of key, waiting (at the server, without polling)
// until some rank sets it or ctx is done. The result belongs to the caller.
func (c *Client) Get(ctx context.Context, key string) ([]byte, error) {
	if err := checkKey("key", []byte(key)); err != nil {
		return nil, err
	}
	f, err := c.request(ctx, opGet, []byte(key))
	if err != nil {
		return nil, fmt.Errorf("store: get %q: %w", key, err)
	}
	if err := expect(f, opValue); err != nil {
		return nil, err
	}
	return f.payload, nil
}

// TryGet returns the value of key and true if it is set, or nil and false
// at once if it is not.
func (c *Client) TryGet(key string) ([]byte, bool, error) {
	if err := checkKey("key", []byte(key)); err != nil {
		return nil, false, err
	}
	f, err := c.request(context.Background(), opTryGet, []byte(key))
	if err != nil {
		return nil, false, fmt.Errorf("store: tryget %q: %w", key, err)
	}
	if err := expect(f, opValue, opNotFound); err != nil {
		return nil, false, err
	}
	if f.op == opNotFound {
		return nil, false, nil
	}
	return f.payload, true, nil
}

// Wait returns once every one of keys is set, or when ctx is done. With no
// keys it returns nil at once.
func (c *Client) Wait(ctx context.Context, keys ...string) error {
	if len(keys) == 0 {
		return nil
	}
	if len(keys) > maxWaitKeys {
		return mpierr.Errorf(mpierr.ErrArg, "store: wait for %d keys exceeds the limit of %d", len(keys), maxWaitKeys)
	}
	p := binary.LittleEndian.AppendUint16(nil, uint16(len(keys)))
	for _, k := range keys {
		if err := checkKey("key", []byte(k)); err != nil {
			return err
		}
		p = appendKey(p, k)
	}
	f, err := c.request(ctx, opWait, p)
	if err != nil {
		return fmt.Errorf("store: wait: %w", err)
	}
	return expect(f, opOK)
}

// Fence returns once every rank of the job has called Fence with the same
// name. Once a fence completes its name may be used again. If a rank that has
// not reached the fence is reported failed (Server.NotifyFailure), Fence
// returns an error wrapping mpierr.ErrProcFailed. If ctx ends first, Fence
// returns ctx.Err(), and this rank still counts as arrived.
func (c *Client) Fence(ctx context.Context, name string) error {
	if err := checkKey("fence name", []byte(name)); err != nil {
		return err
	}
	f, err := c.request(ctx, opFence, []byte(name))
	if err != nil {
		return fmt.Errorf("store: fence %q: %w", name, err)
	}
	return expect(f, opOK)
}

// Finalize tells gorun that this rank finished cleanly, so that its exit will
// be accepted, then closes the client. It returns once gorun has recorded it.
func (c *Client) Finalize() error {
	f, err := c.request(context.Background(), opFinalize)
	if err == nil {
		err = expect(f, opOK)
	}
	cerr := c.Close()
	if err != nil {
		return fmt.Errorf("store: finalize: %w", err)
	}
	return cerr
}

// Abort asks gorun to end the whole job, every rank included this one, and to
// exit with code; gorun exits 1 for a code outside 0..255 (an exit status
// cannot carry it). msg is printed by gorun (at most MaxMsgLen bytes are
// sent). Abort returns once gorun has the request; the client stays open.
// The caller should then exit (gorun stops it in any case).
func (c *Client) Abort(code int, msg string) error {
	code = max(min(code, math.MaxInt32), math.MinInt32)
	f, err := c.request(context.Background(), opAbort, appendCodeMsg(nil, int32(code), msg))
	if err != nil {
		return fmt.Errorf("store: abort: %w", err)
	}
	return expect(f, opOK)
}

// Failures delivers a Failure for every rank gorun reports failed (including
// those reported before this client connected), and one Failure{Rank: -1}
// if the connection to the store is lost. Failures queue without bound until
// read. The channel is closed after the connection ends (at once, dropping
// unread failures, after Close).
func (c *Client) Failures() <-chan Failure { return c.failures.out }

// Close closes the connection. Pending requests fail with ErrClosed; no
// Failure{Rank: -1} is reported. Close is idempotent and waits for the
// client's goroutines.
func (c *Client) Close() error {
	c.mu.Lock()
	already := c.closed
	c.closed = true
	c.mu.Unlock()
	if !already {
		close(c.stop)
		c.conn.Close()
	}
	c.wg.Wait()
	return nil
}
