package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/atom"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
)

// endpoint is this module's connection to one local peer. Sends are
// serialized by mu, which keeps them in order; a send that finds no room
// (fast box or FIFO full, no free fragment) is queued, and everything after
// it queues behind it until Progress or a later send posts it.
type endpoint struct {
	m *Module
	p *peer

	mu        atom.Mutex
	err       error         // guarded by mu: terminal (closed, peer failed)
	tx        *txBox        // guarded by mu: own fast box to the peer
	announced bool          // guarded by mu: the peer was told about tx; all sends use it
	noFbox    bool          // guarded by mu: no fast box for this peer (refused or none left)
	sends     int           // guarded by mu: fragments sent through the FIFO
	pending   []pendingSend // guarded by mu: queued sends, oldest first
	listed    bool          // guarded by mu: e is in m.pendEps
	lastFrag  int           // guarded by mu: the fragment of trySend's sentFrag
	sentN     int64         // guarded by mu
	sentB     int64         // guarded by mu

	helpMu  sync.Mutex // held by the Get using the help slot (help.go)
	helpSeq uint32     // guarded by helpMu
}

var _ btl.Endpoint = (*endpoint)(nil)

var le = binary.LittleEndian

// pendingSend is a queued send: either a filled fragment waiting to be
// posted (frag >= 0) or the caller's bytes (hdr copied, data referenced,
// frag -1), or a Flush's marker (frag fenceMark), which completes when
// the drain reaches it.
type pendingSend struct {
	frag int
	tag  btl.Tag
	hdr  []byte
	data []byte
	cb   btl.Completion
}

func (e *endpoint) Module() btl.Module { return e.m }
func (e *endpoint) Peer() int          { return e.p.rank }

// usable returns the error that stops every operation on e, if any; the
// first call maps the peer's segment (its state check fails until then:
// notAlive). Called with e.mu held.
func (e *endpoint) usable() error {
	if e.err != nil {
		return e.err
	}
	if e.m.closed.Load() {
		return fmt.Errorf("sm: module closed: %w", btl.ErrClosed)
	}
	if err := e.p.failure(); err != nil {
		return err
	}
	if e.p.closed.Load() || e.p.state.Load()>>32 != stateAlive {
		return e.notAlive()
	}
	return nil
}

// notAlive is usable's slow way: the peer's segment is not mapped yet (map
// it and check again), or the peer closed or died.
func (e *endpoint) notAlive() error {
	if !e.p.mapped.Load() && !e.p.closed.Load() {
		e.m.attach(e.p)
		if e.p.mapped.Load() || e.p.failure() != nil || e.m.closed.Load() {
			return e.usable()
		}
		panic("sm: attach left a peer unmapped, not failed, with the module open")
	}
	return e.peerGone()
}

// peerGone classifies a peer whose segment is no longer alive.
func (e *endpoint) peerGone() error {
	if s := e.p.state.Load() >> 32; s == stateDead {
		err := fmt.Errorf("sm: rank %d died: %w", e.p.rank, mpierr.ErrProcFailed)
		e.m.fail(e.p, err)
		return e.p.failure()
	}
	e.p.closed.Store(true)
	return fmt.Errorf("sm: rank %d closed its shared-memory transport: %w", e.p.rank, btl.ErrClosed)
}

func (e *endpoint) checkSize(hn int, data []byte) error {
	if hn+len(data) > e.m.cfg.maxSend || hn > math.MaxUint16 {
		return e.sizeError(hn, data)
	}
	return nil
}

func (e *endpoint) sizeError(hn int, data []byte) error {
	return mpierr.Errorf(mpierr.ErrArg, "sm: fragment of %d bytes (header %d) exceeds %d", hn+len(data), hn, e.m.cfg.maxSend)
}

// SendImmediate delivers hdr+data now or refuses with ErrWouldBlock: on
// nil the fragment is in the peer's fast box or FIFO. It never references
// hdr or data after returning.
func (e *endpoint) SendImmediate(tag btl.Tag, hdr, data []byte) error {
	h := bytesHeader(hdr)
	return e.sendImmediate(tag, &h, data)
}

