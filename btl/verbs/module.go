package verbs

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/btl/verbs/ibv/soft"
	"github.com/gompi-org/gompi/internal/mpierr"
)

var (
	_ btl.Module       = (*module)(nil)
	_ btl.Counted      = (*module)(nil)
	_ btl.Poller       = (*module)(nil)
	_ btl.Endpoint     = (*endpoint)(nil)
	_ ImmWriter        = (*endpoint)(nil)
	_ btl.Registration = (*registration)(nil)
)

// pairKey is where from publishes its address for the pair with to.
func pairKey(from, to int) string { return "btl.verbs." + strconv.Itoa(from) + "." + strconv.Itoa(to) }

// upKey is where from says its QP for to is ready to receive.
func upKey(from, to int) string { return pairKey(from, to) + ".up" }

// closeLinger bounds how long Close waits for the close frames it sends.
const closeLinger = 2 * time.Second

// blockNap bounds Block: the watcher goroutine delivers while it sleeps.
const blockNap = 100 * time.Millisecond

// leaseNap is how long the watcher leaves the completion queues to
// pollers after it saw Progress called, before it looks again.
const leaseNap = time.Millisecond

// Open opens the device and port and returns the module. Without a
// wire-up store (singleton or in-process jobs) it returns an error
// wrapping mpierr.ErrNotSupported, as it does when no provider or device
// is usable; bad parameter values give mpierr.ErrArg.
func (component) Open(env *btl.Env) ([]btl.Module, error) {
	if env.Store == nil {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "verbs: needs gorun's store to exchange addresses (none in a singleton or in-process job)")
	}
	cfg, err := readConfig(env.Params)
	if err != nil {
		return nil, err
	}
	list := ""
	if env.Params.Has("btl") {
		list = env.Params.String("btl")
	}
	prov, err := pickProvider(cfg, env.Params, list)
	if err != nil {
		return nil, err
	}
	m, err := openModule(env, cfg, prov)
	if err != nil {
		return nil, err
	}
	return []btl.Module{m}, nil
}

// openModule opens the device of prov and starts the module.
func openModule(env *btl.Env, cfg config, prov ibv.Provider) (*module, error) {
	dev, err := prov.Open(cfg.device)
	if err != nil {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "verbs: opening device %q of provider %s: %v", cfg.device, prov.Name(), err)
	}
	m := &module{env: env, cfg: cfg, prov: prov, dev: dev, attr: dev.Device(),
		eps: make([]atomic.Pointer[endpoint], env.Size), kick: make(chan struct{}, 1)}
	fail := func(err error) (*module, error) {
		m.destroyDevice()
		return nil, err
	}
	if m.port, err = dev.QueryPort(cfg.port); err != nil {
		return fail(mpierr.Errorf(mpierr.ErrNotSupported, "verbs: %s port %d: %v", m.attr.Name, cfg.port, err))
	}
	if m.port.State != ibv.PortActive {
		return fail(mpierr.Errorf(mpierr.ErrNotSupported, "verbs: %s port %d is %v", m.attr.Name, cfg.port, m.port.State))
	}
	if m.gid, err = dev.QueryGID(cfg.port, cfg.gidIndex); err != nil {
		return fail(mpierr.Errorf(mpierr.ErrNotSupported, "verbs: %s port %d GID %d: %v", m.attr.Name, cfg.port, cfg.gidIndex, err))
	}
	m.mtu = m.port.ActiveMTU
	if cfg.mtu != 0 && cfg.mtu < m.mtu {
		m.mtu = cfg.mtu
	}
	if m.pd, err = dev.AllocPD(); err != nil {
		return fail(fmt.Errorf("verbs: allocating a protection domain: %w", err))
	}
	if m.ch, err = dev.CreateCompChannel(); err != nil {
		return fail(fmt.Errorf("verbs: creating a completion channel: %w", err))
	}
	m.depth = cfg.depth
	if a := m.attr.MaxQPWR; a > 0 && a < m.depth {
		m.depth = a
	}
	m.repostBatch = max(1, min(16, m.depth/16))
	if m.cfg.credits+4 > m.depth {
		return fail(mpierr.Errorf(mpierr.ErrArg, "verbs: %s=%d needs queues of %d, device %s allows %d", paramCredits, cfg.credits, cfg.credits+4, m.attr.Name, m.depth))
	}
	if cfg.timeout > 0 {
		// Four times the QP's own give-up time, at least 5 s.
		qpLimit := time.Duration(4*(int(cfg.retry)+1)) * (4096 * time.Nanosecond << cfg.timeout)
		m.livenessTicks = int(max(5*time.Second, qpLimit) / probeAfter)
	}
	m.cache = newRegCache(func(b []byte) (ibv.MR, error) {
		return m.pd.RegMR(b, ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead)
	}, cfg.regCache, regCacheEntries)
	m.runCtx, m.cancel = context.WithCancel(context.Background())
	for p := range env.Size {
		if p != env.Rank {
			m.wg.Add(1)
			go m.watchPeer(p)
		}
	}
	m.wg.Add(1)
	go m.watch()
	env.Logf("verbs: rank %d on %s (provider %s) port %d: lid %d gid %v mtu %d; %v",
		env.Rank, m.attr.Name, prov.Name(), cfg.port, m.port.LID, m.gid, m.mtu.Bytes(), cfg)
	return m, nil
}

