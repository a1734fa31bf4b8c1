package btltest_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// memModule is a minimal in-memory transport used to check that the suite
// passes on a correct module that is not tcp: one delivery goroutine per
// (sender, receiver) pair keeps order; Put/Get copy on that goroutine.
type memModule struct {
	w      *memWorld
	rank   int
	d      *btl.Dispatcher
	closed atomic.Bool
	dead   atomic.Bool
	caps   btl.Caps
	block  atomic.Int64 // Send, SendAlloc, Put, Get calls to refuse with ErrWouldBlock (< 0: all)

	mu   sync.Mutex
	eps  map[int]*memEP
	regs map[uint64][]byte
	next uint64
	gone map[int]bool // peers reported failed
}

type memWorld struct{ mods []*memModule }

type memEP struct {
	m    *memModule
	peer int
	q    chan func()  // run on the peer's side, in order
	out  atomic.Int64 // functions posted to q and not run yet
	stop chan struct{}
	wg   sync.WaitGroup
}

// refuse reports whether the module's WouldBlock count refuses this call.
func (m *memModule) refuse() bool {
	for {
		n := m.block.Load()
		if n == 0 {
			return false
		}
		if n < 0 || m.block.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (m *memModule) Name() string   { return "mem" }
func (m *memModule) Caps() btl.Caps { return m.caps }
func (m *memModule) Limits() btl.Limits {
	return btl.Limits{EagerLimit: 4096, RndvEagerLimit: 4096, MaxSendSize: 32 << 10}
}
func (m *memModule) Exclusivity() int { return 1 }
func (m *memModule) Latency() int     { return 1 }
func (m *memModule) Bandwidth() int   { return 1 }
func (m *memModule) errClosed() error { return fmt.Errorf("mem: %w", btl.ErrClosed) }
func (e *memEP) Module() btl.Module   { return e.m }
func (e *memEP) Peer() int            { return e.peer }
func (e *memEP) Free([]byte)          {}
func (e *memEP) Alloc(n int) ([]byte, error) {
	if e.m.closed.Load() {
		return nil, e.m.errClosed()
	}
	return make([]byte, n), nil
}

func (m *memModule) AddProc(peer int) (btl.Endpoint, error) {
	if m.closed.Load() {
		return nil, m.errClosed()
	}
	if peer == m.rank || peer < 0 || peer >= len(m.w.mods) {
		return nil, btl.ErrUnreachable
	}
	return m.ep(peer), nil
}

func (m *memModule) ep(peer int) *memEP {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e := m.eps[peer]; e != nil {
		return e
	}
	e := &memEP{m: m, peer: peer, q: make(chan func(), 1<<16), stop: make(chan struct{})}
	m.eps[peer] = e
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			select {
			case f := <-e.q:
				f()
				e.out.Add(-1)
			case <-e.stop:
				return
			}
		}
	}()
	return e
}

func (m *memModule) Register(mem []byte, _ btl.Access) (btl.Registration, error) {
	if m.closed.Load() {
		return nil, m.errClosed()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.next++
	m.regs[m.next] = mem
	h := make([]byte, 16)
	binary.LittleEndian.PutUint64(h, m.next)
	binary.LittleEndian.PutUint64(h[8:], uint64(len(mem)))
	return memReg{m, m.next, h}, nil
}

type memReg struct {
	m  *memModule
	id uint64
	h  []byte
}

func (r memReg) Handle() []byte { return r.h }
func (r memReg) Release() error {
	r.m.mu.Lock()
	delete(r.m.regs, r.id)
	r.m.mu.Unlock()
	return nil
}

func (m *memModule) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	m.mu.Lock()
	eps := m.eps
	m.mu.Unlock()
	for _, e := range eps {
		close(e.stop)
		e.wg.Wait()
	}
	return nil
}

func (m *memModule) kill() {
	m.dead.Store(true)
	m.Close()
	for _, o := range m.w.mods {
		if o != m {
			o.peerFailed(m.rank)
		}
	}
}

func (m *memModule) peerFailed(peer int) {
	m.mu.Lock()
	seen := m.gone[peer]
	m.gone[peer] = true
	m.mu.Unlock()
	if !seen && !m.closed.Load() {
		m.d.PeerFailed(peer, mpierr.Errorf(mpierr.ErrProcFailed, "mem: rank %d died", peer))
	}
}

