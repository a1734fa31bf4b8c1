package tensor

import (
	"fmt"

	"github.com/gompi-org/gompi/btl"
)

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
		r.completeLocked(rq, t, err, &out)
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