// regCacheEntries bounds the registration cache's entries (the bytes are
// bounded by btl_verbs_reg_cache_size).
const regCacheEntries = 4096

// module is one open device port.
type module struct {
	env   *btl.Env
	cfg   config
	prov  ibv.Provider
	dev   ibv.Context
	attr  ibv.DeviceAttr
	port  ibv.PortAttr
	gid   ibv.GID
	mtu   ibv.MTU
	depth int // send and receive queue depth of every QP
	// repostBatch: consumed receives are posted again once this many
	// are (one PostRecv per batch, not per message; the queue keeps at
	// least depth-repostBatch posted).
	repostBatch int
	// livenessTicks: probe ticks without any send completion after which a
	// pair whose operations wait is failed (0: never; btl_verbs_qp_timeout 0).
	livenessTicks int
	pd            ibv.PD
	ch            ibv.CompChannel
	cache         *regCache

	runCtx context.Context // cancelled by Close: watchers, connects
	cancel context.CancelFunc
	wg     sync.WaitGroup // watchers and connects
	closed atomic.Bool

	mu   sync.Mutex // serialises endpoint creation and changes of live
	eps  []atomic.Pointer[endpoint]
	live atomic.Pointer[[]*endpoint] // endpoints with a completion queue, to poll

	pollMu sync.Mutex    // one poller of the completion queues at a time
	polls  atomic.Uint64 // Progress calls: the watcher leaves the queues to pollers while it moves
	kick   chan struct{} // cap 1: Block asks the watcher to watch at once
	// wakeWatch ends the watcher's wait on the completion channel;
	// rewatch asks it not to start one (set when a queue goes live,
	// whose completions may predate its arming).
	wakeWatch atomic.Pointer[context.CancelFunc]
	rewatch   atomic.Bool

	fragsSent, bytesSent atomic.Int64
	fragsRecv, bytesRecv atomic.Int64
	puts, putBytes       atomic.Int64
	gets, getBytes       atomic.Int64
	stalls               atomic.Int64 // operations that waited for credits, ring room or queue slots
	acksSent             atomic.Int64

	// refuse makes the next n Send, SendAlloc, Put and Get calls refuse
	// with ErrWouldBlock (n < 0: all of them): the conformance suite's
	// check that a refusal posts nothing (btltest.Peer.WouldBlock).
	refuse atomic.Int64

	allocMu sync.Mutex // guards small, large
	small   [][]byte
	large   [][]byte
}

func (m *module) Name() string       { return Name }
func (m *module) Caps() btl.Caps     { return m.cfg.caps }
func (m *module) Limits() btl.Limits { return m.cfg.limits }
func (m *module) Exclusivity() int   { return m.cfg.exclusivity }
func (m *module) Latency() int       { return latencyUS }
func (m *module) Bandwidth() int     { return bandwidthMbps }
func (m *module) String() string     { return fmt.Sprintf("verbs(rank %d, %s)", m.env.Rank, m.attr.Name) }

