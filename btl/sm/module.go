package sm

import (
	"fmt"
	"math"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
)

// Module is one process's sm transport. Its methods and its endpoints
// are safe for concurrent use; Progress delivers on one goroutine at a time
// (a concurrent call returns 0). Completions of queued sends run on the
// goroutine that posts them (Progress or a later send on the endpoint),
// never with an endpoint lock or the poll lock held.
type Module struct {
	env   *btl.Env
	cfg   config
	id    hostID
	rank  int
	local int
	pid   int
	nonce uint64

	file *os.File // the memfd; open until Close so peers can reach it
	seg  []byte   // own segment
	lay  layout
	fifo fifo
	// Own shared words.
	state     *atomic.Uint64 // state<<32 | sleepers
	seq       *atomic.Uint32 // futex word
	fboxAvail *atomic.Uint64
	helpPosts *atomic.Uint64 // shared Get requests posted to this process (help.go)

	caps   atomic.Uint32 // btl.Caps; put/get dropped when a peer refuses CMA
	closed atomic.Bool
	pool   *fragPool

	peers     []peerSlot    // by local rank
	resolveMu sync.Mutex    // one resolve at a time
	byRankMu  sync.Mutex    // guards byRank
	byRank    map[int]*peer // world rank -> peer, for every local peer looked up
	resolved  bool          // guarded by resolveMu: every local peer was looked up

	nextFbox atomic.Int32 // next unused fast box index of own segment

	// Progress state: pollMu is held by the one goroutine polling.
	pollMu    sync.Mutex
	head      uint64        // guarded by pollMu: next FIFO position
	rx        []*rxBox      // guarded by pollMu: fast boxes polled
	pollCount uint64        // guarded by pollMu: Progress calls
	polls     atomic.Uint64 // pollCount every 64 calls, to tell whether someone else polls
	events    atomic.Bool   // a peer failed or closed: Progress must look
	recvN     int64         // guarded by pollMu
	recvB     int64         // guarded by pollMu
	recvSnapN atomic.Int64  // recvN as Counters last read it
	recvSnapB atomic.Int64
	later     []drained     // guarded by pollMu: completions for Progress to run once unlocked
	lastWork  uint64        // guarded by pollMu: pollCount of the last call that found work
	runFrom   uint64        // guarded by pollMu: lastWork+1 of the idle run being measured (idle)
	runPolls  uint64        // guarded by pollMu: its length when measuring began
	runAt     time.Time     // guarded by pollMu: when measuring began
	helpNow   bool          // guarded by pollMu: help once the poll lock is released
	helpSeen  atomic.Uint64 // helpPosts when last helped
	helpBytes atomic.Int64  // bytes copied for peers' shared Gets

	pendMu   sync.Mutex
	pendEps  []*endpoint // guarded by pendMu: endpoints with queued sends
	drainEps []*endpoint // drainAll's copy of pendEps (under the poll lock)
	pendingN atomic.Int32

	lifeMu sync.RWMutex   // read-held by Block while it touches own segment; Close write-locks
	mapMu  sync.Mutex     // held while a peer is recorded or its segment mapped, and while Close unmaps
	bg     sync.WaitGroup // watcher and wake-helper goroutines

	// huge pages for registered memory (huge.go), guarded by hugeMu
	hugeMu      sync.Mutex
	hugeSeen    map[uintptr]int // registrations per 2 MiB region
	hugeOff     bool            // too many refusals: stop asking
	hugeClosed  bool            // Close waits for the collapsing goroutines: start no more
	hugeFails   int             // refusals in a row
	hugeRegions int64           // regions collapsed
	hugeSmall   int             // collapses started of regions covered less than half

	regMu sync.Mutex
	regs  map[*registration]struct{} // guarded by regMu: live registrations
	nregs atomic.Int64               // len(regs)

	puts, putBytes, gets, getBytes atomic.Int64

	// guarded by pollMu: a run of fast-box fragments being gathered
	// (pollBox), dispatched together with Dispatcher.DispatchRun (1.5 KiB,
	// kept after the fields every poll reads).
	runHdr, runData [pollBudget][]byte
}

