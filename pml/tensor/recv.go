package tensor

import (
	"fmt"
	"hash/crc32"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/mpi"
)

// recvReq is a receive in progress on the receiving rank, keyed by its
// request index. Guarded by Rendezvous.mu.
type recvReq struct {
	idx  uint32
	src  int
	key  key
	m    meta   // what the destination is sized for
	dest []byte // the destination (nil for an empty or dead tensor)
	// Registration of the destination (or of the proxy) with the
	// transport to src; handle and transport go in the request.
	reg       btl.Registration
	proxy     *proxyBuf
	proxyMod  btl.Module
	handle    []byte
	transport string
	pull      bool // the receiver reads the content (its transport's Get finishes within the call)

	done   func(Tensor, error) // RecvAsync's callback, or
	w      *recvWaiter         // Recv's waiter
	told   bool                // the caller has its outcome (or gave up)
	queued bool                // its request waits in a batch, unsent
	sentRe bool                // a TENSOR_RE_REQUEST went out
}

// releaseReg gives up the destination's registration (the proxy's goes
// back to the rendezvous with putProxy).
func (rq *recvReq) releaseReg() {
	if rq.reg != nil && rq.proxy == nil {
		rq.reg.Release()
	}
	rq.reg = nil
}

// start validates a receive, allocates its destination when the
// meta-data is cached, and sends (or batches) its TENSOR_REQUEST. size is
// the content's expected size (0 when unknown), for the wait.
func (r *Rendezvous) start(step int64, name string, src int, done func(Tensor, error), w *recvWaiter) (rq *recvReq, size int, err error) {
	if err := checkName(name); err != nil {
		return nil, 0, fmt.Errorf("tensor: recv: %w", mpierr.Errorf(mpierr.ErrArg, "%v", err))
	}
	if src < 0 || src >= r.size {
		return nil, 0, mpierr.Errorf(mpierr.ErrRank, "tensor: source %d not in 0..%d", src, r.size-1)
	}
	var out outbox
	r.mu.Lock()
	defer func() {
		r.mu.Unlock()
		r.run(&out)
	}()
	switch {
	case r.aborted != nil:
		return nil, 0, r.aborted
	case r.closed:
		return nil, 0, ErrClosed
	case r.peerErr[src] != nil:
		return nil, 0, r.peerErr[src]
	}
	rq = &recvReq{idx: r.slot<<slotShift | r.nextIdx, src: src, key: key{step, name}, done: done, w: w}
	for { // the next counter value whose index is free (it wraps; until it does, every one is)
		r.nextIdx = (r.nextIdx + 1) & idxMask
		if r.nextIdx == 0 {
			r.idxWrapped = true
		} else if !r.idxWrapped || r.reqs[r.slot<<slotShift|r.nextIdx] == nil {
			break
		}
	}
	r.reqs[rq.idx] = rq
	r.live[src]++
	e := reqEntry{index: rq.idx, step: step, name: name}
	if m, ok := r.cache[cacheKey{src, name}]; ok {
		r.st.hits.Add(1)
		r.destLocked(rq, m)
		e.hasMeta, e.meta, e.handle, e.transport, e.pull = true, m, rq.handle, rq.transport, rq.pull
	} else {
		r.st.misses.Add(1)
	}
	r.st.requests.Add(1)
	if done != nil {
		r.async.Add(1)
		r.wakePump() // it polls while RecvAsyncs pend
	}
	r.requestLocked(rq, e, false, w != nil, &out)
	return rq, int(rq.m.bytes), nil
}

// destLocked allocates rq's destination for m and registers it with the
// transport to rq.src when that transport can put. A destination the
// transport does not register gets a registered proxy buffer. A content
// of pullMin bytes or more that the transport can read within its call
// (btl.SyncGetter: shared memory, where a Get is copied by both
// processes at once, and in-process ranks) is pulled instead: nothing is
// registered here, the sender exposes the content and this rank reads it.
// A content of at most inlineMax bytes comes inline in the NOTIFY.
func (r *Rendezvous) destLocked(rq *recvReq, m meta) {
	rq.m = m
	rq.dest, rq.handle, rq.transport, rq.pull = nil, nil, "", false
	if m.dead || m.bytes == 0 {
		return
	}
	rq.dest = r.pool.get(int(m.bytes))
	if m.bytes <= inlineMax && !r.cfg.forceProxy {
		// Small: the content rides in the NOTIFY (no registration here,
		// no put, which over shared memory is a system call per tensor).
		return
	}
	ep := r.endpoint(rq.src)
	if r.canPull(ep, m.bytes) {
		rq.pull = true
		return
	}
	if ep == nil || ep.Module().Caps()&btl.CapPut == 0 {
		return // the content comes in a message
	}
	mod := ep.Module()
	var reg btl.Registration
	var err error
	if !r.cfg.forceProxy {
		reg, err = mod.Register(rq.dest, btl.AccessRemoteWrite|btl.AccessLocalWrite)
	}
	if r.cfg.forceProxy || err != nil {
		p, perr := r.takeProxyLocked(mod, len(rq.dest))
		if perr != nil {
			return // neither registers: the content comes in a message
		}
		rq.proxy, rq.proxyMod, reg = p, mod, p.reg
	}
	rq.reg = reg
	rq.handle = append([]byte(nil), reg.Handle()...)
	rq.transport = mod.Name()
}

