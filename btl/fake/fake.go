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
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
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

// Attach makes the module of world rank rank, delivering to d.
func (n *Network) Attach(rank int, d *btl.Dispatcher, cfg Config) *Module {
	if cfg.Name == "" {
		cfg.Name = Name
	}
	m := &Module{net: n, rank: rank, disp: d, cfg: cfg, eps: map[int]*endpoint{}}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.mods[rank]; dup {
		panic(fmt.Sprintf("fake: rank %d attached twice", rank))
	}
	n.mods[rank] = m
	return m
}

// Module returns the module of rank (nil if none).
func (n *Network) Module(rank int) *Module {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mods[rank]
}

// Len is the number of pending operations.
func (n *Network) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue)
}

// Pending returns a snapshot of the queue, oldest first.
func (n *Network) Pending() []Op {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Op, len(n.queue))
	for i, op := range n.queue {
		out[i] = *op
	}
	return out
}

// Find returns the index of the first pending operation satisfying f, or -1.
func (n *Network) Find(f func(Op) bool) int {
	for i, op := range n.Pending() {
		if f(op) {
			return i
		}
	}
	return -1
}

// Trace returns every event so far, one line each.
func (n *Network) Trace() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.trace...)
}

// Note appends a line of the test's own to the trace.
func (n *Network) Note(format string, a ...any) {
	n.mu.Lock()
	n.trace = append(n.trace, fmt.Sprintf(format, a...))
	n.mu.Unlock()
}

// Violations lists the transport-contract breaches detected so far.
func (n *Network) Violations() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.viol...)
}

// LiveRegistrations is the number of registrations not yet released.
func (n *Network) LiveRegistrations() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.regs)
}

// OutstandingAllocs is the number of Alloc buffers neither sent nor freed.
func (n *Network) OutstandingAllocs() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.allocs
}

func (n *Network) logLocked(format string, a ...any) {
	n.trace = append(n.trace, fmt.Sprintf(format, a...))
}

func (n *Network) violateLocked(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	n.viol = append(n.viol, s)
	n.trace = append(n.trace, "VIOLATION: "+s)
}

// Step delivers the oldest pending operation; false if there is none.
func (n *Network) Step() bool {
	return n.Deliver(0) == nil
}

// Deliver performs pending operation i (0 is the oldest), whatever the
// ordering rules: the test is explicit.
func (n *Network) Deliver(i int) error {
	op, err := n.take(i)
	if err != nil {
		return err
	}
	n.perform(op)
	return nil
}

// DeliverAll delivers pending operations, oldest first, including those
// started meanwhile, until none is left; it returns how many it delivered.
// It stops (with a violation) after a million, as a livelock guard.
func (n *Network) DeliverAll() int {
	const limit = 1 << 20
	for k := 0; k < limit; k++ {
		if !n.Step() {
			return k
		}
	}
	n.mu.Lock()
	n.violateLocked("DeliverAll: still busy after %d deliveries", limit)
	n.mu.Unlock()
	return limit
}

// Drop removes pending operation i without performing it. A dropped send
// completes locally without error (the fragment was lost in flight); a
// dropped Put or Get completes with ErrDropped.
func (n *Network) Drop(i int) error {
	op, err := n.take(i)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.logLocked("#%d %d->%d dropped %s", op.ID, op.From, op.To, n.describeLocked(op))
	n.mu.Unlock()
	if op.Kind.IsSend() {
		n.complete(op, nil)
	} else {
		n.complete(op, ErrDropped)
	}
	return nil
}

func (n *Network) take(i int) (*Op, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i < 0 || i >= len(n.queue) {
		return nil, fmt.Errorf("fake: no pending operation %d (%d pending)", i, len(n.queue))
	}
	op := n.queue[i]
	n.queue = append(n.queue[:i], n.queue[i+1:]...)
	return op, nil
}

