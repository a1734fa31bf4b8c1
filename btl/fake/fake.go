// Package fake is a deterministic in-memory transport for testing what
// sits above the btl interface (the PML, the tensor rendezvous), in the
// manner of netstack's link/channel and raft's test network.
//
// Nothing is delivered until the test says so. Every outbound operation
// (Send, SendImmediate, SendAlloc, Put, Get) is copied into an Op on the
// Network's pending queue; the test drives delivery with Step, Deliver and
// DeliverAll, shuffles the queue with Reorder, loses operations with Drop,
// breaks links with Cut and Kill, and injects failures with FailNextPut,
// FailNextGet, RefuseImmediate and RefuseAlloc, and full queues with
// WouldBlock and WouldBlockRate (Send, SendAlloc, Put and Get refuse with
// btl.ErrWouldBlock, by count or by a seeded rate). Trace returns one readable
// line per event; Violations lists the transport-contract breaches the
// fake detected in its user (a buffer changed while the transport owned
// it, a fragment above the size limits, RDMA on released memory).
//
// Usage: n := NewNetwork(); m0 := n.Attach(0, &d0, cfg); m1 := n.Attach(1,
// &d1, cfg); ep, _ := m0.AddProc(1); ... then n.Step() until n.Len() == 0.
// SetInline(true) turns the fake into a synchronous transport (like
// btl/self): every operation is performed on the caller's goroutine before
// it returns.
//
// Completion semantics, as a real asynchronous transport: Send and SendAlloc
// return done == false and call their Completion when the test delivers the
// fragment (SetLocalCompletion(true) makes them complete at once instead);
// Put and Get complete through their Completion when delivered; Flush
// completes when the last operation its endpoint started before it and
// reported not done has completed. Handlers run
// on the goroutine that calls Deliver (or Step, DeliverAll); the fake never
// holds its lock while calling a handler or a completion.
package fake

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/params"
)

// Name is the component name used for parameters (btl_fake_*).
const Name = "fake"

// AllCaps is every capability the fake can offer.
const AllCaps = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut | btl.CapGet

// DefaultLimits are the registered defaults of btl_fake_*: small enough
// that every protocol shows up with messages of a few KiB.
var DefaultLimits = btl.Limits{
	EagerLimit:             1024,
	RndvEagerLimit:         1024,
	MaxSendSize:            2048,
	RDMAPipelineFragSize:   2048,
	RDMAPipelineSendLength: 1024,
	MinRDMAPipelineSize:    4096,
}

func init() {
	btl.RegisterParams(Name, btl.Defaults{Limits: DefaultLimits, Caps: AllCaps, Exclusivity: btl.ExclusivityDefault})
}

// Config describes one fake module.
type Config struct {
	Name        string // Module.Name(); empty means "fake"
	Caps        btl.Caps
	Limits      btl.Limits
	Exclusivity int
	Latency     int // microseconds (reported only)
	Bandwidth   int // Mb/s (reported only)
	// SyncGet: the endpoints also implement btl.SyncGetter, whose GetNow
	// needs an inline network (SetInline): on a queued one it is a
	// violation and fails.
	SyncGet bool
}

// DefaultConfig is every capability with DefaultLimits.
func DefaultConfig() Config {
	return Config{Name: Name, Caps: AllCaps, Limits: DefaultLimits, Exclusivity: btl.ExclusivityDefault, Bandwidth: 1000}
}

// ConfigFromParams reads btl_fake_* from p (btl.Settings).
func ConfigFromParams(p *params.Set) (Config, error) {
	lim, caps, excl, err := btl.Settings(p, Name, AllCaps)
	if err != nil {
		return Config{}, err
	}
	return Config{Name: Name, Caps: caps, Limits: lim, Exclusivity: excl, Bandwidth: 1000}, nil
}

// Component opens one module of Net per process instance, configured from
// the instance's parameters. It is not registered globally: a test hands
// it to whatever opens components.
type Component struct{ Net *Network }