// canPull reports whether a content of n bytes from the peer of ep is
// read by this rank (destLocked).
func (r *Rendezvous) canPull(ep btl.Endpoint, n uint64) bool {
	if ep == nil || r.cfg.pullMin <= 0 || n < uint64(r.cfg.pullMin) || r.cfg.forceProxy || ep.Module().Caps()&btl.CapGet == 0 {
		return false
	}
	_, ok := ep.(btl.SyncGetter)
	return ok
}

// requestLocked sends a TENSOR_REQUEST or TENSOR_RE_REQUEST entry, or
// queues it in the source's batch. now: the entry goes at once (a Recv's,
// which waits for it anyway), and the source's batch with it. A
// RecvAsync's entry is batched only while other receives from the source
// are pending: a lone one goes within its call, so that a program that
// computes after it (and runs nothing else meanwhile, on one processor)
// does not hold it back.
func (r *Rendezvous) requestLocked(rq *recvReq, e reqEntry, re, now bool, out *outbox) {
	b := &r.batch[rq.src]
	empty := len(b.req)+len(b.re) == 0
	if !r.cfg.batching || empty && (now || r.live[rq.src] <= 1) {
		m := newRequestMsg(re, 1)
		m.entries, m.released = append(m.entries, e), r.takeReleasedLocked(rq.src)
		out.msg(rq.src, m)
		return
	}
	if re {
		b.re = append(b.re, e)
	} else {
		b.req = append(b.req, e)
	}
	rq.queued = true
	if now {
		r.flushLocked(rq.src, out)
		return
	}
	r.batched.Store(true)
	r.wakePump()
}

// wakePump rings the progress goroutine.
func (r *Rendezvous) wakePump() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// pendingBatch holds the requests to one source not sent yet.
type pendingBatch struct {
	req, re []reqEntry
}

// pump is the rendezvous's progress goroutine. It sends the batched
// requests (requests made while it sends one batch form the next) and,
// while RecvAsync receives are pending, waits in the PML as a Recv does,
// polling the transports, so that their answers are handled as soon as
// they arrive even when the program's goroutines wait elsewhere (on the
// callbacks' channel). Otherwise it sleeps on kick.
func (r *Rendezvous) pump() {
	defer close(r.pumpDone)
	e := r.pc.Engine()
	idle := func() bool { return r.async.Load() == 0 || r.batched.Load() || r.stopped() }
	for {
		select {
		case <-r.stop:
			return
		case <-r.kick:
		}
		for !r.stopped() {
			if r.batched.Load() {
				var out outbox
				r.mu.Lock()
				r.batched.Store(false)
				for p := range r.batch {
					r.flushLocked(p, &out)
				}
				r.mu.Unlock()
				r.run(&out)
			}
			if r.async.Load() == 0 {
				break
			}
			e.Await(nil, -1, idle, r.kick)
		}
	}
}

// stopped reports whether Close began.
func (r *Rendezvous) stopped() bool {
	select {
	case <-r.stop:
		return true
	default:
		return false
	}
}

// flushLocked sends the batched requests to p.
func (r *Rendezvous) flushLocked(p int, out *outbox) {
	b := &r.batch[p]
	r.splitLocked(p, b.req, false, out)
	r.splitLocked(p, b.re, true, out)
	b.req, b.re = nil, nil
}

// splitLocked turns a batch into messages that each fit in one fragment
// to p (and in maxMessage bytes).
func (r *Rendezvous) splitLocked(p int, es []reqEntry, re bool, out *outbox) {
	limit := r.msgMax(p)
	for len(es) > 0 {
		n, size := 0, 16
		for n < len(es) && (n == 0 || size+es[n].size() <= limit) {
			size += es[n].size()
			if rq := r.reqs[es[n].index]; rq != nil {
				rq.queued = false
			}
			n++
		}
		out.msg(p, &requestMsg{re: re, entries: es[:n:n], released: r.takeReleasedLocked(p)})
		es = es[n:]
	}
}

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
		out.tells = append(out.tells, tell{w: w, t: t, err: err})
		return
	}
	if r.async.Add(-1) == 0 {
		r.wakePump() // nothing more to poll for
	}
	done := rq.done
	out.tells = append(out.tells, tell{done: done, t: t, err: err})
}

