package fake

import (
	"fmt"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// Endpoints: the sends and RDMA operations a module's user starts, each
// becoming an Op on the Network (perform.go).

type endpoint struct {
	m    *Module
	peer int
	pub  btl.Endpoint // what AddProc hands out: this endpoint, or its syncEndpoint
}

var (
	_ btl.Endpoint   = (*endpoint)(nil)
	_ btl.SyncGetter = (*syncEndpoint)(nil)
)

func (e *endpoint) Module() btl.Module { return e.m }
func (e *endpoint) Peer() int          { return e.peer }

// usable returns the error that stops an operation on e now, if any.
func (e *endpoint) usable() error {
	if e.m.isClosed() {
		return fmt.Errorf("fake: rank %d closed: %w", e.m.rank, btl.ErrClosed)
	}
	n := e.m.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.dead[link{e.m.rank, e.peer}]; err != nil {
		return err
	}
	return nil
}

func (e *endpoint) checkSize(kind Kind, size int) {
	l := e.m.cfg.Limits
	if lim := max(l.EagerLimit, l.MaxSendSize); size > lim {
		n := e.m.net
		n.mu.Lock()
		n.violateLocked("%d->%d %s of %d bytes exceeds the fragment limit %d", e.m.rank, e.peer, kind, size, lim)
		n.mu.Unlock()
	}
}

func (e *endpoint) newSend(kind Kind, tag btl.Tag, hdr, data []byte) *Op {
	return &Op{Kind: kind, From: e.m.rank, To: e.peer, Tag: tag,
		Hdr: append([]byte(nil), hdr...), Data: append([]byte(nil), data...)}
}

// SendImmediate queues hdr+data (copied) or refuses with btl.ErrWouldBlock
// when the module lacks CapSendImmediate or RefuseImmediate says so.
func (e *endpoint) SendImmediate(tag btl.Tag, hdr, data []byte) error {
	if err := e.usable(); err != nil {
		return err
	}
	n := e.m.net
	n.mu.Lock()
	if n.refuseImm != 0 {
		if n.refuseImm > 0 {
			n.refuseImm--
		}
		n.logLocked("%d->%d sendi refused (would block)", e.m.rank, e.peer)
		n.mu.Unlock()
		return btl.ErrWouldBlock
	}
	n.mu.Unlock()
	if e.m.cfg.Caps&btl.CapSendImmediate == 0 {
		return btl.ErrWouldBlock
	}
	e.checkSize(KindSendImmediate, len(hdr)+len(data))
	n.enqueue(e.newSend(KindSendImmediate, tag, hdr, data))
	return nil
}

// Send queues hdr+data. The fake copies both at once but checks at
// delivery that data did not change meanwhile (the module owns it until
// completion). Completion comes on delivery, unless inline or
// SetLocalCompletion.
func (e *endpoint) Send(tag btl.Tag, hdr, data []byte, cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	if e.m.cfg.Caps&btl.CapSend == 0 {
		return false, mpierr.Errorf(mpierr.ErrNotSupported, "fake: send without CapSend")
	}
	if e.wouldBlock(KindSend) {
		return false, errWouldBlock(KindSend)
	}
	e.checkSize(KindSend, len(hdr)+len(data))
	op := e.newSend(KindSend, tag, hdr, data)
	return e.start(op, data, cb), nil
}

// wouldBlock says whether an operation of kind on e is refused now
// (Network.WouldBlock, WouldBlockRate).
func (e *endpoint) wouldBlock(kind Kind) bool {
	n := e.m.net
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.wouldBlockLocked(e.m.rank, e.peer, kind)
}

func (e *endpoint) start(op *Op, owned []byte, cb btl.Completion) bool {
	n := e.m.net
	n.mu.Lock()
	local := n.localDone
	n.mu.Unlock()
	if len(owned) > 0 && !local {
		op.orig, op.ownership = owned, true
	}
	if !local {
		op.cb, op.async = cb, true
	}
	if n.enqueue(op) {
		return true
	}
	return local
}

// Alloc returns a fresh buffer of size bytes, or btl.ErrWouldBlock when
// RefuseAlloc says so.
func (e *endpoint) Alloc(size int) ([]byte, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	n := e.m.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refuseAlc != 0 {
		if n.refuseAlc > 0 {
			n.refuseAlc--
		}
		n.logLocked("%d->%d alloc refused (would block)", e.m.rank, e.peer)
		return nil, btl.ErrWouldBlock
	}
	n.allocs++
	return make([]byte, size), nil
}

// SendAlloc queues buf (from Alloc); its first hdrLen bytes are the header.
func (e *endpoint) SendAlloc(tag btl.Tag, buf []byte, hdrLen int, cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	if hdrLen < 0 || hdrLen > len(buf) {
		return false, mpierr.Errorf(mpierr.ErrArg, "fake: header of %d bytes in a %d-byte buffer", hdrLen, len(buf))
	}
	n := e.m.net
	n.mu.Lock()
	if n.wouldBlockLocked(e.m.rank, e.peer, KindSendAlloc) {
		n.mu.Unlock()
		return false, errWouldBlock(KindSendAlloc) // buf stays the caller's
	}
	n.allocs--
	n.mu.Unlock()
	e.checkSize(KindSendAlloc, len(buf))
	op := e.newSend(KindSendAlloc, tag, buf[:hdrLen], buf[hdrLen:])
	return e.start(op, buf[hdrLen:], cb), nil
}

// Free returns an unsent Alloc buffer.
func (e *endpoint) Free([]byte) {
	n := e.m.net
	n.mu.Lock()
	n.allocs--
	n.mu.Unlock()
}

func (e *endpoint) rdma(kind Kind, local, handle []byte, off int, cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	need := btl.CapPut
	if kind == KindGet {
		need = btl.CapGet
	}
	if e.m.cfg.Caps&need == 0 {
		return false, mpierr.Errorf(mpierr.ErrNotSupported, "fake: %s without the capability", kind)
	}
	n := e.m.net
	n.mu.Lock()
	if _, err := n.lookupLocked(handle, off, len(local), e.peer, kind); err != nil {
		n.mu.Unlock()
		return false, err
	}
	if cb != nil && n.wouldBlockLocked(e.m.rank, e.peer, kind) { // (GetNow passes no cb: it cannot be refused)
		n.mu.Unlock()
		return false, errWouldBlock(kind)
	}
	if l := e.m.cfg.Limits.MaxRDMASize; l > 0 && len(local) > l {
		n.violateLocked("%d->%d %s of %d bytes exceeds MaxRDMASize %d", e.m.rank, e.peer, kind, len(local), l)
	}
	op := &Op{Kind: kind, From: e.m.rank, To: e.peer, Handle: append([]byte(nil), handle...), Off: off, Len: len(local), cb: cb, async: true}
	if kind == KindPut {
		op.Data = append([]byte(nil), local...)
		op.orig, op.ownership = local, true
		if n.failPut > 0 {
			n.failPut--
			op.Fail = fmt.Errorf("fake: put: %w", ErrInjected)
		}
	} else {
		op.local = local
		if n.failGet > 0 {
			n.failGet--
			op.Fail = fmt.Errorf("fake: get: %w", ErrInjected)
		}
	}
	if n.inline && op.Fail != nil {
		n.nextOp++
		op.ID = n.nextOp
		n.logLocked("#%d %d->%d %s FAILED: %v", op.ID, op.From, op.To, n.describeLocked(op), op.Fail)
		n.mu.Unlock()
		return false, op.Fail
	}
	n.mu.Unlock()
	return n.enqueue(op), nil
}

// Put queues an RDMA write of local into the peer's registration at off.
// The handle and range are checked at once (btl.ErrBadHandle) and again at
// delivery.
func (e *endpoint) Put(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(KindPut, local, handle, off, cb)
}

// Get queues an RDMA read from the peer's registration at off into local.
func (e *endpoint) Get(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(KindGet, local, handle, off, cb)
}

// Flush completes once the operations this endpoint started before it,
// and reported not done, have completed (delivered, dropped, or failed by
// a cut or a close): at once when there are none, else through cb when
// the last of them completes (with the first error they completed with).
// An error return: the module is closed or the link is cut.
func (e *endpoint) Flush(cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	n := e.m.net
	n.mu.Lock()
	f := &fence{cb: cb}
	for op := range n.live {
		if op.From == e.m.rank && op.To == e.peer {
			op.fences = append(op.fences, f)
			f.out++
		}
	}
	n.logLocked("%d->%d flush: %d outstanding", e.m.rank, e.peer, f.out)
	done := f.out == 0
	n.mu.Unlock()
	return done, nil
}
