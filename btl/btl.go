// Package btl defines the byte transfer layer: what every transport (self,
// sm, tcp, verbs) offers to the point-to-point messaging layer (pml).
//
// A transport is a Component. At start-up the job opens every enabled
// component with an Env (Open); a component returns zero or more Modules (a
// NIC, a shared-memory segment). For each peer rank Reach asks every module
// for an Endpoint and chooses the one of the highest exclusivity, which the
// PML then sends by. Modules describe themselves as data (Caps, Limits,
// Exclusivity, Latency, Bandwidth); the PML chooses protocols from that data
// alone.
//
// Calls go down as methods; data comes up through one Dispatcher per process
// instance: a module hands every inbound fragment to the handler registered
// for its tag, and reports a dead peer through Dispatcher.PeerFailed. No other
// callbacks cross the layer, except the completion callbacks of Send, Put,
// Get and Flush.
//
// Every transport implements Component, Module and Endpoint. The optional
// interfaces below let a transport save the PML work; the PML works without
// any of them, and each is defined in this file:
//
//	interface         on        implement it when                                    implemented by
//	Poller            Module    inbound fragments are found by polling               sm, tcp, verbs
//	ConcurrentPoller  Module    Progress may run on several goroutines at once       sm, tcp, verbs
//	HeldPoller        Module    a spinning waiter may keep the poll lock             sm
//	BackgroundNapper  Module    Block sleeps in a system call holding the processor  sm
//	Spinner           Module    small fragments are handed to the receiver's poll    self
//	Counted           Module    the transport counts its traffic (gorun --stats)     all
//	HeaderSender      Endpoint  an immediate send can take its header by value       self, sm
//	SyncGetter        Endpoint  Get always completes within the call                 self, sm
//
// and Dispatcher.RegisterRun, for a transport that finds several fragments
// of one peer at once (sm's fast boxes): the PML matches a run under one
// hold of its lock.
package btl

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

// Tag selects the handler of an inbound fragment. The PML uses 0x40-0x5f;
// the tensor rendezvous 0x60-0x6f; transports may use 0x10-0x3f privately.
type Tag uint8

// Caps is a module's capability bitfield.
type Caps uint32

const (
	CapSend          Caps = 1 << iota // tagged active messages (Send, Alloc/SendAlloc)
	CapSendImmediate                  // SendImmediate may succeed
	CapSendInPlace                    // Send transmits from the caller's data slice without copying it first
	CapPut                            // RDMA write into registered remote memory
	CapGet                            // RDMA read from registered remote memory
)

// CapRDMA is Put and Get.
const CapRDMA = CapPut | CapGet

var capNames = []struct {
	c    Caps
	name string
}{{CapSend, "send"}, {CapSendImmediate, "sendi"}, {CapSendInPlace, "inplace"}, {CapPut, "put"}, {CapGet, "get"}}

func (c Caps) String() string {
	var parts []string
	for _, n := range capNames {
		if c&n.c != 0 {
			parts = append(parts, n.name)
		}
	}
	return strings.Join(parts, ",")
}

// ParseCaps parses a comma list of send, sendi, inplace, put, get.
func ParseCaps(s string) (Caps, error) {
	var c Caps
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		found := false
		for _, n := range capNames {
			if n.name == f {
				c |= n.c
				found = true
			}
		}
		if !found {
			return 0, mpierr.Errorf(mpierr.ErrArg, "unknown transport flag %q (want send, sendi, inplace, put, get)", f)
		}
	}
	return c, nil
}

// Limits are a module's protocol thresholds, in bytes (see Open MPI's btl.h).
type Limits struct {
	EagerLimit             int // largest fragment (header included) sent eagerly
	RndvEagerLimit         int // largest payload carried by the first fragment of a rendezvous
	MaxSendSize            int // largest fragment (header included) of a send pipeline
	RDMAPipelineFragSize   int // largest RDMA operation of the RDMA pipeline
	RDMAPipelineSendLength int // bytes at the end of an RDMA-pipelined message that go by send
	MinRDMAPipelineSize    int // messages up to this size may use RDMA without leave-pinned
	MaxRDMASize            int // largest single Put/Get (0: unlimited)
}