var (
	_ btl.Module  = (*Module)(nil)
	_ btl.Poller  = (*Module)(nil)
	_ btl.Counted = (*Module)(nil)
)

type peerSlot struct {
	mu sync.Mutex // serializes looking the peer up
	p  atomic.Pointer[peer]
}

// peer is another process on this host, as this module knows it. It is
// recorded when it is looked up in the store (the first AddProc) and its
// segment is mapped on first use (attach): the first operation on its
// endpoint, or the first fragment it sends us.
type peer struct {
	m     *Module
	local int
	rank  int
	pid   int
	ep    *endpoint

	// Set once, by attach with ep.mu and m.mapMu held, then mapped is
	// stored: read them with ep.mu held or after mapped.Load(). Until
	// then state points at unmappedState, so that the state check of
	// every operation (usable) is also the check that the segment is
	// mapped, and the other fields are nil. The fields the data path
	// reads come first: behind mapped and entry they cost recvFrag 3
	// instructions a fragment (callgrind, 4 KiB ping-pong).
	seg       []byte // the peer's segment (nil until mapped, and after Close)
	lay       layout // validated copy of its layout
	fifo      fifo
	state     *atomic.Uint64
	seq       *atomic.Uint32
	fboxAvail *atomic.Uint64
	helpPosts *atomic.Uint64
	watch     *sys.PidWatch

	cmaErr error // why Put/Get to it are not possible (nil: they are); set before it is recorded

	failed   atomic.Pointer[error] // why it failed (dead, broke the protocol); set once
	closed   atomic.Bool           // it closed its module
	reported bool                  // guarded by m.pollMu: PeerFailed was called
	rx       *rxBox                // guarded by m.pollMu: its fast box to us

	mapped atomic.Bool // seg and the fields after it are set
	entry  wireEntry   // its store entry: where its segment is
}

func (p *peer) failure() error {
	if e := p.failed.Load(); e != nil {
		return *e
	}
	return nil
}

func newModule(env *btl.Env, cfg config) (*Module, error) {
	m := &Module{env: env, cfg: cfg, id: localHostID(), rank: env.Rank, local: env.LocalRank,
		pid: os.Getpid(), nonce: randomNonce(), peers: make([]peerSlot, env.LocalSize), byRank: map[int]*peer{},
		regs: map[*registration]struct{}{}}
	m.caps.Store(uint32(cfg.caps))
	lay, err := plan(cfg.segmentSize, fifoSlots, env.LocalSize-1, cfg.fboxSize, cfg.fboxMax, cfg.limits.EagerLimit, cfg.maxSend)
	if err != nil {
		return nil, fmt.Errorf("sm: %s: %w", paramSegmentSize, mpierr.Errorf(mpierr.ErrArg, "%v", err))
	}
	m.lay = lay
	f, err := sys.MemfdCreate(fmt.Sprintf("gompi-sm.%s.%d", env.JobID, env.Rank))
	if err != nil {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "sm: %v", err)
	}
	// A memfd is reachable only through this process's descriptor table
	// (/proc/<pid>/fd/<fd>: same user, ptrace-readable); 0600 makes the
	// owner-only intent explicit.
	if err := f.Chmod(0o600); err == nil {
		err = f.Truncate(int64(lay.size))
		if err == nil {
			m.seg, err = sys.MapShared(f, lay.size)
		}
		if err != nil {
			f.Close()
			return nil, mpierr.Errorf(mpierr.ErrNotSupported, "sm: segment of %d bytes: %v", lay.size, err)
		}
	} else {
		f.Close()
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "sm: %v", err)
	}
	m.file = f
	m.lay.writeHeader(m.seg, m.pid, m.rank, m.local, m.nonce)
	m.fifo = newFifo(m.seg, &m.lay)
	m.fifo.init()
	m.state = word64(m.seg, offState)
	m.seq = word32(m.seg, offSeq)
	m.fboxAvail = word64(m.seg, offFboxAvail)
	m.fboxAvail.Store(uint64(cfg.fboxMax))
	m.helpPosts = word64(m.seg, offHelpPosts)
	m.pool = newFragPool(m.seg, &m.lay)

	e := wireEntry{rank: m.rank, local: m.local, localSize: env.LocalSize, pid: m.pid, fd: int(f.Fd()),
		size: lay.size, nonce: m.nonce, id: m.id}
	b := e.encode()
	for _, k := range []string{rankKey(m.rank), localKey(m.id, m.local)} {
		if err := env.Store.Set(k, b); err != nil {
			m.release()
			return nil, fmt.Errorf("sm: publish %s: %w", k, err)
		}
	}
	env.Logf("sm: rank %d (local %d of %d) segment %d bytes: %d eager + %d max-size fragments, %d fast boxes, caps %v; %s",
		m.rank, m.local, env.LocalSize, lay.size, lay.smallCount, lay.largeCount, lay.fboxCount, btl.Caps(m.caps.Load()), Status())
	return m, nil
}

