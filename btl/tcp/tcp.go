// Package tcp is gompi's TCP transport (btl component "tcp").
//
// Open listens (on 127.0.0.1 when every rank is on this host, else on the
// interfaces btl_tcp_if_include names), publishes its addresses in the
// wire-up store under "btl.tcp.<rank>" and returns btl_tcp_links modules.
// Each module keeps at most one connection per peer, made on the first
// operation towards that peer: the dialling side reads the peer's address
// from the store, then both sides authenticate with an HMAC challenge over
// the job secret (handshake.go). Several links give the PML several
// endpoints per peer to stripe large transfers over; fragments are ordered
// per endpoint (per link).
//
// Threading: the modules are btl.Pollers. A goroutine waiting in the PML
// calls Progress, which reads the connected sockets without blocking,
// parses frames (frame.go, reader.go) and calls the Dispatcher on that
// goroutine. Every connection also has a reader goroutine that does the
// same while nobody polls (spinning for btl_tcp_busy_poll, default 200us,
// before it sleeps in poll(2)), and leaves the socket alone while somebody
// does; and a writer goroutine that writes queued frames in batches with
// writev. Sockets are raw descriptors outside Go's netpoller, except when
// ranks outnumber cores: the readers then park on the netpoller
// (sock_linux.go says why).
// A sender that finds the connection idle writes its frame itself, from
// its own goroutine, without a hand-off; what the socket does not take at
// once is queued for the writer goroutine.
//
// Put is emulated: the frame names the target's registration and offset and
// the target's reader reads the payload straight into the registered memory.
// Get (enabled with btl_tcp_flags=...,get) is a request frame answered by a
// data frame that the requester's reader reads straight into the local
// buffer.
package tcp

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

// Open MPI's tcp defaults (btl_tcp_component.c).
var defaults = btl.Defaults{
	Limits: btl.Limits{
		EagerLimit:             64 << 10,
		RndvEagerLimit:         64 << 10,
		MaxSendSize:            128 << 10,
		RDMAPipelineFragSize:   2147482624, // 2 GiB - 1024
		RDMAPipelineSendLength: 128 << 10,
		// Open MPI registers 0, but ob1 applies the pipeline threshold
		// only to transports that register memory (btl_register_mem set,
		// pml_ob1_rdma.c): tcp has none, so every contiguous rendezvous
		// goes as one emulated PUT. The same here: 256 KiB ping-pong
		// 62 -> 40-48 us, bandwidth 2.6-2.9 -> 5.5-5.8 GB/s (forced
		// rdma_put against the default, three alternated runs of
		// gompi-bench; docs/PERFORMANCE.md); 1-4 MiB unchanged or better.
		MinRDMAPipelineSize: math.MaxInt32,
	},
	Caps:        btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut,
	Exclusivity: btl.ExclusivityLow + 100,
}

// have is everything the transport implements; btl_tcp_flags (default
// without get, as Open MPI's tcp) may narrow it.
const have = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut | btl.CapGet

const (
	paramLinks          = "btl_tcp_links"
	paramIfInclude      = "btl_tcp_if_include"
	paramIfExclude      = "btl_tcp_if_exclude"
	paramBusyPoll       = "btl_tcp_busy_poll"
	paramConnectTimeout = "btl_tcp_connect_timeout"
	paramPoll           = "btl_tcp_poll"
	paramSndbuf         = "btl_tcp_sndbuf"
	paramRcvbuf         = "btl_tcp_rcvbuf"
)

// Ranking data: Open MPI's tcp defaults (latency 100 us, bandwidth 100 Mb/s
// per module).
const (
	latencyUS     = 100
	bandwidthMbps = 100
)

// closeLinger bounds how long Close waits for peers to acknowledge the
// close frame before it drops the connections.
const closeLinger = 2 * time.Second

