package tensor

import (
	"fmt"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// sent is a tensor in the table: its meta-data and the bytes that travel,
// or the error that every request for it gets. pre is the content's
// registration for remote read with preMod, made by Send when the last
// request for the name read its content (expose), so that the request
// that takes it finds it registered.
type sent struct {
	m       meta
	content []byte
	err     error
	pre     btl.Registration
	preMod  btl.Module
	shape   [4]int64 // room for m.shape
}

// unexpose gives up s's registration made ahead of its request, into out
// (released after the outbox's writes).
func (s *sent) unexpose(out *outbox) {
	if s.pre != nil {
		out.releases = append(out.releases, exposure{s.pre, s.preMod, s.content})
		s.pre, s.preMod = nil, nil
	}
}

// exposure is a content registered for remote read: the registration,
// its module and the memory it covers.
type exposure struct {
	reg btl.Registration
	mod btl.Module
	mem []byte
}

// covers reports whether x registers exactly mem with mod.
func (x exposure) covers(mod btl.Module, mem []byte) bool {
	return x.mod == mod && len(mem) > 0 && sameMemory(x.mem, mem)
}

// Send puts t in this rank's table under (step, name), or hands it at once
// to a request that is already waiting for it. It never blocks on a peer.
// A content of 32 KiB or more that goes into the table makes Send poll
// the transports once, so that a request for it already on its way is
// answered within the call.
// A (step, name) already in the table is ErrDuplicate; an invalid tensor
// (unknown DType, Data or Strings that do not match the shape) is an error
// here, and every request for that (step, name) fails with ERROR_STATUS
// carrying the same message.
//
// Ownership: from the call on, t's slices belong to the rendezvous until
// the tensor has been received (or the rendezvous is closed); the caller
// must treat them as immutable, as TensorFlow treats a sent tensor. When
// the receiver's meta-data is stale the rendezvous copies the tensor
// before answering, as TensorFlow does.
func (r *Rendezvous) Send(step int64, name string, t Tensor) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("tensor: send: %w", mpierr.Errorf(mpierr.ErrArg, "%v", err))
	}
	s := sents.Get().(*sent)
	m, content, terr := prepareInto(t, s.shape[:0])
	s.m, s.content = m, content
	if terr != nil {
		terr = fmt.Errorf("tensor %q step %d: %w", name, step, mpierr.Errorf(mpierr.ErrArg, "%v", terr))
		s.err = terr
	}
	k := key{step, name}
	var out outbox
	r.mu.Lock()
	switch {
	case r.aborted != nil:
		r.mu.Unlock()
		return r.aborted
	case r.closed:
		r.mu.Unlock()
		return ErrClosed
	}
	if _, dup := r.table[k]; dup {
		r.mu.Unlock()
		return fmt.Errorf("%w: %q at step %d", ErrDuplicate, name, step)
	}
	tabled := r.offerLocked(k, s, &out)
	puller := -1
	if tabled && terr == nil && len(r.pullers) > 0 && r.cfg.pullMin > 0 && len(content) >= r.cfg.pullMin {
		if p, ok := r.pullers[name]; ok && !r.exposedToLocked(p, content) {
			puller = p
		}
	}
	r.mu.Unlock()
	r.run(&out)
	if puller >= 0 {
		r.expose(k, s, content, puller)
	}
	if tabled && len(content) >= pollMin {
		// A request for it may be on its way, or here but not handled
		// yet (this goroutine was busy producing): one poll of the
		// transports answers it within this call instead of when a
		// waiter or the PML's background poller polls next.
		r.pc.Engine().Progress()
	}
	return terr
}

// pollMin is the smallest content whose Send polls the transports once
// after putting it in the table: one poll costs little beside the copy of
// such a content, and not a step of hundreds of small tensors.
const pollMin = 32 << 10

// exposedToLocked reports whether mem is registered for rank p to read
// already: a content in the same memory as one p has not released yet,
// or as the one it released last (a producer that sends from one buffer
// step after step), whose registration the write to p takes over.
func (r *Rendezvous) exposedToLocked(p int, mem []byte) bool {
	if x := r.spare[p]; x.reg != nil && x.covers(x.mod, mem) {
		return true
	}
	for k, x := range r.exposed {
		if k.peer == p && x.covers(x.mod, mem) {
			return true
		}
	}
	return false
}

// expose registers the content of s, which waits in the table under k,
// for remote read by rank p, whose last request for the name read the
// content: the request that takes it then answers at once instead of
// registering first. Send runs it after the tensor is in the table, while
// the request is usually on its way (a producer that sends before its
// consumer asks, as in a loop of steps), so the registration leaves the
// path from the request to the content. A request that takes s before
// the registration is in place registers for itself, and this one is
// released. content is s's content as Send tabled it: s.content itself is
// r.mu's (a request with stale meta-data replaces it with a copy).
func (r *Rendezvous) expose(k key, s *sent, content []byte, p int) {
	ep := r.endpoint(p)
	if !r.canPull(ep, uint64(len(content))) {
		return
	}
	mod := ep.Module()
	reg, err := mod.Register(content, btl.AccessRemoteRead)
	if err != nil {
		return
	}
	r.st.registered.Add(1)
	r.mu.Lock()
	// s may have been taken, written and recycled meanwhile, and tabled
	// again by another Send under the same key: only the same memory
	// takes this registration.
	if r.table[k] == s && s.pre == nil && sameMemory(s.content, content) && !r.closed && r.aborted == nil {
		s.pre, s.preMod, reg = reg, mod, nil
	}
	r.mu.Unlock()
	if reg != nil {
		reg.Release()
	}
}

// sameMemory reports whether a and b are the same bytes of memory.
func sameMemory(a, b []byte) bool {
	return len(a) == len(b) && (len(a) == 0 || &a[0] == &b[0])
}

// offerLocked gives s to the first request waiting for k, or puts it in
// the table; it reports whether s went into the table.
func (r *Rendezvous) offerLocked(k key, s *sent, out *outbox) bool {
	if len(r.waiting) > 0 {
		if w := r.waiting[k]; len(w) > 0 {
			rs := w[0]
			if len(w) == 1 {
				delete(r.waiting, k)
				w[0] = nil
				r.spareWaiting = w[:0] // for the next request that waits
			} else {
				r.waiting[k] = w[1:]
			}
			r.matchLocked(rs, s, out)
			return false
		}
	}
	r.table[k] = s
	return true
}
