// Package pml is gompi's point-to-point messaging layer, modelled on Open
// MPI's ob1: send and receive requests, MPI matching (per-peer sequence
// numbers, posted and unexpected queues, wildcards, probes, cancel) and the
// protocols of seed 004 (eager immediate/prepared/allocated, RDMA direct
// put, RDMA direct get, send/receive pipeline, RDMA pipeline, buffered
// pipeline) over any set of btl transports.
//
// The Engine is a state machine without goroutines, sockets or clocks of
// its own (the one exception, the background poller of polled transports,
// is started only by Start): events come in as method calls (IsendHandle,
// IrecvHandle, Cancel, and inbound fragments through the btl.Dispatcher handlers it
// registers), and actions go out as btl calls made after the engine lock
// is released. Request.Wait and the pollers are the thin driver.
//
// Entry points: New, Engine.SetPeer, Engine.NewComm, then
// Comm.IsendHandle / Comm.IrecvHandle (waited for through the Handle) and
// Comm.Send / Comm.Recv.
package pml

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/pml/hdr"
)

func init() {
	params.Register(params.Def{Name: "pml_send_pipeline_depth", Kind: params.Int, Default: "3",
		Help: "FRAGs in flight per send of the send/receive pipeline"})
	params.Register(params.Def{Name: "pml_recv_pipeline_depth", Kind: params.Int, Default: "4",
		Help: "PUTs in flight per receive of the RDMA pipeline"})
	params.Register(params.Def{Name: "pml_force_protocol", Kind: params.String, Default: "",
		Help: "empty (automatic) or one of eager, rdma_put, rdma_get, send_pipeline, rdma_pipeline: used for every message it can carry"})
	params.Register(params.Def{Name: "pml_leave_pinned", Kind: params.Bool, Default: "false",
		Help: "keep registrations (always use RDMA directly instead of the RDMA pipeline)"})
	params.Register(params.Def{Name: "pml_wait_spin", Kind: params.Duration, Default: "50us",
		Help: "how long a waiting call polls before it parks (when ranks outnumber cores, pml_wait_yield instead)"})
	params.Register(params.Def{Name: "pml_wait_yield", Kind: params.Duration, Default: "1ms",
		Help: "when ranks outnumber cores: how long a waiting call polls, giving the CPU to other processes (sched_yield) after each poll that finds nothing, before it parks (0: it parks at once)"})
}

// Config configures an Engine.
type Config struct {
	Rank, Size     int // world rank and size
	Params         *params.Set
	Dispatch       *btl.Dispatcher
	Oversubscribed bool
	Stats          bool // count messages per protocol (Engine.Stats); off, nothing is counted
	Logf           func(format string, a ...any)
}

type peer struct {
	world   int
	ep      btl.Endpoint
	caps    btl.Caps
	lim     btl.Limits
	immMax  int              // largest standard-mode payload Select sends EagerImmediate (-1: none)
	prepMax int              // Select sends standard-mode payloads in (max(immMax, 0), prepMax] EagerPrepared
	hs      btl.HeaderSender // ep, when it takes a header by value (nil otherwise)
	sg      btl.SyncGetter   // ep, when its Get always finishes at once (nil otherwise)
	failed  error            // guarded by Engine.mu
}

func newPeer(world int, ep btl.Endpoint) *peer {
	m := ep.Module()
	p := &peer{world: world, ep: ep, caps: m.Caps(), lim: m.Limits(), immMax: -1, prepMax: -1}
	if p.caps&btl.CapSendImmediate != 0 {
		p.immMax = min(ImmediateMax, EagerMax(p.lim))
	}
	if p.caps&btl.CapSendInPlace != 0 {
		p.prepMax = EagerMax(p.lim)
	}
	p.hs, _ = ep.(btl.HeaderSender)
	p.sg, _ = ep.(btl.SyncGetter)
	return p
}

