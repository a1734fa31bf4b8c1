package tensor

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
		m.entries = append(m.entries, e)
		if rel := r.rel[rq.src]; len(rel) <= len(m.one.rel) {
			// The usual one or few releases go in the message's own
			// room, and the rank's list is kept for the next ones.
			m.released = append(m.one.rel[:0], rel...)
			r.rel[rq.src], r.relBytes[rq.src] = rel[:0], 0
		} else {
			m.released = r.takeReleasedLocked(rq.src)
		}
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

// msgMax is the largest control message to p that goes in one fragment.
func (r *Rendezvous) msgMax(p int) int { return min(maxMessage, r.fragMax[p]-msgHdrLen) }