// SendImmediateHeader is SendImmediate with the header by value
// (btl.HeaderSender).
func (e *endpoint) SendImmediateHeader(tag btl.Tag, h0, h1 uint64, data []byte) error {
	// The common case in place: the fast box in use, nothing queued, and
	// the entry within the ring's current line (a small message; a
	// larger one goes the general way at once).
	if entryHdr+16+len(data) <= line {
		e.mu.Lock()
		if e.announced && len(e.pending) == 0 && e.usable() == nil && e.tx.putWords(uint8(tag), h0, h1, data) {
			e.sentN++
			e.sentB += int64(16 + len(data))
			e.mu.Unlock()
			e.p.wake()
			return nil
		}
		e.mu.Unlock()
	}
	h := header{w0: h0, w1: h1, useWords: true}
	return e.sendImmediate(tag, &h, data)
}

func (e *endpoint) sendImmediate(tag btl.Tag, h *header, data []byte) error {
	if err := e.checkSize(h.len(), data); err != nil {
		return err
	}
	e.mu.Lock()
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return err
	}
	var d drained
	if len(e.pending) > 0 {
		d = e.drain()
	}
	st, err := notSent, e.err // drain may have failed the peer
	if len(e.pending) == 0 && err == nil {
		st, err = e.trySend(tag, h, data)
		if st == sentFrag {
			// Copied but not posted: refuse rather than keep it.
			e.m.pool.put(e.lastFrag)
			st = notSent
		}
	}
	e.mu.Unlock()
	d.run()
	if err != nil {
		return err
	}
	if st != sent {
		return btl.ErrWouldBlock
	}
	e.p.wake()
	return nil
}

// Send transmits hdr followed by data as one fragment, copied into shared
// memory. done is true when the fragment was posted during the call (in
// the peer's fast box or FIFO). Otherwise the send is queued behind earlier
// ones: hdr is copied, data stays referenced until cb is called, with nil
// once posted or with the error that stopped it (peer failed or closed,
// module closed). An error return means nothing was sent and cb is not
// called.
func (e *endpoint) Send(tag btl.Tag, hdr, data []byte, cb btl.Completion) (bool, error) {
	if err := e.checkSize(len(hdr), data); err != nil {
		return false, err
	}
	e.mu.Lock()
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		return false, err
	}
	var d drained
	if len(e.pending) > 0 {
		d = e.drain()
	}
	if len(e.pending) == 0 {
		h := bytesHeader(hdr)
		st, err := e.trySend(tag, &h, data)
		switch {
		case err != nil:
			e.mu.Unlock()
			d.run()
			return false, err
		case st == sent:
			e.mu.Unlock()
			d.run()
			e.p.wake()
			return true, nil
		case st == sentFrag:
			e.queue(pendingSend{frag: e.lastFrag, tag: tag, cb: cb})
			e.mu.Unlock()
			d.run()
			return false, nil
		}
	}
	if e.err != nil { // drain failed the peer
		err := e.err
		e.mu.Unlock()
		d.run()
		return false, err
	}
	if !e.queueCopy(tag, hdr, data, cb) {
		e.queue(pendingSend{frag: -1, tag: tag, hdr: bytes.Clone(hdr), data: data, cb: cb})
	}
	e.mu.Unlock()
	d.run()
	return false, nil
}

// queueCopy queues a send behind others as a filled fragment, so that the
// drain only has to post its reference. It does so only behind sends that
// all hold their fragment: behind one still waiting for a fragment, the
// sends queued after it could hold the whole pool. False when it did not.
// Called with e.mu held.
func (e *endpoint) queueCopy(tag btl.Tag, hdr, data []byte, cb btl.Completion) bool {
	k := len(e.pending)
	if k == 0 || e.pending[k-1].frag < 0 {
		return false
	}
	h := bytesHeader(hdr)
	idx, ok := e.copyToFrag(tag, &h, data)
	if ok {
		e.queue(pendingSend{frag: idx, tag: tag, cb: cb})
	}
	return ok
}

// Alloc returns a fragment buffer of exactly size bytes in this process's
// segment; the caller fills it and passes it to SendAlloc or Free. It is
// invalid after Close. ErrWouldBlock when every fragment is in flight.
func (e *endpoint) Alloc(size int) ([]byte, error) {
	if size < 0 || size > e.m.cfg.maxSend {
		return nil, mpierr.Errorf(mpierr.ErrArg, "sm: Alloc(%d): at most %d bytes", size, e.m.cfg.maxSend)
	}
	e.mu.Lock()
	err := e.usable()
	e.mu.Unlock()
	if err != nil {
		return nil, err
	}
	_, payload, ok := e.m.pool.get(size)
	if !ok {
		return nil, btl.ErrWouldBlock
	}
	return payload[:size], nil
}

