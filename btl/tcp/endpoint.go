package tcp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// epState is an endpoint's connection state. Every transition happens
// under endpoint.mu.
//
//	idle ──first operation──▶ connecting ──verdict accept──▶ connected
//	idle/connecting ──incoming accepted──▶ attaching ──▶ connected
//	any ──connect failure, EOF or reset, protocol error──▶ failed (PeerFailed)
//	any ──peer's close frame, or our Close──▶ closed
type epState uint8

const (
	epIdle       epState = iota
	epConnecting         // our dial/handshake is running; frames queue in pending
	epAttaching          // an incoming connection was accepted; its verdict is being sent
	epConnected          // conn carries the frames
	epFailed             // the peer died, was unreachable or broke the protocol
	epClosed             // the peer or this module closed in order
)

// endpoint is a module's path to one peer.
type endpoint struct {
	m    *module
	peer int
	cur  atomic.Pointer[conn] // the connected conn (nil otherwise): the lock-free fast path

	mu      sync.Mutex // guards the fields below
	state   epState
	conn    *conn
	err     error             // why state is failed or closed
	pending []*outFrame       // frames queued before the connection exists
	gets    map[uint64]*getOp // Gets waiting for their reply
	fences  []*fence          // Flushes waiting for what was posted before them
	fenceN  uint64            // Flush calls so far (a Get records the count)
	// replying counts the Gets whose GETREPLY is being read: out of gets
	// (a second reply for one is refused) but not finished, so that a
	// Flush waits for them too.
	replying int
}

// getOp is a Get waiting for its GETREPLY.
type getOp struct {
	local    []byte
	cb       btl.Completion
	fence    uint64 // endpoint.fenceN when the Get was posted: fences later than that wait for it
	replying bool   // counted in endpoint.replying (takeGet)
}

// fence is a Flush waiting for its marker frame (behind every frame queued
// before it) and for the Gets posted before it.
type fence struct {
	n   uint64 // the Flush's number (endpoint.fenceN after it)
	out int    // parts not completed yet: the marker and the Gets
	err error  // the first error a part completed with
	cb  btl.Completion
}

func (e *endpoint) Module() btl.Module { return e.m }
func (e *endpoint) Peer() int          { return e.peer }

// submit hands a frame to the connection, or queues it while connecting.
// The frame's payload data is referenced until the frame is written; uh is
// copied. With imm, it refuses (ErrWouldBlock) unless the frame can be
// written at once. Returns as for btl.Endpoint.Send.
func (e *endpoint) submit(fh frameHeader, uh, data []byte, cb btl.Completion, abuf []byte, imm bool) (bool, error) {
	if c := e.cur.Load(); c != nil {
		return c.submit(fh, uh, data, cb, abuf, imm)
	}
	e.mu.Lock()
	switch e.state {
	case epConnected:
		c := e.conn
		e.mu.Unlock()
		return c.submit(fh, uh, data, cb, abuf, imm)
	case epFailed, epClosed:
		err := e.err
		e.mu.Unlock()
		return false, err
	}
	if imm {
		e.mu.Unlock()
		return false, btl.ErrWouldBlock
	}
	if e.state == epIdle {
		e.state = epConnecting
		e.m.wg.Add(1)
		go e.connect()
	}
	e.pending = append(e.pending, newOutFrame(fh, uh, data, cb, abuf))
	e.mu.Unlock()
	return false, nil
}

// SendImmediate writes the fragment now, from the calling goroutine, or
// returns ErrWouldBlock (not connected yet, or other frames are being
// written). If the socket takes only part of it, the rest is copied and
// written later: it still counts as sent. Neither hdr nor data is
// referenced after the call.
func (e *endpoint) SendImmediate(tag btl.Tag, hdr, data []byte) error {
	if e.m.closed.Load() {
		return e.m.errClosed()
	}
	if err := e.checkSend(len(hdr) + len(data)); err != nil {
		return err
	}
	_, err := e.submit(frameHeader{kind: frameSend, tag: tag, hdrLen: uint32(len(hdr)), length: uint64(len(data))}, hdr, data, nil, nil, true)
	if err == nil {
		e.m.fragsSent.Add(1)
		e.m.bytesSent.Add(int64(len(hdr) + len(data)))
	}
	return err
}

