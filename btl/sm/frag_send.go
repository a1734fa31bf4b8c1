package sm

import (
	"fmt"
	"math"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
)

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
