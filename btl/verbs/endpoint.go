package verbs

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// epState is an endpoint's connection state; transitions happen under
// endpoint.mu.
//
//	idle ──first operation, or the peer's address appears──▶ connecting ──both QPs up──▶ connected
//	any ──connect failure, work completion error, protocol error──▶ failed (PeerFailed)
//	any ──peer's close frame, or our Close──▶ closed
type epState int32

const (
	epIdle epState = iota
	epConnecting
	epConnected
	epFailed
	epClosed
)

// opKind is what a send work request (or a queued operation) does.
type opKind uint8

const (
	opPad   opKind = iota // the pad frame before a message
	opMsg                 // a control message (fragment)
	opClose               // the close frame
	opACK                 // an acknowledgement
	opPut
	opGet
	opImm   // a Put with an immediate
	opProbe // a zero-length RDMA WRITE checking that the peer lives
	opFence // a zero-length RDMA WRITE whose completion completes what was posted before it
)

// recvBit marks the work request ids of receives.
const recvBit = 1 << 63

// maxChunk is the largest RDMA operation posted as one work request.
const maxChunk = 1 << 30

// ackReserve send queue slots are kept for acknowledgements.
const ackReserve = 1

// wrOp is a posted send work request, in post order.
type wrOp struct {
	id   uint64
	kind opKind
	take int    // opMsg, opClose: ring bytes taken, pad included
	seq  uint64 // operation number on its last work request (0 otherwise)
	cb   btl.Completion
	reg  *regEntry // released on the operation's last work request
	last bool
}

// pendOp is an operation waiting for the connection, credits, ring room
// or send queue slots, in submission order.
type pendOp struct {
	kind  opKind
	tag   btl.Tag
	hdr   []byte // copied
	data  []byte // the caller's, until posted
	abuf  []byte // SendAlloc buffer, recycled once posted
	cb    btl.Completion
	local []byte
	raddr uint64
	rkey  uint32
	imm   uint32
	reg   *regEntry
	seq   uint64
}

type doneCB struct {
	cb  btl.Completion
	err error
}

type flushWait struct {
	seq uint64
	cb  btl.Completion
}

// endpoint is the module's pair with one peer.
type endpoint struct {
	m    *module
	peer int

	// Set by connect before the endpoint goes live; read-only after.
	cq      ibv.CQ
	qp      ibv.QP
	ring    []byte // inbound control ring
	ringMR  ibv.MR
	stage   []byte // outbound staging copy of the peer's ring
	stageMR ibv.MR
	pin     runtime.Pinner
	psn     uint32
	remote  addr

	mu       sync.Mutex // guards the fields below
	state    epState
	err      error // why failed or closed
	win      sendWindow
	sqFree   int
	ops      []wrOp // posted send work requests, oldest at opsHead
	opsHead  int
	pending  []*pendOp
	acksOwed int
	nextID   uint64
	opSeq    uint64 // operations submitted
	doneSeq  uint64 // operations completed (in order)
	flushes  []flushWait
	closeSeq uint64      // operation number of our close frame (0: none)
	probe    *time.Timer // liveness probe while operations wait for the peer
	probing  bool        // a probe is posted
	// sendsDone counts send completions; probeMark is its value at the
	// last probe tick and idleTicks the ticks since it last moved.
	sendsDone uint64
	probeMark uint64
	idleTicks int
	// unsig counts the unsignaled work requests posted since the last
	// signaled one, and unsigTake the ring bytes of their messages.
	unsig     int
	unsigTake int
	later     []doneCB
	report    error // failure to report with PeerFailed once mu is released
	reported  bool

	// Receive side: only the goroutine holding module.pollMu.
	rwin   recvWindow
	rqFree int // receives to post again
	cqDead bool
	wcs    []ibv.WC
	rwrs   []ibv.RecvWR

	// Scratch of postMsgLocked, guarded by mu.
	wrScratch [2]ibv.SendWR
	sgScratch [3]ibv.SGEntry
}

func newEndpoint(m *module, peer int) *endpoint {
	return &endpoint{m: m, peer: peer}
}

func (e *endpoint) Module() btl.Module { return e.m }
func (e *endpoint) Peer() int          { return e.peer }

// unlock releases mu, then runs the completions queued meanwhile and
// reports a failure, both with no lock held.
func (e *endpoint) unlock() {
	later, rep := e.later, e.report
	e.later, e.report = nil, nil
	e.mu.Unlock()
	for _, d := range later {
		d.cb(d.err)
	}
	if rep != nil {
		e.m.env.Logf("verbs: rank %d: %v", e.m.env.Rank, rep)
		e.m.env.Dispatch.PeerFailed(e.peer, rep)
	}
}

// startConnect begins connecting an idle endpoint.
func (e *endpoint) startConnect() {
	e.mu.Lock()
	e.startConnectLocked()
	e.unlock()
}

func (e *endpoint) startConnectLocked() {
	if e.state != epIdle {
		return
	}
	m := e.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return
	}
	e.state = epConnecting
	m.wg.Add(1)
	go e.connect()
}

// checkOpen returns the error of an endpoint that cannot take operations.
func (e *endpoint) checkLocked() error {
	switch e.state {
	case epFailed, epClosed:
		return e.err
	}
	if e.m.closed.Load() {
		return e.m.errClosed()
	}
	return nil
}

func (e *endpoint) checkSize(n int) error {
	if n > e.m.cfg.maxFrag {
		return mpierr.Errorf(mpierr.ErrArg, "verbs: %d-byte fragment exceeds the %d-byte limit", n, e.m.cfg.maxFrag)
	}
	return nil
}

