// The one-sided path. Put, Get and WriteWithImm check the peer's handle,
// register the local memory through the cache and post RDMA WRITE or READ
// work requests between it and the peer's registration, split into
// pieces of at most maxChunk bytes (postRDMALocked).

package verbs

import (
	"fmt"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

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
