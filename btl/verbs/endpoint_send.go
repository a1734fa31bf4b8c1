// The control-message send path. SendImmediate, Send and SendAlloc turn a
// fragment into a frame in the staging copy of the peer's ring and write
// it into the peer's ring with an RDMA WRITE_WITH_IMM (postMsgLocked);
// large data goes from the caller's registered memory instead of being
// copied. What does not fit yet (credits, ring room, queue slots, or no
// connection) waits in the endpoint's queue (endpoint_post.go).

package verbs

import (
	"errors"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

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