// Exclusivity levels: the reachable module with the highest wins a peer.
const (
	ExclusivityLow     = 0
	ExclusivityDefault = 1024
	ExclusivityHigh    = 65536
)

// Access flags for memory registration.
type Access uint8

const (
	AccessLocalWrite  Access = 1 << iota // the module may write into the memory locally (Get destination)
	AccessRemoteRead                     // peers may Get from it
	AccessRemoteWrite                    // peers may Put into it
)

// Registration is memory made reachable by peers.
type Registration interface {
	// Handle returns the bytes a peer passes to Endpoint.Put/Get to reach
	// this memory. The slice is owned by the registration; copy it.
	Handle() []byte
	// Release ends the registration. Peers must not use the handle after.
	Release() error
}

// Completion is called exactly once when an asynchronous operation that
// did not complete at once finishes: err is nil on success. It may run on any
// goroutine, but never while the module holds a lock that the caller of the
// operation could need.
type Completion func(err error)

// Errors every module returns in the documented places.
var (
	// ErrWouldBlock: the module has no resources for the operation now.
	// SendImmediate and Alloc return it when they cannot go ahead at once;
	// Send, SendAlloc, Put and Get may return an error wrapping it when
	// the module's queue to that peer is full (a NIC's send queue, its
	// credits). Then nothing was posted or delivered, the completion is
	// not called, the caller still owns every buffer it passed (a
	// SendAlloc's buf included: send it again later or Free it), and it
	// retries later, after polling the module (Poller.Progress), which is
	// what frees queue space.
	ErrWouldBlock = errors.New("btl: would block")
	// ErrUnreachable: the module cannot reach that peer.
	ErrUnreachable = errors.New("btl: peer unreachable")
	// ErrClosed: the module or endpoint is closed.
	ErrClosed = errors.New("btl: closed")
	// ErrBadHandle: a remote registration handle that does not decode or
	// does not cover the requested range.
	ErrBadHandle = errors.New("btl: bad registration handle")
)

// Module is one instance of a transport.
type Module interface {
	Name() string // component name: self, sm, tcp, verbs
	Caps() Caps   // effective capabilities (after btl_<name>_flags)
	Limits() Limits
	Exclusivity() int
	Latency() int   // microseconds, for ranking
	Bandwidth() int // Mb/s, for ranking and striping

	// AddProc returns an endpoint for world rank peer, or an error wrapping
	// ErrUnreachable when this module cannot reach it. Connection set-up may
	// be lazy (on first send). The same endpoint is returned on every call.
	AddProc(peer int) (Endpoint, error)

	// Register makes mem reachable by peers with the given access. mem must
	// stay valid (and, for Go memory, reachable) until Release.
	Register(mem []byte, access Access) (Registration, error)

	// Close tears the module down: pending operations complete with an
	// error wrapping ErrClosed, and so does every later call. An orderly
	// Close is not a peer failure (no Dispatcher.PeerFailed for it). Close
	// must not be called from a Handler or a completion callback.
	Close() error
}

// HeaderSender is implemented by endpoints that also take a 16-byte
// header by value, as two little-endian words: SendImmediateHeader(tag,
// h0, h1, data) is SendImmediate(tag, h, data) where h holds h0 then h1.
// A slice passed through the Endpoint interface escapes, so a caller of
// SendImmediate must keep its header on the heap (the PML took a pooled
// buffer per message); words stay in registers. The 8 B one-way message
// of go test -bench 'PMLRoundTrip/size=8B$' ./btl/sm measures the choice.
//
// Unlike the endpoint's other sends, fragments sent this way are not
// ordered: the in-process transport may leave one in a ring for the
// receiving rank to dispatch while a later one (of either kind) is
// delivered directly (btl/self's handoff.go). Use it only for fragments
// the receiver puts in order itself (the PML's sequenced match headers).
type HeaderSender interface {
	SendImmediateHeader(tag Tag, h0, h1 uint64, data []byte) error
}

