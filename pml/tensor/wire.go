package tensor

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml"
)

// Control messages travel as btl fragments of the rendezvous's tag range
// (0x60-0x6f), on the endpoint the PML uses for the peer and through the
// PML's queue of refused operations (pml.Engine.PeerSend), so that they
// keep their order with each other and with the puts. They are handled
// where the transport delivers them: on whichever goroutine polls it (a
// Recv waiting for its tensor, any other waiting MPI call, the PML's
// background poller) or, between in-process ranks, on the sender's. No
// goroutine of the rendezvous stands between a fragment and its handling.
//
// A fragment names the rendezvous by the context id of its private
// communicator (the same on every rank), so several rendezvous share one
// engine. A message larger than what the transport sends in one fragment
// goes in parts, which carry a message id of the sender; parts of one
// message arrive in order (one goroutine sends them on one ordered
// endpoint), parts of messages sent by different goroutines may
// interleave.
const (
	// tagMessage: one whole control message. Header: u32 context id.
	tagMessage btl.Tag = 0x61
	// tagPart: a part of a control message. Header: u32 context id, u32
	// message id, u8 last (1 on the message's last part, else 0).
	tagPart btl.Tag = 0x62
)

// Request indices are unique per engine, so that the immediate of a
// write (TagImmediate), which carries only the index, names the
// rendezvous too: the top byte is the rendezvous's slot on its engine,
// the low 24 bits a counter of the rendezvous (never 0).
const (
	slotShift = 24
	maxSlots  = 255 // slot 255 would make indices reach the verbs immediates' reserved values
	idxMask   = 1<<slotShift - 1
)

const (
	msgHdrLen  = 4
	partHdrLen = 9
	// maxParted bounds the messages from one peer being reassembled at
	// once (each at most maxMessage bytes).
	maxParted = 16
)

// partHdr is a tagPart fragment's header.
type partHdr struct {
	ctx, id uint32
	last    bool
}

func (h partHdr) append(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, h.ctx)
	b = binary.LittleEndian.AppendUint32(b, h.id)
	return append(b, boolByte(h.last))
}

// decodePartHdr parses a tagPart header that fills b.
func decodePartHdr(b []byte) (partHdr, int, error) {
	if len(b) != partHdrLen {
		return partHdr{}, 0, fmt.Errorf("%w: part header of %d bytes (want %d)", ErrBadMessage, len(b), partHdrLen)
	}
	h := partHdr{ctx: binary.LittleEndian.Uint32(b), id: binary.LittleEndian.Uint32(b[4:])}
	switch b[8] {
	case 0:
	case 1:
		h.last = true
	default:
		return partHdr{}, 0, fmt.Errorf("%w: part header's last flag is %d", ErrBadMessage, b[8])
	}
	return h, partHdrLen, nil
}

// decodeMsgHdr parses a tagMessage header that fills b: the context id.
func decodeMsgHdr(b []byte) (uint32, int, error) {
	if len(b) != msgHdrLen {
		return 0, 0, fmt.Errorf("%w: message header of %d bytes (want %d)", ErrBadMessage, len(b), msgHdrLen)
	}
	return binary.LittleEndian.Uint32(b), msgHdrLen, nil
}

// demux routes an engine's control fragments to its rendezvous by context
// id. One per engine (pml.Engine.Attach).
type demux struct {
	mu    sync.Mutex                             // serializes changes of m and slots
	m     atomic.Pointer[map[uint32]*Rendezvous] // by context id; replaced whole (copy on write): lookups take no lock
	slots [maxSlots]atomic.Pointer[Rendezvous]   // by slot (the top byte of request indices)
}

type demuxKey struct{}

// demuxOf returns e's demux, installing its handlers on first use.
func demuxOf(e *pml.Engine) *demux {
	return e.Attach(demuxKey{}, func() any {
		d := &demux{}
		d.m.Store(&map[uint32]*Rendezvous{})
		e.SetUpperHandler(tagMessage, d.onMessage)
		e.SetUpperHandler(tagPart, d.onPart)
		e.SetUpperHandler(TagImmediate, d.onImmediate)
		return d
	}).(*demux)
}

// add routes r's context id to r and gives it a free slot; false when
// every slot is taken.
func (d *demux) add(r *Rendezvous) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	slot := -1
	for i := range d.slots {
		if d.slots[i].Load() == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		return false
	}
	r.slot = uint32(slot)
	d.slots[slot].Store(r)
	d.setLocked(r.ctx, r)
	return true
}

// remove forgets r: later fragments for it are dropped.
func (d *demux) remove(r *Rendezvous) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.slots[r.slot].Load() == r {
		d.slots[r.slot].Store(nil)
	}
	d.setLocked(r.ctx, nil)
}

