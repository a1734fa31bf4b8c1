package tensor

import (
	"fmt"
	"hash/crc32"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/mpi"
)

// cancel withdraws a Recv whose context ended; false when its outcome
// came first (the caller then takes it from the channel).
func (r *Rendezvous) cancel(rq *recvReq) bool {
	var out outbox
	r.mu.Lock()
	if rq.told {
		r.mu.Unlock()
		return false
	}
	rq.told = true
	r.st.cncl.Add(1)
	if rq.queued {
		// Never sent: nothing can be written; forget it here.
		b := &r.batch[rq.src]
		b.req = dropEntry(b.req, rq.idx)
		b.re = dropEntry(b.re, rq.idx)
		r.finishLocked(rq)
	} else if r.reqs[rq.idx] == rq {
		out.msg(rq.src, &cancelMsg{indices: []uint32{rq.idx}})
	}
	r.mu.Unlock()
	r.run(&out)
	return true
}

func dropEntry(es []reqEntry, idx uint32) []reqEntry {
	for i, e := range es {
		if e.index == idx {
			return append(es[:i], es[i+1:]...)
		}
	}
	return es
}

// tellLocked arranges for the caller of rq to get its outcome (once),
// after r.mu is released. rq stays in the table until the sender's last
// word on it.
func (r *Rendezvous) tellLocked(rq *recvReq, t Tensor, err error, out *outbox) {
	if rq.told {
		return
	}
	rq.told = true
	if rq.w != nil {
		w := rq.w
		out.tells.add(tell{w: w, t: t, err: err})
		return
	}
	if r.async.Add(-1) == 0 {
		r.wakePump() // nothing more to poll for
	}
	done := rq.done
	out.tells.add(tell{done: done, t: t, err: err})
}

// completeLocked ends rq with its outcome once its content is in (or
// failed): a destination whose caller already gave up goes back to the
// pool, rq leaves the table and its caller is told.
func (r *Rendezvous) completeLocked(rq *recvReq, t Tensor, err error, out *outbox) {
	if rq.told && rq.dest != nil {
		r.pool.put(rq.dest)
	}
	r.finishLocked(rq)
	r.tellLocked(rq, t, err, out)
}

// finishLocked removes rq: its registration is released (a proxy goes
// back to the pool) and, when its caller did not get it, its destination
// is reused.
func (r *Rendezvous) finishLocked(rq *recvReq) {
	if r.reqs[rq.idx] == rq {
		delete(r.reqs, rq.idx)
		r.live[rq.src]--
	}
	rq.releaseReg()
	if rq.proxy != nil {
		r.putProxyLocked(rq.proxyMod, rq.proxy)
		rq.proxy = nil
	}
}

// lookupLocked returns the receive that a message from peer about idx
// concerns, nil when none (a late answer after Close, or a confused peer).
func (r *Rendezvous) lookupLocked(peer int, idx uint32) *recvReq {
	rq := r.reqs[idx]
	if rq == nil || rq.src != peer {
		return nil
	}
	return rq
}

// onMeta: the sender's meta-data differs from what rq asked with. The
// cache takes it, the destination is reallocated for it, and the request
// goes again as TENSOR_RE_REQUEST.
func (r *Rendezvous) onMetaLocked(peer int, m *metaMsg, out *outbox) {
	for _, e := range m.entries {
		rq := r.lookupLocked(peer, e.index)
		if rq == nil || rq.sentRe {
			continue
		}
		r.cache[cacheKey{peer, rq.key.name}] = e.meta
		if rq.told {
			continue // cancelled or aborted: the sender answers the CANCEL, or ERROR_STATUS
		}
		rq.releaseReg()
		if rq.proxy != nil {
			r.putProxyLocked(rq.proxyMod, rq.proxy)
			rq.proxy = nil
		}
		if rq.dest != nil {
			r.pool.put(rq.dest)
		}
		r.destLocked(rq, e.meta)
		rq.sentRe = true
		r.st.reRequests.Add(1)
		r.requestLocked(rq, reqEntry{index: rq.idx, step: rq.key.step, name: rq.key.name, hasMeta: true, meta: e.meta,
			handle: rq.handle, transport: rq.transport, pull: rq.pull}, true, rq.w != nil, out)
	}
}

// onNotify: the content of these requests is in place (or follows in a
// message).
func (r *Rendezvous) onNotifyLocked(peer int, m *notifyMsg, out *outbox) {
	for _, e := range m.entries {
		rq := r.lookupLocked(peer, e.index)
		if rq == nil {
			continue
		}
		if e.via == viaMessage {
			r.awaitMessageLocked(rq, e)
			continue
		}
		if e.via == viaGet && rq.pull && !rq.told {
			out.gets.add(pendingGet{rq, e}) // read after r.mu is released
			continue
		}
		if e.via == viaGet && rq.pull {
			r.releasedLocked(rq.src, rq.idx, int(rq.m.bytes), out) // given up: nothing to read
		}
		t, err := r.contentLocked(rq, e)
		r.completeLocked(rq, t, err, out)
	}
}

