package store

import (
	"net"
	"sync"
)

// outbox is the write side of one connection: callers queue encoded frames
// without blocking and one writer goroutine sends them in batches with a
// vectored write. A write error closes the connection, which ends its reader.
type outbox struct {
	conn net.Conn
	wake chan struct{} // capacity 1: merges wake-ups

	mu     sync.Mutex
	queue  net.Buffers // guarded by mu
	closed bool        // guarded by mu
}

func newOutbox(c net.Conn) *outbox {
	return &outbox{conn: c, wake: make(chan struct{}, 1)}
}

// send queues one encoded frame; the outbox owns it from now on. It reports
// false when the outbox is closed.
func (o *outbox) send(b []byte) bool {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return false
	}
	o.queue = append(o.queue, b)
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
	return true
}

// close stops the writer after the frames queued so far are written.
func (o *outbox) close() {
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// run is the writer loop; it returns when the outbox is closed and drained or
// a write fails. It closes the connection on a write error only.
func (o *outbox) run() {
	for range o.wake {
		o.mu.Lock()
		q, closed := o.queue, o.closed
		o.queue = nil
		o.mu.Unlock()
		if len(q) > 0 {
			if _, err := q.WriteTo(o.conn); err != nil {
				o.conn.Close()
				o.mu.Lock()
				o.closed = true
				o.queue = nil
				o.mu.Unlock()
				return
			}
		}
		if closed {
			return
		}
	}
}

// mailbox is an unbounded queue that delivers to a channel in order without
// ever blocking the producer.
type mailbox[T any] struct {
	wake chan struct{} // capacity 1
	out  chan T

	mu     sync.Mutex
	items  []T  // guarded by mu
	closed bool // guarded by mu
}

func newMailbox[T any](buffer int) *mailbox[T] {
	return &mailbox[T]{wake: make(chan struct{}, 1), out: make(chan T, buffer)}
}

// put queues v; it is dropped if the mailbox is closed.
func (m *mailbox[T]) put(v T) {
	m.mu.Lock()
	if !m.closed {
		m.items = append(m.items, v)
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// close makes run deliver what is queued, then close out.
func (m *mailbox[T]) close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// run delivers queued items to out until the mailbox is closed and drained,
// then closes out. If stop is closed first, undelivered items are dropped and
// out is closed at once.
func (m *mailbox[T]) run(stop <-chan struct{}) {
	defer close(m.out)
	for {
		m.mu.Lock()
		items, closed := m.items, m.closed
		m.items = nil
		m.mu.Unlock()
		for _, v := range items {
			select {
			case m.out <- v:
			case <-stop:
				return
			}
		}
		if closed && len(items) == 0 {
			return
		}
		if len(items) > 0 {
			continue // more may have arrived meanwhile
		}
		select {
		case <-m.wake:
		case <-stop:
			return
		}
	}
}
