package soft

import (
	"time"
)

// ackDeferBound is the longest a deferred ACK waits for a carrier when
// no one polls the device: well below the least local ACK timeout
// (Config.MinTimeout), so that deferring never costs a retransmission.
const ackDeferBound = 100 * time.Microsecond

// deferAck notes that q owes an ACK that waits for a carrier: q's next
// request packets, the next progress pass, or the timer. Called with
// q.mu held.
func (d *device) deferAck(q *qp) {
	d.ackMu.Lock()
	if !q.ackQueued {
		q.ackQueued = true
		d.acks = append(d.acks, q)
		d.nAcks.Store(int32(len(d.acks)))
	}
	if !d.ackArmed {
		d.ackArmed = true
		d.ackTimer.Reset(ackDeferBound)
	}
	d.ackMu.Unlock()
}

// flushAcks sends the deferred ACKs still owed.
func (d *device) flushAcks() {
	var buf [8]*qp
	for d.nAcks.Load() > 0 {
		d.ackMu.Lock()
		n := copy(buf[:], d.acks)
		for _, q := range buf[:n] {
			q.ackQueued = false
		}
		rest := copy(d.acks, d.acks[n:])
		clear(d.acks[rest:])
		d.acks = d.acks[:rest]
		d.nAcks.Store(int32(rest))
		d.ackMu.Unlock()
		for i, q := range buf[:n] {
			q.sendAckNow(false)
			buf[i] = nil
		}
	}
}

// ackLazyBound is the longest an ACK no one asked for waits (at most a
// quarter of Config.MinTimeout, so that the requester's early go-back
// never fires for want of it).
const ackLazyBound = 250 * time.Microsecond

// deferLazy notes that q owes a lazy ACK (qp.queueAckLazy), due within
// wait, and arms the lazy timer if it is not. Called with q.mu held.
func (d *device) deferLazy(q *qp, wait time.Duration) {
	d.ackMu.Lock()
	if !q.lazyQueued {
		q.lazyQueued = true
		d.lazy = append(d.lazy, q)
	}
	if !d.lazyArmed {
		d.lazyArmed = true
		d.lazyTimer.Reset(wait)
	}
	d.ackMu.Unlock()
}

// onLazyTimer sends the lazy ACKs that have waited for most of the lazy
// bound; the younger ones wait for a later pass (in a ping-pong the
// replies carry them before: ackLazyMax).
func (d *device) onLazyTimer() {
	var buf [8]*qp
	d.ackMu.Lock()
	if isClosed(d.done) {
		d.ackMu.Unlock()
		return
	}
	d.lazyArmed = false
	todo := len(d.lazy) // the QPs put back below wait for the next pass
	now := d.clock.Now()
	for todo > 0 {
		n := copy(buf[:min(todo, len(buf))], d.lazy)
		todo -= n
		for _, q := range buf[:n] {
			q.lazyQueued = false
		}
		rest := copy(d.lazy, d.lazy[n:])
		clear(d.lazy[rest:])
		d.lazy = d.lazy[:rest]
		d.ackMu.Unlock()
		for i, q := range buf[:n] {
			q.mu.Lock()
			owed := q.r.ctl && q.r.ackLazy
			age := now.Sub(q.lazySince)
			if owed && age < d.lazyBound*3/4 {
				d.deferLazy(q, d.lazyBound-age)
				owed = false
			}
			q.mu.Unlock()
			if owed {
				q.sendAckNow(true)
			}
			buf[i] = nil
		}
		d.ackMu.Lock()
	}
	d.ackMu.Unlock()
}

// onAckTimer sends the ACKs that no carrier took within ackDeferBound.
func (d *device) onAckTimer() {
	d.ackMu.Lock()
	closed := d.ackArmed && isClosed(d.done)
	if !closed {
		d.ackArmed = false
	}
	d.ackMu.Unlock()
	if !closed {
		d.flushAcks()
	}
}