// Send transmits hdr and data as one fragment. hdr is copied; data is read
// by the socket write, from the caller's slice (in place), and belongs to
// the module until completion. When the connection is idle the caller's
// goroutine writes the frame itself and Send returns done. The completion
// means the bytes are in the kernel's socket buffer, not that the peer got
// them. Errors: ErrClosed (module closed, or the peer closed), ErrProcFailed
// (the peer failed), mpierr.ErrArg (fragment larger than max(eager_limit,
// max_send_size)).
func (e *endpoint) Send(tag btl.Tag, hdr, data []byte, cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	if err := e.checkSend(len(hdr) + len(data)); err != nil {
		return false, err
	}
	done, err := e.submit(frameHeader{kind: frameSend, tag: tag, hdrLen: uint32(len(hdr)), length: uint64(len(data))}, hdr, data, cb, nil, false)
	if err == nil {
		e.m.fragsSent.Add(1)
		e.m.bytesSent.Add(int64(len(hdr) + len(data)))
	}
	return done, err
}

func (e *endpoint) checkSend(n int) error {
	if n > e.m.sh.cfg.maxSend {
		return mpierr.Errorf(mpierr.ErrArg, "tcp: %d-byte fragment exceeds the %d-byte limit", n, e.m.sh.cfg.maxSend)
	}
	return nil
}

// Alloc returns a module buffer of size bytes (at most max(eager_limit,
// max_send_size)) for SendAlloc or Free.
func (e *endpoint) Alloc(size int) ([]byte, error) {
	if e.m.closed.Load() {
		return nil, e.m.errClosed()
	}
	if size < 0 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "tcp: Alloc(%d)", size)
	}
	if err := e.checkSend(size); err != nil {
		return nil, err
	}
	return e.m.alloc(size), nil
}

// SendAlloc sends buf (from Alloc) as one fragment whose first hdrLen bytes
// are the header. buf returns to the module (also on error).
func (e *endpoint) SendAlloc(tag btl.Tag, buf []byte, hdrLen int, cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	if hdrLen < 0 || hdrLen > len(buf) {
		return false, mpierr.Errorf(mpierr.ErrArg, "tcp: SendAlloc header length %d of a %d-byte buffer", hdrLen, len(buf))
	}
	if err := e.checkSend(len(buf)); err != nil {
		return false, err
	}
	fh := frameHeader{kind: frameSend, tag: tag, hdrLen: uint32(hdrLen), length: uint64(len(buf) - hdrLen)}
	done, err := e.submit(fh, nil, buf, cb, buf, false)
	switch {
	case err != nil:
		e.m.recycle(buf)
	case done:
		e.m.recycle(buf)
		fallthrough
	default:
		e.m.fragsSent.Add(1)
		e.m.bytesSent.Add(int64(len(buf)))
	}
	return done, err
}

// Free returns an unsent Alloc buffer.
func (e *endpoint) Free(buf []byte) { e.m.recycle(buf) }

// Put writes local into the peer's registration named by handle at off.
// local belongs to the module until completion, which means the bytes are
// in the kernel's socket buffer: a fragment sent on this endpoint after
// that is delivered after the data is in the peer's memory. Empty local
// completes at once. Errors wrap ErrBadHandle (handle does not decode, range
// outside the registration: nothing is sent), mpierr.ErrNotSupported
// (btl_tcp_flags without put), ErrClosed or ErrProcFailed.
func (e *endpoint) Put(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	if e.m.sh.cfg.caps&btl.CapPut == 0 {
		return false, mpierr.Errorf(mpierr.ErrNotSupported, "tcp: put is disabled by btl_tcp_flags")
	}
	id, err := decodeHandle(handle, off, len(local))
	if err != nil {
		return false, err
	}
	if len(local) == 0 {
		return true, nil
	}
	done, err := e.submit(frameHeader{kind: framePut, length: uint64(len(local)), reg: id, off: uint64(off)}, nil, local, cb, nil, false)
	if err == nil {
		e.m.puts.Add(1)
		e.m.putBytes.Add(int64(len(local)))
	}
	return done, err
}