// post runs f in the peer's context, in order; an error if it is gone.
func (e *memEP) post(f func()) error {
	if e.m.closed.Load() {
		return e.m.errClosed()
	}
	p := e.m.w.mods[e.peer]
	if p.dead.Load() || p.closed.Load() {
		e.m.peerFailed(e.peer)
		return mpierr.Errorf(mpierr.ErrProcFailed, "mem: rank %d is gone", e.peer)
	}
	e.out.Add(1)
	select {
	case e.q <- f:
		return nil
	case <-e.stop:
		e.out.Add(-1)
		return e.m.errClosed()
	}
}

// Flush is done when nothing posted is left to run, else completes from
// the delivery goroutine behind what was posted before.
func (e *memEP) Flush(cb btl.Completion) (bool, error) {
	if e.out.Load() == 0 {
		return !e.m.closed.Load(), nil
	}
	return false, e.post(func() { cb(nil) })
}

func (e *memEP) deliver(tag btl.Tag, hdr, data []byte) error {
	hdr, data = append([]byte(nil), hdr...), append([]byte(nil), data...)
	p := e.m.w.mods[e.peer]
	back := p.ep(e.m.rank)
	return e.post(func() {
		if !p.closed.Load() {
			p.d.Dispatch(back, tag, hdr, data)
		}
	})
}

func (e *memEP) SendImmediate(tag btl.Tag, hdr, data []byte) error { return e.deliver(tag, hdr, data) }
func (e *memEP) Send(tag btl.Tag, hdr, data []byte, _ btl.Completion) (bool, error) {
	if e.m.refuse() {
		return false, btl.ErrWouldBlock
	}
	return true, e.deliver(tag, hdr, data)
}
func (e *memEP) SendAlloc(tag btl.Tag, buf []byte, n int, _ btl.Completion) (bool, error) {
	if e.m.refuse() {
		return false, btl.ErrWouldBlock
	}
	return true, e.deliver(tag, buf[:n], buf[n:])
}

func (e *memEP) rdma(local, handle []byte, off int, cb btl.Completion, put bool) (bool, error) {
	if e.m.closed.Load() {
		return false, e.m.errClosed()
	}
	if len(handle) != 16 {
		return false, btl.ErrBadHandle
	}
	id, size := binary.LittleEndian.Uint64(handle), binary.LittleEndian.Uint64(handle[8:])
	if off < 0 || uint64(off) > size || uint64(len(local)) > size-uint64(off) {
		return false, btl.ErrBadHandle
	}
	if e.m.refuse() {
		return false, btl.ErrWouldBlock
	}
	p := e.m.w.mods[e.peer]
	return false, e.post(func() {
		p.mu.Lock()
		mem := p.regs[id]
		p.mu.Unlock()
		if put {
			copy(mem[off:], local)
		} else {
			copy(local, mem[off:])
		}
		cb(nil)
	})
}

func (e *memEP) Put(local, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(local, handle, off, cb, true)
}
func (e *memEP) Get(local, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(local, handle, off, cb, false)
}

func memPeers(caps btl.Caps) func(t *testing.T, n int) []btltest.Peer {
	return func(t *testing.T, n int) []btltest.Peer {
		w := &memWorld{}
		peers := make([]btltest.Peer, n)
		for i := range n {
			m := &memModule{w: w, rank: i, d: &btl.Dispatcher{}, caps: caps,
				eps: map[int]*memEP{}, regs: map[uint64][]byte{}, gone: map[int]bool{}}
			w.mods = append(w.mods, m)
			peers[i] = btltest.Peer{Module: m, Dispatch: m.d, Kill: m.kill, WouldBlock: func(n int) { m.block.Store(int64(n)) }}
			t.Cleanup(func() { m.Close() })
		}
		return peers
	}
}

func TestSuiteOnMemModule(t *testing.T) {
	t.Run("rdma", func(t *testing.T) {
		btltest.Run(t, memPeers(btl.CapSend|btl.CapSendImmediate|btl.CapRDMA))
	})
	t.Run("send-only", func(t *testing.T) {
		btltest.Run(t, memPeers(btl.CapSend))
	})
}

func TestStore(t *testing.T) {
	s := btltest.NewStore()
	got := make(chan []byte)
	go func() {
		v, err := s.Get(context.Background(), "k")
		if err != nil {
			panic(err)
		}
		got <- v
	}()
	v := []byte("value")
	require.NoError(t, s.Set("k", v))
	v[0] = 'X' // Set copied it
	select {
	case b := <-got:
		require.Equal(t, []byte("value"), b)
	case <-time.After(10 * time.Second):
		t.Fatal("Get did not wake")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	_, err := s.Get(ctx, "missing")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}