// msgMax is the largest control message to p that goes in one fragment.
func (r *Rendezvous) msgMax(p int) int { return min(maxMessage, r.fragMax[p]-msgHdrLen) }

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
			out.gets = append(out.gets, pendingGet{rq, e}) // read after r.mu is released
			continue
		}
		if e.via == viaGet && rq.pull {
			r.releasedLocked(rq.src, rq.idx, int(rq.m.bytes), out) // given up: nothing to read
		}
		t, err := r.contentLocked(rq, e)
		if rq.told && rq.dest != nil {
			r.pool.put(rq.dest)
		}
		r.finishLocked(rq)
		r.tellLocked(rq, t, err, out)
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

// onCancelled: the sender dropped these requests; nothing will be written.
func (r *Rendezvous) onCancelledLocked(peer int, m *cancelMsg) {
	for _, idx := range m.indices {
		if rq := r.lookupLocked(peer, idx); rq != nil {
			if rq.dest != nil {
				r.pool.put(rq.dest)
			}
			r.finishLocked(rq)
		}
	}
}

// peerGoneLocked fails everything that involves peer p, which died
// (mpi.ErrProcFailed) or closed its rendezvous. Its destinations are
// released: p writes no more.
func (r *Rendezvous) peerGoneLocked(p int, err error, out *outbox) {
	if r.peerErr[p] != nil {
		return
	}
	r.peerErr[p] = err
	for _, rq := range r.reqs {
		if rq.src == p {
			r.finishLocked(rq)
			r.tellLocked(rq, Tensor{}, err, out)
		}
	}
	b := &r.batch[p]
	b.req, b.re = nil, nil
	r.rel[p], r.relBytes[p] = nil, 0
	for k, x := range r.exposed { // p reads no more
		if k.peer == p {
			x.reg.Release()
			delete(r.exposed, k)
		}
	}
	if x := r.spare[p]; x.reg != nil {
		x.reg.Release()
		r.spare[p] = exposure{}
	}
	for k, rs := range r.resps {
		if k.peer == p {
			r.returnLocked(rs, out)
			delete(r.resps, k)
		}
	}
	for k, ws := range r.waiting {
		n := 0
		for _, rs := range ws {
			if rs.peer != p {
				ws[n] = rs
				n++
			}
		}
		if n == 0 {
			delete(r.waiting, k)
		} else {
			r.waiting[k] = ws[:n]
		}
	}
}

// peerFailure is the error of a receive whose source died.
func peerFailure(p int, err error) error {
	if err == nil {
		err = mpierr.Errorf(mpi.ErrProcFailed, "rank %d failed", p)
	}
	return fmt.Errorf("tensor: rank %d: %w", p, err)
}

// pendingGet is a content this rank reads from the sender (pull), once
// the handler that took its NOTIFY released r.mu.
type pendingGet struct {
	rq *recvReq
	e  notifyEntry
}

// pull reads rq's content from the sender's registered memory, then
// completes rq and notes the release of the sender's registration. It
// runs without r.mu, on the goroutine that handled the NOTIFY: the copy
// happens where the receiver waits (over shared memory, with the
// sender's help when it has nothing else to do).
func (r *Rendezvous) pull(g pendingGet) {
	rq, e := g.rq, g.e
	n := int(rq.m.bytes)
	var err error
	if sg, ok := r.endpoint(rq.src).(btl.SyncGetter); ok {
		err = sg.GetNow(rq.dest[:n], e.handle, 0)
	} else {
		err = fmt.Errorf("the transport to rank %d cannot read", rq.src)
	}
	r.st.gets.Add(1)
	var out outbox
	r.mu.Lock()
	r.releasedLocked(rq.src, rq.idx, n, &out)
	if r.reqs[rq.idx] == rq {
		var t Tensor
		if err != nil {
			err = fmt.Errorf("tensor %q step %d from rank %d: read the content: %w", rq.key.name, rq.key.step, rq.src, err)
		} else {
			t, err = r.contentLocked(rq, e)
		}
		if rq.told && rq.dest != nil {
			r.pool.put(rq.dest)
		}
		r.finishLocked(rq)
		r.tellLocked(rq, t, err, &out)
	}
	r.mu.Unlock()
	r.run(&out)
}

// Releases wait for the next request to their sender, up to these
// bounds, beyond which a RELEASE message takes them.
const (
	releaseMax      = 16
	releaseMaxBytes = 64 << 20
)

// releasedLocked notes that the content of request idx from src (n
// bytes) was read: the sender may release its registration.
func (r *Rendezvous) releasedLocked(src int, idx uint32, n int, out *outbox) {
	if r.closed || r.peerErr[src] != nil {
		return
	}
	r.rel[src] = append(r.rel[src], idx)
	r.relBytes[src] += n
	if len(r.rel[src]) >= releaseMax || r.relBytes[src] >= releaseMaxBytes {
		out.msg(src, &releaseMsg{indices: r.takeReleasedLocked(src)})
	}
}

// takeReleasedLocked returns the releases waiting for src and forgets them.
func (r *Rendezvous) takeReleasedLocked(src int) []uint32 {
	idx := r.rel[src]
	r.rel[src], r.relBytes[src] = nil, 0
	return idx
}