// SendImmediate copies the fragment into the peer's ring now, or returns
// ErrWouldBlock (not connected yet, other operations queued, or no credit,
// ring room or queue slot). Neither hdr nor data is referenced after the
// call.
func (e *endpoint) SendImmediate(tag btl.Tag, hdr, data []byte) error {
	if e.m.closed.Load() {
		return e.m.errClosed()
	}
	if err := e.checkSize(len(hdr) + len(data)); err != nil {
		return err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.unlock()
		return err
	}
	if e.state != epConnected {
		e.startConnectLocked()
		e.unlock()
		return btl.ErrWouldBlock
	}
	if len(e.pending) > 0 || !e.postMsgLocked(frameMsg, tag, hdr, data, nil, nil, e.opSeq+1) {
		err := e.checkLocked() // the post may have failed the endpoint
		if err == nil {
			err = btl.ErrWouldBlock
		}
		e.unlock()
		return err
	}
	e.opSeq++
	e.unlock()
	e.m.fragsSent.Add(1)
	e.m.bytesSent.Add(int64(len(hdr) + len(data)))
	return nil
}

// Send transmits hdr and data as one fragment. hdr is copied at once.
// Data of at least inplaceMin bytes is written from the caller's memory
// (registered through the cache): it belongs to the module until cb, when
// the write completed. Smaller data is copied into the registered staging
// ring, at once when the pair is connected and has room (done), else when
// room comes (cb); a registration failure also makes it copied. Fragments
// are delivered in order. Errors: ErrClosed (module or peer closed),
// mpierr.ErrProcFailed (the peer failed), mpierr.ErrArg (fragment larger
// than max(eager_limit, max_send_size)).
func (e *endpoint) Send(tag btl.Tag, hdr, data []byte, cb btl.Completion) (bool, error) {
	return e.send(tag, hdr, data, nil, cb)
}

func (e *endpoint) send(tag btl.Tag, hdr, data, abuf []byte, cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	if e.m.refused() {
		return false, e.m.errWouldBlock()
	}
	if err := e.checkSize(len(hdr) + len(data)); err != nil {
		return false, err
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.unlock()
		return false, err
	}
	var reg *regEntry
	if abuf == nil && len(data) >= inplaceMin && e.m.cfg.caps&btl.CapSendInPlace != 0 {
		e.mu.Unlock()
		reg, _ = e.m.cache.get(data) // on failure the data is copied
		e.mu.Lock()
		if err := e.checkLocked(); err != nil {
			e.unlock()
			if reg != nil {
				e.m.cache.put(reg)
			}
			return false, err
		}
	}
	e.opSeq++
	if e.state == epConnected && len(e.pending) == 0 && e.postMsgLocked(frameMsg, tag, hdr, data, reg, cb, e.opSeq) {
		e.unlock()
		e.m.fragsSent.Add(1)
		e.m.bytesSent.Add(int64(len(hdr) + len(data)))
		return reg == nil, nil
	}
	if err := e.checkLocked(); err != nil { // the post failed the endpoint
		e.unlock()
		if reg != nil {
			e.m.cache.put(reg)
		}
		return false, err
	}
	if len(e.pending) >= e.m.depth {
		// The queue is full: the caller keeps the operation and retries
		// after polling (btl.ErrWouldBlock), which bounds what a sender
		// that outruns its peer (or floods a dead one) holds here.
		e.opSeq--
		e.unlock()
		if reg != nil {
			e.m.cache.put(reg)
		}
		return false, e.m.errWouldBlock()
	}
	if e.state == epConnected {
		e.m.stalls.Add(1)
		e.stalledLocked()
	}
	e.pending = append(e.pending, &pendOp{kind: opMsg, tag: tag, hdr: append([]byte(nil), hdr...), data: data, abuf: abuf, reg: reg, cb: cb, seq: e.opSeq})
	e.startConnectLocked()
	e.unlock()
	e.m.fragsSent.Add(1)
	e.m.bytesSent.Add(int64(len(hdr) + len(data)))
	return false, nil
}

// Alloc returns a module buffer of size bytes (at most max(eager_limit,
// max_send_size)) for SendAlloc or Free.
func (e *endpoint) Alloc(size int) ([]byte, error) {
	if e.m.closed.Load() {
		return nil, e.m.errClosed()
	}
	if size < 0 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "verbs: Alloc(%d)", size)
	}
	if err := e.checkSize(size); err != nil {
		return nil, err
	}
	return e.m.alloc(size), nil
}

// SendAlloc sends buf (from Alloc) as one fragment whose first hdrLen bytes
// are the header; buf returns to the module (also on error).
func (e *endpoint) SendAlloc(tag btl.Tag, buf []byte, hdrLen int, cb btl.Completion) (bool, error) {
	if hdrLen < 0 || hdrLen > len(buf) {
		e.m.recycle(buf)
		return false, mpierr.Errorf(mpierr.ErrArg, "verbs: SendAlloc header length %d of a %d-byte buffer", hdrLen, len(buf))
	}
	done, err := e.send(tag, buf[:hdrLen], buf[hdrLen:], buf, cb)
	if done || err != nil && !errors.Is(err, btl.ErrWouldBlock) { // refused: buf stays the caller's
		e.m.recycle(buf)
	}
	return done, err
}

// Free returns an unsent Alloc buffer.
func (e *endpoint) Free(buf []byte) { e.m.recycle(buf) }

// Put writes local into the peer's registration named by handle at off
// with RDMA WRITE. local is registered through the registration cache and
// belongs to the module until cb (an empty local completes at once: done).
// A fragment sent on this endpoint after cb arrives after the data (RC
// order). Errors: ErrBadHandle (handle does not decode or the range lies
// outside it: nothing is sent), mpierr.ErrNotSupported (put not in
// btl_verbs_flags), ErrClosed, mpierr.ErrProcFailed.
func (e *endpoint) Put(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(opPut, local, handle, off, 0, cb)
}