// Get reads len(local) bytes at off of the peer's registration named by
// handle into local, which belongs to the module until cb runs (never
// during the call, except for an empty local, which completes at once).
// It needs get in btl_tcp_flags. Errors as for Put; a peer that fails
// before answering completes the Get with its error.
func (e *endpoint) Get(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	if e.m.sh.cfg.caps&btl.CapGet == 0 {
		return false, mpierr.Errorf(mpierr.ErrNotSupported, "tcp: get is disabled by btl_tcp_flags (add get to enable it)")
	}
	id, err := decodeHandle(handle, off, len(local))
	if err != nil {
		return false, err
	}
	if len(local) == 0 {
		return true, nil
	}
	req := e.m.sh.reqs.Add(1)
	e.mu.Lock()
	if e.state == epFailed || e.state == epClosed {
		err := e.err
		e.mu.Unlock()
		return false, err
	}
	if e.gets == nil {
		e.gets = map[uint64]*getOp{}
	}
	e.gets[req] = &getOp{local: local, cb: cb, fence: e.fenceN}
	e.mu.Unlock()
	if _, err := e.submit(frameHeader{kind: frameGetReq, length: uint64(len(local)), reg: id, off: uint64(off), req: req}, nil, nil, nil, nil, false); err != nil {
		if op := e.takeGet(req, false); op != nil {
			e.getFinished(op, nil) // never posted: a fence counted it, nothing else will
			return false, err
		}
		// The endpoint failed meanwhile and has completed the Get.
		return false, nil
	}
	e.m.gets.Add(1)
	e.m.getBytes.Add(int64(len(local)))
	return false, nil
}

// takeGet takes Get req out of the Gets waiting for their reply (nil if
// it is not there). With replying (the reader of its GETREPLY) the Get
// stays counted until getFinished, so that a Flush called while its
// bytes are being read waits for them.
func (e *endpoint) takeGet(req uint64, replying bool) *getOp {
	e.mu.Lock()
	defer e.mu.Unlock()
	op := e.gets[req]
	if op != nil {
		delete(e.gets, req)
		if replying {
			op.replying = true
			e.replying++
		}
	}
	return op
}

// Flush completes once every frame queued on the endpoint before it has
// been written (Send, SendAlloc and Put complete then: their bytes are in
// the kernel's socket buffer) and every Get posted before it has its
// reply. The frames part is a marker without bytes queued behind them,
// completed in order with them; the Gets part counts the Gets in flight.
// Done at once when nothing is queued or in flight. An error return: the
// module is closed, or the endpoint failed or closed (what was posted
// before completes with that error).
func (e *endpoint) Flush(cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	f := &fence{cb: cb, out: 1}
	e.mu.Lock()
	if e.state == epFailed || e.state == epClosed {
		err := e.err
		e.mu.Unlock()
		return false, err
	}
	e.fenceN++
	f.n = e.fenceN
	f.out += len(e.gets) + e.replying // every Get in the map or being replied to was posted before this fence
	e.fences = append(e.fences, f)
	e.mu.Unlock()
	done, err := e.mark(func(err error) { e.fencePart(f, err) })
	if err != nil {
		// The endpoint ended meanwhile: the fence ends with it, by its
		// Gets (failed by down) or here.
		e.fencePart(f, err)
		return false, nil
	}
	if !done {
		return false, nil
	}
	e.mu.Lock()
	f.out--
	last := f.out == 0
	if last {
		e.dropFence(f)
	}
	e.mu.Unlock()
	return last, nil
}

// mark queues a marker frame (no bytes) with completion cb behind the
// frames queued so far; done when there are none (all written).
func (e *endpoint) mark(cb btl.Completion) (bool, error) {
	if c := e.cur.Load(); c != nil {
		return c.mark(cb)
	}
	e.mu.Lock()
	switch e.state {
	case epConnected:
		c := e.conn
		e.mu.Unlock()
		return c.mark(cb)
	case epFailed, epClosed:
		err := e.err
		e.mu.Unlock()
		return false, err
	case epIdle:
		e.mu.Unlock()
		return true, nil // nothing was ever queued
	}
	e.pending = append(e.pending, markerFrame(cb))
	e.mu.Unlock()
	return false, nil
}