// Engine is one process instance's PML.
type Engine struct {
	mu       sync.Mutex
	rank     int
	size     int
	peers    []atomic.Pointer[peer] // by world rank; replaced only under mu
	comms    map[uint32]*Comm
	lastComm *Comm    // the communicator of the last matching fragment (a one-entry cache of comms)
	parked   []*frag  // matching fragments of communicators not created yet
	fragFree []*frag  // stored fragments given back, for copyFrag (recv_match.go)
	reqs     reqTable // rendezvous requests by the id peers name them with
	nextCtx  uint32
	reserved map[uint32]struct{}     // context ids being agreed on (ProposeContext)
	toStart  []*Request              // matched rendezvous receives to start outside the lock
	free     []*Request              // clean requests for Irecv (RecycleAll), at most freeMax
	spare    atomic.Pointer[Request] // a done blocking receive's request, not yet cleaned (takeSpare)
	scratch  frag                    // the fragment being matched (aliases transport memory; copied when kept)
	closed   error
	// troubled is set once closed or any peer's failed is, and while a
	// sendQueue holds operations: the send fast path reads it instead of
	// taking the lock (Comm.target).
	troubled atomic.Bool
	nfailed  int         // peers with failed set (guarded by mu)
	window   int         // pml_unexpected_window (flow.go); 0: no flow control
	grants   []grantRef  // CREDITs due (guarded by mu; flow.go)
	queues   []sendQueue // by world rank: operations the transport refused (queue.go)
	upper    upper       // the layers above: their btl tags and failure watchers (peerep.go)

	spin        time.Duration
	osYield     bool // oversubscribed: spinning waits yield the CPU to other processes (spinWait)
	depth       int
	recvDepth   int
	force       Force
	leavePinned bool
	logf        func(string, ...any)
	poll        pollers
	inbox       btl.Spinner // in-process: the self transport's hand-offs, polled by this engine's calls (SetSpinner)
	countStats  bool

	Stats Stats
}

// Stats counts messages per protocol (gorun --stats), when Config.Stats
// asked for it: three atomic additions per message otherwise saved.
type Stats struct {
	Sent  [BufferedPipeline + 1]atomic.Int64
	Bytes [BufferedPipeline + 1]atomic.Int64
	Recvd atomic.Int64
}

// New makes an engine and registers its handlers on cfg.Dispatch.
func New(cfg Config) (*Engine, error) {
	p := cfg.Params
	force, ok := ParseForce(p.String("pml_force_protocol"))
	if !ok {
		return nil, mpierr.Errorf(mpierr.ErrArg, "pml_force_protocol=%q: want eager, rdma_put, rdma_get, send_pipeline or rdma_pipeline", p.String("pml_force_protocol"))
	}
	e := &Engine{
		rank: cfg.Rank, size: cfg.Size,
		peers:       make([]atomic.Pointer[peer], cfg.Size),
		queues:      make([]sendQueue, cfg.Size),
		comms:       map[uint32]*Comm{},
		nextCtx:     1,
		spin:        p.Duration("pml_wait_spin"),
		depth:       max(1, p.Int("pml_send_pipeline_depth")),
		recvDepth:   max(1, p.Int("pml_recv_pipeline_depth")),
		force:       force,
		leavePinned: p.Bool("pml_leave_pinned"),
		window:      min(max(p.Int("pml_unexpected_window"), 0), 1<<14),
		logf:        cfg.Logf,
		countStats:  cfg.Stats,
	}
	if cfg.Oversubscribed {
		// When ranks outnumber cores, waits poll and yield the CPU for
		// pml_wait_yield (osYield), then park. A waiter that sleeps at
		// once makes every message a wake-up of a sleeping process by
		// its sender; one that spins without yielding holds a core that
		// the rank it waits for needs. A Sendrecv ring of 4 ranks on 2
		// cores took 61 us a step over sm and 86-89 over tcp sleeping at
		// once (gorun -np 4 --oversubscribe --param pml_wait_yield=0
		// bench/ring -mode sr), 7.6 and 35.5 yielding; Open MPI, which
		// yields the same way, 4.9 and 50.9 (bench/ring.sh).
		e.spin = p.Duration("pml_wait_yield")
		e.osYield = e.spin > 0
	}
	e.poll.starts = e.runStarts
	e.poll.retry = e.retry
	e.poll.kick = make(chan struct{}, 1)
	if e.logf == nil {
		e.logf = func(string, ...any) {}
	}
	d := cfg.Dispatch
	d.Register(btl.Tag(hdr.TypeMatch), e.onMatching)
	d.RegisterRun(btl.Tag(hdr.TypeMatch), e.onMatchingRun)
	d.Register(btl.Tag(hdr.TypeRndv), e.onMatching)
	d.Register(btl.Tag(hdr.TypeRget), e.onMatching)
	d.Register(btl.Tag(hdr.TypeAck), e.onAck)
	d.Register(btl.Tag(hdr.TypeFrag), e.onFrag)
	d.Register(btl.Tag(hdr.TypePut), e.onPut)
	d.Register(btl.Tag(hdr.TypeFin), e.onFin)
	d.Register(btl.Tag(hdr.TypeCredit), e.onCredit)
	d.OnPeerFailed(e.PeerFailed)
	e.upper.register(d)
	engines.add(e)
	return e, nil
}

