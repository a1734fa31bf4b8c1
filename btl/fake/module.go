package fake

import (
	"encoding/binary"
	"fmt"
	"sync"

	"github.com/gompi-org/gompi/btl"
)

// Module is one rank's fake transport.
type Module struct {
	net  *Network
	rank int
	disp *btl.Dispatcher
	cfg  Config

	mu       sync.Mutex
	eps      map[int]*endpoint
	closed   bool
	counters btl.Counters
}

var (
	_ btl.Module    = (*Module)(nil)
	_ btl.Counted   = (*Module)(nil)
	_ btl.Component = Component{}
)

func (m *Module) Name() string       { return m.cfg.Name }
func (m *Module) Caps() btl.Caps     { return m.cfg.Caps }
func (m *Module) Limits() btl.Limits { return m.cfg.Limits }
func (m *Module) Exclusivity() int   { return m.cfg.Exclusivity }
func (m *Module) Latency() int       { return m.cfg.Latency }
func (m *Module) Bandwidth() int     { return m.cfg.Bandwidth }

// Rank is the module's world rank.
func (m *Module) Rank() int { return m.rank }

// Counters returns the traffic counters.
func (m *Module) Counters() btl.Counters {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.counters
}

func (m *Module) count(f func(*btl.Counters)) {
	m.mu.Lock()
	f(&m.counters)
	m.mu.Unlock()
}

func (m *Module) isClosed() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.closed
}

// AddProc returns the endpoint to peer if peer is attached to the network.
func (m *Module) AddProc(peer int) (btl.Endpoint, error) {
	if m.isClosed() {
		return nil, fmt.Errorf("fake: rank %d closed: %w", m.rank, btl.ErrClosed)
	}
	m.net.mu.Lock()
	_, ok := m.net.mods[peer]
	m.net.mu.Unlock()
	if !ok {
		return nil, fmt.Errorf("fake: rank %d is not attached: %w", peer, btl.ErrUnreachable)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ep := m.eps[peer]; ep != nil {
		return ep.pub, nil
	}
	ep := &endpoint{m: m, peer: peer}
	ep.pub = ep
	if m.cfg.SyncGet {
		ep.pub = &syncEndpoint{ep}
	}
	m.eps[peer] = ep
	return ep.pub, nil
}

// syncEndpoint is an endpoint of a Config.SyncGet module.
type syncEndpoint struct{ *endpoint }

// GetNow is Get on an inline network, which finishes before it returns.
func (e *syncEndpoint) GetNow(local, handle []byte, off int) error {
	n := e.m.net
	n.mu.Lock()
	inline := n.inline
	if inline {
		n.logLocked("%d->%d GetNow", e.m.rank, e.peer)
	} else {
		n.violateLocked("%d->%d GetNow on a queued network", e.m.rank, e.peer)
	}
	n.mu.Unlock()
	if !inline {
		return fmt.Errorf("fake: GetNow needs an inline network: %w", btl.ErrWouldBlock)
	}
	_, err := e.rdma(KindGet, local, handle, off, nil)
	return err
}

// Register records mem in the network's table; the handle is (id, length).
func (m *Module) Register(mem []byte, access btl.Access) (btl.Registration, error) {
	if m.isClosed() {
		return nil, fmt.Errorf("fake: rank %d closed: %w", m.rank, btl.ErrClosed)
	}
	n := m.net
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nextRg++
	rg := &region{id: n.nextRg, owner: m.rank, mem: mem, access: access}
	n.regs[rg.id] = rg
	r := &registration{n: n, id: rg.id}
	binary.LittleEndian.PutUint64(r.handle[:], rg.id)
	binary.LittleEndian.PutUint64(r.handle[8:], uint64(len(mem)))
	n.logLocked("rank%d register reg%d len=%d access=%s", m.rank, rg.id, len(mem), accessString(access))
	return r, nil
}

// Close closes the module: pending operations from or to it complete
// with btl.ErrClosed when delivered; later calls fail with it.
func (m *Module) Close() error {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	return nil
}

type registration struct {
	n        *Network
	id       uint64
	handle   [16]byte
	released bool
}

func (r *registration) Handle() []byte { return r.handle[:] }

func (r *registration) Release() error {
	n := r.n
	n.mu.Lock()
	defer n.mu.Unlock()
	if r.released {
		n.violateLocked("reg%d released twice", r.id)
		return fmt.Errorf("fake: reg%d released twice: %w", r.id, btl.ErrBadHandle)
	}
	r.released = true
	owner := n.regs[r.id].owner
	delete(n.regs, r.id)
	n.logLocked("rank%d release reg%d", owner, r.id)
	return nil
}