// Name is "fake".
func (c Component) Name() string { return Name }

// Open attaches env.Rank to the network.
func (c Component) Open(env *btl.Env) ([]btl.Module, error) {
	cfg, err := ConfigFromParams(env.Params)
	if err != nil {
		return nil, err
	}
	return []btl.Module{c.Net.Attach(env.Rank, env.Dispatch, cfg)}, nil
}

// Kind is the kind of a queued operation.
type Kind uint8

const (
	KindSend          Kind = iota // Endpoint.Send
	KindSendImmediate             // Endpoint.SendImmediate
	KindSendAlloc                 // Endpoint.SendAlloc
	KindPut                       // Endpoint.Put: From writes into To's registered memory
	KindGet                       // Endpoint.Get: From reads To's registered memory
)

var kindNames = [...]string{"send", "sendi", "alloc", "rdma-put", "rdma-get"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return "kind?"
}

// IsSend reports whether k carries a fragment to a handler.
func (k Kind) IsSend() bool { return k <= KindSendAlloc }

// Errors the fake reports.
var (
	// ErrInjected is the error of an RDMA operation failed by FailNextPut
	// or FailNextGet.
	ErrInjected = errors.New("fake: injected failure")
	// ErrDropped completes an RDMA operation removed by Drop.
	ErrDropped = errors.New("fake: operation dropped")
)

// Op is one queued operation. Hdr and Data are the fake's copies, taken
// when the operation was started; treat them as read-only.
type Op struct {
	ID       int // 1, 2, ... in the order operations were started
	Kind     Kind
	From, To int // world ranks: the initiator and its peer
	Tag      btl.Tag
	Hdr      []byte // sends: the header
	Data     []byte // sends: the payload; Put: the bytes to write
	Handle   []byte // Put/Get: the remote registration handle
	Off, Len int    // Put/Get: range in the remote registration
	Fail     error  // the operation will complete with this error (injected)

	orig      []byte         // the caller's memory the transport owns until completion
	local     []byte         // Get: destination
	cb        btl.Completion // nil when done was returned at start
	ownership bool           // check orig against Data at delivery
	async     bool           // its start returned done == false: a Flush waits for it
	fences    []*fence       // the Flushes waiting for it (guarded by Network.mu)
}

// fence is a Flush waiting for operations of its endpoint.
type fence struct {
	out int   // operations not completed yet (guarded by Network.mu)
	err error // the first error one completed with
	cb  btl.Completion
}

// Formatter describes a fragment's header for the trace.
type Formatter func(tag btl.Tag, hdr []byte) string

func defaultFormat(tag btl.Tag, hdr []byte) string {
	return fmt.Sprintf("tag=%#x hdr=%dB", uint8(tag), len(hdr))
}

type link struct{ a, b int }

type region struct {
	id     uint64
	owner  int
	mem    []byte
	access btl.Access
}

// Network connects the fake modules of one test. All methods are safe for
// concurrent use.
type Network struct {
	mu     sync.Mutex
	mods   map[int]*Module
	queue  []*Op
	nextOp int
	regs   map[uint64]*region
	nextRg uint64
	dead   map[link]error
	trace  []string
	viol   []string
	format Formatter

	inline    bool
	starts    bool // trace operations when started, not only when delivered
	unordered bool
	localDone bool
	failPut   int
	failGet   int
	refuseImm int        // < 0: always
	refuseAlc int        // < 0: always
	blockN    int        // Send, SendAlloc, Put, Get refused with ErrWouldBlock (< 0: always)
	blockRate float64    // and this fraction of the others, drawn from blockRng
	blockRng  *rand.Rand // nil: no rate
	allocs    int
	live      map[*Op]struct{} // started, reported not done, not completed yet (Flush waits for them)
}

// NewNetwork makes an empty network.
func NewNetwork() *Network {
	return &Network{mods: map[int]*Module{}, regs: map[uint64]*region{}, dead: map[link]error{}, live: map[*Op]struct{}{}, format: defaultFormat, starts: true}
}

