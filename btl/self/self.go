// Package self is the in-process transport: every pair of ranks that live
// in one process (mpi.Run's goroutine ranks), including a rank sending to
// itself. A send calls the receiver's handler directly on the sender's
// goroutine (no goroutine hop, no copy before the receiver's own), and
// Put/Get are one copy between the two user buffers.
//
// The one exception is a small header-by-value send (SendImmediateHeader)
// in a world whose waiters spin (btl.Spinner): the fragment goes into a
// ring of the pair and the receiver's own goroutine dispatches it, on its
// core, when it polls (see handoff.go).
package self

import (
	"encoding/binary"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

// Name is the component name.
const Name = "self"

const caps = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut | btl.CapGet

func init() {
	btl.RegisterParams(Name, btl.Defaults{
		// Open MPI's self defaults (notes A.9).
		Limits: btl.Limits{
			EagerLimit:             1 << 10,
			RndvEagerLimit:         128 << 10,
			MaxSendSize:            16 << 10,
			RDMAPipelineFragSize:   math.MaxInt32,
			RDMAPipelineSendLength: math.MaxInt32,
			MinRDMAPipelineSize:    0,
		},
		Caps:        caps,
		Exclusivity: btl.ExclusivityHigh,
	})
	params.Register(params.Def{Name: paramSpin, Kind: params.Duration, Default: "500us",
		Help: "how long an in-process rank waiting for a receive of up to 224 bytes or of 1 MiB and more polls for hand-offs after pml_wait_spin, before it parks (needs no more mpi.Run ranks than GOMAXPROCS; 0: no hand-offs, ranks park at once)"})
	params.Register(params.Def{Name: paramSplit, Kind: params.Size, Default: "2m",
		Help: "Puts and Gets of at least this many bytes are copied in chunks by the asking rank and by any rank of the process that waits polling meanwhile (needs btl_self_spin > 0; 0 disables)"})
	params.Register(params.Def{Name: paramSplitChunk, Kind: params.Size, Default: "256k",
		Help: "largest chunk of a shared Put or Get (btl_self_split; at least 64k, and at least 1m for copies over 8m, which then stream past the caches as copy() does)"})
}

const (
	paramSpin       = "btl_self_spin"
	paramSplit      = "btl_self_split"
	paramSplitChunk = "btl_self_split_chunk"
)

// World is the set of ranks living in one process. Ranks join it with
// Attach; a module reaches exactly the ranks of its world.
type World struct {
	mu   sync.RWMutex
	mods map[int]*Module // world rank -> module

	regMu   sync.RWMutex
	regs    map[uint64][]byte
	nextReg atomic.Uint64

	size  atomic.Int32 // modules attached (a rank spins only while size <= procs)
	procs int32        // GOMAXPROCS when the world was made

	_   [64]byte                // job on a line of its own: every poll reads it
	job atomic.Pointer[copyJob] // the shared copy in progress (split.go)
	_   [56]byte
}

// NewWorld makes an empty world.
func NewWorld() *World {
	return &World{mods: map[int]*Module{}, regs: map[uint64][]byte{}, procs: int32(runtime.GOMAXPROCS(0))}
}

// Attach makes the self module of world rank env.Rank.
func (w *World) Attach(env *btl.Env) (*Module, error) {
	lim, c, excl, err := btl.Settings(env.Params, Name, caps)
	if err != nil {
		return nil, err
	}
	if c&btl.CapSend == 0 {
		return nil, mpierr.Errorf(mpierr.ErrArg, "btl_self_flags must include send")
	}
	w.size.Add(1)
	m := &Module{w: w, rank: env.Rank, disp: env.Dispatch, lim: lim, caps: c, excl: excl, eps: map[int]*endpoint{}, stats: env.Stats,
		spin: max(0, env.Params.Duration(paramSpin)), split: max(0, env.Params.Int(paramSplit)), splitChunk: env.Params.Int(paramSplitChunk)}
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, dup := w.mods[env.Rank]; dup {
		return nil, fmt.Errorf("self: rank %d attached twice", env.Rank)
	}
	w.mods[env.Rank] = m
	return m, nil
}

// Module is one rank's self transport.
type Module struct {
	w      *World
	rank   int
	disp   *btl.Dispatcher
	lim    btl.Limits
	caps   btl.Caps
	excl   int
	closed atomic.Bool
	spin   time.Duration // btl_self_spin

	split, splitChunk int // btl_self_split, btl_self_split_chunk (split.go)

	mu  sync.Mutex
	eps map[int]*endpoint

	inbox // the rings of senders handing fragments to this rank (handoff.go)

	// The fragment counters cost two locked instructions per message:
	// kept only with stats (btl.Env.Stats). Puts and gets are counted
	// always (one per large message).
	stats                                           bool
	sent, sentBytes, puts, putBytes, gets, getBytes atomic.Int64
}

var _ btl.Module = (*Module)(nil)
var _ btl.Counted = (*Module)(nil)

func (m *Module) Name() string       { return Name }
func (m *Module) Caps() btl.Caps     { return m.caps }
func (m *Module) Limits() btl.Limits { return m.lim }
func (m *Module) Exclusivity() int   { return m.excl }
func (m *Module) Latency() int       { return 0 }
func (m *Module) Bandwidth() int     { return 100000 }

// AddProc returns the endpoint to peer when it lives in this world.
func (m *Module) AddProc(peer int) (btl.Endpoint, error) {
	if m.closed.Load() {
		return nil, btl.ErrClosed
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if ep := m.eps[peer]; ep != nil {
		return ep, nil
	}
	m.w.mu.RLock()
	to := m.w.mods[peer]
	m.w.mu.RUnlock()
	if to == nil {
		return nil, fmt.Errorf("self: rank %d is not in this process: %w", peer, btl.ErrUnreachable)
	}
	ep := &endpoint{from: m, to: to}
	m.eps[peer] = ep
	return ep, nil
}

// Close detaches the module; sends to it fail with ErrClosed.
func (m *Module) Close() error {
	if m.closed.Swap(true) {
		return nil
	}
	m.w.mu.Lock()
	delete(m.w.mods, m.rank)
	m.w.mu.Unlock()
	return nil
}

// Counters returns the traffic counters (fragments sent: only with
// btl.Env.Stats).
func (m *Module) Counters() btl.Counters {
	return btl.Counters{FragsSent: m.sent.Load(), BytesSent: m.sentBytes.Load(),
		Puts: m.puts.Load(), PutBytes: m.putBytes.Load(), Gets: m.gets.Load(), GetBytes: m.getBytes.Load()}
}

type registration struct {
	w      *World
	id     uint64
	handle [16]byte
}

// Register records mem in the world's table; the handle is (id, length).
func (m *Module) Register(mem []byte, _ btl.Access) (btl.Registration, error) {
	if m.closed.Load() {
		return nil, btl.ErrClosed
	}
	r := &registration{w: m.w, id: m.w.nextReg.Add(1)}
	binary.LittleEndian.PutUint64(r.handle[:], r.id)
	binary.LittleEndian.PutUint64(r.handle[8:], uint64(len(mem)))
	m.w.regMu.Lock()
	m.w.regs[r.id] = mem
	m.w.regMu.Unlock()
	return r, nil
}

func (r *registration) Handle() []byte { return r.handle[:] }
func (r *registration) Release() error {
	r.w.regMu.Lock()
	delete(r.w.regs, r.id)
	r.w.regMu.Unlock()
	return nil
}

// lookup returns the registered memory [off, off+n) named by handle.
func (w *World) lookup(handle []byte, off, n int) ([]byte, error) {
	if len(handle) != 16 || off < 0 || n < 0 {
		return nil, fmt.Errorf("self: handle of %d bytes: %w", len(handle), btl.ErrBadHandle)
	}
	id := binary.LittleEndian.Uint64(handle)
	w.regMu.RLock()
	mem, ok := w.regs[id]
	w.regMu.RUnlock()
	if !ok || uint64(len(mem)) != binary.LittleEndian.Uint64(handle[8:]) {
		return nil, fmt.Errorf("self: registration %d is not live: %w", id, btl.ErrBadHandle)
	}
	if off > len(mem) || n > len(mem)-off {
		return nil, fmt.Errorf("self: range [%d,+%d) outside a %d-byte registration: %w", off, n, len(mem), btl.ErrBadHandle)
	}
	return mem[off : off+n], nil
}

type endpoint struct {
	from, to *Module
	back     atomic.Pointer[endpoint] // to -> from, as the receiver sees the sender (set on first use)
	ring     atomic.Pointer[ring]     // from -> to hand-offs (made on first use)
}

var _ btl.Endpoint = (*endpoint)(nil)

func (e *endpoint) Module() btl.Module { return e.from }
func (e *endpoint) Peer() int          { return e.to.rank }

func (e *endpoint) reverse() (*endpoint, error) {
	if b := e.back.Load(); b != nil {
		return b, nil
	}
	// Racing senders get the same endpoint: AddProc returns one per peer.
	ep, err := e.to.AddProc(e.from.rank)
	if err != nil {
		return nil, err
	}
	b := ep.(*endpoint)
	e.back.Store(b)
	return b, nil
}

func (e *endpoint) deliver(tag btl.Tag, hdr, data []byte) error {
	if e.from.closed.Load() || e.to.closed.Load() {
		return btl.ErrClosed
	}
	back, err := e.reverse()
	if err != nil {
		return err
	}
	if e.from.stats {
		e.from.sent.Add(1)
		e.from.sentBytes.Add(int64(len(hdr) + len(data)))
	}
	e.flush()
	e.to.disp.Dispatch(back, tag, hdr, data)
	return nil
}

// SendImmediate delivers at once: the receiver's handler runs before it returns.
func (e *endpoint) SendImmediate(tag btl.Tag, hdr, data []byte) error {
	return e.deliver(tag, hdr, data)
}

// Send delivers at once and reports done.
func (e *endpoint) Send(tag btl.Tag, hdr, data []byte, _ btl.Completion) (bool, error) {
	if err := e.deliver(tag, hdr, data); err != nil {
		return false, err
	}
	return true, nil
}

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 64<<10); return &b }}