// Reorder shuffles the pending queue deterministically from seed. Unless
// SetUnordered(true), the sends of each link keep their order (the btl
// guarantee) and only different links and RDMA operations interleave.
func (n *Network) Reorder(seed uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	if n.unordered {
		rng.Shuffle(len(n.queue), func(i, j int) { n.queue[i], n.queue[j] = n.queue[j], n.queue[i] })
	} else {
		// Lanes: one FIFO per link for sends, one lane per RDMA operation.
		// A random sequence of lane labels, one per operation, taken in
		// order, is a uniformly random interleaving that keeps lane order.
		type lane struct {
			l  link
			op int // 0 for a send lane, else the RDMA operation's ID
		}
		lanes := map[lane][]*Op{}
		labels := make([]lane, 0, len(n.queue))
		for _, op := range n.queue {
			k := lane{l: link{op.From, op.To}}
			if !op.Kind.IsSend() {
				k.op = op.ID
			}
			lanes[k] = append(lanes[k], op)
			labels = append(labels, k)
		}
		rng.Shuffle(len(labels), func(i, j int) { labels[i], labels[j] = labels[j], labels[i] })
		for i, k := range labels {
			n.queue[i] = lanes[k][0]
			lanes[k] = lanes[k][1:]
		}
	}
	ids := make([]string, len(n.queue))
	for i, op := range n.queue {
		ids[i] = fmt.Sprint("#", op.ID)
	}
	n.logLocked("reorder seed=%d -> [%s]", seed, strings.Join(ids, " "))
}

// Cut breaks the link between a and b in both directions: both
// dispatchers get PeerFailed for the other side, then every pending
// operation between them completes with an error wrapping btl.ErrClosed.
// Later operations on the link fail at once with such an error.
func (n *Network) Cut(a, b int) {
	n.cut(a, b, true, true, fmt.Errorf("fake: link %d-%d cut: %w", a, b, btl.ErrClosed))
}

