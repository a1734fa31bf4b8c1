package tcp

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// outFrame is a frame waiting for the socket.
type outFrame struct {
	head     []byte // encoded frame header followed by a copy of the sender's header
	data     []byte // payload, referenced (user data, registered memory or an Alloc buffer)
	skip     int    // bytes of head+data already written
	cb       btl.Completion
	abuf     []byte // Alloc buffer to recycle once written
	closeOut bool   // CLOSE frame: shut our side down after it
	inl      [maxFrameHeader + 88]byte
}

var framePool = sync.Pool{New: func() any { return new(outFrame) }}

func newOutFrame(fh frameHeader, uh, data []byte, cb btl.Completion, abuf []byte) *outFrame {
	f := framePool.Get().(*outFrame)
	n := fh.encode(f.inl[:])
	if n+len(uh) <= len(f.inl) {
		f.head = append(f.inl[:n], uh...)
	} else {
		f.head = append(append(make([]byte, 0, n+len(uh)), f.inl[:n]...), uh...)
	}
	f.data, f.cb, f.abuf = data, cb, abuf
	return f
}

func (f *outFrame) size() int { return len(f.head) + len(f.data) }

// markerFrame is a Flush's marker: a frame of no bytes whose completion
// runs, in queue order, once the frames before it are written.
func markerFrame(cb btl.Completion) *outFrame {
	f := framePool.Get().(*outFrame)
	f.cb = cb
	return f
}

// completeAll runs the completions of frames (with err) and recycles them.
func completeAll(m *module, frames []*outFrame, err error) {
	for i, f := range frames {
		if f.cb != nil {
			f.cb(err)
		}
		if f.abuf != nil {
			m.recycle(f.abuf)
		}
		*f = outFrame{}
		framePool.Put(f)
		frames[i] = nil
	}
}

// conn is one established, authenticated connection of an endpoint. Its
// write side belongs to whoever set busy: a sender writing its frame
// directly, or the writer goroutine draining q. Its read side belongs to
// whoever holds rmu: the reader goroutine, after the netpoller reported
// the socket readable, or a goroutine polling through Module.Progress
// (the application waiting in the PML), which reads and dispatches on its
// own goroutine and so saves the reader goroutine's wake-up. Both read
// without blocking until the socket is empty; pollers only TryLock, the
// reader goroutine waits for the lock, then looks at the socket itself
// before it parks, so no byte is left unread without a goroutine that will
// be woken for it.
type conn struct {
	ep *endpoint
	m  *module
	s  *sock

	laddr, raddr string // the socket's addresses, for messages and tests

	rmu   sync.Mutex   // the read side: rd, s's read state, rerr
	rd    *frameReader // rmu
	rerr  error        // rmu: why the read side ended
	rdead atomic.Bool  // rerr is set: pollers stay away

	mu      sync.Mutex  // guards q, busy, err, closing
	q       []*outFrame // frames waiting for the write side, in order
	busy    bool        // someone owns the write side (s.writev, hb, iov)
	err     error       // set when the connection ended: writes fail with it
	closing bool        // our module is closing: CLOSE queued, inbound frames dropped

	wake  chan struct{} // cap 1: the writer goroutine has work
	kickc chan struct{} // cap 1: Module.Block was called: the reader waits on the socket now
	stop  chan struct{} // closed when the connection ends
	done  chan struct{} // closed when reader and writer have returned

	hb    [maxFrameHeader]byte // header scratch of the write-side owner
	iov   [][]byte             // iovec scratch of the write-side owner
	batch []*outFrame          // the writer goroutine's spare queue slice

	getting *getOp // rmu: the Get whose reply is being read
	wdone   chan struct{}
}

func newConn(ep *endpoint, nc *net.TCPConn) (*conn, error) {
	if err := nc.SetNoDelay(true); err != nil {
		return nil, fmt.Errorf("TCP_NODELAY: %w", err)
	}
	if n := ep.m.sh.cfg.sndbuf; n > 0 {
		if err := nc.SetWriteBuffer(n); err != nil {
			return nil, fmt.Errorf("SO_SNDBUF: %w", err)
		}
	}
	if n := ep.m.sh.cfg.rcvbuf; n > 0 {
		if err := nc.SetReadBuffer(n); err != nil {
			return nil, fmt.Errorf("SO_RCVBUF: %w", err)
		}
	}
	laddr, raddr := nc.LocalAddr().String(), nc.RemoteAddr().String()
	s, err := newSock(nc, ep.m.sh.cfg.spin, ep.m.sh.cfg.netpoll)
	if err != nil {
		return nil, err
	}
	c := &conn{ep: ep, m: ep.m, s: s, laddr: laddr, raddr: raddr,
		wake: make(chan struct{}, 1), kickc: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}), wdone: make(chan struct{})}
	c.rd = newFrameReader(s, c, ep.m.sh.cfg.maxSend)
	return c, nil
}