// fencePart completes one part of fence f with err; the last one calls
// its completion.
func (e *endpoint) fencePart(f *fence, err error) {
	e.mu.Lock()
	if err != nil && f.err == nil {
		f.err = err
	}
	f.out--
	last := f.out == 0
	if last {
		e.dropFence(f)
	}
	e.mu.Unlock()
	if last {
		f.cb(f.err)
	}
}

// dropFence removes f from the waiting fences; e.mu is held.
func (e *endpoint) dropFence(f *fence) {
	for i, g := range e.fences {
		if g == f {
			e.fences = append(e.fences[:i], e.fences[i+1:]...)
			return
		}
	}
}

// getFinished tells the fences posted after Get op (taken from e.gets)
// that it completed with err; its own completion ran before.
func (e *endpoint) getFinished(op *getOp, err error) {
	e.mu.Lock()
	if op.replying {
		op.replying = false
		e.replying--
	}
	var done []*fence
	for _, f := range e.fences {
		if op.fence >= f.n {
			continue
		}
		if err != nil && f.err == nil {
			f.err = err
		}
		if f.out--; f.out == 0 {
			done = append(done, f)
		}
	}
	for _, f := range done {
		e.dropFence(f)
	}
	e.mu.Unlock()
	for _, f := range done {
		f.cb(f.err)
	}
}

// decideIncoming chooses the verdict for an authenticated incoming
// connection. Simultaneous connects are resolved so that the connection
// dialled by the lower rank survives: while we are dialling, a connection
// from a higher rank is refused (ours wins) and one from a lower rank is
// taken (the peer refuses ours). An accepted connection moves the endpoint
// to attaching, so that no dial starts before it is attached.
func (e *endpoint) decideIncoming() verdict {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.m.closed.Load() || e.state == epFailed || e.state == epClosed:
		return verdictGone
	case e.state == epConnected || e.state == epAttaching:
		return verdictDup
	case e.state == epConnecting && e.peer > e.m.sh.env.Rank:
		return verdictTie
	}
	e.state = epAttaching
	return verdictAccept
}

// attach makes c the endpoint's connection if the endpoint is still in
// state from, moving the queued frames onto it in order, and starts its
// goroutines. Otherwise it reports false and c is not used.
func (e *endpoint) attach(c *conn, from epState) bool {
	e.mu.Lock()
	if e.state != from || e.m.closed.Load() {
		e.mu.Unlock()
		c.s.abort()
		c.s.close()
		return false
	}
	e.state = epConnected
	e.conn = c
	c.q = e.pending // c is not shared yet
	e.pending = nil
	e.m.wg.Add(2)
	e.cur.Store(c)
	e.mu.Unlock()
	c.start()
	return true
}

// connect dials the peer until a connection is attached (by us or, after a
// simultaneous connect, by the peer's dial), the endpoint fails, or
// btl_tcp_connect_timeout passes.
func (e *endpoint) connect() {
	defer e.m.wg.Done()
	sh := e.m.sh
	ctx, cancel := context.WithTimeout(e.m.ctx, sh.cfg.connectTimeout)
	defer cancel()
	addrs, err := sh.peerAddrs(ctx, e.peer)
	if err != nil {
		e.connectFailed(err)
		return
	}
	backoff := time.Millisecond
	for {
		nc, v, err := e.dial(ctx, addrs)
		if err != nil {
			e.connectFailed(err)
			return
		}
		if v == verdictAccept {
			c, err := newConn(e, nc)
			if err != nil {
				nc.Close()
				e.connectFailed(err)
				return
			}
			if !e.attach(c, epConnecting) {
				// Cannot happen while the peer follows decideIncoming; the
				// peer sees the connection close and fails us.
				e.m.logf("tcp: rank %d: dropping an accepted connection to rank %d: endpoint no longer connecting", sh.env.Rank, e.peer)
				nc.Close()
			}
			return
		}
		nc.Close()
		if v == verdictGone {
			e.connectFailed(fmt.Errorf("rank %d refused the connection: %v", e.peer, v))
			return
		}
		// Tie or duplicate: the peer's own connection should arrive; retry
		// if it does not.
		select {
		case <-time.After(backoff):
		case <-ctx.Done():
			e.connectFailed(fmt.Errorf("connection %v, and none arrived from it: %w", v, ctx.Err()))
			return
		}
		backoff = min(2*backoff, 50*time.Millisecond)
		e.mu.Lock()
		st := e.state
		e.mu.Unlock()
		if st != epConnecting {
			return
		}
	}
}