// SendAlloc sends buf, a buffer from Alloc whose first hdrLen bytes are the
// header. buf belongs to the module again. done and cb as for Send.
func (e *endpoint) SendAlloc(tag btl.Tag, buf []byte, hdrLen int, cb btl.Completion) (bool, error) {
	idx, err := e.m.fragOf(buf)
	if err != nil {
		return false, err
	}
	if hdrLen < 0 || hdrLen > len(buf) || hdrLen > math.MaxUint16 {
		return false, mpierr.Errorf(mpierr.ErrArg, "sm: SendAlloc header length %d of %d", hdrLen, len(buf))
	}
	e.mu.Lock()
	if err := e.usable(); err != nil {
		e.mu.Unlock()
		e.m.pool.put(idx)
		return false, err
	}
	e.fill(idx, tag, hdrLen, len(buf))
	var d drained
	if len(e.pending) > 0 {
		d = e.drain()
	}
	if len(e.pending) == 0 && e.err == nil {
		switch err := e.post(idx); {
		case err == nil:
			e.mu.Unlock()
			d.run()
			e.p.wake()
			return true, nil
		case !isFull(err):
			e.mu.Unlock()
			d.run()
			e.m.pool.put(idx)
			return false, err
		}
	}
	if err := e.err; err != nil {
		e.mu.Unlock()
		d.run()
		e.m.pool.put(idx)
		return false, err
	}
	e.queue(pendingSend{frag: idx, tag: tag, cb: cb})
	e.mu.Unlock()
	d.run()
	return false, nil
}

// Free returns an unsent Alloc buffer.
func (e *endpoint) Free(buf []byte) {
	if idx, err := e.m.fragOf(buf); err == nil {
		e.m.pool.put(idx)
	}
}

// fragOf finds the fragment whose payload buf (from Alloc) starts.
func (m *Module) fragOf(buf []byte) (int, error) {
	bad := mpierr.Errorf(mpierr.ErrArg, "sm: buffer was not returned by Alloc (or was sent or freed)")
	if m.closed.Load() {
		return -1, fmt.Errorf("sm: module closed: %w", btl.ErrClosed)
	}
	if cap(buf) == 0 {
		return -1, bad
	}
	off := int(sys.Addr(buf) - sys.Addr(m.seg[:1]))
	var idx int
	switch l := &m.lay; {
	case off >= l.smallOff+fragHdr && off < l.largeOff && (off-l.smallOff-fragHdr)%l.smallStride == 0:
		idx = (off - l.smallOff - fragHdr) / l.smallStride
	case off >= l.largeOff+fragHdr && off < l.size && (off-l.largeOff-fragHdr)%l.largeStride == 0:
		idx = l.smallCount + (off-l.largeOff-fragHdr)/l.largeStride
	default:
		return -1, bad
	}
	if !m.pool.owned(idx) {
		return -1, bad
	}
	if _, c := m.lay.frag(idx); len(buf) > c {
		return -1, bad
	}
	return idx, nil
}

// Send outcomes of trySend.
const (
	notSent  = iota // no room: nothing changed
	sent            // posted
	sentFrag        // copied into fragment e.lastFrag, which could not be posted yet
)

// trySend posts hdr+data: inline in the fast box when it exists and the
// fragment is small, else through a fragment. Called with e.mu held.
func (e *endpoint) trySend(tag btl.Tag, h *header, data []byte) (int, error) {
	n := h.len() + len(data)
	if e.announced && n <= e.m.lay.inlineLimit {
		switch err := e.tx.putInline(uint8(tag), h, data); {
		case err == nil:
			e.sentN++
			e.sentB += int64(n)
			return sent, nil
		case !isFull(err):
			return notSent, e.brokeProtocol(err)
		}
		// The box is full of inline entries: copy into a fragment, whose
		// reference (8 bytes of box) is posted as soon as the receiver
		// frees a little space, instead of waiting for room for the
		// whole entry (a window of 512-byte sends ran at a quarter of
		// the rate of 4 KiB ones).
	}
	idx, ok := e.copyToFrag(tag, h, data)
	if !ok {
		return notSent, nil
	}
	switch err := e.post(idx); {
	case err == nil:
		return sent, nil
	case isFull(err):
		e.lastFrag = idx
		return sentFrag, nil
	default:
		e.m.pool.put(idx)
		return notSent, err
	}
}