// Get reads len(local) bytes at off of the peer's registration into local
// with RDMA READ; as Put otherwise.
func (e *endpoint) Get(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(opGet, local, handle, off, 0, cb)
}

// WriteWithImm implements ImmWriter: a Put whose last work request is an
// RDMA WRITE_WITH_IMM carrying imm. Even an empty local is sent (the
// notification is the point), so it never completes during the call.
func (e *endpoint) WriteWithImm(local []byte, handle []byte, off int, imm uint32, cb btl.Completion) (bool, error) {
	if imm > MaxImm {
		return false, mpierr.Errorf(mpierr.ErrArg, "verbs: immediate %#x is reserved (at most %#x)", imm, MaxImm)
	}
	return e.rdma(opImm, local, handle, off, imm, cb)
}

func (e *endpoint) rdma(kind opKind, local, handle []byte, off int, imm uint32, cb btl.Completion) (bool, error) {
	m := e.m
	if m.closed.Load() {
		return false, m.errClosed()
	}
	need := btl.CapPut
	if kind == opGet {
		need = btl.CapGet
	}
	if m.cfg.caps&need == 0 {
		return false, mpierr.Errorf(mpierr.ErrNotSupported, "verbs: %v is disabled by btl_verbs_flags", need)
	}
	raddr, rkey, err := decodeHandle(handle, off, len(local))
	if err != nil {
		return false, err
	}
	if len(local) == 0 && kind != opImm {
		return true, nil
	}
	if m.refused() {
		return false, m.errWouldBlock()
	}
	op := &pendOp{kind: kind, local: local, raddr: raddr, rkey: rkey, imm: imm, cb: cb}
	if len(local) > 0 {
		if op.reg, err = m.cache.get(local); err != nil {
			return false, fmt.Errorf("verbs: registering %d local bytes: %w", len(local), err)
		}
	}
	e.mu.Lock()
	if err := e.checkLocked(); err != nil {
		e.unlock()
		if op.reg != nil {
			m.cache.put(op.reg)
		}
		return false, err
	}
	e.opSeq++
	op.seq = e.opSeq
	if !(e.state == epConnected && len(e.pending) == 0 && e.postRDMALocked(op)) {
		if err := e.checkLocked(); err != nil { // the post failed the endpoint
			e.unlock()
			if op.reg != nil {
				m.cache.put(op.reg)
			}
			return false, err
		}
		if len(e.pending) >= m.depth { // full: as in send
			e.opSeq--
			e.unlock()
			if op.reg != nil {
				m.cache.put(op.reg)
			}
			return false, m.errWouldBlock()
		}
		if e.state == epConnected {
			m.stalls.Add(1)
			e.stalledLocked()
		}
		e.pending = append(e.pending, op)
		e.startConnectLocked()
	}
	e.unlock()
	if kind == opGet {
		m.gets.Add(1)
		m.getBytes.Add(int64(len(local)))
	} else {
		m.puts.Add(1)
		m.putBytes.Add(int64(len(local)))
	}
	return false, nil
}

// Flush calls cb (or returns done) once every operation submitted on the
// endpoint before the call has completed: its work requests finished at
// the device (for fragments: written into the peer's ring; this covers
// copied Sends that returned done too). Operations that failed count as
// completed; cb then gets the endpoint's error. After the module's Close
// it returns an error wrapping ErrClosed and fences nothing.
func (e *endpoint) Flush(cb btl.Completion) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	e.mu.Lock()
	defer e.unlock()
	if e.doneSeq >= e.opSeq {
		return true, nil
	}
	e.flushes = append(e.flushes, flushWait{seq: e.opSeq, cb: cb})
	e.doneSeqLocked(e.doneSeq) // a pair already down releases it at once
	e.fenceLocked()
	return false, nil
}

// fenceLocked posts a signaled zero-length RDMA WRITE when a flush waits
// and the last work request posted was unsignaled: no completion would
// come for it, and the write's completes everything before it (RC
// completes in order). While flushes wait, every work request is posted
// signaled (postLocked), so one fence is enough.
func (e *endpoint) fenceLocked() {
	if len(e.flushes) == 0 || e.unsig == 0 || e.state != epConnected || e.sqFree == 0 {
		return
	}
	wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWrite, RemoteAddr: e.remote.RingAddr, RKey: e.remote.RingKey}}
	e.postLocked(wr, []wrOp{{kind: opFence}})
}

// sigEvery bounds the unsignaled work requests in a row (at most a
// quarter of the queue depth).
const sigEvery = 16

// signalLocked reports whether op's work request is posted signaled. A
// copied message, its pad and a credit ACK need no completion of their
// own (nothing waits for one): they go unsignaled, so that the device's
// requester need not ask the peer for an acknowledgement of each (the
// soft device's ACK datagram per message), and a later signaled one
// completes them. One in sigEvery work requests, and the one that brings
// the unsignaled messages' ring bytes to a quarter of the ring, are
// signaled: a sender short of queue slots or of its staging copy of the
// ring then always has a signaled request outstanding whose completion
// frees them. Everything is signaled while a flush waits.
func (e *endpoint) signalLocked(op *wrOp) bool {
	switch op.kind {
	case opPad, opMsg, opACK:
	default:
		return true
	}
	return op.cb != nil || op.reg != nil || len(e.flushes) > 0 ||
		e.unsig+1 >= min(sigEvery, max(1, e.m.depth/4)) ||
		uint64(e.unsigTake+op.take)*4 >= e.win.ringSize
}