func (m *Module) Name() string       { return Name }
func (m *Module) Caps() btl.Caps     { return btl.Caps(m.caps.Load()) }
func (m *Module) Limits() btl.Limits { return m.cfg.limits }
func (m *Module) Exclusivity() int   { return m.cfg.exclusivity }
func (m *Module) Latency() int       { return latencyUS }

func (m *Module) Bandwidth() int {
	if m.Caps()&btl.CapRDMA != 0 {
		return bandwidthSCopy
	}
	return bandwidthMbps
}

// Counters returns the traffic counters.
func (m *Module) Counters() btl.Counters {
	c := btl.Counters{Puts: m.puts.Load(), PutBytes: m.putBytes.Load(), Gets: m.gets.Load(), GetBytes: m.getBytes.Load(),
		HelpBytes: m.helpBytes.Load()}
	// The receive counters are Progress's plain fields: read them when
	// nobody polls, else (a handler asking) the last value read.
	if m.pollMu.TryLock() {
		m.recvSnapN.Store(m.recvN)
		m.recvSnapB.Store(m.recvB)
		m.pollMu.Unlock()
	}
	c.FragsRecv, c.BytesRecv = m.recvSnapN.Load(), m.recvSnapB.Load()
	for i := range m.peers {
		if p := m.peers[i].p.Load(); p != nil {
			p.ep.mu.Lock()
			c.FragsSent += p.ep.sentN
			c.BytesSent += p.ep.sentB
			p.ep.mu.Unlock()
		}
	}
	return c
}

// AddProc returns the endpoint to world rank peer when it runs on this
// host. The first call looks up every other local rank's store entry
// (waiting up to btl_sm_wireup_timeout) and probes it for single copies;
// no segment is mapped until the endpoint is first used. A local peer that
// died before it could be mapped still gets an endpoint: its operations
// fail and PeerFailed reports it.
func (m *Module) AddProc(rank int) (btl.Endpoint, error) {
	if m.closed.Load() {
		return nil, btl.ErrClosed
	}
	if rank == m.rank {
		return nil, fmt.Errorf("sm: rank %d is this process (btl self serves it): %w", rank, btl.ErrUnreachable)
	}
	if err := m.resolve(); err != nil {
		return nil, err
	}
	m.byRankMu.Lock()
	p := m.byRank[rank]
	m.byRankMu.Unlock()
	if p == nil {
		return nil, fmt.Errorf("sm: rank %d is not on this host (%s): %w", rank, m.id.host, btl.ErrUnreachable)
	}
	return p.ep, nil
}

// fail records that p failed (first reason wins) and makes Progress report
// it. It takes no lock: senders call it with their endpoint locked.
func (m *Module) fail(p *peer, err error) {
	if p.failed.CompareAndSwap(nil, &err) {
		m.events.Store(true)
	}
}

func protoErr(p *peer, err error) error {
	return fmt.Errorf("sm: rank %d broke the shared-memory protocol: %v: %w (%w)", p.rank, err, mpierr.ErrProtocol, mpierr.ErrProcFailed)
}

// kick wakes every goroutine of this process sleeping or napping in Block.
// The caller makes sure the segment is still mapped: it runs before Close
// unmaps (holding lifeMu or pollMu, or counted in bg, or before closed).
func (m *Module) kick() {
	bump(m.seq)
	sys.FutexWake(m.seq, math.MaxInt32)
}