// copyToFrag copies hdr+data into a free fragment of this process's pool
// and fills its header; false when none is free.
func (e *endpoint) copyToFrag(tag btl.Tag, h *header, data []byte) (int, bool) {
	hn := h.len()
	idx, payload, ok := e.m.pool.get(hn + len(data))
	if !ok {
		return 0, false
	}
	h.put(payload, 0, hn)
	copy(payload[hn:], data)
	e.fill(idx, tag, hn, hn+len(data))
	return idx, true
}

// fill writes a fragment's meta and destination words.
func (e *endpoint) fill(idx int, tag btl.Tag, hdrLen, n int) {
	off, _ := e.m.lay.frag(idx)
	// Plain stores: the FIFO slot or fast-box entry that publishes the
	// fragment is written after them with an atomic store (release).
	le.PutUint64(e.m.seg[off+fragMeta:], packFragMeta(uint8(tag), 0, hdrLen, n))
	le.PutUint64(e.m.seg[off+fragDest:], uint64(uint32(e.p.local)))
}

// post publishes filled fragment idx to the peer: as a fast-box reference
// once the peer knows the box, else through its FIFO (announcing the fast
// box on this fragment when it is time). errBoxFull/errFifoFull leave the
// fragment with the caller. Called with e.mu held.
func (e *endpoint) post(idx int) error {
	pool := e.m.pool
	off, _ := e.m.lay.frag(idx)
	if e.announced {
		pool.posting(idx, e.p.local)
		if err := e.tx.putFrag(idx); err != nil {
			pool.unpost(idx)
			if !isFull(err) {
				return e.brokeProtocol(err)
			}
			return err
		}
		e.count(idx)
		return nil
	}
	if e.tx == nil && !e.noFbox && e.sends >= e.m.cfg.fboxThreshold {
		e.setupFbox()
	}
	meta, dest := e.m.seg[off+fragMeta:off+fragMeta+8], e.m.seg[off+fragDest:off+fragDest+8]
	if e.tx != nil {
		le.PutUint64(meta, le.Uint64(meta)|uint64(flagSetupFbox)<<8)
		le.PutUint64(dest, uint64(uint32(e.p.local))|uint64(e.tx.index)<<32)
	}
	pool.posting(idx, e.p.local)
	if err := e.p.fifo.push(e.m.local, idx); err != nil {
		pool.unpost(idx)
		le.PutUint64(meta, le.Uint64(meta)&^(uint64(flagSetupFbox)<<8))
		return err
	}
	e.sends++
	e.count(idx)
	if e.tx != nil {
		e.announced = true
	}
	return nil
}

func (e *endpoint) count(idx int) {
	off, _ := e.m.lay.frag(idx)
	e.sentN++
	e.sentB += int64(uint32(le.Uint64(e.m.seg[off+fragMeta:]) >> 32))
}

// setupFbox takes a fast box of own segment for this peer and one of the
// peer's fast-box credits (btl_sm_fbox_max). Either failing means no fast
// box for this peer, ever.
func (e *endpoint) setupFbox() {
	e.noFbox = true
	i := int(e.m.nextFbox.Add(1) - 1)
	if i >= e.m.lay.fboxCount {
		return
	}
	for {
		v := e.p.fboxAvail.Load()
		if int64(v) <= 0 || v > maxLocal {
			return
		}
		if e.p.fboxAvail.CompareAndSwap(v, v-1) {
			break
		}
	}
	e.tx = newTxBox(e.m.seg, &e.m.lay, i)
	e.noFbox = false
}

// queue appends a pending send and lists the endpoint for Progress.
// Called with e.mu held.
func (e *endpoint) queue(ps pendingSend) {
	if !e.listed {
		e.listed = true
		e.m.pendMu.Lock()
		e.m.pendEps = append(e.m.pendEps, e)
		e.m.pendingN.Store(int32(len(e.m.pendEps)))
		e.m.pendMu.Unlock()
	}
	e.pending = append(e.pending, ps)
}