// post posts wrs, recording ops for their completions; a refusal fails the
// endpoint (the device took some of them, or none, so the pair's state is
// unknown).
func (e *endpoint) postLocked(wrs []ibv.SendWR, ops []wrOp) bool {
	unsig, take := e.unsig, e.unsigTake
	for i := range wrs {
		e.nextID++
		wrs[i].ID = e.nextID
		ops[i].id = e.nextID
		if e.signalLocked(&ops[i]) {
			wrs[i].Flags |= ibv.FlagSignaled
			e.unsig, e.unsigTake = 0, 0
		} else {
			wrs[i].Flags &^= ibv.FlagSignaled
			e.unsig++
			e.unsigTake += ops[i].take
		}
	}
	bad, err := e.qp.PostSend(wrs)
	if err == nil {
		bad = len(wrs)
	} else {
		e.unsig, e.unsigTake = unsig, take // a failed endpoint posts nothing more
	}
	for i := range bad {
		e.ops = append(e.ops, ops[i])
		e.sqFree--
	}
	if err != nil {
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: posting to rank %d: %w", e.m.env.Rank, e.peer, err)))
		return false
	}
	return true
}

// inplaceMin is the smallest data a Send writes from the caller's memory
// (registered through the cache) instead of copying it into the staging
// ring.
const inplaceMin = 16 << 10

// postMsgLocked writes a frame into the staging ring and posts it (with
// its pad) if the window and the send queue have room. It reports false
// when they do not (nothing posted) or the post failed the endpoint. With
// reg (covering data) the data goes from the caller's memory as the
// write's second scatter/gather entry, and cb runs when the write
// completes; otherwise data is copied and cb is not used.
func (e *endpoint) postMsgLocked(kind frameKind, tag btl.Tag, hdr, data []byte, reg *regEntry, cb btl.Completion, seq uint64) bool {
	n := frameHdrLen + len(hdr) + len(data)
	s, ok := e.win.reserve(n)
	nwr := 1
	if s.pad > 0 {
		nwr = 2
	}
	if !ok || e.sqFree < nwr+ackReserve {
		return false
	}
	// The work requests are built in the endpoint's scratch (guarded by
	// mu): posted through the QP interface, stack copies would escape to
	// the heap, two allocations per message.
	wrs := &e.wrScratch
	*wrs = [2]ibv.SendWR{}
	var ops [2]wrOp
	i := 0
	if s.pad > 0 {
		ph := frameHdr{length: uint32(s.pad), kind: framePad, seq: e.win.seq}
		ph.put(e.stage[s.padOff:])
		e.sgScratch[2] = ibv.SGE(e.stageMR, s.padOff, frameHdrLen)
		wrs[0] = ibv.SendWR{Opcode: ibv.WRRDMAWrite, SGList: e.sgScratch[2:3:3],
			RemoteAddr: e.remote.RingAddr + uint64(s.padOff), RKey: e.remote.RingKey}
		ops[0] = wrOp{kind: opPad}
		i = 1
	}
	fh := frameHdr{length: uint32(n), kind: kind, tag: tag, hdrLen: uint32(len(hdr)), seq: e.win.seq}
	f := e.stage[s.off : s.off+n]
	fh.put(f)
	copy(f[frameHdrLen:], hdr)
	e.sgScratch[0] = ibv.SGE(e.stageMR, s.off, n)
	sg := e.sgScratch[0:1:2]
	if reg != nil {
		sg[0].Length = uint32(frameHdrLen + len(hdr))
		sg = append(sg, ibv.SGEntry{Addr: reg.iova(sliceAddr(data)), Length: uint32(len(data)), LKey: reg.mr.LKey()})
	} else {
		copy(f[frameHdrLen+len(hdr):], data)
		cb = nil // copied: the caller completes it
	}
	wrs[i] = ibv.SendWR{Opcode: ibv.WRRDMAWriteWithImm, Imm: immMsg, SGList: sg,
		RemoteAddr: e.remote.RingAddr + uint64(s.off), RKey: e.remote.RingKey}
	ops[i] = wrOp{kind: opMsg, take: s.pad + s.foot, seq: seq, last: true, reg: reg, cb: cb}
	if kind == frameClose {
		ops[i].kind = opClose
	}
	e.win.commit(s)
	return e.postLocked(wrs[:nwr], ops[:nwr])
}

// postRDMALocked posts a Put, Get or WriteWithImm if the send queue has
// room for its work requests.
func (e *endpoint) postRDMALocked(op *pendOp) bool {
	n := len(op.local)
	chunks := max(1, (n+maxChunk-1)/maxChunk)
	if e.sqFree < chunks+ackReserve {
		return false
	}
	wrs := make([]ibv.SendWR, chunks)
	ops := make([]wrOp, chunks)
	var base uint64
	if op.reg != nil {
		base = op.reg.iova(sliceAddr(op.local))
	}
	for i := range chunks {
		o, l := i*maxChunk, min(maxChunk, n-i*maxChunk)
		w := &wrs[i]
		w.Opcode = ibv.WRRDMAWrite
		if op.kind == opGet {
			w.Opcode = ibv.WRRDMARead
		}
		if l > 0 {
			w.SGList = []ibv.SGEntry{{Addr: base + uint64(o), Length: uint32(l), LKey: op.reg.mr.LKey()}}
		}
		w.RemoteAddr, w.RKey = op.raddr+uint64(o), op.rkey
		ops[i] = wrOp{kind: op.kind}
	}
	if op.kind == opImm {
		wrs[chunks-1].Opcode = ibv.WRRDMAWriteWithImm
		wrs[chunks-1].Imm = op.imm
	}
	ops[chunks-1] = wrOp{kind: op.kind, seq: op.seq, cb: op.cb, reg: op.reg, last: true}
	return e.postLocked(wrs, ops)
}