// Alloc returns a pooled buffer.
func (e *endpoint) Alloc(size int) ([]byte, error) {
	if e.from.closed.Load() {
		return nil, btl.ErrClosed
	}
	bp := bufPool.Get().(*[]byte)
	if cap(*bp) < size {
		bufPool.Put(bp)
		return make([]byte, size), nil
	}
	return (*bp)[:size], nil
}

// SendAlloc delivers buf and recycles it.
func (e *endpoint) SendAlloc(tag btl.Tag, buf []byte, hdrLen int, _ btl.Completion) (bool, error) {
	err := e.deliver(tag, buf[:hdrLen], buf[hdrLen:])
	e.Free(buf)
	if err != nil {
		return false, err
	}
	return true, nil
}

// Free recycles an Alloc buffer.
func (e *endpoint) Free(buf []byte) {
	if cap(buf) >= 64<<10 && cap(buf) <= 1<<20 {
		buf = buf[:0]
		bufPool.Put(&buf)
	}
}

// Put copies local into the registration named by handle, at off.
func (e *endpoint) Put(local []byte, handle []byte, off int, _ btl.Completion) (bool, error) {
	if e.from.closed.Load() || e.to.closed.Load() {
		return false, btl.ErrClosed
	}
	mem, err := e.from.w.lookup(handle, off, len(local))
	if err != nil {
		return false, err
	}
	e.from.copyShared(mem, local)
	e.from.puts.Add(1)
	e.from.putBytes.Add(int64(len(local)))
	return true, nil
}

// Get copies from the registration named by handle, at off, into local.
func (e *endpoint) Get(local []byte, handle []byte, off int, _ btl.Completion) (bool, error) {
	if err := e.GetNow(local, handle, off); err != nil {
		return false, err
	}
	return true, nil
}

// GetNow is Get, which in-process is one copy done before it returns
// (btl.SyncGetter).
func (e *endpoint) GetNow(local []byte, handle []byte, off int) error {
	if e.from.closed.Load() || e.to.closed.Load() {
		return btl.ErrClosed
	}
	mem, err := e.from.w.lookup(handle, off, len(local))
	if err != nil {
		return err
	}
	e.from.copyShared(local, mem)
	e.from.gets.Add(1)
	e.from.getBytes.Add(int64(len(local)))
	return nil
}

// Flush reports done at once: Send, SendAlloc, Put and Get complete
// during their calls here, so nothing posted is ever outstanding.
func (e *endpoint) Flush(btl.Completion) (bool, error) {
	if e.from.closed.Load() {
		return false, btl.ErrClosed
	}
	return true, nil
}
