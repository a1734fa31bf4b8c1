package tensor

import (
	"errors"
	"fmt"

	"github.com/gompi-org/gompi/mpi"
)

// postReceives posts the loop's two control receives and a sentinel
// receive from every other rank. The sentinel's tag is never sent: it
// completes only when its rank fails, with the PML's error (wrapping
// mpi.ErrProcFailed), which is how the loop learns which peer died even
// while it is busy.
func (r *Rendezvous) postReceives() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.wild {
		r.wildMem[i] = make([]byte, maxMessage)
		q, err := r.comm.Irecv(r.wildMem[i], mpi.AnySource, tagControl)
		if err != nil {
			return err
		}
		r.wild[i] = q
	}
	for p := 0; p < r.size; p++ {
		if p == r.rank {
			continue
		}
		q, err := r.comm.Irecv(nil, p, tagSentinel)
		if err != nil {
			return err
		}
		r.sentry[p] = q
	}
	return nil
}

// loop takes the control messages in arrival order: two receives are
// posted at any time (the second takes the next message while the first's
// is handled) and it always waits for the older one, which MPI matched
// first. It ends when the rendezvous is closed or the communicator fails.
func (r *Rendezvous) loop() {
	defer close(r.loopDone)
	head := 0
	for {
		r.mu.Lock()
		if r.closed {
			r.mu.Unlock()
			return
		}
		waitOn := make([]*mpi.Request, 1+r.size)
		waitOn[0] = r.wild[head]
		copy(waitOn[1:], r.sentry)
		r.mu.Unlock()
		i, st, err := mpi.Waitany(waitOn)
		if i < 0 {
			return
		}
		if i > 0 {
			r.sentinel(i-1, st, err)
			continue
		}
		var msg []byte
		if err == nil && !st.Cancelled {
			msg = r.wildMem[head][:st.Count]
		}
		if st.Cancelled || r.stopped() {
			return
		}
		if err != nil && !errors.Is(err, mpi.ErrProcFailed) {
			r.fatal(err)
			return
		}
		if err == nil {
			r.handle(st.Source, msg)
		}
		// Post the buffer again: it is now the newer of the two.
		if !r.repost(head, r.wildMem[head]) {
			return
		}
		head ^= 1
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

// repost posts control receive i again into buf; false when the
// rendezvous is closing or the communicator no longer takes receives.
func (r *Rendezvous) repost(i int, buf []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		r.wild[i] = nil
		return false
	}
	q, err := r.comm.Irecv(buf, mpi.AnySource, tagControl)
	if err != nil {
		r.wild[i] = nil
		var out outbox
		r.fatalLocked(err, &out)
		go r.run(&out)
		return false
	}
	r.wild[i] = q
	return true
}

// sentinel handles the end of rank p's sentinel receive: p failed (or
// the receive was cancelled by Close).
func (r *Rendezvous) sentinel(p int, st mpi.Status, err error) {
	var out outbox
	r.mu.Lock()
	r.sentry[p] = nil
	if !st.Cancelled && err != nil && !r.closed {
		if errors.Is(err, mpi.ErrProcFailed) {
			r.peerGoneLocked(p, peerFailure(p, err), &out)
		} else {
			r.fatalLocked(err, &out)
		}
	}
	r.mu.Unlock()
	r.run(&out)
}

// fatal: the communicator failed under the rendezvous (the job was
// aborted, or finalized): everything pending fails with err.
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
	out.msgs = nil // the communicator carries nothing more
}

// handle decodes and dispatches one control message from peer.
func (r *Rendezvous) handle(peer int, b []byte) {
	m, _, err := decode(b)
	if debug {
		fmt.Printf("rank %d <- %d: %T %+v %v\n", r.rank, peer, m, m, err)
	}
	var out outbox
	r.mu.Lock()
	if err != nil {
		// Nothing in it can be answered: the peer is cut off both ways,
		// and told why, so that its receives from this rank fail too.
		r.peerGoneLocked(peer, fmt.Errorf("tensor: rank %d sent a bad control message: %w", peer, err), &out)
		out.msg(peer, &abortMsg{closed: true, text: fmt.Sprintf("rank %d rejected a control message: %v", r.rank, err)})
		r.mu.Unlock()
		r.run(&out)
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
	case *cancelMsg:
		if m.cancelled {
			r.onCancelledLocked(peer, m)
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
		} else if r.aborted == nil && !r.closed {
			r.abortLocked(fmt.Errorf("tensor: rank %d aborted the rendezvous: %s: %w", peer, m.text, mpi.ErrAborted), &out)
		}
	}
	r.mu.Unlock()
	r.run(&out)
}

var debug = false