// postACKLocked sends the acknowledgements owed, as the send queue allows.
func (e *endpoint) postACKLocked() {
	for e.acksOwed > 0 && e.sqFree > 0 && e.state == epConnected {
		wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWriteWithImm, Imm: immACK, RemoteAddr: e.remote.RingAddr, RKey: e.remote.RingKey}}
		if !e.postLocked(wr, []wrOp{{kind: opACK}}) {
			return
		}
		e.acksOwed--
		e.m.acksSent.Add(1)
	}
}

// drainLocked posts queued operations in order while they fit.
func (e *endpoint) drainLocked() {
	e.postACKLocked()
	for len(e.pending) > 0 && e.state == epConnected {
		op := e.pending[0]
		switch op.kind {
		case opMsg, opClose:
			fk := frameMsg
			if op.kind == opClose {
				fk = frameClose
			}
			if !e.postMsgLocked(fk, op.tag, op.hdr, op.data, op.reg, op.cb, op.seq) {
				return
			}
			if op.abuf != nil {
				e.m.recycle(op.abuf)
			}
			if op.cb != nil && op.reg == nil { // copied: complete now
				e.later = append(e.later, doneCB{op.cb, nil})
			}
		default:
			if !e.postRDMALocked(op) {
				return
			}
		}
		e.pending[0] = nil
		e.pending = e.pending[1:]
	}
	if len(e.pending) == 0 {
		e.pending = nil
	} else if e.state == epConnected {
		e.stalledLocked()
	}
	e.fenceLocked()
}

// probeAfter is how long operations wait for room before the endpoint
// checks that the peer is alive.
const probeAfter = 100 * time.Millisecond

// stalledLocked starts the liveness probe of an endpoint whose queued
// operations wait for the peer (its ACKs): without it a peer that died
// after taking our messages would leave them queued forever (TensorFlow's
// hang on a lost ACK), since no work request would be outstanding to fail.
func (e *endpoint) stalledLocked() {
	if e.probe == nil {
		e.probe = time.AfterFunc(probeAfter, e.probeAlive)
	}
}

// probeAlive posts a zero-length RDMA WRITE while operations are still
// queued: a live peer's device completes it at once, a dead one's never,
// and the QP's retries then end in RETRY_EXC_ERR, which fails the pair.
func (e *endpoint) probeAlive() {
	e.mu.Lock()
	defer e.unlock()
	e.probe = nil
	if e.state != epConnected || len(e.pending) == 0 {
		e.idleTicks = 0
		return
	}
	if e.sendsDone != e.probeMark {
		e.probeMark, e.idleTicks = e.sendsDone, 0
	} else if e.idleTicks++; e.m.livenessTicks > 0 && e.idleTicks >= e.m.livenessTicks {
		// The device has completed nothing, not even a probe, for the
		// liveness limit: the peer is gone even if the QP's own retries
		// have not said so yet.
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: rank %d completed no work request for %v while operations waited",
			e.m.env.Rank, e.peer, time.Duration(e.idleTicks)*probeAfter)))
		return
	}
	if e.sqFree > 0 && !e.probing {
		wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWrite, RemoteAddr: e.remote.RingAddr, RKey: e.remote.RingKey}}
		if !e.postLocked(wr, []wrOp{{kind: opProbe}}) {
			return
		}
		e.probing = true
	}
	e.probe = time.AfterFunc(probeAfter, e.probeAlive)
}

// procFailed wraps err as a peer failure.
func procFailed(err error) error {
	return &classedError{msg: err.Error(), wraps: []error{mpierr.ErrProcFailed, err}}
}

type classedError struct {
	msg   string
	wraps []error
}

func (e *classedError) Error() string   { return e.msg }
func (e *classedError) Unwrap() []error { return e.wraps }

// failLocked moves the endpoint to failed (err wraps ErrProcFailed or
// ErrProtocol: reported with PeerFailed once mu is released) or closed
// (err wraps ErrClosed), completes the queued operations with err and
// moves the QP to the error state, so that the device flushes the posted
// ones (their completions then carry err).
func (e *endpoint) failLocked(err error) {
	if e.state == epFailed || e.state == epClosed {
		return
	}
	wasLive := e.state == epConnected
	if errors.Is(err, btl.ErrClosed) {
		e.state = epClosed
	} else {
		e.state = epFailed
		if !e.reported && !e.m.closed.Load() {
			e.reported = true
			e.report = err
		}
	}
	e.err = err
	if e.probe != nil {
		e.probe.Stop()
		e.probe = nil
	}
	for _, op := range e.pending {
		e.completeLocked(op.cb, err)
		if op.abuf != nil {
			e.m.recycle(op.abuf)
		}
		if op.reg != nil {
			e.m.cache.put(op.reg)
		}
	}
	e.pending = nil
	if wasLive {
		e.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState)
	}
	e.doneSeqLocked(e.doneSeq)
}

func (e *endpoint) completeLocked(cb btl.Completion, err error) {
	if cb != nil {
		e.later = append(e.later, doneCB{cb, err})
	}
}