func (m *module) errClosed() error {
	return fmt.Errorf("verbs: module of rank %d: %w", m.env.Rank, btl.ErrClosed)
}

// Counters returns the traffic counters: sends and Puts counted when
// accepted, receptions when dispatched.
func (m *module) Counters() btl.Counters {
	return btl.Counters{
		FragsSent: m.fragsSent.Load(), BytesSent: m.bytesSent.Load(),
		FragsRecv: m.fragsRecv.Load(), BytesRecv: m.bytesRecv.Load(),
		Puts: m.puts.Load(), PutBytes: m.putBytes.Load(),
		Gets: m.gets.Load(), GetBytes: m.getBytes.Load(),
	}
}

// Status describes the device and the flow control (gompi-info, --stats).
func (m *module) Status() string {
	n, b, hits, misses, ev := m.cache.stats()
	st := fmt.Sprintf("device %s (provider %s) port %d mtu %d; credits %d, ring %d B; %d stalls, %d ACKs; reg cache %d entries %d B, %d hits %d misses %d evictions",
		m.attr.Name, m.prov.Name(), m.cfg.port, m.mtu.Bytes(), m.cfg.credits, m.cfg.ringSize, m.stalls.Load(), m.acksSent.Load(), n, b, hits, misses, ev)
	if c, ok := soft.CountersOf(m.dev); ok {
		// What the software device's retransmission costs: packets sent
		// again after losses it learnt of (sequence NAKs, READ response
		// gaps) and after timeouts.
		st += fmt.Sprintf("; soft: %d packets sent, %d received, %d retransmitted, %d timeouts, %d early go-backs, %d sequence NAKs sent, %d dropped by fault injection",
			c.PacketsSent, c.PacketsReceived, c.Retransmits, c.Timeouts, c.EarlyGoBacks, c.SeqNAKsSent, c.DropsInjected)
	}
	return st
}

// refused reports whether the refuse knob refuses this operation.
func (m *module) refused() bool {
	for {
		n := m.refuse.Load()
		switch {
		case n == 0:
			return false
		case n < 0:
			return true
		case m.refuse.CompareAndSwap(n, n-1):
			return true
		}
	}
}

func (m *module) errWouldBlock() error {
	return fmt.Errorf("verbs: rank %d: queue full: %w", m.env.Rank, btl.ErrWouldBlock)
}

// Stalls returns how many operations had to wait for credits, ring room
// or send queue slots.
func (m *module) Stalls() int64 { return m.stalls.Load() }

// AddProc returns the endpoint for peer without contacting it: the QP is
// connected by the first operation (or when the peer connects). The own
// rank is unreachable (self serves it); a rank outside the job is an error
// wrapping mpierr.ErrRank.
func (m *module) AddProc(peer int) (btl.Endpoint, error) {
	if m.closed.Load() {
		return nil, m.errClosed()
	}
	if peer < 0 || peer >= len(m.eps) {
		return nil, mpierr.Errorf(mpierr.ErrRank, "verbs: rank %d outside the job of %d", peer, len(m.eps))
	}
	if peer == m.env.Rank {
		return nil, fmt.Errorf("verbs: rank %d is this process: %w", peer, btl.ErrUnreachable)
	}
	ep := m.endpoint(peer)
	if ep == nil {
		return nil, m.errClosed()
	}
	return ep, nil
}

// endpoint returns (creating it) the endpoint of a valid peer, or nil
// once the module is closed.
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
	ep := newEndpoint(m, peer)
	m.eps[peer].Store(ep)
	return ep
}

// addLive makes ep's completion queue polled.
func (m *module) addLive(ep *endpoint) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var l []*endpoint
	if p := m.live.Load(); p != nil {
		l = append(l, *p...)
	}
	l = append(l, ep)
	m.live.Store(&l)
}