// Spinner is implemented by modules whose senders hand small fragments
// to the receiving process instance to dispatch on its own goroutines,
// when it polls, rather than on the sender's (the in-process transport).
// Senders hand off only once the instance called Enable; from then on it
// must poll (Poll) in every call that can observe a message, and a
// goroutine of it must not block without saying so: Park before it
// blocks (senders then dispatch themselves; what is already handed over
// is dispatched) and Unpark after. SpinFor(size) is how long a waiter for
// messages of at most size bytes (its receive buffers) may poll before it
// parks (0: it should not spin). Poll returns how many fragments it
// dispatched.
type Spinner interface {
	Enable()
	SpinFor(size int) time.Duration
	Poll() int
	Park()
	Unpark()
}

// SyncGetter is an optional Endpoint interface for transports whose Get
// always finishes before it returns (shared memory, in-process): GetNow is
// Get without a completion, so the caller allocates none (a closure per
// rendezvous). It returns Get's error; nil means the bytes are in local.
type SyncGetter interface {
	GetNow(local, handle []byte, off int) error
}

// Endpoint is a module's connection to one peer. All methods are safe for
// concurrent use. Fragments sent with Send, SendImmediate and SendAlloc on
// one endpoint arrive in order (per endpoint, not across endpoints).
//
// Send, SendAlloc, Put and Get may refuse with an error wrapping
// ErrWouldBlock when the module's queue to the peer is full (see
// ErrWouldBlock: nothing happened, the caller retries). A caller that
// needs its fragments in order must then hold back its later operations
// on the endpoint until the refused one went through.
type Endpoint interface {
	Module() Module
	Peer() int // world rank

	// SendImmediate delivers hdr+data now or refuses with ErrWouldBlock. On
	// return (success or not) the module no longer references hdr or data.
	SendImmediate(tag Tag, hdr, data []byte) error

	// Send transmits hdr followed by data as one fragment; len(hdr)+len(data)
	// is at most max(Limits().EagerLimit, Limits().MaxSendSize). hdr
	// is copied before Send returns. data is owned by the module until the
	// operation completes: done == true means it completed during the call
	// (cb is not called); otherwise cb is called once later. An error return
	// means nothing was sent and cb is not called.
	Send(tag Tag, hdr, data []byte, cb Completion) (done bool, err error)

	// Alloc returns a module-owned buffer of exactly size bytes that the
	// caller fills (header first, then payload) and hands to SendAlloc, or
	// returns with Free. ErrWouldBlock when none is available now.
	Alloc(size int) ([]byte, error)
	// SendAlloc sends buf (from Alloc): its first hdrLen bytes are the header.
	// Ownership of buf returns to the module (also on error), except on
	// ErrWouldBlock, which leaves buf with the caller; completion as for
	// Send.
	SendAlloc(tag Tag, buf []byte, hdrLen int, cb Completion) (done bool, err error)
	// Free returns an unsent Alloc buffer.
	Free(buf []byte)

	// Put writes local into the peer's registered memory named by handle,
	// at byte offset off. Get reads from it into local. local is owned by the
	// module until completion (done or cb, as for Send). They need CapPut /
	// CapGet; a handle that does not decode or a range outside the
	// registration is an error wrapping ErrBadHandle (nothing is posted,
	// cb is not called). A Put's data is in the peer's memory before any
	// fragment sent on this endpoint after the Put completed arrives (the
	// FIN that announces it relies on this). A handle names memory only
	// while its Registration is held; a handle from another module or a
	// released one is ErrBadHandle, never a write elsewhere.
	//
	// local is ordinary memory: the caller does not register it. A module
	// whose hardware needs the local side registered too (a NIC's lkey)
	// registers local itself, through a registration cache that keeps
	// registrations for reuse (leave_pinned), and keeps local reachable
	// (and pinned) until completion; a registration failure is an error
	// return with nothing posted. Empty local completes at once.
	Put(local []byte, handle []byte, off int, cb Completion) (done bool, err error)
	Get(local []byte, handle []byte, off int, cb Completion) (done bool, err error)

	// Flush is a fence: it completes once every Send, SendAlloc, Put and
	// Get posted on this endpoint before the call has completed (those
	// that returned done, an error or ErrWouldBlock count as completed;
	// SendImmediate fragments are not covered). done == true means that
	// was already so (cb is not called); otherwise cb is called once
	// later, after the covered operations' own completions, with nil, or
	// with the error that ended the endpoint meanwhile (peer failed,
	// module closed) when some of them failed with it. Operations posted
	// after the call are not waited for. An error return (module closed)
	// means nothing was fenced and cb is not called.
	Flush(cb Completion) (done bool, err error)
}