// doneSeqLocked records that operations up to seq completed and releases
// the flushes they satisfy (all of them once the endpoint is down and
// nothing is posted).
func (e *endpoint) doneSeqLocked(seq uint64) {
	if seq > e.doneSeq {
		e.doneSeq = seq
	}
	down := (e.state == epFailed || e.state == epClosed) && len(e.ops) == e.opsHead && len(e.pending) == 0
	kept := e.flushes[:0]
	for _, f := range e.flushes {
		switch {
		case e.doneSeq >= f.seq && e.err == nil:
			e.later = append(e.later, doneCB{f.cb, nil})
		case e.doneSeq >= f.seq || down:
			e.later = append(e.later, doneCB{f.cb, e.err})
		default:
			kept = append(kept, f)
		}
	}
	e.flushes = kept
}

// onSendDoneLocked handles a send completion: it completes the work
// request it names and every unsignaled one posted before it (RC
// completes in post order).
func (e *endpoint) onSendDoneLocked(wc *ibv.WC) {
	if e.opsHead == len(e.ops) || wc.ID < e.ops[e.opsHead].id || wc.ID > e.ops[len(e.ops)-1].id {
		e.failLocked(mpierr.Errorf(mpierr.ErrProtocol, "verbs: rank %d: completion %#x for rank %d names no work request posted", e.m.env.Rank, wc.ID, e.peer))
		return
	}
	for e.opsHead < len(e.ops) && e.ops[e.opsHead].id <= wc.ID {
		e.retireLocked(wc)
	}
}

// retireLocked completes the oldest posted work request, whose
// completion (or a later one's) is wc.
func (e *endpoint) retireLocked(wc *ibv.WC) {
	op := &e.ops[e.opsHead]
	e.opsHead++
	e.sendsDone++
	if e.opsHead == len(e.ops) {
		e.ops, e.opsHead = e.ops[:0], 0
	}
	e.sqFree++
	err := wc.Err()
	if err != nil {
		if e.state == epConnected {
			e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: %v to rank %d: %w", e.m.env.Rank, opName(op.kind), e.peer, err)))
		}
		err = e.err
		if err == nil { // a flush while connecting cannot happen; keep the class anyway
			err = procFailed(wc.Err())
		}
	}
	switch op.kind {
	case opMsg, opClose:
		e.win.written(op.take)
	case opProbe:
		e.probing = false
	}
	if op.reg != nil {
		e.m.cache.put(op.reg)
	}
	if op.last {
		e.completeLocked(op.cb, err)
		if op.seq != 0 {
			e.doneSeqLocked(op.seq)
		}
	}
	*op = wrOp{}
}

func opName(k opKind) string {
	return [...]string{"pad", "message", "close frame", "ACK", "RDMA write", "RDMA read", "RDMA write with immediate", "liveness probe", "fence"}[k]
}

// poll takes what the endpoint's completion queue holds: send
// completions and ACKs under mu, then messages and immediates dispatched
// in order with no endpoint lock held, then the ACKs due and the receives
// to post again. Called with module.pollMu held.
func (e *endpoint) poll() int {
	if e.cqDead {
		return 0
	}
	n, err := e.cq.Poll(e.wcs)
	if err != nil {
		e.cqDead = true
		e.mu.Lock()
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: completion queue of rank %d: %w", e.m.env.Rank, e.peer, err)))
		e.abandonLocked()
		e.unlock()
		return 1
	}
	if n == 0 {
		return 0
	}
	wcs := e.wcs[:n]
	// Pass 1: send completions, ACKs, receive errors.
	e.mu.Lock()
	for i := range wcs {
		wc := &wcs[i]
		if wc.ID&recvBit == 0 {
			e.onSendDoneLocked(wc)
			continue
		}
		e.rqFree++
		if err := wc.Err(); err != nil {
			if e.state == epConnected {
				e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: receive from rank %d: %w", e.m.env.Rank, e.peer, err)))
			}
			continue
		}
		if wc.Imm == immACK && e.state == epConnected {
			if err := e.win.acked(); err != nil {
				e.failLocked(fmt.Errorf("rank %d: %w", e.peer, err))
			}
		}
	}
	e.drainLocked()
	e.unlock()
	// Pass 2: messages and immediates, in arrival order.
	acks := 0
	for i := range wcs {
		wc := &wcs[i]
		if wc.ID&recvBit == 0 || wc.Status != ibv.WCSuccess || wc.Imm == immACK {
			continue
		}
		e.mu.Lock()
		st := e.state
		e.mu.Unlock()
		if st != epConnected {
			continue // the ring's contents no longer count
		}
		due, err := e.onRecv(wc)
		if err != nil {
			e.mu.Lock()
			e.failLocked(err)
			e.unlock()
			continue
		}
		if due {
			acks++
		}
	}
	e.mu.Lock()
	e.acksOwed += acks
	e.postACKLocked()
	if e.state == epConnected && e.rqFree >= e.m.repostBatch {
		e.repostLocked()
	}
	e.unlock()
	return n
}

// repostLocked posts the receives consumed (zero-length: immediates need
// a receive, the data goes to the written address).
func (e *endpoint) repostLocked() {
	r := e.rwrs[:e.rqFree]
	for i := range r {
		r[i] = ibv.RecvWR{ID: recvBit | uint64(i)}
	}
	if _, err := e.qp.PostRecv(r); err != nil {
		e.failLocked(procFailed(fmt.Errorf("verbs: rank %d: posting receives for rank %d: %w", e.m.env.Rank, e.peer, err)))
		return
	}
	e.rqFree = 0
}