// watchPeer waits for peer to publish its address for this rank and then
// connects the pair from this side too.
func (m *module) watchPeer(peer int) {
	defer m.wg.Done()
	if _, err := m.env.Store.Get(m.runCtx, pairKey(peer, m.env.Rank)); err != nil {
		return // closed, or the store is gone (gorun reports failures itself)
	}
	if ep := m.endpoint(peer); ep != nil {
		ep.startConnect()
	}
}

// Register makes mem reachable by peers' Put (AccessRemoteWrite) and Get
// (AccessRemoteRead) through the registration cache: the memory stays
// registered (and mem reachable) after Release while the cache keeps it.
// A peer's operation on a released handle that the cache still holds
// reaches mem; one on an evicted handle fails at the peer with a remote
// access error, which breaks that pair. Empty mem gives a handle that
// covers nothing.
func (m *module) Register(mem []byte, access btl.Access) (btl.Registration, error) {
	if m.closed.Load() {
		return nil, m.errClosed()
	}
	r := &registration{m: m}
	if len(mem) == 0 {
		encodeHandle(r.handle[:], 0, 0, 0)
		return r, nil
	}
	e, err := m.cache.get(mem)
	if err != nil {
		return nil, fmt.Errorf("verbs: registering %d bytes: %w", len(mem), err)
	}
	r.e = e
	encodeHandle(r.handle[:], e.iova(sliceAddr(mem)), len(mem), e.mr.RKey())
	return r, nil
}

// registration is memory registered with Module.Register.
type registration struct {
	m        *module
	e        *regEntry // nil for empty memory
	handle   [handleLen]byte
	released atomic.Bool
}

func (r *registration) Handle() []byte { return r.handle[:] }

// Release hands the memory back to the registration cache. Releasing
// twice returns an error wrapping ErrBadHandle.
func (r *registration) Release() error {
	if !r.released.CompareAndSwap(false, true) {
		return fmt.Errorf("verbs: registration released twice: %w", btl.ErrBadHandle)
	}
	if r.e != nil && !r.m.closed.Load() {
		r.m.cache.put(r.e)
	}
	return nil
}

// Progress polls the completion queues of the connected pairs on the
// calling goroutine, dispatching what arrived and completing what
// finished, and returns how many completions it handled. It returns 0 at
// once while another goroutine polls.
func (m *module) Progress() int {
	m.polls.Add(1)
	if !m.pollMu.TryLock() {
		return 0
	}
	n := m.pollLocked()
	m.pollMu.Unlock()
	return n
}

// ConcurrentProgress: Progress serializes itself (pml.ConcurrentPoller).
func (m *module) ConcurrentProgress() bool { return true }

func (m *module) pollLocked() int {
	p := m.live.Load()
	if p == nil {
		return 0
	}
	n := 0
	for _, ep := range *p {
		n += ep.poll()
	}
	return n
}

// Block waits until wake is signalled (or closed), the module closes, or
// blockNap passes. It first tells the watcher goroutine to watch the
// completion channel at once: the watcher delivers while Block sleeps.
func (m *module) Block(wake <-chan struct{}) {
	select {
	case m.kick <- struct{}{}:
	default:
	}
	t := time.NewTimer(blockNap)
	select {
	case <-wake:
	case <-m.runCtx.Done():
	case <-t.C:
	}
	t.Stop()
}

// watch delivers completions while nobody calls Progress: it arms the
// completion queues, polls them once (for what came before the arming)
// and sleeps on the completion channel. While Progress is being called it
// leaves the queues to the pollers, looking again every leaseNap (or at
// once when Block kicks it).
func (m *module) watch() {
	defer m.wg.Done()
	t := time.NewTimer(leaseNap)
	defer t.Stop()
	last := m.polls.Load()
	for m.runCtx.Err() == nil {
		if p := m.polls.Load(); p != last {
			last = p
			t.Reset(leaseNap)
			select {
			case <-m.kick:
				last = m.polls.Load()
			case <-t.C:
			case <-m.runCtx.Done():
				return
			}
			continue
		}
		m.arm()
		m.pollMu.Lock()
		n := m.pollLocked()
		m.pollMu.Unlock()
		if n > 0 {
			continue
		}
		ctx, cancel := context.WithCancel(m.runCtx)
		m.wakeWatch.Store(&cancel)
		if m.rewatch.Swap(false) { // a queue went live since the arming
			cancel()
		}
		cq, err := m.ch.GetEvent(ctx)
		m.wakeWatch.Store(nil)
		cancel()
		if err != nil {
			if m.runCtx.Err() != nil {
				return
			}
			if ctx.Err() != nil {
				continue // woken: look again
			}
			m.env.Logf("verbs: rank %d: completion channel: %v", m.env.Rank, err)
			t.Reset(leaseNap)
			select {
			case <-t.C:
			case <-m.runCtx.Done():
				return
			}
			continue
		}
		cq.AckEvents(1)
	}
}

