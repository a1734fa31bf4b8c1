package tensor

import "github.com/gompi-org/gompi/mpi"

// outbox collects what a handler decided under r.mu, to be done after:
// control messages, writes and user notifications.
type outbox struct {
	msgs     []outMsg
	writes   []*resp
	gets     []pendingGet
	tells    []tell
	releases []exposure // registrations to release (contents the receiver has read), unless a write reuses one
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

func (o *outbox) msg(peer int, m message) { o.msgs = append(o.msgs, outMsg{peer, m}) }

// run does what o holds: messages first (in order), then writes, reads,
// the user's completions, and last the releases. Called without r.mu.
func (r *Rendezvous) run(o *outbox) {
	for _, m := range o.msgs {
		r.send(m.peer, m.m)
	}
	if len(o.writes) > 0 {
		r.write(o.writes, o)
	}
	for _, g := range o.gets {
		r.pull(g)
	}
	for _, t := range o.tells {
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

// send encodes m and sends it to peer as a control message.
func (r *Rendezvous) send(peer int, m message) {
	b := encode(m)
	switch m.kind() {
	case kindNotify:
		r.st.notifies.Add(1)
	default:
		r.st.control.Add(1)
	}
	r.sendBytes(peer, b)
}

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