// onRecv handles an inbound WRITE_WITH_IMM: a control message in the ring
// (dispatched in place) or an immediate for TagImm. It reports whether an
// ACK is due. Garbage in the ring is an error wrapping mpierr.ErrProtocol.
func (e *endpoint) onRecv(wc *ibv.WC) (bool, error) {
	m := e.m
	if wc.Imm != immMsg {
		var h [8]byte
		binary.LittleEndian.PutUint32(h[0:], wc.Imm)
		binary.LittleEndian.PutUint32(h[4:], wc.ByteLen)
		m.env.Dispatch.Dispatch(e, TagImm, h[:], nil)
		return false, nil
	}
	r := len(e.ring)
	pos := int(e.rwin.tail % uint64(r))
	take := 0
	h, err := decodeFrame(e.ring[pos:], e.rwin.seq)
	if err == nil && h.kind == framePad {
		take, pos = int(h.length), 0
		h, err = decodeFrame(e.ring, e.rwin.seq)
		if err == nil && h.kind == framePad {
			err = mpierr.Errorf(mpierr.ErrProtocol, "verbs: two pad frames in a row")
		}
	}
	if err == nil && h.length != wc.ByteLen {
		err = mpierr.Errorf(mpierr.ErrProtocol, "verbs: %d-byte control frame written with %d bytes", h.length, wc.ByteLen)
	}
	if err != nil {
		return false, fmt.Errorf("rank %d at ring offset %d: %w", e.peer, pos, err)
	}
	take += alignUp(int(h.length))
	f := e.ring[pos : pos+int(h.length)]
	hdrEnd := frameHdrLen + int(h.hdrLen)
	switch h.kind {
	case frameMsg:
		m.fragsRecv.Add(1)
		m.bytesRecv.Add(int64(len(f) - frameHdrLen))
		m.env.Dispatch.Dispatch(e, h.tag, f[frameHdrLen:hdrEnd:hdrEnd], f[hdrEnd:len(f):len(f)])
	case frameClose:
		e.mu.Lock()
		e.failLocked(fmt.Errorf("verbs: rank %d closed: %w", e.peer, btl.ErrClosed))
		e.unlock()
	}
	return e.rwin.consumed(take), nil
}

// sendClose fails the queued operations with ErrClosed and sends the
// close frame (queued behind nothing, waiting for room if needed). It
// reports whether a frame is on its way.
func (e *endpoint) sendClose() bool {
	e.mu.Lock()
	defer e.unlock()
	if e.state != epConnected {
		return false
	}
	err := e.m.errClosed()
	for _, op := range e.pending {
		e.completeLocked(op.cb, err)
		if op.abuf != nil {
			e.m.recycle(op.abuf)
		}
		if op.reg != nil {
			e.m.cache.put(op.reg)
		}
	}
	e.pending = nil
	e.opSeq++
	e.closeSeq = e.opSeq
	if !e.postMsgLocked(frameClose, 0, nil, nil, nil, nil, e.closeSeq) && e.state == epConnected {
		e.pending = append(e.pending, &pendOp{kind: opClose, seq: e.closeSeq})
	}
	return true
}

// closeDelivered reports whether the close frame completed (or the pair
// went down).
func (e *endpoint) closeDelivered() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.state != epConnected || e.doneSeq >= e.closeSeq
}

// close marks the endpoint closed for the module's Close and completes
// everything with err: queued and posted operations (the device objects
// go next, so no completion will come for the posted ones). Called with
// the module's goroutines stopped and pollMu held.
func (e *endpoint) close(err error) {
	e.mu.Lock()
	e.failLocked(err)
	e.abandonLocked()
	e.unlock()
}

// abandonLocked completes the posted operations with the endpoint's
// error without waiting for their completions.
func (e *endpoint) abandonLocked() {
	for i := e.opsHead; i < len(e.ops); i++ {
		op := &e.ops[i]
		if op.reg != nil {
			e.m.cache.put(op.reg)
		}
		if op.last {
			e.completeLocked(op.cb, e.err)
		}
	}
	e.ops, e.opsHead = nil, 0
	e.doneSeqLocked(e.opSeq)
}

// destroy releases the pair's device objects.
func (e *endpoint) destroy() {
	var errs []error
	if e.qp != nil {
		errs = append(errs, e.qp.Destroy())
	}
	if e.cq != nil {
		errs = append(errs, e.cq.Destroy())
	}
	for _, mr := range []ibv.MR{e.ringMR, e.stageMR} {
		if mr != nil {
			errs = append(errs, mr.Dereg())
		}
	}
	e.pin.Unpin()
	if err := errors.Join(errs...); err != nil {
		e.m.env.Logf("verbs: rank %d: releasing the pair with rank %d: %v", e.m.env.Rank, e.peer, err)
	}
}

// connectFailed fails a connecting endpoint.
func (e *endpoint) connectFailed(err error) {
	e.mu.Lock()
	if e.state == epConnecting {
		e.failLocked(&classedError{msg: fmt.Sprintf("verbs: rank %d cannot connect to rank %d: %v", e.m.env.Rank, e.peer, err),
			wraps: []error{mpierr.ErrProcFailed, btl.ErrUnreachable, err}})
	}
	e.unlock()
}