// start runs the reader and writer goroutines (counted in m.wg by attach).
func (c *conn) start() {
	go c.writeLoop()
	go c.readLoop()
	c.mu.Lock()
	if len(c.q) > 0 && !c.busy {
		c.signal()
	}
	c.mu.Unlock()
}

// signal wakes the writer goroutine; c.mu is held.
func (c *conn) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// submit writes a frame directly when the write side is free, else queues
// it (imm: refuses with ErrWouldBlock instead). See endpoint.submit.
func (c *conn) submit(fh frameHeader, uh, data []byte, cb btl.Completion, abuf []byte, imm bool) (bool, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return false, err
	}
	if c.closing {
		c.mu.Unlock()
		return false, c.m.errClosed()
	}
	if c.busy || len(c.q) > 0 {
		if imm {
			c.mu.Unlock()
			return false, btl.ErrWouldBlock
		}
		c.q = append(c.q, newOutFrame(fh, uh, data, cb, abuf))
		c.mu.Unlock()
		return false, nil
	}
	c.busy = true
	c.mu.Unlock()

	n := fh.encode(c.hb[:])
	total := n + len(uh) + len(data)
	iov := append(c.iov[:0], c.hb[:n], uh, data)
	w, err := c.s.writev(iov, false)
	clear(iov)
	c.iov = iov[:0]
	if err != nil {
		err = c.ioFailure(err)
		c.fail(err)
		return false, err
	}
	if w == total {
		c.release()
		return true, nil
	}
	if imm && w == 0 {
		c.release()
		return false, btl.ErrWouldBlock
	}
	// The socket took part of the frame: the rest goes first in the queue.
	if imm {
		data, cb = append([]byte(nil), data...), nil
	}
	f := newOutFrame(fh, uh, data, cb, abuf)
	f.skip = w
	c.mu.Lock()
	c.busy = false
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		*f = outFrame{}
		framePool.Put(f)
		return false, err
	}
	c.q = append(c.q, nil)
	copy(c.q[1:], c.q)
	c.q[0] = f
	c.signal()
	c.mu.Unlock()
	return imm, nil
}

// mark queues a Flush's marker frame behind the frames queued or being
// written; done (nothing queued) when there are none.
func (c *conn) mark(cb btl.Completion) (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return false, c.err
	}
	if c.closing {
		return false, c.m.errClosed()
	}
	if !c.busy && len(c.q) == 0 {
		return true, nil
	}
	c.q = append(c.q, markerFrame(cb))
	if !c.busy {
		c.signal()
	}
	return false, nil
}

// release gives up the write side, waking the writer if frames queued
// meanwhile.
func (c *conn) release() {
	c.mu.Lock()
	c.busy = false
	if len(c.q) > 0 {
		c.signal()
	}
	c.mu.Unlock()
}

func (c *conn) writeLoop() {
	defer c.m.wg.Done()
	defer close(c.wdone)
	for {
		select {
		case <-c.wake:
		case <-c.stop:
			return
		}
		c.flush()
	}
}

// flush writes queued frames in batches, one writev per batch (split at
// iovMax), blocking in the netpoller when the socket is full.
func (c *conn) flush() {
	c.mu.Lock()
	for c.err == nil && !c.busy && len(c.q) > 0 {
		batch := c.q
		c.q = c.batch[:0]
		c.busy = true
		c.mu.Unlock()

		iov := c.iov[:0]
		closeOut := false
		for _, f := range batch {
			h, d := f.head, f.data
			if f.skip < len(h) {
				h = h[f.skip:]
			} else {
				h, d = nil, d[f.skip-len(h):]
			}
			if len(h) > 0 {
				iov = append(iov, h)
			}
			if len(d) > 0 {
				iov = append(iov, d)
			}
			closeOut = closeOut || f.closeOut
		}
		_, err := c.s.writev(iov, true)
		clear(iov)
		c.iov = iov[:0]
		if err == nil && closeOut {
			c.s.shutdownWrite()
		}
		if err != nil {
			err = c.ioFailure(err)
			c.fail(err)
			completeAll(c.m, batch, err)
			return
		}
		completeAll(c.m, batch, nil)
		c.mu.Lock()
		c.batch = batch[:0]
		c.busy = false
	}
	c.mu.Unlock()
}

