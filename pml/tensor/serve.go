package tensor

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"sync"

	"github.com/gompi-org/gompi/btl"
)

// respKey names a request on the sending rank: the requester and its index.
type respKey struct {
	peer int
	idx  uint32
}

// resp is a request being served on the sending rank. Guarded by
// Rendezvous.mu until it is handed to write.
type resp struct {
	peer     int
	idx      uint32
	key      key
	req      reqEntry // the latest request (meta-data, destination)
	s        *sent    // the tensor, once matched
	metaSent bool     // META_DATA_RESPONSE went out; a TENSOR_RE_REQUEST is awaited
	// The content's registration made ahead by Send (sent.pre), handed
	// to the write with the tensor.
	pre    btl.Registration
	preMod btl.Module
	// ready: the content's registration for the requester to read, in
	// exposed already (readyLocked), so that the write only sends NOTIFY.
	ready  btl.Registration
	listed bool     // in resps
	shape  [4]int64 // room for req.meta.shape when rs outlives the request's message
}

// keepShape moves rs.req's shape out of the request's message, which
// goes back to its pool after the handler (recycle), into rs.
func (rs *resp) keepShape() {
	rs.req.meta.shape = append(rs.shape[:0:len(rs.shape)], rs.req.meta.shape...)
}

// onRequestLocked takes TENSOR_REQUEST and TENSOR_RE_REQUEST entries
// (and the releases they carry).
func (r *Rendezvous) onRequestLocked(peer int, m *requestMsg, out *outbox) {
	r.releaseLocked(peer, m.released, out)
	for _, e := range m.entries {
		r.notePullerLocked(peer, e)
		rk := respKey{peer, e.index}
		if m.re {
			r.onReRequestLocked(rk, e, out)
			continue
		}
		rs := resps.Get().(*resp)
		*rs = resp{peer: peer, idx: e.index, key: key{e.step, e.name}, req: e}
		switch {
		case r.aborted != nil:
			r.answerErrorLocked(rs, classAborted, r.aborted.Error(), out)
			continue
		case r.closed:
			r.answerErrorLocked(rs, classClosed, ErrClosed.Error(), out)
			continue
		}
		if len(r.resps) > 0 {
			if _, dup := r.resps[rk]; dup {
				continue // the requester reused a live index: nothing sane to answer
			}
		}
		s, ok := r.table[rs.key]
		if !ok {
			// It waits for Send past this call: its shape must not stay
			// in the message, which goes back to its pool (recycle).
			rs.keepShape()
			r.resps[rk] = rs
			rs.listed = true
			ws := r.waiting[rs.key]
			if ws == nil {
				ws, r.spareWaiting = r.spareWaiting, nil
			}
			r.waiting[rs.key] = append(ws, rs)
			continue
		}
		delete(r.table, rs.key)
		r.matchLocked(rs, s, out) // (it keeps rs in resps only while a TENSOR_RE_REQUEST is awaited)
	}
}

// matchLocked serves a request with its tensor: an error for an invalid
// tensor, a write when the requester's meta-data is current, and
// otherwise META_DATA_RESPONSE (keeping a copy of the tensor until the
// TENSOR_RE_REQUEST, as TensorFlow clones it).
func (r *Rendezvous) matchLocked(rs *resp, s *sent, out *outbox) {
	rs.s = s
	if s.err != nil {
		r.answerErrorLocked(rs, classRequest, s.err.Error(), out)
		return
	}
	if rs.req.hasMeta && rs.req.meta.equal(s.m) {
		if rs.listed {
			delete(r.resps, respKey{rs.peer, rs.idx})
			rs.listed = false
		}
		rs.pre, rs.preMod = s.pre, s.preMod
		s.pre, s.preMod = nil, nil
		r.readyLocked(rs, out)
		out.writes.add(rs)
		return
	}
	s.unexpose(out) // the content is copied: the registration covers the original
	if s.m.dtype != String && len(s.content) > 0 {
		s.content = bytes.Clone(s.content)
	}
	rs.keepShape() // it stays past the message's handler (recycle)
	r.resps[respKey{rs.peer, rs.idx}] = rs
	rs.listed = true
	rs.metaSent = true
	r.st.metas.Add(1)
	out.meta(rs.peer, metaEntry{index: rs.idx, meta: s.m})
}