// connect brings the pair up: QP, rings, address exchange through the
// store, RTR and RTS, then the "up" exchange, after which both sides may
// send.
func (e *endpoint) connect() {
	m := e.m
	defer m.wg.Done()
	if err := e.setup(); err != nil {
		e.connectFailed(err)
		return
	}
	ctx, cancel := contextWithTimeout(m)
	defer cancel()
	me := m.env.Rank
	local := addr{LID: m.port.LID, Port: m.cfg.port, MTU: m.mtu, QPN: e.qp.QPN(), PSN: e.psn, GID: m.gid,
		RingAddr: e.ringMR.Addr(), RingKey: e.ringMR.RKey(), RingSize: uint32(len(e.ring)), Credits: uint32(m.cfg.credits)}
	if err := m.env.Store.Set(pairKey(me, e.peer), local.encode()); err != nil {
		e.connectFailed(fmt.Errorf("publishing the address: %w", err))
		return
	}
	b, err := m.env.Store.Get(ctx, pairKey(e.peer, me))
	if err != nil {
		e.connectFailed(fmt.Errorf("waiting for its address: %w", err))
		return
	}
	ra, err := decodeAddr(b)
	if err != nil {
		e.connectFailed(err)
		return
	}
	if n := alignUp(m.cfg.maxFrag + frameHdrLen); n > int(ra.RingSize)/4 {
		e.connectFailed(mpierr.Errorf(mpierr.ErrArg, "its %d-byte control ring is too small for this rank's %d-byte fragments (set the same btl_verbs_* parameters on every rank)", ra.RingSize, m.cfg.maxFrag))
		return
	}
	if err := e.bringUp(ra); err != nil {
		e.connectFailed(err)
		return
	}
	if err := m.env.Store.Set(upKey(me, e.peer), []byte{1}); err != nil {
		e.connectFailed(fmt.Errorf("publishing readiness: %w", err))
		return
	}
	if _, err := m.env.Store.Get(ctx, upKey(e.peer, me)); err != nil {
		e.connectFailed(fmt.Errorf("waiting for its QP to come up: %w", err))
		return
	}
	e.mu.Lock()
	if e.state != epConnecting {
		e.unlock()
		return
	}
	e.remote = ra
	e.win = newSendWindow(int(ra.RingSize), int(ra.Credits))
	e.sqFree = m.depth
	e.state = epConnected
	m.addLive(e)
	e.drainLocked()
	e.unlock()
	m.wake() // completions may have come before the watcher armed the queue
	m.env.Logf("verbs: rank %d connected to rank %d: %v", me, e.peer, ra)
}

// setup makes the pair's completion queue, QP (moved to INIT, receives
// posted) and inbound ring.
func (e *endpoint) setup() error {
	m := e.m
	var err error
	if e.cq, err = m.dev.CreateCQ(2*m.depth+8, m.ch); err != nil {
		return fmt.Errorf("creating a completion queue: %w", err)
	}
	if e.qp, err = m.pd.CreateQP(ibv.QPInitAttr{SendCQ: e.cq, RecvCQ: e.cq, Type: ibv.QPTypeRC,
		Cap: ibv.QPCap{MaxSendWR: m.depth, MaxRecvWR: m.depth, MaxSendSGE: 2, MaxRecvSGE: 1}}); err != nil {
		return fmt.Errorf("creating a QP: %w", err)
	}
	e.ring = make([]byte, m.cfg.ringSize)
	e.pin.Pin(&e.ring[0])
	if e.ringMR, err = m.pd.RegMR(e.ring, ibv.AccessLocalWrite|ibv.AccessRemoteWrite); err != nil {
		return fmt.Errorf("registering the control ring: %w", err)
	}
	if err = e.qp.Modify(&ibv.QPAttr{State: ibv.QPSInit, PKeyIndex: m.cfg.pkeyIndex, Port: m.cfg.port,
		AccessFlags: ibv.AccessLocalWrite | ibv.AccessRemoteWrite | ibv.AccessRemoteRead}, ibv.MaskResetToInit); err != nil {
		return fmt.Errorf("QP to INIT: %w", err)
	}
	e.rwin = newRecvWindow(len(e.ring), m.cfg.credits)
	e.wcs = make([]ibv.WC, 32)
	e.rwrs = make([]ibv.RecvWR, m.depth)
	e.rqFree = m.depth
	e.mu.Lock()
	e.repostLocked()
	err = e.err
	e.unlock()
	if e.rqFree != 0 {
		return fmt.Errorf("posting receives: %v", err)
	}
	e.psn = rand.Uint32() & 0xFFFFFF
	return nil
}

// bringUp moves the QP to RTR and RTS towards ra and allocates the staging
// copy of the peer's ring.
func (e *endpoint) bringUp(ra addr) error {
	m := e.m
	rd := uint8(1)
	if a := min(m.attr.MaxQPRdAtom, m.attr.MaxQPInitRdAtom, 16); a > 1 {
		rd = uint8(a)
	}
	mtu := min(m.mtu, ra.MTU)
	global := m.port.LinkLayer == ibv.LinkEthernet || ra.GID != (ibv.GID{})
	rtr := ibv.QPAttr{State: ibv.QPSRTR, PathMTU: mtu, DestQPN: ra.QPN, RQPSN: ra.PSN, MaxDestRdAtomic: rd, MinRNRTimer: 12,
		AH: ibv.AH{DLID: ra.LID, SL: m.cfg.sl, IsGlobal: global, DGID: ra.GID, SGIDIndex: uint8(m.cfg.gidIndex),
			HopLimit: 64, TrafficClass: m.cfg.trafficClass, Port: m.cfg.port}}
	if err := e.qp.Modify(&rtr, ibv.MaskInitToRTR); err != nil {
		return fmt.Errorf("QP to RTR: %w", err)
	}
	rts := ibv.QPAttr{State: ibv.QPSRTS, SQPSN: e.psn, Timeout: m.cfg.timeout, RetryCnt: m.cfg.retry, RNRRetry: m.cfg.rnrRetry, MaxRdAtomic: rd}
	if err := e.qp.Modify(&rts, ibv.MaskRTRToRTS); err != nil {
		return fmt.Errorf("QP to RTS: %w", err)
	}
	e.stage = make([]byte, ra.RingSize)
	e.pin.Pin(&e.stage[0])
	var err error
	if e.stageMR, err = m.pd.RegMR(e.stage, ibv.AccessLocalWrite); err != nil {
		return fmt.Errorf("registering the staging ring: %w", err)
	}
	return nil
}