// seqArmed is the futex word's top bit: a goroutine that announced it
// sleeps sets it (arm) before its last look for work; the first sender
// that finds it set clears it and makes the wake-up call (disarm). The
// low bits count wake-ups, so a sleeper's FutexWait sees any change.
const seqArmed = 1 << 31

// arm sets the armed bit and returns the word's value with it set: the
// value to sleep on.
func arm(seq *atomic.Uint32) uint32 {
	for {
		s := seq.Load()
		if s&seqArmed != 0 || seq.CompareAndSwap(s, s|seqArmed) {
			return s | seqArmed
		}
	}
}

// disarm clears the armed bit and counts a wake-up; false if the bit was
// not set (nobody armed it since the last wake-up).
func disarm(seq *atomic.Uint32) bool {
	for {
		s := seq.Load()
		if s&seqArmed == 0 {
			return false
		}
		if seq.CompareAndSwap(s, (s+1)&^seqArmed) {
			return true
		}
	}
}

// bump counts a wake-up unconditionally and clears the armed bit.
func bump(seq *atomic.Uint32) {
	for {
		s := seq.Load()
		if seq.CompareAndSwap(s, (s+1)&^seqArmed) {
			return
		}
	}
}

// Close tears the module down: it marks its segment closed (senders then
// fail with ErrClosed), completes queued sends with ErrClosed, stops the
// watchers, and unmaps every segment. Buffers from Alloc and fragments
// handed to handlers must not be used after Close. Close is idempotent and
// safe to call after kill.
func (m *Module) Close() error {
	return m.shutdown(stateClosed)
}

// kill ends the module as the crash of its process would look to peers in
// this process (the test hook behind btltest.Peer.Kill): its segment says
// dead, and it says nothing else.
func (m *Module) kill() {
	m.shutdown(stateDead)
}

func (m *Module) shutdown(state uint64) error {
	if !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	// Tell the peers, and wake them so they look.
	for {
		old := m.state.Load()
		if m.state.CompareAndSwap(old, state<<32|old&0xFFFFFFFF) {
			break
		}
	}
	m.kick()
	for i := range m.peers {
		if p := m.peers[i].p.Load(); p != nil && p.mapped.Load() {
			bump(p.seq)
			sys.FutexWake(p.seq, math.MaxInt32)
		}
	}
	m.pollMu.Lock() // no Progress in flight from here on
	var cbs []pendingSend
	for i := range m.peers {
		if p := m.peers[i].p.Load(); p != nil {
			cbs = p.ep.terminate(fmt.Errorf("sm: module closed: %w", btl.ErrClosed), cbs)
		}
	}
	m.pollMu.Unlock()
	d := drained{failed: cbs, err: fmt.Errorf("sm: module closed: %w", btl.ErrClosed)}
	d.run()
	// Lock order everywhere: lifeMu, pollMu, a peer slot's mu or an
	// endpoint's mu, mapMu.
	m.lifeMu.Lock() // Block calls are out
	m.pollMu.Lock() // Progress too
	m.mapMu.Lock()  // a lookup or attach in flight has recorded its peer or mapping; later ones see closed
	for i := range m.peers {
		if p := m.peers[i].p.Load(); p != nil && p.watch != nil {
			p.watch.Close()
		}
	}
	m.hugeMu.Lock()
	m.hugeClosed = true
	m.hugeMu.Unlock()
	m.bg.Wait() // watchers, wake helpers and huge-page collapses are out
	m.release()
	m.mapMu.Unlock()
	m.pollMu.Unlock()
	m.lifeMu.Unlock()
	m.releaseAll()
	return nil
}

// release unmaps every segment and closes the memfd. Called with mapMu
// held (or before the module is published).
func (m *Module) release() {
	for i := range m.peers {
		if p := m.peers[i].p.Load(); p != nil && p.seg != nil {
			sys.Unmap(p.seg)
			p.seg = nil
		}
	}
	if m.seg != nil {
		sys.Unmap(m.seg)
		m.seg = nil
	}
	if m.file != nil {
		m.file.Close()
		m.file = nil
	}
}