// onReRequestLocked: the requester reallocated for the meta-data it was
// sent; the content goes now.
func (r *Rendezvous) onReRequestLocked(rk respKey, e reqEntry, out *outbox) {
	rs := r.resps[rk]
	if rs == nil || !rs.metaSent {
		r.answerErrorLocked(&resp{peer: rk.peer, idx: rk.idx}, classRequest, fmt.Sprintf("TENSOR_RE_REQUEST %d without a META_DATA_RESPONSE", rk.idx), out)
		return
	}
	if !e.meta.equal(rs.s.m) {
		r.answerErrorLocked(rs, classRequest, fmt.Sprintf("TENSOR_RE_REQUEST for %v, the tensor is %v", e.meta, rs.s.m), out)
		return
	}
	rs.req = e
	delete(r.resps, rk)
	rs.listed = false
	r.readyLocked(rs, out)
	out.writes.add(rs)
}

// readyLocked exposes the content of rs for its requester to read, when
// the request asks to and a registration is at hand: Send's, made ahead,
// or the requester's spare when the content is in the memory it covers.
// Done here, under the lock the handler holds anyway, the write then only
// sends NOTIFY. Otherwise the write registers (writeOne).
func (r *Rendezvous) readyLocked(rs *resp, out *outbox) {
	content := rs.s.content
	if !rs.req.pull || len(content) == 0 || r.peerErr[rs.peer] != nil {
		return
	}
	ep := r.endpoint(rs.peer)
	if ep == nil || ep.Module().Caps()&btl.CapGet == 0 {
		return
	}
	mod := ep.Module()
	var reg btl.Registration
	if rs.pre != nil && rs.preMod == mod {
		reg, rs.pre, rs.preMod = rs.pre, nil, nil
	}
	reg = r.takeSpareLocked(rs.peer, reg, mod, content, out)
	if reg != nil {
		rs.ready = reg
		r.exposed[respKey{rs.peer, rs.idx}] = exposure{reg, mod, content}
	}
}

// takeSpareLocked ends peer's spare registration (releaseLocked) at a
// write to peer: it returns reg when reg is not nil, else the spare when
// it covers content on mod, else nil; a spare it does not return goes to
// out's releases (not this memory: the next content will not be either).
func (r *Rendezvous) takeSpareLocked(peer int, reg btl.Registration, mod btl.Module, content []byte, out *outbox) btl.Registration {
	x := r.spare[peer]
	if x.reg == nil {
		return reg
	}
	r.spare[peer] = exposure{}
	if reg == nil && x.covers(mod, content) {
		return x.reg
	}
	out.releases = append(out.releases, x)
	return reg
}

// releaseLocked takes the registrations of contents peer has read; out
// releases them after its writes, which a request carrying releases
// usually starts (they wait for nobody). The last one stays as peer's
// spare until the next write to peer, which takes it over when its
// content is in the same memory (a producer that sends from one buffer
// step after step registers it once) and releases it otherwise.
func (r *Rendezvous) releaseLocked(peer int, idx []uint32, out *outbox) {
	for _, i := range idx {
		k := respKey{peer, i}
		if x, ok := r.exposed[k]; ok {
			if old := r.spare[peer]; old.reg != nil {
				out.releases = append(out.releases, old)
			}
			r.spare[peer] = x
			delete(r.exposed, k)
		}
	}
}

// answerErrorLocked fails a request with ERROR_STATUS.
func (r *Rendezvous) answerErrorLocked(rs *resp, class errClass, text string, out *outbox) {
	delete(r.resps, respKey{rs.peer, rs.idx})
	r.st.errors.Add(1)
	out.msg(rs.peer, &errorMsg{index: rs.idx, text: text, class: class})
}

// onCancelLocked drops requests the requester gave up, answering
// CANCELLED for those not being written (a write in progress ends with its
// NOTIFY). A tensor already matched goes back to the table for a later
// request.
func (r *Rendezvous) onCancelLocked(peer int, m *cancelMsg, out *outbox) {
	var done []uint32
	for _, idx := range m.indices {
		rk := respKey{peer, idx}
		rs := r.resps[rk]
		if rs == nil {
			continue
		}
		delete(r.resps, rk)
		if rs.s == nil {
			ws := r.waiting[rs.key]
			for i, w := range ws {
				if w == rs {
					ws = append(ws[:i], ws[i+1:]...)
					break
				}
			}
			if len(ws) == 0 {
				delete(r.waiting, rs.key)
			} else {
				r.waiting[rs.key] = ws
			}
		} else {
			r.returnLocked(rs, out)
		}
		done = append(done, idx)
	}
	if len(done) > 0 {
		out.msg(peer, &cancelMsg{cancelled: true, indices: done})
	}
}