func init() {
	btl.RegisterParams("tcp", defaults)
	params.Register(params.Def{Name: paramLinks, Kind: params.Int, Default: "1",
		Help: "TCP connections (modules) per peer; the PML stripes large transfers over them"})
	params.Register(params.Def{Name: paramIfInclude, Kind: params.String, Default: "",
		Help: "comma list of interface names, addresses or CIDR subnets the tcp transport listens on (default: 127.0.0.1 when every rank is on this host, else every non-loopback interface)"})
	params.Register(params.Def{Name: paramIfExclude, Kind: params.String, Default: "",
		Help: "comma list of interface names, addresses or CIDR subnets the tcp transport does not listen on (not together with btl_tcp_if_include)"})
	params.Register(params.Def{Name: paramBusyPoll, Kind: params.Duration, Default: "200us",
		Help: "how long a tcp reader goroutine spins on its socket before it sleeps in poll(2), when no application goroutine is polling (0: never spin; 0 when oversubscribed unless set explicitly). Spinning makes 1-4 MiB ping-pongs and streaming faster where the reader would otherwise sleep between segments (docs/tuning.md)"})
	params.Register(params.Def{Name: paramPoll, Kind: params.Bool, Default: "true",
		Help: "a goroutine waiting in the PML reads the sockets itself (btl.Poller) instead of waiting for a reader goroutine to be woken; false: only the reader goroutines read"})
	params.Register(params.Def{Name: paramSndbuf, Kind: params.Size, Default: "0",
		Help: "SO_SNDBUF of every connection (0: the kernel's autotuning, as Open MPI's btl_tcp_sndbuf)"})
	params.Register(params.Def{Name: paramRcvbuf, Kind: params.Size, Default: "0",
		Help: "SO_RCVBUF of every connection (0: the kernel's autotuning, as Open MPI's btl_tcp_rcvbuf)"})
	params.Register(params.Def{Name: paramConnectTimeout, Kind: params.Duration, Default: "30s",
		Help: "time allowed to look up a peer's address, connect to it and authenticate"})
	btl.RegisterComponent(component{})
}

type component struct{}

func (component) Name() string { return "tcp" }

// config is the resolved settings of one Open.
type config struct {
	limits         btl.Limits
	caps           btl.Caps
	exclusivity    int
	links          int
	spin           time.Duration
	poll           bool
	lease          bool // readers leave their sockets to pollers (not when oversubscribed)
	netpoll        bool // readers park on the netpoller, not in poll(2) (when oversubscribed)
	sndbuf, rcvbuf int
	connectTimeout time.Duration
	maxSend        int // largest SEND frame, header included: max(eager_limit, max_send_size)
}

func readConfig(env *btl.Env) (config, error) {
	p := env.Params
	l, caps, excl, err := btl.Settings(p, "tcp", have)
	if err != nil {
		return config{}, err
	}
	c := config{limits: l, caps: caps, exclusivity: excl,
		links:          p.Int(paramLinks),
		spin:           p.Duration(paramBusyPoll),
		poll:           p.Bool(paramPoll),
		sndbuf:         p.Int(paramSndbuf),
		rcvbuf:         p.Int(paramRcvbuf),
		connectTimeout: p.Duration(paramConnectTimeout),
		maxSend:        max(l.EagerLimit, l.MaxSendSize),
	}
	if c.links < 1 || c.links > 64 {
		return c, mpierr.Errorf(mpierr.ErrArg, "%s=%d: want 1..64", paramLinks, c.links)
	}
	if c.connectTimeout <= 0 {
		return c, mpierr.Errorf(mpierr.ErrArg, "%s=%v: want a positive duration", paramConnectTimeout, c.connectTimeout)
	}
	if c.maxSend <= 0 || c.maxSend > 1<<30 {
		return c, mpierr.Errorf(mpierr.ErrArg, "btl_tcp_max_send_size/eager_limit %d: want 1..1g", c.maxSend)
	}
	if c.spin < 0 {
		c.spin = 0
	}
	if _, src := p.Value(paramBusyPoll); env.Oversubscribed && src == params.FromDefault {
		c.spin = 0
	}
	// Oversubscribed, the PML's waiters yield the CPU between polls and
	// soon park: the readers then deliver, parked on the netpoller
	// rather than left out of the way of pollers (sock).
	c.lease = c.poll && !env.Oversubscribed
	c.netpoll = env.Oversubscribed
	return c, nil
}

// storeKey is where rank publishes its address blob.
func storeKey(rank int) string { return "btl.tcp." + strconv.Itoa(rank) }