// ioFailure classifies a socket error of the write side.
func (c *conn) ioFailure(err error) error {
	c.mu.Lock()
	closing, cerr := c.closing, c.err
	c.mu.Unlock()
	if cerr != nil {
		return cerr
	}
	if closing {
		return c.m.errClosed()
	}
	return failure(fmt.Sprintf("tcp: connection to rank %d failed: %v", c.ep.peer, err), mpierr.ErrProcFailed)
}

// fail ends the connection with err (once): the socket is closed, queued
// frames complete with err, and the endpoint goes down unless our module is
// closing.
func (c *conn) fail(err error) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	q := c.q
	c.q = nil
	c.mu.Unlock()
	close(c.stop)
	c.s.abort()
	completeAll(c.m, q, err)
	c.ep.connDown(c, err)
}

// closeOrderly starts an orderly close for the module's Close: frames not
// yet started complete with ErrClosed, a CLOSE frame is queued, and the
// reader drops what still arrives until the peer closes too.
func (c *conn) closeOrderly() {
	err := c.m.errClosed()
	f := newOutFrame(frameHeader{kind: frameClose}, nil, nil, nil, nil)
	f.closeOut = true
	c.mu.Lock()
	if c.err != nil || c.closing {
		c.mu.Unlock()
		return
	}
	c.closing = true
	q := c.q
	c.q = []*outFrame{f}
	if !c.busy {
		c.signal()
	}
	c.mu.Unlock()
	completeAll(c.m, q, err)
}

// drain handles the frames that can be read without blocking; rmu is held.
// It returns how many it handled and, if the read side ended, why. It stops
// when the socket is empty, or when it has handled frames and nothing
// read is left unparsed: the read that would find the socket empty is
// saved (the caller looks at the socket again anyway: a poller on its next
// call, the reader goroutine before it sleeps), which shortens the path of
// a message to the waiter that polls for it.
func (c *conn) drain() (int, error) {
	n := 0
	for {
		switch err := c.rd.next(); err {
		case nil:
			n++
			if c.rd.idle() {
				return n, nil
			}
		case errWouldBlock:
			return n, nil
		default:
			return n, err
		}
	}
}

// poll reads and dispatches what the socket holds, on the calling
// goroutine, unless another goroutine is reading it; it returns the frames
// handled. The reader goroutine reports the end of the read side.
func (c *conn) poll() int {
	if c.rdead.Load() || !c.rmu.TryLock() {
		return 0
	}
	if c.rerr != nil {
		c.rmu.Unlock()
		return 0
	}
	n, err := c.drain()
	if err != nil {
		c.rerr = err
		c.rdead.Store(true)
	}
	c.rmu.Unlock()
	if err != nil {
		c.s.kick()
	}
	return n
}

// pollLease is how long the reader goroutine leaves its socket to the
// pollers after it saw Module.Progress called: it then looks again, and
// waits on the socket itself once nobody has polled for a whole lease (or
// at once when Module.Block is called).
const pollLease = 200 * time.Microsecond