// Kill makes rank r die: every link of r is cut and the survivors'
// dispatchers get PeerFailed(r), with an error wrapping
// mpierr.ErrProcFailed and btl.ErrClosed. r's own dispatcher is not told.
func (n *Network) Kill(r int) {
	n.mu.Lock()
	var peers []int
	for p := range n.mods {
		if p != r {
			peers = append(peers, p)
		}
	}
	n.mu.Unlock()
	sortInts(peers)
	for _, p := range peers {
		n.cut(r, p, false, true, fmt.Errorf("fake: rank %d killed: %w (%w)", r, mpierr.ErrProcFailed, btl.ErrClosed))
	}
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func (n *Network) cut(a, b int, tellA, tellB bool, err error) {
	n.mu.Lock()
	n.dead[link{a, b}] = err
	n.dead[link{b, a}] = err
	var failed []*Op
	kept := n.queue[:0]
	for _, op := range n.queue {
		if (op.From == a && op.To == b) || (op.From == b && op.To == a) {
			failed = append(failed, op)
		} else {
			kept = append(kept, op)
		}
	}
	for i := len(kept); i < len(n.queue); i++ {
		n.queue[i] = nil
	}
	n.queue = kept
	n.logLocked("cut %d-%d: %d pending operations fail", a, b, len(failed))
	ma, mb := n.mods[a], n.mods[b]
	n.mu.Unlock()
	if tellA && ma != nil && ma.disp != nil {
		ma.disp.PeerFailed(b, err)
	}
	if tellB && mb != nil && mb.disp != nil {
		mb.disp.PeerFailed(a, err)
	}
	for _, op := range failed {
		n.complete(op, err)
	}
}

// Inject hands a fragment to rank to's dispatcher as if rank from had sent
// it, at once, bypassing the queue (for protocol-violation tests).
func (n *Network) Inject(from, to int, tag btl.Tag, hdr, data []byte) error {
	n.mu.Lock()
	m := n.mods[to]
	n.mu.Unlock()
	if m == nil {
		return fmt.Errorf("fake: rank %d not attached", to)
	}
	ep, err := m.AddProc(from)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.logLocked("inject %d->%d %s%s", from, to, n.format(tag, hdr), dataSuffix(data))
	n.mu.Unlock()
	m.disp.Dispatch(ep, tag, append([]byte(nil), hdr...), append([]byte(nil), data...))
	return nil
}

func dataSuffix(data []byte) string {
	if len(data) == 0 {
		return ""
	}
	return fmt.Sprintf(" data=%dB", len(data))
}

func (n *Network) describeLocked(op *Op) string {
	if op.Kind.IsSend() {
		return fmt.Sprintf("%s %s%s", op.Kind, n.format(op.Tag, op.Hdr), dataSuffix(op.Data))
	}
	return fmt.Sprintf("%s %s[%d,+%d)", op.Kind, HandleString(op.Handle), op.Off, op.Len)
}

// enqueue queues op (or, inline, performs it at once). It returns whether
// the operation is complete.
func (n *Network) enqueue(op *Op) (done bool) {
	n.mu.Lock()
	n.nextOp++
	op.ID = n.nextOp
	if n.inline {
		n.mu.Unlock()
		op.cb, op.async = nil, false // reported as done by the caller
		n.perform(op)
		return true
	}
	n.queue = append(n.queue, op)
	if op.async {
		n.live[op] = struct{}{}
	}
	if n.starts {
		n.logLocked("  +#%d %d->%d %s", op.ID, op.From, op.To, n.shortLocked(op))
	}
	n.mu.Unlock()
	return false
}

// shortLocked is the first word of the description: the kind and the
// header's name, or the RDMA range.
func (n *Network) shortLocked(op *Op) string {
	if !op.Kind.IsSend() {
		return n.describeLocked(op)
	}
	d := n.format(op.Tag, op.Hdr)
	if i := strings.IndexByte(d, ' '); i > 0 {
		d = d[:i]
	}
	return op.Kind.String() + " " + d
}

// perform delivers op: dispatches a fragment or runs an RDMA operation,
// then calls its completion.
func (n *Network) perform(op *Op) {
	n.mu.Lock()
	if op.ownership && !bytes.Equal(op.orig, op.Data) {
		n.violateLocked("#%d %d->%d %s: the buffer changed while the transport owned it", op.ID, op.From, op.To, op.Kind)
	}
	if err := n.dead[link{op.From, op.To}]; err != nil {
		n.logLocked("#%d %d->%d %s: link cut", op.ID, op.From, op.To, n.describeLocked(op))
		n.mu.Unlock()
		n.complete(op, err)
		return
	}
	to, from := n.mods[op.To], n.mods[op.From]
	if to == nil || from == nil || to.isClosed() || from.isClosed() {
		n.logLocked("#%d %d->%d %s: closed", op.ID, op.From, op.To, n.describeLocked(op))
		n.mu.Unlock()
		n.complete(op, btl.ErrClosed)
		return
	}
	if op.Kind.IsSend() {
		n.logLocked("#%d %d->%d %s", op.ID, op.From, op.To, n.describeLocked(op))
		n.mu.Unlock()
		ep, err := to.AddProc(op.From)
		if errors.Is(err, btl.ErrClosed) {
			// The receiver closed after the check above: as if before it.
			n.complete(op, btl.ErrClosed)
			return
		} else if err != nil {
			panic("fake: reverse endpoint: " + err.Error())
		}
		from.count(func(c *btl.Counters) { c.FragsSent++; c.BytesSent += int64(len(op.Hdr) + len(op.Data)) })
		to.count(func(c *btl.Counters) { c.FragsRecv++; c.BytesRecv += int64(len(op.Hdr) + len(op.Data)) })
		// The handler gets its own copies, scribbled over afterwards: a
		// handler that keeps them past the call sees garbage.
		h := append([]byte(nil), op.Hdr...)
		d := append([]byte(nil), op.Data...)
		to.disp.Dispatch(ep, op.Tag, h, d)
		scribble(h)
		scribble(d)
		n.complete(op, nil)
		return
	}
	err := op.Fail
	if err == nil {
		var rg *region
		rg, err = n.lookupLocked(op.Handle, op.Off, op.Len, op.To, op.Kind)
		if err != nil && errors.Is(err, errReleased) {
			n.violateLocked("#%d %s on a released registration", op.ID, op.Kind)
		}
		if err == nil {
			if op.Kind == KindPut {
				copy(rg.mem[op.Off:op.Off+op.Len], op.Data)
			} else {
				copy(op.local, rg.mem[op.Off:op.Off+op.Len])
			}
		}
	}
	status := "ok"
	if err != nil {
		status = "FAILED: " + err.Error()
	}
	n.logLocked("#%d %d->%d %s %s", op.ID, op.From, op.To, n.describeLocked(op), status)
	n.mu.Unlock()
	if err == nil {
		if op.Kind == KindPut {
			from.count(func(c *btl.Counters) { c.Puts++; c.PutBytes += int64(op.Len) })
		} else {
			from.count(func(c *btl.Counters) { c.Gets++; c.GetBytes += int64(op.Len) })
		}
	}
	n.complete(op, err)
}

// complete runs op's completion with err, then tells the fences (Flush)
// that wait for op.
func (n *Network) complete(op *Op, err error) {
	if op.cb != nil {
		op.cb(err)
	}
	if !op.async {
		return
	}
	n.mu.Lock()
	delete(n.live, op)
	var done []*fence
	for _, f := range op.fences {
		if err != nil && f.err == nil {
			f.err = err
		}
		if f.out--; f.out == 0 {
			done = append(done, f)
			n.logLocked("%d->%d flush done", op.From, op.To)
		}
	}
	op.fences = nil
	n.mu.Unlock()
	for _, f := range done {
		f.cb(f.err)
	}
}

func scribble(b []byte) {
	for i := range b {
		b[i] = 0xdb
	}
}

var errReleased = errors.New("registration released")

// lookupLocked finds the registration named by handle and checks that it
// belongs to owner, covers [off, off+n) and allows the access of kind.
func (n *Network) lookupLocked(handle []byte, off, size, owner int, kind Kind) (*region, error) {
	if len(handle) != 16 {
		return nil, fmt.Errorf("fake: handle of %d bytes: %w", len(handle), btl.ErrBadHandle)
	}
	id := binary.LittleEndian.Uint64(handle)
	rg := n.regs[id]
	if rg == nil {
		if id == 0 || id > n.nextRg {
			return nil, fmt.Errorf("fake: reg%d does not exist: %w", id, btl.ErrBadHandle)
		}
		return nil, fmt.Errorf("fake: reg%d: %w: %w", id, errReleased, btl.ErrBadHandle)
	}
	if uint64(len(rg.mem)) != binary.LittleEndian.Uint64(handle[8:]) {
		return nil, fmt.Errorf("fake: reg%d: handle length mismatch: %w", id, btl.ErrBadHandle)
	}
	if rg.owner != owner {
		return nil, fmt.Errorf("fake: reg%d belongs to rank %d, not %d: %w", id, rg.owner, owner, btl.ErrBadHandle)
	}
	if off < 0 || size < 0 || off > len(rg.mem) || size > len(rg.mem)-off {
		return nil, fmt.Errorf("fake: range [%d,+%d) outside reg%d of %d bytes: %w", off, size, id, len(rg.mem), btl.ErrBadHandle)
	}
	need := btl.AccessRemoteWrite
	if kind == KindGet {
		need = btl.AccessRemoteRead
	}
	if rg.access&need == 0 {
		return nil, fmt.Errorf("fake: reg%d lacks %s access: %w", id, accessString(need), btl.ErrBadHandle)
	}
	return rg, nil
}

// HandleString names a fake registration handle ("reg3"), for traces.
func HandleString(h []byte) string {
	if len(h) != 16 {
		return fmt.Sprintf("handle(%dB)", len(h))
	}
	return fmt.Sprintf("reg%d", binary.LittleEndian.Uint64(h))
}

func accessString(a btl.Access) string {
	var p []string
	if a&btl.AccessLocalWrite != 0 {
		p = append(p, "lw")
	}
	if a&btl.AccessRemoteRead != 0 {
		p = append(p, "rr")
	}
	if a&btl.AccessRemoteWrite != 0 {
		p = append(p, "rw")
	}
	return strings.Join(p, ",")
}

// ---- modules ----

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

// ---- endpoints ----

type endpoint struct {
	m    *Module
	peer int
	pub  btl.Endpoint // what AddProc hands out: this endpoint, or its syncEndpoint
}

var (
	_ btl.Endpoint   = (*endpoint)(nil)
	_ btl.SyncGetter = (*syncEndpoint)(nil)
)

func (e *endpoint) Module() btl.Module { return e.m }
func (e *endpoint) Peer() int          { return e.peer }

// usable returns the error that stops an operation on e now, if any.
func (e *endpoint) usable() error {
	if e.m.isClosed() {
		return fmt.Errorf("fake: rank %d closed: %w", e.m.rank, btl.ErrClosed)
	}
	n := e.m.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := n.dead[link{e.m.rank, e.peer}]; err != nil {
		return err
	}
	return nil
}

func (e *endpoint) checkSize(kind Kind, size int) {
	l := e.m.cfg.Limits
	if lim := max(l.EagerLimit, l.MaxSendSize); size > lim {
		n := e.m.net
		n.mu.Lock()
		n.violateLocked("%d->%d %s of %d bytes exceeds the fragment limit %d", e.m.rank, e.peer, kind, size, lim)
		n.mu.Unlock()
	}
}

func (e *endpoint) newSend(kind Kind, tag btl.Tag, hdr, data []byte) *Op {
	return &Op{Kind: kind, From: e.m.rank, To: e.peer, Tag: tag,
		Hdr: append([]byte(nil), hdr...), Data: append([]byte(nil), data...)}
}

// SendImmediate queues hdr+data (copied) or refuses with btl.ErrWouldBlock
// when the module lacks CapSendImmediate or RefuseImmediate says so.
func (e *endpoint) SendImmediate(tag btl.Tag, hdr, data []byte) error {
	if err := e.usable(); err != nil {
		return err
	}
	n := e.m.net
	n.mu.Lock()
	if n.refuseImm != 0 {
		if n.refuseImm > 0 {
			n.refuseImm--
		}
		n.logLocked("%d->%d sendi refused (would block)", e.m.rank, e.peer)
		n.mu.Unlock()
		return btl.ErrWouldBlock
	}
	n.mu.Unlock()
	if e.m.cfg.Caps&btl.CapSendImmediate == 0 {
		return btl.ErrWouldBlock
	}
	e.checkSize(KindSendImmediate, len(hdr)+len(data))
	n.enqueue(e.newSend(KindSendImmediate, tag, hdr, data))
	return nil
}

// Send queues hdr+data. The fake copies both at once but checks at
// delivery that data did not change meanwhile (the module owns it until
// completion). Completion comes on delivery, unless inline or
// SetLocalCompletion.
func (e *endpoint) Send(tag btl.Tag, hdr, data []byte, cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	if e.m.cfg.Caps&btl.CapSend == 0 {
		return false, mpierr.Errorf(mpierr.ErrNotSupported, "fake: send without CapSend")
	}
	if e.wouldBlock(KindSend) {
		return false, errWouldBlock(KindSend)
	}
	e.checkSize(KindSend, len(hdr)+len(data))
	op := e.newSend(KindSend, tag, hdr, data)
	return e.start(op, data, cb), nil
}

// wouldBlock says whether an operation of kind on e is refused now
// (Network.WouldBlock, WouldBlockRate).
func (e *endpoint) wouldBlock(kind Kind) bool {
	n := e.m.net
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.wouldBlockLocked(e.m.rank, e.peer, kind)
}

func (e *endpoint) start(op *Op, owned []byte, cb btl.Completion) bool {
	n := e.m.net
	n.mu.Lock()
	local := n.localDone
	n.mu.Unlock()
	if len(owned) > 0 && !local {
		op.orig, op.ownership = owned, true
	}
	if !local {
		op.cb, op.async = cb, true
	}
	if n.enqueue(op) {
		return true
	}
	return local
}

// Alloc returns a fresh buffer of size bytes, or btl.ErrWouldBlock when
// RefuseAlloc says so.
func (e *endpoint) Alloc(size int) ([]byte, error) {
	if err := e.usable(); err != nil {
		return nil, err
	}
	n := e.m.net
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.refuseAlc != 0 {
		if n.refuseAlc > 0 {
			n.refuseAlc--
		}
		n.logLocked("%d->%d alloc refused (would block)", e.m.rank, e.peer)
		return nil, btl.ErrWouldBlock
	}
	n.allocs++
	return make([]byte, size), nil
}

// SendAlloc queues buf (from Alloc); its first hdrLen bytes are the header.
func (e *endpoint) SendAlloc(tag btl.Tag, buf []byte, hdrLen int, cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	if hdrLen < 0 || hdrLen > len(buf) {
		return false, mpierr.Errorf(mpierr.ErrArg, "fake: header of %d bytes in a %d-byte buffer", hdrLen, len(buf))
	}
	n := e.m.net
	n.mu.Lock()
	if n.wouldBlockLocked(e.m.rank, e.peer, KindSendAlloc) {
		n.mu.Unlock()
		return false, errWouldBlock(KindSendAlloc) // buf stays the caller's
	}
	n.allocs--
	n.mu.Unlock()
	e.checkSize(KindSendAlloc, len(buf))
	op := e.newSend(KindSendAlloc, tag, buf[:hdrLen], buf[hdrLen:])
	return e.start(op, buf[hdrLen:], cb), nil
}

// Free returns an unsent Alloc buffer.
func (e *endpoint) Free([]byte) {
	n := e.m.net
	n.mu.Lock()
	n.allocs--
	n.mu.Unlock()
}

func (e *endpoint) rdma(kind Kind, local, handle []byte, off int, cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	need := btl.CapPut
	if kind == KindGet {
		need = btl.CapGet
	}
	if e.m.cfg.Caps&need == 0 {
		return false, mpierr.Errorf(mpierr.ErrNotSupported, "fake: %s without the capability", kind)
	}
	n := e.m.net
	n.mu.Lock()
	if _, err := n.lookupLocked(handle, off, len(local), e.peer, kind); err != nil {
		n.mu.Unlock()
		return false, err
	}
	if cb != nil && n.wouldBlockLocked(e.m.rank, e.peer, kind) { // (GetNow passes no cb: it cannot be refused)
		n.mu.Unlock()
		return false, errWouldBlock(kind)
	}
	if l := e.m.cfg.Limits.MaxRDMASize; l > 0 && len(local) > l {
		n.violateLocked("%d->%d %s of %d bytes exceeds MaxRDMASize %d", e.m.rank, e.peer, kind, len(local), l)
	}
	op := &Op{Kind: kind, From: e.m.rank, To: e.peer, Handle: append([]byte(nil), handle...), Off: off, Len: len(local), cb: cb, async: true}
	if kind == KindPut {
		op.Data = append([]byte(nil), local...)
		op.orig, op.ownership = local, true
		if n.failPut > 0 {
			n.failPut--
			op.Fail = fmt.Errorf("fake: put: %w", ErrInjected)
		}
	} else {
		op.local = local
		if n.failGet > 0 {
			n.failGet--
			op.Fail = fmt.Errorf("fake: get: %w", ErrInjected)
		}
	}
	if n.inline && op.Fail != nil {
		n.nextOp++
		op.ID = n.nextOp
		n.logLocked("#%d %d->%d %s FAILED: %v", op.ID, op.From, op.To, n.describeLocked(op), op.Fail)
		n.mu.Unlock()
		return false, op.Fail
	}
	n.mu.Unlock()
	return n.enqueue(op), nil
}

// Put queues an RDMA write of local into the peer's registration at off.
// The handle and range are checked at once (btl.ErrBadHandle) and again at
// delivery.
func (e *endpoint) Put(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(KindPut, local, handle, off, cb)
}

// Get queues an RDMA read from the peer's registration at off into local.
func (e *endpoint) Get(local []byte, handle []byte, off int, cb btl.Completion) (bool, error) {
	return e.rdma(KindGet, local, handle, off, cb)
}

// Flush completes once the operations this endpoint started before it,
// and reported not done, have completed (delivered, dropped, or failed by
// a cut or a close): at once when there are none, else through cb when
// the last of them completes (with the first error they completed with).
// An error return: the module is closed or the link is cut.
func (e *endpoint) Flush(cb btl.Completion) (bool, error) {
	if err := e.usable(); err != nil {
		return false, err
	}
	n := e.m.net
	n.mu.Lock()
	f := &fence{cb: cb}
	for op := range n.live {
		if op.From == e.m.rank && op.To == e.peer {
			op.fences = append(op.fences, f)
			f.out++
		}
	}
	n.logLocked("%d->%d flush: %d outstanding", e.m.rank, e.peer, f.out)
	done := f.out == 0
	n.mu.Unlock()
	return done, nil
}