// Open listens, publishes this rank's addresses and returns the link
// modules. Without a wire-up store (singleton or in-process jobs) or a job
// secret it returns an error wrapping mpierr.ErrNotSupported.
func (component) Open(env *btl.Env) ([]btl.Module, error) {
	if env.Store == nil {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "tcp: needs gorun's store to exchange addresses (none in a singleton or in-process job)")
	}
	if len(env.Secret) == 0 {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "tcp: needs the job secret to authenticate peers (none given)")
	}
	cfg, err := readConfig(env)
	if err != nil {
		return nil, err
	}
	ips, err := listenIPs(env, env.Params.String(paramIfInclude), env.Params.String(paramIfExclude))
	if err != nil {
		return nil, err
	}
	sh := &shared{env: env, cfg: cfg, addrs: map[int][]string{}, hsConns: map[net.Conn]struct{}{}}
	sh.hs = hsConfig{secret: env.Secret, jobID: env.JobID, rank: env.Rank, size: env.Size, links: cfg.links, rand: rand.Reader}
	sh.regs.m = map[uint64]*registration{}
	sh.ctx, sh.cancel = context.WithCancel(context.Background())
	var addrs []string
	for _, ip := range ips {
		ln, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip})
		if err != nil {
			sh.closeListeners()
			return nil, fmt.Errorf("tcp: listen on %v: %w", ip, err)
		}
		sh.lns = append(sh.lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	if err := env.Store.Set(storeKey(env.Rank), encodeBlob(cfg.links, addrs)); err != nil {
		sh.closeListeners()
		return nil, fmt.Errorf("tcp: publishing addresses: %w", err)
	}
	mods := make([]btl.Module, cfg.links)
	for i := range cfg.links {
		m := &module{sh: sh, link: i, eps: make([]atomic.Pointer[endpoint], env.Size)}
		m.ctx, m.cancel = context.WithCancel(sh.ctx)
		sh.mods = append(sh.mods, m)
		mods[i] = m
	}
	sh.open.Store(int32(cfg.links))
	for _, ln := range sh.lns {
		sh.wg.Add(1)
		go sh.acceptLoop(ln)
	}
	env.Logf("tcp: rank %d listening on %v, %d link(s), busy poll %v, poll %v", env.Rank, addrs, cfg.links, cfg.spin, cfg.poll)
	return mods, nil
}

// shared is the state of one Open, common to its link modules: listeners,
// the registration table, the peers' addresses.
type shared struct {
	env    *btl.Env
	cfg    config
	hs     hsConfig
	lns    []*net.TCPListener
	regs   regTable
	mods   []*module
	ctx    context.Context // cancelled when the last module closes
	cancel context.CancelFunc
	wg     sync.WaitGroup // accept loops and incoming handshakes
	open   atomic.Int32   // modules not closed yet
	reqs   atomic.Uint64  // Get request ids
	polls  atomic.Uint64  // Progress calls on any link: readers leave their sockets to pollers while it moves

	mu      sync.Mutex            // guards addrs, hsConns, down
	addrs   map[int][]string      // peers' published addresses
	hsConns map[net.Conn]struct{} // incoming connections still in their handshake
	down    bool
}

func (sh *shared) closeListeners() {
	for _, ln := range sh.lns {
		ln.Close()
	}
}

// shutdown stops accepting and waits for the accept side to finish; called
// when the last module closes.
func (sh *shared) shutdown() {
	sh.cancel()
	sh.closeListeners()
	sh.mu.Lock()
	sh.down = true
	for c := range sh.hsConns {
		c.Close()
	}
	sh.mu.Unlock()
	sh.wg.Wait()
}

// peerAddrs returns peer's published addresses, waiting for them in the
// store if needed.
func (sh *shared) peerAddrs(ctx context.Context, peer int) ([]string, error) {
	sh.mu.Lock()
	a, ok := sh.addrs[peer]
	sh.mu.Unlock()
	if ok {
		return a, nil
	}
	b, err := sh.env.Store.Get(ctx, storeKey(peer))
	if err != nil {
		return nil, fmt.Errorf("looking up the address of rank %d: %w", peer, err)
	}
	links, a, err := decodeBlob(b)
	if err != nil {
		return nil, fmt.Errorf("address of rank %d: %w", peer, err)
	}
	if links != sh.cfg.links {
		return nil, fmt.Errorf("rank %d has %s=%d, this rank %d (set the same value on every rank)", peer, paramLinks, links, sh.cfg.links)
	}
	sh.mu.Lock()
	sh.addrs[peer] = a
	sh.mu.Unlock()
	return a, nil
}

