package pml

import (
	"slices"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml/hdr"
)

// Failures among survivors (ULFM's point-to-point part). A peer's failure
// (Engine.PeerFailed) fails what can no longer complete and leaves the
// rest working:
//
//   - sends to the dead rank, pending and later, fail with ErrProcFailed
//     (Comm.target; rendezvous requests through Engine.reqs);
//   - receives and probes naming it fail, pending and later, except that
//     eager messages it sent that had arrived before stay deliverable: a
//     later receive that matches one completes normally;
//   - receives and probes from AnySource fail while the communicator has
//     a failed rank not yet acknowledged (Comm.FailureAck), pending ones
//     at the failure and later ones when no arrived message matches them;
//   - every send and receive of an internal (negative) tag on a
//     communicator with a failed rank fails: those belong to operations of the whole group
//     (Barrier, Dup, Split), where a rank waiting on a live peer that
//     itself waits on the dead one would otherwise hang;
//   - rendezvous announcements (RNDV, RGET) from the dead rank, queued or
//     arriving late, are dropped: their data can never come.

// commPeerFailedLocked records that rank cr of c failed and appends to out
// the posted requests of c that can no longer complete. Called by
// PeerFailed with e.mu held.
func (e *Engine) commPeerFailedLocked(c *Comm, cr int, out []*Request) []*Request {
	c.failed = append(c.failed, cr)
	out = c.m.drainSource(cr, out)
	out = c.m.drainInternal(out)
	for f := c.m.uSrc[cr].head; f != nil; {
		next := f.srcNext
		if f.typ != hdr.TypeMatch {
			e.takeUnexpectedLocked(c, f)
		}
		f = next
	}
	return out
}

// has reports whether world rank w belongs to c.
func (c *Comm) has(w int) bool {
	_, ok := c.toComm[w]
	return ok
}

// noteFailedLocked records the ranks of a new communicator whose
// processes failed before it was made. Called with e.mu held.
func (c *Comm) noteFailedLocked() {
	if c.e.nfailed == 0 {
		return
	}
	for i, w := range c.group {
		if p := c.e.peers[w].Load(); p != nil && p.failed != nil {
			c.failed = append(c.failed, i)
		}
	}
}

// recvFailureLocked returns the error a receive or probe of (src, tag)
// on c gets when no arrived message matches it, nil when it may be
// posted. Called with e.mu held, when c has a failed rank.
func (c *Comm) recvFailureLocked(src, tag int) error {
	if tag < AnyTag {
		return c.groupFailure()
	}
	if src == AnySource {
		if len(c.failed) > c.nacked {
			return mpierr.Errorf(mpierr.ErrProcFailed, "receive from any source: rank(s) %v of the communicator failed and are not acknowledged (FailureAck)", c.unackedLocked())
		}
		return nil
	}
	if p := c.e.peers[c.group[src]].Load(); p != nil && p.failed != nil {
		return p.failed
	}
	return nil
}

// groupFailure is the error of an operation of the whole group of c
// (an internal tag) once a rank of c failed. Called with e.mu held.
func (c *Comm) groupFailure() error {
	return mpierr.Errorf(mpierr.ErrProcFailed, "rank(s) %v of the communicator failed", c.failed)
}

func (c *Comm) unackedLocked() []int {
	return slices.Clone(c.failed[c.nacked:])
}

// dropsFromFailedLocked reports whether f, an in-sequence matching
// fragment, is a rendezvous announcement from a failed peer (dropped:
// its data can never come). Called with e.mu held.
func (e *Engine) dropsFromFailedLocked(f *frag) bool {
	if f.typ == hdr.TypeMatch || e.nfailed == 0 {
		return false
	}
	p := e.peers[f.peer.world].Load()
	return p != nil && p.failed != nil
}

// FailureAck acknowledges the failures of c's ranks known now, as
// MPI_Comm_failure_ack: receives and probes from AnySource no longer fail
// because of them (they match the live ranks' messages, and messages the
// dead sent before they died), and FailedRanks lists them. Failures that
// become known later are not acknowledged until the next call. It fails
// only when c is freed or the engine closed.
func (c *Comm) FailureAck() error {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := c.check(); err != nil {
		return err
	}
	c.nacked = len(c.failed)
	return nil
}

// FailedRanks returns the ranks of c whose failure was acknowledged by
// FailureAck, in ascending order (MPI_Comm_failure_get_acked); empty when
// none. The slice is the caller's.
func (c *Comm) FailedRanks() []int {
	e := c.e
	e.mu.Lock()
	out := slices.Clone(c.failed[:c.nacked])
	e.mu.Unlock()
	slices.Sort(out)
	return out
}

// drainInternal removes the posted receives and probes of internal
// (negative) tags, whatever their source.
func (m *matchState) drainInternal(out []*Request) []*Request {
	swept := false
	for k, l := range m.spec.m {
		if k.tag() < 0 && l.head != nil {
			out = m.drainList(l, out)
			swept = true
		}
	}
	if swept {
		m.spec.sweep(nil)
	}
	for r := m.wild.head; r != nil; {
		next := r.next
		if r.tag < AnyTag {
			m.wild.remove(r)
			out = append(out, r)
		}
		r = next
	}
	return out
}