// awaitMessageLocked receives a content that travels as a separate
// message into rq's destination, on a goroutine of its own (the handler
// that took the NOTIFY runs inside a transport's progress and must not
// wait for a large message).
func (r *Rendezvous) awaitMessageLocked(rq *recvReq, e notifyEntry) {
	q, err := r.comm.Irecv(rq.dest, rq.src, dataTag(rq.idx))
	go func() {
		var out outbox
		if err == nil {
			_, err = q.Wait()
		}
		r.mu.Lock()
		var t Tensor
		if err == nil {
			t, err = r.contentLocked(rq, e)
			if rq.told && rq.dest != nil {
				r.pool.put(rq.dest)
			}
		} else {
			err = fmt.Errorf("tensor %q step %d from rank %d: receive the content: %w", rq.key.name, rq.key.step, rq.src, err)
		}
		r.finishLocked(rq)
		r.tellLocked(rq, t, err, &out)
		r.mu.Unlock()
		r.run(&out)
	}()
}

// contentLocked builds the received tensor from rq's destination: the
// proxy's copy, the inline bytes, the checksum check and the strings'
// decoding.
func (r *Rendezvous) contentLocked(rq *recvReq, e notifyEntry) (Tensor, error) {
	n := int(rq.m.bytes)
	if rq.m.dead {
		n = 0
	}
	switch e.via {
	case viaNone:
		if n != 0 {
			return Tensor{}, r.protoErr(rq, "no content for %d bytes", n)
		}
	case viaGet:
		if !rq.pull {
			return Tensor{}, r.protoErr(rq, "a content to read that was not asked for")
		}
	case viaPut:
		if rq.reg == nil {
			return Tensor{}, r.protoErr(rq, "a put into a destination that was not registered")
		}
		if rq.proxy != nil {
			copy(rq.dest, rq.proxy.mem[:n])
			r.st.proxies.Add(1)
		}
	case viaInline:
		if len(e.inline) != n {
			return Tensor{}, r.protoErr(rq, "%d inline bytes for %d", len(e.inline), n)
		}
		copy(rq.dest, e.inline)
	}
	if rq.told {
		return Tensor{}, nil
	}
	dest := rq.dest[:n]
	if testHookContent != nil {
		testHookContent(dest)
	}
	if r.cfg.checksum && e.hasSum {
		if got := crc32.Checksum(dest, castagnoli); got != e.sum {
			return Tensor{}, fmt.Errorf("%w: tensor %q step %d from rank %d: content CRC-32C %08x, the sender's %08x",
				ErrChecksum, rq.key.name, rq.key.step, rq.src, got, e.sum)
		}
	}
	t := Tensor{DType: rq.m.dtype, Shape: append([]int64(nil), rq.m.shape...), IsDead: rq.m.dead}
	if rq.m.dtype == String && !rq.m.dead {
		count, _ := elements(rq.m.shape)
		ss, err := decodeStrings(dest, count)
		if err != nil {
			return Tensor{}, r.protoErr(rq, "string tensor: %v", err)
		}
		t.Strings = ss
		r.pool.put(rq.dest)
		return t, nil
	}
	if n > 0 {
		t.Data = dest
	}
	return t, nil
}

// testHookContent, when set (tests), sees every content before it is
// verified: a test corrupts it to check the checksum.
var testHookContent func([]byte)

func (r *Rendezvous) protoErr(rq *recvReq, format string, a ...any) error {
	return fmt.Errorf("tensor %q step %d from rank %d: %w: %s", rq.key.name, rq.key.step, rq.src, mpierr.ErrProtocol, fmt.Sprintf(format, a...))
}

// onError: the sender failed the request.
func (r *Rendezvous) onErrorLocked(peer int, m *errorMsg, out *outbox) {
	rq := r.lookupLocked(peer, m.index)
	if rq == nil {
		return
	}
	r.st.errors.Add(1)
	r.finishLocked(rq)
	err := fmt.Errorf("tensor %q step %d from rank %d: %w: %s", rq.key.name, rq.key.step, peer, ErrRemote, m.text)
	switch m.class {
	case classAborted:
		err = fmt.Errorf("%w (%w)", err, mpi.ErrAborted)
	case classClosed:
		err = fmt.Errorf("%w (%w)", err, ErrClosed)
	}
	r.tellLocked(rq, Tensor{}, err, out)
	if m.class == classAborted && r.aborted == nil {
		// The sender's rendezvous is aborted, so this one is: its ABORT
		// (or the aborting rank's) may come after this answer, which was
		// sent on another goroutine, but the calls made from now on fail
		// as it would make them.
		r.abortLocked(fmt.Errorf("tensor: rank %d's rendezvous is aborted: %s: %w", peer, m.text, mpi.ErrAborted), out)
	}
}

// onCancelled: the sender dropped these requests, which this rank
// withdrew (cancel); nothing will be written.
func (r *Rendezvous) onCancelledLocked(peer int, m *cancelMsg, out *outbox) {
	for _, idx := range m.indices {
		if rq := r.lookupLocked(peer, idx); rq != nil {
			if !rq.told {
				// This rank sends CANCEL only for a receive whose caller
				// gave up (cancel): dropping one still waited for would
				// leave its caller waiting for good, even through Close.
				r.rejectLocked(peer, fmt.Errorf("%w: CANCELLED for request %d, which was not withdrawn", ErrBadMessage, idx), out)
				return
			}
			if rq.dest != nil {
				r.pool.put(rq.dest)
			}
			r.finishLocked(rq)
		}
	}
}