func (sh *shared) acceptLoop(ln *net.TCPListener) {
	defer sh.wg.Done()
	delay := time.Millisecond
	for {
		nc, err := ln.AcceptTCP()
		if err != nil {
			if sh.ctx.Err() != nil {
				return
			}
			sh.env.Logf("tcp: accept on %v: %v", ln.Addr(), err)
			select {
			case <-time.After(delay):
			case <-sh.ctx.Done():
				return
			}
			delay = min(2*delay, time.Second)
			continue
		}
		delay = time.Millisecond
		sh.mu.Lock()
		if sh.down {
			sh.mu.Unlock()
			nc.Close()
			return
		}
		sh.hsConns[nc] = struct{}{}
		sh.wg.Add(1)
		sh.mu.Unlock()
		go sh.serveIncoming(nc)
	}
}

// serveIncoming authenticates an accepted connection and hands it to its
// endpoint, or drops it (logged).
func (sh *shared) serveIncoming(nc *net.TCPConn) {
	defer sh.wg.Done()
	keep := false
	defer func() {
		sh.mu.Lock()
		delete(sh.hsConns, nc)
		sh.mu.Unlock()
		if !keep {
			nc.Close()
		}
	}()
	nc.SetDeadline(time.Now().Add(sh.cfg.connectTimeout))
	var ep *endpoint
	hi, v, err := accept(nc, &sh.hs, func(hi *hello) verdict {
		ep = sh.mods[hi.link].endpoint(hi.from)
		if ep == nil {
			return verdictGone
		}
		return ep.decideIncoming()
	})
	if err != nil {
		if v == verdictAccept {
			ep.connectFailed(fmt.Errorf("sending the handshake verdict: %w", err))
		}
		sh.env.Logf("tcp: rank %d: dropping incoming connection from %v: %v", sh.env.Rank, nc.RemoteAddr(), err)
		return
	}
	if v != verdictAccept {
		sh.env.Logf("tcp: rank %d: incoming connection from rank %d link %d %v", sh.env.Rank, hi.from, hi.link, v)
		return
	}
	nc.SetDeadline(time.Time{})
	c, err := newConn(ep, nc)
	if err != nil {
		ep.connectFailed(err)
		return
	}
	keep = ep.attach(c, epAttaching)
}

// regTable is the process's registered memory, shared by the link modules.
type regTable struct {
	mu   sync.RWMutex // guards next, m
	next uint64
	m    map[uint64]*registration
}

// registration is memory registered with Module.Register. Its handle is
// 16 bytes: the id and the length, little-endian u64s.
type registration struct {
	t      *regTable
	id     uint64
	mem    []byte
	access btl.Access
	handle [16]byte
}

func (r *registration) Handle() []byte { return r.handle[:] }

// Release removes the registration; later Put/Get frames naming it are
// protocol errors. Releasing twice returns an error wrapping ErrBadHandle.
func (r *registration) Release() error {
	r.t.mu.Lock()
	defer r.t.mu.Unlock()
	if r.t.m[r.id] != r {
		return fmt.Errorf("tcp: registration %d released twice: %w", r.id, btl.ErrBadHandle)
	}
	delete(r.t.m, r.id)
	return nil
}

// lookup returns length bytes at off of registration id, which must allow
// access.
func (t *regTable) lookup(id, off, length uint64, access btl.Access) ([]byte, error) {
	t.mu.RLock()
	r := t.m[id]
	t.mu.RUnlock()
	if r == nil {
		return nil, protof("unknown registration %d", id)
	}
	if r.access&access == 0 {
		return nil, protof("registration %d does not allow remote %s", id, map[btl.Access]string{btl.AccessRemoteRead: "read", btl.AccessRemoteWrite: "write"}[access])
	}
	if n := uint64(len(r.mem)); off > n || length > n-off {
		return nil, protof("range %d+%d outside registration %d of %d bytes", off, length, id, n)
	}
	return r.mem[off : off+length : off+length], nil
}