// dial connects to the first address of the peer that answers and runs the
// initiator's handshake.
func (e *endpoint) dial(ctx context.Context, addrs []string) (*net.TCPConn, verdict, error) {
	var d net.Dialer
	var errs []error
	for _, a := range addrs {
		c, err := d.DialContext(ctx, "tcp", a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		nc := c.(*net.TCPConn)
		if dl, ok := ctx.Deadline(); ok {
			nc.SetDeadline(dl)
		}
		stop := context.AfterFunc(ctx, func() { nc.Close() })
		v, err := initiate(nc, &e.m.sh.hs, e.peer, e.m.link)
		stop()
		if err != nil {
			nc.Close()
			return nil, 0, fmt.Errorf("handshake with %v: %w", a, err)
		}
		nc.SetDeadline(time.Time{})
		return nc, v, nil
	}
	return nil, 0, errors.Join(errs...)
}

// connectFailed fails the endpoint when it could not be connected.
func (e *endpoint) connectFailed(err error) {
	e.down(nil, failure(fmt.Sprintf("tcp: rank %d cannot connect to rank %d: %v", e.m.sh.env.Rank, e.peer, err), mpierr.ErrProcFailed, btl.ErrUnreachable))
}

// connDown is called once when connection c ends with err: if c is the
// endpoint's connection the endpoint goes down with it.
func (e *endpoint) connDown(c *conn, err error) {
	e.down(c, err)
}

// down moves the endpoint to failed (err wraps ErrProcFailed: reported with
// PeerFailed) or closed (err wraps ErrClosed) and completes what was
// waiting with err: with c non-nil only if c is the current connection,
// with c nil only while the endpoint is connecting or attaching.
func (e *endpoint) down(c *conn, err error) {
	e.mu.Lock()
	if c != nil && e.conn != c || c == nil && e.state != epConnecting && e.state != epAttaching {
		e.mu.Unlock()
		return
	}
	state := epClosed
	if errors.Is(err, mpierr.ErrProcFailed) {
		state = epFailed
	}
	e.state = state
	e.err = err
	e.conn = nil
	e.cur.Store(nil)
	pend, gets := e.pending, e.gets
	e.pending, e.gets = nil, nil
	e.mu.Unlock()
	completeAll(e.m, pend, err)
	for _, g := range gets {
		g.cb(err)
		e.getFinished(g, err)
	}
	if e.m.closed.Load() {
		return
	}
	e.m.logf("tcp: rank %d: %v", e.m.sh.env.Rank, err)
	if state == epFailed {
		e.m.sh.env.Dispatch.PeerFailed(e.peer, err)
	}
}

// close marks the endpoint closed for this module's Close and returns its
// connection (nil if none); queued frames and Gets complete with ErrClosed.
func (e *endpoint) close() *conn {
	err := e.m.errClosed()
	e.mu.Lock()
	c := e.conn
	if e.state == epFailed || e.state == epClosed {
		c = nil
	} else {
		e.state = epClosed
		e.err = err
	}
	e.conn = nil
	e.cur.Store(nil)
	pend, gets := e.pending, e.gets
	e.pending, e.gets = nil, nil
	e.mu.Unlock()
	completeAll(e.m, pend, err)
	for _, g := range gets {
		g.cb(err)
		e.getFinished(g, err)
	}
	return c
}

// failure is an error with message msg that wraps every class in wraps.
func failure(msg string, wraps ...error) error { return &classedError{msg: msg, wraps: wraps} }

type classedError struct {
	msg   string
	wraps []error
}

func (e *classedError) Error() string   { return e.msg }
func (e *classedError) Unwrap() []error { return e.wraps }
