package tcp

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

var (
	_ btl.Module       = (*module)(nil)
	_ btl.Counted      = (*module)(nil)
	_ btl.Poller       = (*module)(nil)
	_ btl.Endpoint     = (*endpoint)(nil)
	_ btl.Registration = (*registration)(nil)
)

// module is one link: at most one connection per peer.
type module struct {
	sh     *shared
	link   int
	closed atomic.Bool
	ctx    context.Context // cancelled by Close: stops connection attempts
	cancel context.CancelFunc
	wg     sync.WaitGroup // connection attempts and connection goroutines

	mu  sync.Mutex // serialises endpoint creation
	eps []atomic.Pointer[endpoint]

	fragsSent, bytesSent atomic.Int64
	fragsRecv, bytesRecv atomic.Int64
	puts, putBytes       atomic.Int64
	gets, getBytes       atomic.Int64

	allocMu sync.Mutex // guards small, large
	small   [][]byte   // free Alloc buffers of cap allocSmall
	large   [][]byte   // free Alloc buffers of cap cfg.maxSend
}

const (
	allocSmall   = 4 << 10
	allocKeepMax = 64 // free buffers kept per class
)

func (m *module) Name() string       { return "tcp" }
func (m *module) Caps() btl.Caps     { return m.sh.cfg.caps }
func (m *module) Limits() btl.Limits { return m.sh.cfg.limits }
func (m *module) Exclusivity() int   { return m.sh.cfg.exclusivity }
func (m *module) Latency() int       { return latencyUS }
func (m *module) Bandwidth() int     { return bandwidthMbps }
func (m *module) String() string     { return fmt.Sprintf("tcp(rank %d, link %d)", m.sh.env.Rank, m.link) }
func (m *module) errClosed() error {
	return fmt.Errorf("tcp: module of rank %d link %d: %w", m.sh.env.Rank, m.link, btl.ErrClosed)
}
func (m *module) logf(f string, a ...any) { m.sh.env.Logf(f, a...) }

// Counters returns the module's traffic counters. Sends and Puts are counted
// when accepted, receptions when dispatched.
func (m *module) Counters() btl.Counters {
	return btl.Counters{
		FragsSent: m.fragsSent.Load(), BytesSent: m.bytesSent.Load(),
		FragsRecv: m.fragsRecv.Load(), BytesRecv: m.bytesRecv.Load(),
		Puts: m.puts.Load(), PutBytes: m.putBytes.Load(),
		Gets: m.gets.Load(), GetBytes: m.getBytes.Load(),
	}
}

// AddProc returns the endpoint for peer without contacting it: the
// connection is made by the first operation. The own rank is unreachable
// (the self transport serves it); a rank outside the job is an error
// wrapping mpierr.ErrRank.
func (m *module) AddProc(peer int) (btl.Endpoint, error) {
	if m.closed.Load() {
		return nil, m.errClosed()
	}
	if peer < 0 || peer >= len(m.eps) {
		return nil, mpierr.Errorf(mpierr.ErrRank, "tcp: rank %d outside the job of %d", peer, len(m.eps))
	}
	if peer == m.sh.env.Rank {
		return nil, fmt.Errorf("tcp: rank %d is this process: %w", peer, btl.ErrUnreachable)
	}
	ep := m.endpoint(peer)
	if ep == nil {
		return nil, m.errClosed()
	}
	return ep, nil
}