// wake makes the watcher poll the live queues again.
func (m *module) wake() {
	m.rewatch.Store(true)
	if c := m.wakeWatch.Load(); c != nil {
		(*c)()
	}
}

// arm asks every live completion queue for an event on its next
// completion.
func (m *module) arm() {
	if p := m.live.Load(); p != nil {
		for _, ep := range *p {
			ep.cq.ReqNotify(false)
		}
	}
}

// Close closes every pair in order: operations not yet started complete
// with an error wrapping ErrClosed, a close frame tells each connected
// peer (which then fails its operations towards this rank with ErrClosed
// without reporting a failure), and Close waits up to closeLinger for
// them to be delivered. Then the QPs, rings, registrations and the device
// go. Closing twice is a no-op. Close waits for the module's goroutines,
// so it must not be called from a Handler, a Completion or the PeerFailed
// handler.
func (m *module) Close() error {
	return m.shutdown(true)
}

// abort ends the module as a crash would: no close frames (tests).
func (m *module) abort() { m.shutdown(false) }

func (m *module) shutdown(orderly bool) error {
	if !m.closed.CompareAndSwap(false, true) {
		return nil
	}
	m.env.Logf("verbs: rank %d closing: %s", m.env.Rank, m.Status())
	m.mu.Lock() // no endpoint is created after this
	m.mu.Unlock()
	var eps []*endpoint
	for i := range m.eps {
		if ep := m.eps[i].Load(); ep != nil {
			eps = append(eps, ep)
		}
	}
	if orderly {
		var sent []*endpoint
		for _, ep := range eps {
			if ep.sendClose() {
				sent = append(sent, ep)
			}
		}
		deadline := time.Now().Add(closeLinger)
		for len(sent) > 0 && time.Now().Before(deadline) {
			m.pollMu.Lock()
			m.pollLocked()
			m.pollMu.Unlock()
			kept := sent[:0]
			for _, ep := range sent {
				if !ep.closeDelivered() {
					kept = append(kept, ep)
				}
			}
			sent = kept
			if len(sent) > 0 {
				time.Sleep(50 * time.Microsecond)
			}
		}
	}
	m.cancel()
	m.wg.Wait()
	m.pollMu.Lock()
	defer m.pollMu.Unlock()
	for _, ep := range eps {
		ep.close(m.errClosed())
	}
	for _, ep := range eps {
		ep.destroy()
	}
	m.cache.clear()
	m.destroyDevice()
	return nil
}

// destroyDevice releases the module's device objects (those made).
func (m *module) destroyDevice() {
	var errs []error
	if m.pd != nil {
		errs = append(errs, m.pd.Dealloc())
	}
	if m.ch != nil {
		errs = append(errs, m.ch.Close())
	}
	errs = append(errs, m.dev.Close())
	if err := errors.Join(errs...); err != nil {
		m.env.Logf("verbs: rank %d: releasing %s: %v", m.env.Rank, m.attr.Name, err)
	}
}

const (
	allocSmall   = 4 << 10
	allocKeepMax = 64
)

// alloc returns a buffer of length size from the free lists.
func (m *module) alloc(size int) []byte {
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	list, c := &m.large, m.cfg.maxFrag
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
	case cap(b) == m.cfg.maxFrag && len(m.large) < allocKeepMax:
		m.large = append(m.large, b[:0])
	}
}

func contextWithTimeout(m *module) (context.Context, context.CancelFunc) {
	return context.WithTimeout(m.runCtx, m.cfg.connectTimeout)
}