// Poller is implemented by modules whose inbound fragments are found by
// polling: shared memory always, and tcp, whose waiting goroutines read
// the sockets themselves (a reader goroutine per connection only takes
// over while nobody polls). The PML's waiters and its background poller
// call Progress; Block is where the background poller sleeps.
type Poller interface {
	// Progress polls for inbound fragments and completions, dispatching
	// them, and returns how many events it handled.
	Progress() int
	// Block waits until Progress may find work or wake is signalled,
	// spinning at most briefly (a transport may poll for a bounded time
	// before it sleeps). It may return early.
	Block(wake <-chan struct{})
}

// HeldPoller is implemented by transports whose poll lock a waiter that
// spins may keep across polls: BeginPoll takes it (false: another
// goroutine polls), PollHeld is Progress for its holder and reports
// whether the holder still holds it (a call with work to do unlocked
// releases it), EndPoll releases it. The PML's spinning waiter holds it for at most 256
// polls at a time and never while it yields, blocks or runs deferred
// rendezvous starts.
type HeldPoller interface {
	Poller
	BeginPoll() bool
	PollHeld() (n int, held bool)
	EndPoll()
}

// BackgroundNapper is implemented by transports that the background
// goroutine must not wait on with Block, and that it polls after timed
// naps instead. A transport whose Block sleeps in a system call (sm's
// futex) holds the process's processor meanwhile: under gorun's one
// processor per rank, a rank's goroutine that wants to run again (a
// ping-pong's waiter, preempted) then waits for the runtime's monitor to
// take the processor back, up to 10 ms, and the monitor then polls every
// 20 us for a while, taking the core from the spinning ranks (sm 8 B
// ping-pong: stretches at 0.44-0.50 us instead of 0.31-0.33 us, runs of
// gompi-bench latency --sizes 8). Waiters still block in the transport.
type BackgroundNapper interface {
	Poller
	NapInBackground() bool
}

// ConcurrentPoller is implemented by transports whose Progress may be
// called from several goroutines at once (it serializes itself, e.g. by
// returning 0 when another call is in flight). The PML then calls it
// without a lock of its own, which saves two atomic operations per poll.
type ConcurrentPoller interface {
	Poller
	ConcurrentProgress() bool
}

// Counters are a module's traffic counters (for gorun --stats).
type Counters struct {
	FragsSent, BytesSent int64
	FragsRecv, BytesRecv int64
	Puts, PutBytes       int64
	Gets, GetBytes       int64
	// HelpBytes: bytes this process copied into peers' buffers for their
	// Gets of its memory (sm's shared Get).
	HelpBytes int64
}

// Counted is implemented by modules that count their traffic.
type Counted interface{ Counters() Counters }

// Handler receives one inbound fragment: hdr and data are valid only during
// the call (copy what must outlive it). It runs on the module's delivery
// goroutine (or the sender's, for self) and must not block.
type Handler func(ep Endpoint, hdr, data []byte)

// Dispatcher routes inbound fragments to the handler of their tag and peer
// failures to the failure handler. One per process instance (per PML).
type Dispatcher struct {
	handlers [256]Handler
	runs     [256]RunHandler
	failed   func(peer int, err error)
}

// RunHandler takes a run of fragments of one tag from one endpoint, in
// arrival order: hdrs[i] and datas[i] are one fragment, valid only during
// the call, as for a Handler. A run costs its handler one pass where one
// call per fragment would repeat it (the PML takes its lock once).
type RunHandler func(ep Endpoint, hdrs, datas [][]byte)