// returnLocked puts back the tensor of a request that will not take it.
func (r *Rendezvous) returnLocked(rs *resp, out *outbox) {
	if rs.s == nil || rs.s.err != nil || r.aborted != nil || r.closed {
		return
	}
	if _, dup := r.table[rs.key]; dup {
		return
	}
	s := rs.s
	rs.s = nil
	r.offerLocked(rs.key, s, out)
}

// write sends the content of each request: a put into the registered
// destination when the transport to the requester can put with its
// handle, and otherwise a message (inline in the NOTIFY when small). The
// notifications of writes that completed during the call go to each peer
// in one NOTIFY; a put that completes later sends its own. Called without
// r.mu.
func (r *Rendezvous) write(rss *few[*resp], o *outbox) {
	type note struct {
		peer, size int
		m          *notifyMsg
	}
	if rss.len() == 1 { // one request (the steady state of Recv)
		rs := rss.at(0)
		m := newNotifyMsg(1)
		ne, now := r.writeOne(rs, o, m.one.handle[:0])
		if now {
			m.entries = append(m.entries, ne)
			r.send(rs.peer, m)
		}
		recycle(m)
		if now && ne.via != viaPut && !rs.listed {
			// Written and notified: nothing refers to rs or its tensor
			// any more (a put's completion would).
			recycleResp(rs)
		}
		return
	}
	var notes []note // by peer, in the order they came (usually one)
	for i := range rss.len() {
		rs := rss.at(i)
		ne, now := r.writeOne(rs, o, nil)
		if !now {
			continue
		}
		i := 0
		for i < len(notes) && notes[i].peer != rs.peer {
			i++
		}
		if i == len(notes) {
			notes = append(notes, note{peer: rs.peer, size: 16, m: &notifyMsg{}})
		}
		n := &notes[i]
		add := len(ne.inline) + len(ne.handle) + 32
		if len(n.m.entries) > 0 && n.size+add > r.msgMax(rs.peer) {
			r.send(rs.peer, n.m)
			n.m, n.size = &notifyMsg{}, 16
		}
		n.m.entries = append(n.m.entries, ne)
		n.size += add
	}
	for _, n := range notes {
		r.send(n.peer, n.m)
	}
}

// resps and sents recycle the responses and sent tensors of single
// writes (write): two allocations a tensor fewer.
var (
	resps = sync.Pool{New: func() any { return new(resp) }}
	sents = sync.Pool{New: func() any { return new(sent) }}
)

func recycleResp(rs *resp) {
	if s := rs.s; s != nil {
		*s = sent{}
		sents.Put(s)
	}
	*rs = resp{}
	resps.Put(rs)
}