func (d *demux) setLocked(ctx uint32, r *Rendezvous) {
	old := *d.m.Load()
	m := make(map[uint32]*Rendezvous, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	if r == nil {
		delete(m, ctx)
	} else {
		m[ctx] = r
	}
	d.m.Store(&m)
}

func (d *demux) lookup(ctx uint32) *Rendezvous { return (*d.m.Load())[ctx] }

// onMessage takes a whole control message. A fragment that names no
// rendezvous of this rank is late traffic of a closed one: dropped.
func (d *demux) onMessage(ep btl.Endpoint, hdr, data []byte) {
	ctx, _, err := decodeMsgHdr(hdr)
	if err != nil {
		return // nothing names the rendezvous it was meant for
	}
	if r := d.lookup(ctx); r != nil {
		if p, ok := r.rankOf(ep.Peer()); ok {
			r.handle(p, data)
		}
	}
}

// onPart takes a part of a control message.
func (d *demux) onPart(ep btl.Endpoint, hdr, data []byte) {
	if len(hdr) < msgHdrLen {
		return
	}
	r := d.lookup(binary.LittleEndian.Uint32(hdr))
	if r == nil {
		return
	}
	p, ok := r.rankOf(ep.Peer())
	if !ok {
		return
	}
	h, _, err := decodePartHdr(hdr)
	if err != nil {
		r.reject(p, err)
		return
	}
	if msg, err := r.assemble(p, h, data); err != nil {
		r.reject(p, err)
	} else if msg != nil {
		r.handle(p, msg)
	}
}

// onImmediate takes the immediate of a write (ImmediatePutter): the
// content of that request is in place.
func (d *demux) onImmediate(ep btl.Endpoint, hdr, _ []byte) {
	imm, count, _, err := decodeImmHdr(hdr)
	if err != nil || imm>>slotShift >= maxSlots {
		return // names no rendezvous
	}
	r := d.slots[imm>>slotShift].Load()
	if r == nil {
		return
	}
	if p, ok := r.rankOf(ep.Peer()); ok {
		r.onImmediate(p, imm, count)
	}
}

// onImmediate completes the receive idx from peer whose content a write
// with immediate put in place, as a NOTIFY of a put would.
func (r *Rendezvous) onImmediate(peer int, idx, count uint32) {
	var out outbox
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	rq := r.lookupLocked(peer, idx)
	if rq == nil {
		r.mu.Unlock()
		return
	}
	var t Tensor
	var err error
	if rq.m.dead || uint64(count) != rq.m.bytes {
		err = r.protoErr(rq, "a write of %d bytes for %v", count, rq.m)
	} else {
		t, err = r.contentLocked(rq, notifyEntry{index: idx, via: viaPut})
	}
	r.completeLocked(rq, t, err, &out)
	r.mu.Unlock()
	r.run(&out)
}

// partKey names a message being reassembled.
type partKey struct {
	peer int
	id   uint32
}

// assemble adds a part from peer; it returns the whole message once its
// last part is in.
func (r *Rendezvous) assemble(peer int, h partHdr, data []byte) ([]byte, error) {
	r.partMu.Lock()
	defer r.partMu.Unlock()
	k := partKey{peer, h.id}
	buf, ok := r.parts[k]
	if !ok {
		n := 0
		for pk := range r.parts {
			if pk.peer == peer {
				n++
			}
		}
		if n >= maxParted {
			return nil, fmt.Errorf("%w: more than %d parted messages at once", ErrBadMessage, maxParted)
		}
	}
	if len(buf)+len(data) > maxMessage {
		delete(r.parts, k)
		return nil, fmt.Errorf("%w: parted message beyond %d bytes", ErrBadMessage, maxMessage)
	}
	buf = append(buf, data...)
	if h.last {
		delete(r.parts, k)
		return buf, nil
	}
	r.parts[k] = buf
	return nil, nil
}

// sendBytes sends one encoded control message to peer: in one fragment
// when it fits the transport's, else in parts. A send that fails is the
// end of the exchange with that peer (it failed, or the engine closed).
// It reports whether the transport is done with b (every fragment
// completed within its call), so that b may be used again.
func (r *Rendezvous) sendBytes(peer int, b []byte) (free bool) {
	w := r.pc.World(peer)
	e := r.pc.Engine()
	limit := r.fragMax[peer]
	var err error
	free = true
	if msgHdrLen+len(b) <= limit {
		free, err = e.PeerSend(w, tagMessage, r.hdr, b, sendDone)
	} else {
		id := r.msgID.Add(1)
		step := limit - partHdrLen
		var hdr [partHdrLen]byte
		for off := 0; off < len(b) && err == nil; off += step {
			end := min(off+step, len(b))
			h := partHdr{ctx: r.ctx, id: id, last: end == len(b)}
			var done bool
			done, err = e.PeerSend(w, tagPart, h.append(hdr[:0]), b[off:end], sendDone)
			free = free && done
		}
	}
	if err != nil {
		r.sendFailed(peer, err)
		return false
	}
	return free
}

// sendDone is the completion of a control send: nothing waits for it (a
// failed peer is reported by the PML's watch).
func sendDone(error) {}

// sendFailed: a control message to peer could not be sent; receives
// from peer fail with err.
func (r *Rendezvous) sendFailed(peer int, err error) {
	if debug {
		fmt.Printf("rank %d -> %d: send failed: %v\n", r.rank, peer, err)
	}
	var out outbox
	r.mu.Lock()
	if errors.Is(err, mpi.ErrProcFailed) {
		r.peerGoneLocked(peer, peerFailure(peer, err), &out)
	} else {
		r.peerGoneLocked(peer, fmt.Errorf("tensor: send a control message to rank %d: %w", peer, err), &out)
	}
	out.msgs = few[outMsg]{} // nothing more goes to it
	r.mu.Unlock()
	r.run(&out)
}

// onFailure is the PML's failure watch: world rank w failed, or (w -1)
// the engine was aborted or closed under the rendezvous.
func (r *Rendezvous) onFailure(w int, err error) {
	if w < 0 {
		r.fatal(err)
		return
	}
	p, ok := r.rankOf(w)
	if !ok || p == r.rank {
		return
	}
	var out outbox
	r.mu.Lock()
	if !r.closed {
		r.peerGoneLocked(p, peerFailure(p, err), &out)
	}
	out.msgs = few[outMsg]{}
	r.mu.Unlock()
	r.run(&out)
}

// fatal: the engine under the rendezvous failed (the job was aborted, or
// finalized): everything pending fails with err.
func (r *Rendezvous) fatal(err error) {
	var out outbox
	r.mu.Lock()
	r.fatalLocked(err, &out)
	r.mu.Unlock()
	r.run(&out)
}

func (r *Rendezvous) fatalLocked(err error, out *outbox) {
	if r.aborted == nil && !r.closed {
		r.abortLocked(fmt.Errorf("tensor: communicator failed: %w", err), out)
	}
	out.msgs = few[outMsg]{} // the engine carries nothing more
}

// reject cuts peer off after a malformed fragment or message, and tells
// it why, so that its receives from this rank fail too.
func (r *Rendezvous) reject(peer int, err error) {
	var out outbox
	r.mu.Lock()
	r.rejectLocked(peer, err, &out)
	r.mu.Unlock()
	r.run(&out)
}

func (r *Rendezvous) rejectLocked(peer int, err error, out *outbox) {
	r.peerGoneLocked(peer, fmt.Errorf("tensor: rank %d sent a bad control message: %w", peer, err), out)
	out.msg(peer, &abortMsg{closed: true, text: fmt.Sprintf("rank %d rejected a control message: %v", r.rank, err)})
}

// handle decodes and dispatches one control message from peer. b is
// valid only during the call (decoding copies what is kept).
func (r *Rendezvous) handle(peer int, b []byte) {
	m, _, err := decode(b)
	if debug {
		fmt.Printf("rank %d <- %d: %T %+v %v\n", r.rank, peer, m, m, err)
	}
	if err != nil {
		r.reject(peer, err)
		return
	}
	var out outbox
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	switch m := m.(type) {
	case *requestMsg:
		r.onRequestLocked(peer, m, &out)
	case *metaMsg:
		r.onMetaLocked(peer, m, &out)
	case *notifyMsg:
		r.onNotifyLocked(peer, m, &out)
	case *errorMsg:
		r.onErrorLocked(peer, m, &out)
	case *releaseMsg:
		r.releaseLocked(peer, m.indices, &out)
	case *cancelMsg:
		if m.cancelled {
			r.onCancelledLocked(peer, m, &out)
		} else {
			r.onCancelLocked(peer, m, &out)
		}
	case *abortMsg:
		if m.closed {
			why := "closed its rendezvous"
			if m.text != "" {
				why = m.text
			}
			r.peerGoneLocked(peer, fmt.Errorf("%w: rank %d: %s", ErrClosed, peer, why), &out)
		} else if r.aborted == nil {
			r.abortLocked(fmt.Errorf("tensor: rank %d aborted the rendezvous: %s: %w", peer, m.text, mpi.ErrAborted), &out)
		}
	}
	r.mu.Unlock()
	r.run(&out)
	recycle(m) // handled within this call (a waiting request copies what it keeps)
}

var debug = false