// RegisterRun installs a RunHandler for tag, which must have a Handler.
// It must not run long: a transport holds a run's fragments back until it
// hands them over together.
func (d *Dispatcher) RegisterRun(tag Tag, h RunHandler) {
	if d.handlers[tag] == nil || d.runs[tag] != nil {
		panic(fmt.Sprintf("btl: run handler for tag %#x without a handler, or twice", tag))
	}
	d.runs[tag] = h
}

// TakesRuns reports whether tag has a RunHandler. A transport gathers runs
// only of such tags and dispatches other fragments one by one at once.
func (d *Dispatcher) TakesRuns(tag Tag) bool { return d.runs[tag] != nil }

// DispatchRun hands a run of fragments of tag to its RunHandler (or one by
// one to its Handler).
func (d *Dispatcher) DispatchRun(ep Endpoint, tag Tag, hdrs, datas [][]byte) {
	if h := d.runs[tag]; h != nil {
		h(ep, hdrs, datas)
		return
	}
	for i := range hdrs {
		d.Dispatch(ep, tag, hdrs[i], datas[i])
	}
}

// Register installs h for tag. Registering a tag twice is a program bug.
func (d *Dispatcher) Register(tag Tag, h Handler) {
	if d.handlers[tag] != nil {
		panic(fmt.Sprintf("btl: tag %#x registered twice", tag))
	}
	d.handlers[tag] = h
}

// OnPeerFailed installs the handler for peer failures.
func (d *Dispatcher) OnPeerFailed(f func(peer int, err error)) { d.failed = f }

// Dispatch hands a fragment to its handler. A tag without a handler is a
// protocol error on that peer (reported as such).
func (d *Dispatcher) Dispatch(ep Endpoint, tag Tag, hdr, data []byte) {
	if h := d.handlers[tag]; h != nil {
		h(ep, hdr, data)
		return
	}
	d.PeerFailed(ep.Peer(), mpierr.Errorf(mpierr.ErrProtocol, "fragment with unknown tag %#x from rank %d", uint8(tag), ep.Peer()))
}

// Handles reports whether tag has a handler.
func (d *Dispatcher) Handles(tag Tag) bool { return d.handlers[tag] != nil }

// PeerFailed reports that peer died, became unreachable or broke the
// protocol. Modules call it once per peer, with an error that wraps
// mpierr.ErrProcFailed (or mpierr.ErrProtocol for a broken protocol), and
// then fail that peer's pending operations.
func (d *Dispatcher) PeerFailed(peer int, err error) {
	if d.failed != nil {
		d.failed(peer, err)
	}
}

// Store is the wire-up key-value store (served by gorun).
type Store interface {
	Set(key string, value []byte) error
	Get(ctx context.Context, key string) ([]byte, error) // waits until the key exists
}

// Env is what a component needs to open its modules in one process instance.
type Env struct {
	Rank, Size           int // world rank and size
	LocalRank, LocalSize int // among the ranks on this host
	JobID                string
	Secret               []byte      // job secret for authenticating peers
	Params               *params.Set // resolved parameters
	Store                Store       // nil for a singleton or in-process job
	Dispatch             *Dispatcher
	Oversubscribed       bool                          // more ranks than cores: waits yield the CPU between polls, then park
	Logf                 func(format string, a ...any) // verbose log (never nil)
	// Stats: Counters will be read (gorun --stats). Without it a transport
	// may leave counters that cost a locked instruction per fragment at
	// zero (self's fragment counters).
	Stats bool
}

// Component is a transport kind.
type Component interface {
	Name() string
	// Open returns the modules usable in this process. No modules and an
	// error wrapping mpierr.ErrNotSupported means "not usable here", with
	// the reason in the error.
	Open(env *Env) ([]Module, error)
}

var (
	compMu     sync.Mutex
	components = map[string]Component{}
)

// RegisterComponent makes a transport available; called from init.
func RegisterComponent(c Component) {
	compMu.Lock()
	defer compMu.Unlock()
	components[c.Name()] = c
}