// SetPeer sets ep as the endpoint by which the engine sends to world
// rank r (btl.Reach chooses it among the transports). A nil ep is an
// error wrapping btl.ErrUnreachable.
func (e *Engine) SetPeer(r int, ep btl.Endpoint) error {
	if ep == nil {
		return fmt.Errorf("no transport reaches rank %d: %w", r, btl.ErrUnreachable)
	}
	np := newPeer(r, ep)
	e.mu.Lock()
	if old := e.peers[r].Load(); old != nil {
		np.failed = old.failed // a failure noticed before: it stands
	}
	e.peers[r].Store(np)
	e.mu.Unlock()
	return nil
}

// peerOf returns the peer of a fragment that came in on ep. A transport
// may deliver before SetPeer ran for its sender (it starts receiving once
// its address is published, while the other ranks' endpoints are still
// being chosen): the peer is then set up provisionally from ep, and
// SetPeer later sets the endpoint chosen for sending.
func (e *Engine) peerOf(ep btl.Endpoint) *peer {
	r := ep.Peer()
	if r < 0 || r >= e.size {
		return nil
	}
	if p := e.peers[r].Load(); p != nil && p.ep != nil {
		return p
	}
	return e.newPeerOf(ep, r)
}

// newPeerOf is peerOf for a sender without a peer yet (rank r, in range).
func (e *Engine) newPeerOf(ep btl.Endpoint, r int) *peer {
	e.mu.Lock()
	defer e.mu.Unlock()
	p := e.peers[r].Load()
	if p == nil || p.ep == nil {
		np := newPeer(r, ep)
		if p != nil {
			np.failed = p.failed
		}
		e.peers[r].Store(np)
		p = np
	}
	return p
}

// PeerTransport names the transport chosen for world rank r ("" if none).
func (e *Engine) PeerTransport(r int) string {
	if p := e.peers[r].Load(); p != nil && p.ep != nil {
		return p.ep.Module().Name()
	}
	return ""
}

// AddPoller registers a transport that needs polling; before the first
// wait.
func (e *Engine) AddPoller(p btl.Poller) { e.poll.add(p) }

// Start starts the background progress goroutine (only if a transport needs polling).
func (e *Engine) Start() { e.poll.start() }

// Close stops the background poller. Pending requests are failed with err
// (nil: ErrNotInit).
func (e *Engine) Close(err error) {
	if err == nil {
		err = mpierr.Errorf(mpierr.ErrNotInit, "finalized")
	}
	e.Abort(err)
	e.poll.close()
	engines.remove(e)
}

// engines counts the engines of the process that are open, and names
// the one while the process has only ever had one open at a time (a
// process of gorun's): a Handle's wait then polls that engine before it
// takes a use count on its request (Handle.spinSink), whose engine it may
// not read without one. When two were open and one closes, it names none
// until the other closes too: the waits then only skip that first poll.
var engines engineSet

type engineSet struct {
	mu   sync.Mutex
	n    int
	sole atomic.Pointer[Engine]
}

func (es *engineSet) add(e *Engine) {
	es.mu.Lock()
	defer es.mu.Unlock()
	es.n++
	if es.n == 1 {
		es.sole.Store(e)
	} else {
		es.sole.Store(nil)
	}
}

func (es *engineSet) remove(e *Engine) {
	es.mu.Lock()
	defer es.mu.Unlock()
	es.n--
	es.sole.CompareAndSwap(e, nil)
}