// SetFormatter sets how fragment headers are described in the trace.
func (n *Network) SetFormatter(f Formatter) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if f == nil {
		f = defaultFormat
	}
	n.format = f
}

// SetInline makes every later operation happen on the caller's goroutine
// during the call (a synchronous transport like btl/self): sends are
// delivered and return done == true, RDMA operations copy and return done
// == true (or return an injected failure as their error).
func (n *Network) SetInline(on bool) { n.mu.Lock(); n.inline = on; n.mu.Unlock() }

// SetTraceStarts says whether the trace gets a short "  +#n" line when an
// operation is queued (default true), besides the full line on delivery.
func (n *Network) SetTraceStarts(on bool) { n.mu.Lock(); n.starts = on; n.mu.Unlock() }

// SetUnordered lets Reorder permute fragments of one link. By default
// Reorder keeps the btl guarantee that the sends of one endpoint arrive in
// order, and only interleaves different links and RDMA operations.
func (n *Network) SetUnordered(on bool) { n.mu.Lock(); n.unordered = on; n.mu.Unlock() }

// SetLocalCompletion makes Send and SendAlloc report done == true at once
// (the data was copied) while delivery still waits for the test.
func (n *Network) SetLocalCompletion(on bool) { n.mu.Lock(); n.localDone = on; n.mu.Unlock() }

// FailNextPut makes the next Put complete with ErrInjected (no bytes written).
func (n *Network) FailNextPut() { n.mu.Lock(); n.failPut++; n.mu.Unlock() }

// FailNextGet makes the next Get complete with ErrInjected (no bytes read).
func (n *Network) FailNextGet() { n.mu.Lock(); n.failGet++; n.mu.Unlock() }

// RefuseImmediate makes the next count SendImmediate calls fail with
// btl.ErrWouldBlock (count < 0: every call until RefuseImmediate(0)).
func (n *Network) RefuseImmediate(count int) { n.mu.Lock(); n.refuseImm = count; n.mu.Unlock() }

// RefuseAlloc makes the next count Alloc calls fail with btl.ErrWouldBlock
// (count < 0: every call until RefuseAlloc(0)).
func (n *Network) RefuseAlloc(count int) { n.mu.Lock(); n.refuseAlc = count; n.mu.Unlock() }

// WouldBlock makes the next count Send, SendAlloc, Put and Get calls
// (count < 0: every call until WouldBlock(0)) refuse with an error
// wrapping btl.ErrWouldBlock, as a transport whose queue to the peer is
// full: nothing is queued and the completion is not called.
func (n *Network) WouldBlock(count int) { n.mu.Lock(); n.blockN = count; n.mu.Unlock() }

// WouldBlockRate makes Send, SendAlloc, Put and Get calls refuse with
// btl.ErrWouldBlock with probability rate, drawn from a generator seeded
// with seed (the same calls in the same order get the same answers).
// rate 0 turns it off. WouldBlock's count is used up first.
func (n *Network) WouldBlockRate(rate float64, seed uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.blockRate, n.blockRng = rate, nil
	if rate > 0 {
		n.blockRng = rand.New(rand.NewPCG(seed, 0x2545f4914f6cdd1d))
	}
}

// wouldBlockLocked says whether this operation is refused (WouldBlock,
// WouldBlockRate), and traces the refusal.
func (n *Network) wouldBlockLocked(from, to int, kind Kind) bool {
	refuse := false
	switch {
	case n.blockN != 0:
		if n.blockN > 0 {
			n.blockN--
		}
		refuse = true
	case n.blockRng != nil:
		refuse = n.blockRng.Float64() < n.blockRate
	}
	if refuse {
		n.logLocked("%d->%d %s would block", from, to, kind)
	}
	return refuse
}

func errWouldBlock(kind Kind) error {
	return fmt.Errorf("fake: %s: queue full: %w", kind, btl.ErrWouldBlock)
}