// Components returns the registered components, sorted by name.
func Components() []Component {
	compMu.Lock()
	defer compMu.Unlock()
	out := make([]Component, 0, len(components))
	for _, c := range components {
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name() < out[j].Name() })
	return out
}

// Selected applies the `btl` parameter (include list, or ^exclude list) to
// name. An empty list selects every transport.
func Selected(list, name string) bool {
	list = strings.TrimSpace(list)
	if list == "" {
		return true
	}
	exclude := strings.HasPrefix(list, "^")
	list = strings.TrimPrefix(list, "^")
	found := false
	for _, n := range strings.Split(list, ",") {
		if strings.TrimSpace(n) == name {
			found = true
		}
	}
	return found != exclude
}

// Defaults are a component's parameter defaults for RegisterParams.
type Defaults struct {
	Limits      Limits
	Caps        Caps // what the transport can do; btl_<name>_flags may only narrow it
	Exclusivity int
}

// RegisterParams registers btl_<name>_eager_limit, _rndv_eager_limit,
// _max_send_size, _rdma_pipeline_frag_size, _rdma_pipeline_send_length,
// _min_rdma_pipeline_size, _flags and _exclusivity for a component.
func RegisterParams(name string, d Defaults) {
	sz := func(suffix string, v int, help string) {
		params.Register(params.Def{Name: "btl_" + name + "_" + suffix, Kind: params.Size, Default: params.FormatSize(v), Help: help})
	}
	l := d.Limits
	sz("eager_limit", l.EagerLimit, "largest message (header included) the "+name+" transport sends eagerly")
	sz("rndv_eager_limit", l.RndvEagerLimit, "payload bytes carried by the first fragment of a rendezvous over "+name)
	sz("max_send_size", l.MaxSendSize, "largest fragment (header included) of a send pipeline over "+name)
	sz("rdma_pipeline_frag_size", l.RDMAPipelineFragSize, "largest RDMA operation of the RDMA pipeline over "+name)
	sz("rdma_pipeline_send_length", l.RDMAPipelineSendLength, "bytes at the end of an RDMA-pipelined message sent by copy over "+name)
	sz("min_rdma_pipeline_size", l.MinRDMAPipelineSize, "messages up to this size use RDMA directly over "+name+"; longer ones the RDMA pipeline")
	params.Register(params.Def{Name: "btl_" + name + "_flags", Kind: params.String, Default: d.Caps.String(),
		Help: "capabilities the " + name + " transport may use: comma list of send,sendi,inplace,put,get"})
	params.Register(params.Def{Name: "btl_" + name + "_exclusivity", Kind: params.Int, Default: fmt.Sprint(d.Exclusivity),
		Help: "rank of the " + name + " transport: the reachable transport with the highest value wins a peer"})
}

// Settings reads back what RegisterParams registered: the limits, the
// capabilities (have narrowed by the flags parameter) and the exclusivity.
// min_rdma_pipeline_size is raised to at least eager_limit +
// rdma_pipeline_send_length, as Open MPI does.
func Settings(p *params.Set, name string, have Caps) (Limits, Caps, int, error) {
	g := func(s string) int { return p.Int("btl_" + name + "_" + s) }
	l := Limits{
		EagerLimit:             g("eager_limit"),
		RndvEagerLimit:         g("rndv_eager_limit"),
		MaxSendSize:            g("max_send_size"),
		RDMAPipelineFragSize:   g("rdma_pipeline_frag_size"),
		RDMAPipelineSendLength: g("rdma_pipeline_send_length"),
		MinRDMAPipelineSize:    g("min_rdma_pipeline_size"),
	}
	if m := l.EagerLimit + l.RDMAPipelineSendLength; l.MinRDMAPipelineSize < m {
		l.MinRDMAPipelineSize = m
	}
	caps, err := ParseCaps(p.String("btl_" + name + "_flags"))
	if err != nil {
		return l, 0, 0, fmt.Errorf("btl_%s_flags: %w", name, err)
	}
	return l, caps & have, g("exclusivity"), nil
}