// SetSpinner gives an engine without polled transports (in-process
// ranks) the self transport's hand-offs (btl.Spinner), unless
// pml_wait_spin is 0 (then senders keep delivering directly): its waits
// poll s, spinning for pml_wait_spin plus s.SpinFor, and say when they
// park; Progress polls s. Call before the engine is used.
func (e *Engine) SetSpinner(s btl.Spinner) {
	if e.spin > 0 {
		e.inbox = s
		s.Enable()
	}
}

// Progress polls the polled transports once, and the spinner's
// hand-offs, and posts again operations the transports refused.
func (e *Engine) Progress() int {
	n := e.poll.progress()
	if e.inbox != nil {
		n += e.inbox.Poll()
	}
	return n
}

// Queued reports how many operations the transports refused with
// btl.ErrWouldBlock are waiting to be posted again.
func (e *Engine) Queued() int { return int(e.poll.blocked.Load()) }

// Pending reports how many rendezvous requests are still in progress.
func (e *Engine) Pending() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reqs.len()
}

// Abort fails every pending request with err and every later call.
func (e *Engine) Abort(err error) {
	e.mu.Lock()
	first := e.closed == nil
	if first {
		e.closed = err
		e.troubled.Store(true)
	}
	var fail []*Request
	e.reqs.each(func(id uint64, r *Request) {
		fail = append(fail, r)
		e.reqs.del(id)
	})
	for _, c := range e.comms {
		fail = c.m.drainPosted(fail)
	}
	for _, r := range fail {
		e.failLocked(r, err)
	}
	var queued []queuedOp
	for w := range e.queues {
		queued = e.failQueueLocked(w, queued)
	}
	e.mu.Unlock()
	failQueued(queued, err)
	if first {
		e.upper.notify(-1, err)
	}
}

// failLocked ends request r with err and gives back what it holds: its
// registrations and, for a buffered send, the attached-buffer space.
// Called with e.mu held.
func (e *Engine) failLocked(r *Request, err error) {
	if r.kind == kindSend {
		e.failSendLocked(r, err)
		return
	}
	for _, reg := range r.regs {
		reg.Release()
	}
	r.regs = nil
	if !r.mpiDone {
		r.mpiDone = true
		r.complete(Status{Source: r.peer, Tag: r.tag}, err)
	}
}

// PeerFailed fails every request that involves world rank r. Called by
// the transports (through the dispatcher) and by the launcher's failure
// notices.
func (e *Engine) PeerFailed(r int, err error) {
	if r < 0 || r >= e.size {
		return
	}
	e.mu.Lock()
	p := e.peers[r].Load()
	if p == nil {
		p = &peer{world: r}
		e.peers[r].Store(p)
	}
	if p.failed != nil {
		e.mu.Unlock()
		return
	}
	if !errors.Is(err, mpierr.ErrProcFailed) {
		err = fmt.Errorf("rank %d: %w (%w)", r, mpierr.ErrProcFailed, err)
	}
	p.failed = err
	e.nfailed++
	e.troubled.Store(true)
	e.logf("pml: rank %d failed: %v", r, err)
	var fail []*Request
	e.reqs.each(func(id uint64, q *Request) {
		if q.peerWorld == r || q.kind == kindSend && q.tag < 0 && q.comm.has(r) {
			// (A send of an internal tag belongs to an operation of the
			// whole group, which fails: ft.go.)
			fail = append(fail, q)
			e.reqs.del(id)
		}
	})
	for _, c := range e.comms {
		cr, ok := c.commRank(r)
		if !ok {
			continue
		}
		fail = e.commPeerFailedLocked(c, cr, fail)
	}
	for _, q := range fail {
		e.failLocked(q, err)
	}
	// Operations queued for r fail too (their completions run the
	// requests' failure paths): a waiter does not retry them forever.
	queued := e.failQueueLocked(r, nil)
	e.mu.Unlock()
	failQueued(queued, err)
	e.upper.notify(r, err)
}

// protocolError reports a peer that broke the protocol: it is treated as failed.
func (e *Engine) protocolError(ep btl.Endpoint, format string, a ...any) {
	e.protocolErrorFrom(ep.Peer(), format, a...)
}

func (e *Engine) protocolErrorFrom(rank int, format string, a ...any) {
	err := fmt.Errorf("rank %d: %w: %s", rank, mpierr.ErrProtocol, fmt.Sprintf(format, a...))
	e.logf("pml: %v", err)
	e.PeerFailed(rank, err)
}