// drained is what drain completed: callbacks to run once e.mu is released.
type drained struct {
	ok     []btl.Completion // posted: called with nil
	failed []pendingSend    // stopped: called with err
	err    error
}

// run is called after every send: an empty d (nothing was queued) costs
// a test here, not a call with d copied.
func (d *drained) run() {
	if d.ok != nil || d.failed != nil {
		d.runAll()
	}
}

func (d *drained) runAll() {
	for _, cb := range d.ok {
		if cb != nil {
			cb(nil)
		}
	}
	for _, ps := range d.failed {
		if ps.cb != nil {
			ps.cb(d.err)
		}
	}
}

// drain posts queued sends in order until one does not fit. A send that
// fails for good (the peer broke the protocol) fails every queued one.
// Called with e.mu held.
func (e *endpoint) drain() drained {
	var d drained
	k := 0
	var err error
	for ; k < len(e.pending); k++ {
		ps := &e.pending[k]
		if ps.frag == fenceMark {
			d.ok = append(d.ok, ps.cb)
			continue
		}
		if ps.frag >= 0 {
			err = e.post(ps.frag)
		} else {
			var st int
			h := bytesHeader(ps.hdr)
			st, err = e.trySend(ps.tag, &h, ps.data)
			switch {
			case err != nil:
			case st == sentFrag:
				ps.frag, ps.hdr, ps.data = e.lastFrag, nil, nil
				err = errFifoFull
			case st == notSent:
				err = errFifoFull
			}
		}
		if err != nil {
			break
		}
		d.ok = append(d.ok, ps.cb)
	}
	if k > 0 {
		clear(e.pending[:k])
		e.pending = append(e.pending[:0], e.pending[k:]...)
	}
	if err != nil && !isFull(err) {
		if e.err == nil {
			e.err = err
		}
		d.err = e.err
		d.failed = e.dropPending(nil)
	}
	return d
}

// fenceMark is the frag of a Flush's marker in the queue.
const fenceMark = -2

// Flush completes once the sends queued before it are posted: at once
// when none is queued, else through cb when the drain reaches its marker
// (or with the error that fails the queue). Put and Get complete during
// their calls. An error return: the module is closed or the endpoint
// failed.
func (e *endpoint) Flush(cb btl.Completion) (bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.m.closed.Load() {
		return false, fmt.Errorf("sm: module closed: %w", btl.ErrClosed)
	}
	if e.err != nil {
		return false, e.err
	}
	if len(e.pending) == 0 {
		return true, nil
	}
	e.queue(pendingSend{frag: fenceMark, cb: cb})
	return false, nil
}

// terminate fails every queued send with err (returned for the caller to
// complete outside the lock) and makes err the endpoint's terminal error.
func (e *endpoint) terminate(err error, out []pendingSend) []pendingSend {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.err == nil {
		e.err = err
	}
	return e.dropPending(out)
}

// dropPending empties the queue, returning its fragments to the pool, and
// appends the dropped sends to out. Called with e.mu held.
func (e *endpoint) dropPending(out []pendingSend) []pendingSend {
	for _, ps := range e.pending {
		if ps.frag >= 0 {
			e.m.pool.put(ps.frag)
		}
		out = append(out, ps)
	}
	e.pending = nil
	return out
}

// brokeProtocol fails the peer after it wrote nonsense into shared memory
// that this process reads as a sender (fast-box control line).
func (e *endpoint) brokeProtocol(err error) error {
	err = protoErr(e.p, err)
	e.m.fail(e.p, err)
	e.m.events.Store(true)
	return e.p.failure()
}

func isFull(err error) bool { return errors.Is(err, errBoxFull) || errors.Is(err, errFifoFull) }

// wake wakes the peer if it announced it sleeps and nobody woke it since.
// The loads are after the fragment's publication (all sequentially
// consistent), and the peer announces, then arms its futex word, before
// its last look for work, so either it sees the fragment or this sees it
// announced and armed. Only the sender that disarms the word makes the
// system call: while the peer's sleeper has not run yet (or its process
// polls with another goroutine) the following fragments cost two loads,
// not a futex wake each.
func (p *peer) wake() {
	if uint32(p.state.Load()) != 0 {
		p.wakeArmed()
	}
}

func (p *peer) wakeArmed() {
	if disarm(p.seq) {
		sys.FutexWake(p.seq, math.MaxInt32)
	}
}
