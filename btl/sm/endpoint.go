package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/gompi-org/gompi/btl"
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

	mu        sync.Mutex
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
	// The common case in place, as in SendImmediateHeader: the fast box
	// in use, nothing queued, an entry within its inline limit.
	if n := len(hdr) + len(data); n <= e.m.lay.inlineLimit && n <= e.m.cfg.maxSend {
		e.mu.Lock()
		if e.announced && len(e.pending) == 0 && e.usable() == nil && e.tx.putLine(uint8(tag), hdr, data) {
			e.sentN++
			e.sentB += int64(len(hdr) + len(data))
			e.mu.Unlock()
			e.p.wake()
			return nil
		}
		e.mu.Unlock()
	}
	h := bytesHeader(hdr)
	return e.sendImmediate(tag, &h, data)
}

// SendImmediateHeader is SendImmediate with the header by value
// (btl.HeaderSender).
func (e *endpoint) SendImmediateHeader(tag btl.Tag, h0, h1 uint64, data []byte) error {
	// The common case in place: the fast box in use, nothing queued, and
	// the entry within the ring's current line, or a longer one within
	// the box's inline limit (a larger message goes the general way at
	// once). The two are written out apart: one block choosing between
	// putWords and putWordsLong under the lock cost the 8-byte send 6
	// instructions more (bench/instr.sh: 552.3 against 546.1).
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
	} else if 16+len(data) <= e.m.lay.inlineLimit {
		e.mu.Lock()
		if e.announced && len(e.pending) == 0 && e.usable() == nil && e.tx.putWordsLong(uint8(tag), h0, h1, data) {
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