// endpoint returns (creating it) the endpoint of peer, which must be a
// valid rank other than this one, or nil when the module is closed.
func (m *module) endpoint(peer int) *endpoint {
	if ep := m.eps[peer].Load(); ep != nil {
		return ep
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed.Load() {
		return nil
	}
	if ep := m.eps[peer].Load(); ep != nil {
		return ep
	}
	ep := &endpoint{m: m, peer: peer}
	m.eps[peer].Store(ep)
	return ep
}

// Register makes mem reachable by Put (AccessRemoteWrite) and Get
// (AccessRemoteRead) from peers on any link of this process. mem stays
// referenced until Release.
func (m *module) Register(mem []byte, access btl.Access) (btl.Registration, error) {
	if m.closed.Load() {
		return nil, m.errClosed()
	}
	t := &m.sh.regs
	t.mu.Lock()
	defer t.mu.Unlock()
	t.next++
	r := &registration{t: t, id: t.next, mem: mem, access: access}
	binary.LittleEndian.PutUint64(r.handle[0:], r.id)
	binary.LittleEndian.PutUint64(r.handle[8:], uint64(len(mem)))
	t.m[r.id] = r
	return r, nil
}

// decodeHandle checks that handle names n bytes at off of a registration
// and returns its id, or an error wrapping ErrBadHandle.
func decodeHandle(handle []byte, off, n int) (uint64, error) {
	if len(handle) != 16 {
		return 0, fmt.Errorf("tcp: %d-byte registration handle, want 16: %w", len(handle), btl.ErrBadHandle)
	}
	id := binary.LittleEndian.Uint64(handle)
	size := binary.LittleEndian.Uint64(handle[8:])
	if off < 0 || uint64(off) > size || uint64(n) > size-uint64(off) {
		return 0, fmt.Errorf("tcp: range %d+%d outside the %d-byte registration: %w", off, n, size, btl.ErrBadHandle)
	}
	return id, nil
}

// Progress reads and dispatches, on the calling goroutine, what the link's
// connected sockets hold, skipping a socket that its reader goroutine (or
// another poller) is reading; it returns the number of frames handled. It
// never blocks. A PML that waits by spinning on Progress gets its messages
// without the wake-up of a reader goroutine (btl_tcp_poll=false turns this
// off: Progress then does nothing and the reader goroutines deliver
// everything).
func (m *module) Progress() int {
	if !canPoll || !m.sh.cfg.poll {
		return 0
	}
	m.sh.polls.Add(1)
	n := 0
	for i := range m.eps {
		if ep := m.eps[i].Load(); ep != nil {
			if c := ep.cur.Load(); c != nil {
				n += c.poll()
			}
		}
	}
	return n
}

// ConcurrentProgress reports that Progress may be called from several
// goroutines at once (each socket is read by whoever gets its lock; the
// others skip it), so the PML need not serialize the calls
// (btl.ConcurrentPoller).
func (m *module) ConcurrentProgress() bool { return true }

// blockNap bounds Block: the reader goroutines deliver while it sleeps, so
// it only has to return for the PML to poll other transports that it
// does not block on.
const blockNap = 100 * time.Millisecond

// Block waits until wake is signalled (or closed), the module closes, or
// blockNap passes. It first tells the reader goroutines of the link to wait
// on their sockets at once (they leave them to pollers otherwise): they
// deliver while it sleeps, so nothing waits for Progress.
func (m *module) Block(wake <-chan struct{}) {
	for i := range m.eps {
		if ep := m.eps[i].Load(); ep != nil {
			if c := ep.cur.Load(); c != nil {
				select {
				case c.kickc <- struct{}{}:
				default:
				}
			}
		}
	}
	t := time.NewTimer(blockNap)
	select {
	case <-wake:
	case <-m.ctx.Done():
	case <-t.C:
	}
	t.Stop()
}

// Close closes every connection of this link in order: operations not yet
// started complete with an error wrapping ErrClosed, a close frame tells the
// peers (which then fail their operations towards this rank with ErrClosed
// but do not report it as a failure), and Close waits up to closeLinger for
// them to answer. Frames arriving meanwhile are dropped. Closing twice is a
// no-op. The listeners close with the last link. Close waits for the
// module's goroutines, so it must not be called from a Handler, a
// Completion or the PeerFailed handler.
func (m *module) Close() error {
	if !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	m.shutdownEndpoints(true)
	if m.sh.open.Add(-1) == 0 {
		m.sh.shutdown()
	}
	return nil
}

// abort ends the module as a crash would: sockets closed, no close frames.
func (m *module) abort() {
	if !m.closed.CompareAndSwap(false, true) {
		return
	}
	m.shutdownEndpoints(false)
	if m.sh.open.Add(-1) == 0 {
		m.sh.shutdown()
	}
}

func (m *module) shutdownEndpoints(orderly bool) {
	m.mu.Lock() // no endpoint is created after this
	m.mu.Unlock()
	m.cancel()
	var conns []*conn
	for i := range m.eps {
		if ep := m.eps[i].Load(); ep != nil {
			if c := ep.close(); c != nil {
				conns = append(conns, c)
			}
		}
	}
	if orderly {
		for _, c := range conns {
			c.closeOrderly()
		}
		deadline := time.NewTimer(closeLinger)
		for _, c := range conns {
			select {
			case <-c.done:
			case <-deadline.C:
			}
		}
		deadline.Stop()
	}
	for _, c := range conns {
		c.fail(m.errClosed())
	}
	m.wg.Wait()
}

// alloc returns a buffer of length size from the free lists.
func (m *module) alloc(size int) []byte {
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	list, c := &m.large, m.sh.cfg.maxSend
	if size <= allocSmall {
		list, c = &m.small, allocSmall
	}
	if n := len(*list); n > 0 {
		b := (*list)[n-1]
		(*list)[n-1] = nil
		*list = (*list)[:n-1]
		return b[:size]
	}
	return make([]byte, size, c)
}

// recycle returns an Alloc buffer to the free lists.
func (m *module) recycle(b []byte) {
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	switch {
	case cap(b) == allocSmall && len(m.small) < allocKeepMax:
		m.small = append(m.small, b[:0])
	case cap(b) == m.sh.cfg.maxSend && len(m.large) < allocKeepMax:
		m.large = append(m.large, b[:0])
	}
}
