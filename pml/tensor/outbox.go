package tensor

import (
	"sync"

	"github.com/gompi-org/gompi/mpi"
)

// outbox collects what a handler decided under r.mu, to be done after:
// control messages, writes and user notifications.
type outbox struct {
	msgs     few[outMsg]
	writes   few[*resp]
	gets     few[pendingGet]
	tells    few[tell]
	releases []exposure // registrations to release (contents the receiver has read), unless a write reuses one
}

// few is a list whose first value lives in place: a handler's outbox
// usually holds one message, one write, one read or one outcome, and a
// list of one then costs no allocation. Each allocation on the path from
// a Recv to its content measured about 0.13 us in-process, after the copy
// of the step before has taken the caches (gompi-bench tensor --inprocess
// --sizes 4m with 20 allocations added to Recv: 1.093 -> 1.145 the plain
// Recv's time, 16 alternated runs). It is not a slice pointing into
// itself, which would make every outbox escape to the heap.
type few[T any] struct {
	first T
	more  []T
	n     int
}

func (f *few[T]) add(v T) {
	if f.n == 0 {
		f.first = v
	} else {
		f.more = append(f.more, v)
	}
	f.n++
}

func (f *few[T]) len() int { return f.n }

// at returns the i-th value, 0 <= i < len.
func (f *few[T]) at(i int) T {
	if i == 0 {
		return f.first
	}
	return f.more[i-1]
}

// tell is a receive's outcome for its caller: Recv's waiter or
// RecvAsync's callback.
type tell struct {
	w    *recvWaiter
	done func(Tensor, error)
	t    Tensor
	err  error
}

type outMsg struct {
	peer int
	m    message
}

func (o *outbox) msg(peer int, m message) { o.msgs.add(outMsg{peer, m}) }

// run does what o holds: messages first (in order), then writes, reads,
// the user's completions, and last the releases. Called without r.mu.
func (r *Rendezvous) run(o *outbox) {
	for i := range o.msgs.len() {
		m := o.msgs.at(i)
		r.send(m.peer, m.m)
		recycle(m.m)
	}
	if o.writes.len() > 0 {
		r.write(&o.writes, o)
	}
	for i := range o.gets.len() {
		r.pull(o.gets.at(i))
	}
	for i := range o.tells.len() {
		t := o.tells.at(i)
		if t.w != nil {
			t.w.tell(t.t, t.err)
		} else {
			t.done(t.t, t.err)
		}
	}
	for _, x := range o.releases {
		if x.reg != nil {
			x.reg.Release()
		}
	}
}

// send encodes m and sends it to peer as a control message, in a buffer
// used again once a transport is done with it within its call (few, above,
// says what an allocation costs here).
func (r *Rendezvous) send(peer int, m message) {
	bp := encodeBufs.Get().(*[]byte)
	b := encodeTo((*bp)[:0], m)
	switch m.kind() {
	case kindNotify:
		r.st.notifies.Add(1)
	default:
		r.st.control.Add(1)
	}
	if r.sendBytes(peer, b) && cap(b) <= maxPooledEncode {
		*bp = b[:0]
		encodeBufs.Put(bp)
	}
}

// encodeBufs holds buffers for send; those grown past maxPooledEncode
// (large batches) are left to the collector.
var encodeBufs = sync.Pool{New: func() any { b := make([]byte, 0, 128); return &b }}

const maxPooledEncode = 4 << 10

// track keeps a send request until it is seen complete, so that none is
// dropped unfinished; completed ones are swept out as more come.
func (r *Rendezvous) track(q *mpi.Request) {
	r.sendMu.Lock()
	r.sends = append(r.sends, q)
	if len(r.sends) >= 64 {
		n := 0
		for _, s := range r.sends {
			if _, done, _ := s.Test(); !done {
				r.sends[n] = s
				n++
			}
		}
		clear(r.sends[n:])
		r.sends = r.sends[:n]
	}
	r.sendMu.Unlock()
}