// readLoop is the reader goroutine: it reads and dispatches what arrives
// while nobody polls. While the application calls Module.Progress it does
// not wait on the socket (so no thread is woken per message; the pollers
// read): it only comes back every pollLease to see whether they stopped.
func (c *conn) readLoop() {
	defer c.m.wg.Done()
	sh := c.m.sh
	leasing := canPoll && sh.cfg.lease
	var lease *time.Timer
	if leasing {
		lease = time.NewTimer(pollLease)
		lease.Stop()
		defer lease.Stop()
	}
	seen := sh.polls.Load()
	// pollersBack stops the reader's busy polling (btl_tcp_busy_poll) as
	// soon as the application polls: two goroutines spinning for the same
	// socket would only take CPU from the peer.
	var pollersBack func() bool
	if leasing {
		pollersBack = func() bool { return sh.polls.Load() != seen }
	}
	var err error
	for {
		c.rmu.Lock()
		if c.rerr == nil {
			if _, c.rerr = c.drain(); c.rerr != nil {
				c.rdead.Store(true)
			}
		}
		err = c.rerr
		c.rmu.Unlock()
		if err != nil {
			break
		}
		if leasing {
			if p := sh.polls.Load(); p != seen {
				seen = p
				lease.Reset(pollLease)
				select {
				case <-lease.C:
					continue
				case <-c.stop: // the socket is shut down: the drain sees its end
					lease.Stop()
					continue
				case <-c.kickc: // Block: wait on the socket now
					lease.Stop()
				}
			}
			seen = sh.polls.Load()
		}
		yielded, werr := c.s.wait(pollersBack)
		if yielded {
			continue // the lease path takes it from here
		}
		if werr != nil {
			c.rmu.Lock()
			if c.rerr == nil { // else a poller found the end and kicked us
				c.rerr = werr
				c.rdead.Store(true)
			}
			err = c.rerr
			c.rmu.Unlock()
			break
		}
	}
	c.mu.Lock()
	closing := c.closing
	c.mu.Unlock()
	peer := c.ep.peer
	var pe *protoError
	switch {
	case closing || c.m.closed.Load():
		err = c.m.errClosed()
	case err == errPeerClosed:
		err = fmt.Errorf("tcp: rank %d closed its tcp module: %w", peer, btl.ErrClosed)
	case errors.As(err, &pe):
		err = failure(fmt.Sprintf("tcp: rank %d broke the protocol, dropping its connection: %v", peer, pe), mpierr.ErrProtocol, mpierr.ErrProcFailed)
	case err == io.EOF:
		err = failure(fmt.Sprintf("tcp: rank %d closed the connection without a close frame (process died?)", peer), mpierr.ErrProcFailed)
	case err == io.ErrUnexpectedEOF:
		err = failure(fmt.Sprintf("tcp: rank %d closed the connection in the middle of a frame, without a close frame (process died?)", peer), mpierr.ErrProcFailed)
	default:
		err = failure(fmt.Sprintf("tcp: rank %d: connection lost: %v", peer, err), mpierr.ErrProcFailed)
	}
	c.rmu.Lock()
	op := c.getting
	c.getting = nil
	c.rmu.Unlock()
	if op != nil {
		op.cb(err)
		c.ep.getFinished(op, err)
	}
	c.fail(err)
	<-c.wdone
	c.s.close()
	close(c.done)
}

// The frameSink methods, called by c.rd on the reader goroutine.

func (c *conn) deliver(tag btl.Tag, hdr, data []byte) error {
	if c.m.closed.Load() {
		return nil
	}
	c.m.fragsRecv.Add(1)
	c.m.bytesRecv.Add(int64(len(hdr) + len(data)))
	c.m.sh.env.Dispatch.Dispatch(c.ep, tag, hdr, data)
	return nil
}

func (c *conn) putTarget(reg, off, length uint64) ([]byte, error) {
	return c.m.sh.regs.lookup(reg, off, length, btl.AccessRemoteWrite)
}

func (c *conn) putDone(uint64) {}

func (c *conn) getRequest(reg, off, length, req uint64) error {
	mem, err := c.m.sh.regs.lookup(reg, off, length, btl.AccessRemoteRead)
	if err != nil {
		return err
	}
	// An error here means the connection is ending; the reader sees it next.
	c.submit(frameHeader{kind: frameGetReply, length: length, req: req}, nil, mem, nil, nil, false)
	return nil
}

// testGetReplyTaken, when set (by a test, before the job opens), runs on
// the reader once a GETREPLY's Get is taken out of the endpoint's map,
// before its bytes are read.
var testGetReplyTaken func()

func (c *conn) getTarget(req, length uint64) ([]byte, *getOp, error) {
	op := c.ep.takeGet(req, true)
	if op == nil {
		return nil, nil, protof("GETREPLY for unknown request %d", req)
	}
	if testGetReplyTaken != nil {
		testGetReplyTaken()
	}
	if uint64(len(op.local)) != length {
		c.getting = op // completed with the connection's error
		return nil, nil, protof("GETREPLY of %d bytes for a %d-byte Get", length, len(op.local))
	}
	c.getting = op
	return op.local, op, nil
}

func (c *conn) getDone(op *getOp) {
	c.getting = nil
	op.cb(nil)
	c.ep.getFinished(op, nil)
}