// writeOne starts one content's write; now reports whether its
// notification can go at once (false: a put completes later and notifies
// itself). A registration's handle in ne is copied into hbuf's room when
// it fits (the NOTIFY's own), else into a new slice.
func (r *Rendezvous) writeOne(rs *resp, o *outbox, hbuf []byte) (ne notifyEntry, now bool) {
	content := rs.s.content
	ne.index = rs.idx
	pre, preMod := rs.pre, rs.preMod
	rs.pre, rs.preMod = nil, nil
	if r.cfg.checksum {
		ne.hasSum, ne.sum = true, crc32.Checksum(content, castagnoli)
	}
	if len(content) > 0 {
		r.st.written.Add(int64(len(content)))
	}
	if rs.ready != nil { // exposed by the handler (readyLocked)
		ne.via, ne.handle = viaGet, append(hbuf, rs.ready.Handle()...)
		rs.ready = nil
		if pre != nil {
			pre.Release()
		}
		return ne, true
	}
	ep := r.endpoint(rs.peer)
	if len(content) > 0 && rs.req.pull && ep != nil && ep.Module().Caps()&btl.CapGet != 0 {
		// The receiver reads the content: expose it until it says it did.
		// The registration is Send's, made ahead when the name's last
		// request read it from the same transport, or the receiver's
		// spare when the content is in the memory it released last (a
		// producer sending from one buffer), or a new one.
		mod := ep.Module()
		reg, err := pre, error(nil)
		if pre != nil && preMod == mod {
			pre = nil
		} else {
			reg = nil
		}
		r.mu.Lock()
		reg = r.takeSpareLocked(rs.peer, reg, mod, content, o)
		r.mu.Unlock()
		if reg == nil {
			reg, err = mod.Register(content, btl.AccessRemoteRead)
			r.st.registered.Add(1)
		}
		if err == nil {
			ne.via, ne.handle = viaGet, append(hbuf, reg.Handle()...)
			r.mu.Lock()
			if r.closed || r.peerErr[rs.peer] != nil {
				reg.Release()
			} else {
				r.exposed[respKey{rs.peer, rs.idx}] = exposure{reg, mod, content}
			}
			r.mu.Unlock()
			if pre != nil {
				pre.Release()
			}
			return ne, true
		}
		// Not registered: the content goes as a message (below).
	}
	if pre != nil { // taken by a request that does not read it
		pre.Release()
	}
	if len(content) == 0 {
		return ne, true
	}
	if rs.req.handle != nil && ep != nil && ep.Module().Caps()&btl.CapPut != 0 && ep.Module().Name() == rs.req.transport {
		ne.via = viaPut
		pe := ne // the completions' copy: ne itself stays off the heap on the other paths
		w := r.pc.World(rs.peer)
		if ip, ok := ep.(ImmediatePutter); ok && !r.cfg.checksum && !r.pc.Engine().PeerQueued(w) {
			// The write carries the request index: no NOTIFY.
			_, err := ip.WriteWithImm(content, rs.req.handle, 0, rs.idx, func(err error) {
				if err != nil {
					r.putDone(rs, pe, err)
				}
			})
			if err == nil {
				r.st.puts.Add(1)
				return ne, false
			}
			// Refused (its queue is full: btl.ErrWouldBlock), or an index
			// it cannot carry: a put and a NOTIFY.
		}
		// Through the PML's queue: a put the transport refuses for now
		// (btl.ErrWouldBlock) is posted again from progress, and the
		// control messages sent after it wait behind it.
		done, err := r.pc.Engine().PeerPut(w, content, rs.req.handle, 0, func(err error) {
			r.putDone(rs, pe, err)
		})
		if err == nil {
			r.st.puts.Add(1)
			return ne, done
		}
		// The transport refused the handle (or the peer is gone): the
		// content goes as a message.
	}
	r.st.msgContents.Add(1)
	if len(content) <= inlineMax {
		ne.via, ne.inline = viaInline, content
		return ne, true
	}
	ne.via = viaMessage
	if q, err := r.comm.Isend(content, rs.peer, dataTag(rs.idx)); err == nil {
		r.track(q)
	}
	return ne, true
}

// maxPullers bounds the names whose last reader Send remembers.
const maxPullers = 4096

// notePullerLocked remembers whether the request e from rank p reads the
// content: Send registers the next tensor of the name ahead for the rank
// whose last request (with meta-data, so sized) read it (expose), and
// for none after one that does not.
func (r *Rendezvous) notePullerLocked(p int, e reqEntry) {
	switch {
	case e.pull:
		if q, ok := r.pullers[e.name]; ok && q == p {
			return
		}
		if len(r.pullers) >= maxPullers {
			clear(r.pullers)
		}
		r.pullers[e.name] = p
	case e.hasMeta && len(r.pullers) > 0:
		delete(r.pullers, e.name)
	}
}

// putDone notifies a put that completed after its call, or fails the
// request when the put failed. It runs as the put's completion, on
// whichever goroutine the transport (or the PML's queue) completes it.
func (r *Rendezvous) putDone(rs *resp, ne notifyEntry, err error) {
	if err != nil {
		r.st.errors.Add(1)
		r.send(rs.peer, &errorMsg{index: rs.idx, text: fmt.Sprintf("write the content: %v", err)})
		return
	}
	m := newNotifyMsg(1)
	m.entries = append(m.entries, ne)
	r.send(rs.peer, m)
	recycle(m)
}

// meta adds a META_DATA_RESPONSE entry for peer; one message per peer
// carries them all.
func (o *outbox) meta(peer int, e metaEntry) {
	for i := range o.msgs.len() {
		m := o.msgs.at(i)
		if mm, ok := m.m.(*metaMsg); ok && m.peer == peer && len(mm.entries) < 256 {
			mm.entries = append(mm.entries, e)
			return
		}
	}
	o.msg(peer, &metaMsg{entries: []metaEntry{e}})
}
