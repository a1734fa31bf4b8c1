package tensor

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/commx"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml"
)

// Errors callers test with errors.Is. Besides these, a receive fails with
// an error wrapping mpi.ErrProcFailed when its source died, mpi.ErrAborted
// when another rank aborted the rendezvous, the error given to Abort on
// the rank that called it, and the context's error when its context ended.
var (
	// ErrClosed: the rendezvous (this rank's or the source's) is closed.
	ErrClosed = errors.New("tensor: rendezvous closed")
	// ErrRemote: the sending rank failed the request (ERROR_STATUS); the
	// error's text carries the sender's message.
	ErrRemote = errors.New("tensor: error on the sending rank")
	// ErrChecksum: the content's CRC-32C differs from the sender's
	// (WithChecksum).
	ErrChecksum = errors.New("tensor: checksum mismatch")
	// ErrDuplicate: Send of a (step, name) already in the table.
	ErrDuplicate = errors.New("tensor: tensor already sent")
)

// dataTagBase: a content that travels as a separate MPI message (the
// transport cannot put) has this tag on the private communicator, with
// the request index in the low bits.
const dataTagBase = 1 << 29

// dataTag is the tag of a content that travels as a separate message.
func dataTag(index uint32) int { return dataTagBase | int(index&(dataTagBase-1)) }

// inlineMax is the largest content a NOTIFY carries inline: every
// content up to it (the receiver registers nothing for it, and the sender
// makes no put, a system call over shared memory), and, when the
// transport cannot put, nothing larger: those travel as a separate
// message.
const inlineMax = 4 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Option configures New.
type Option func(*config)

type config struct {
	checksum   bool
	batching   bool
	pullMin    int  // contents of at least this many bytes are read by the receiver where it can (0: never)
	forceProxy bool // tests: every destination goes through a proxy buffer
}

// defaultPullMin is the smallest content a receiver reads itself over a
// transport whose Get finishes within its call: sm's default for sharing
// a Get between both processes (btl_sm_get_split), from which a read is
// faster than the sender's single-process put.
const defaultPullMin = 32 << 10

// WithChecksum turns data validation on or off: every transfer carries a
// CRC-32C of the content, which the receiver verifies; a mismatch fails the
// Recv with ErrChecksum. Give every rank the same setting.
func WithChecksum(on bool) Option { return func(c *config) { c.checksum = on } }

// WithBatching turns the batching of RecvAsync's requests on or off
// (default on). On, a RecvAsync made while other receives from the same
// source are pending leaves its request with the rendezvous's progress
// goroutine, which sends the requests made meanwhile to one source
// together in one TENSOR_REQUEST as soon as it runs (the sender then
// notifies the writes of a batch with one message): hundreds of small
// tensors per step cost a few messages. A request waits only for that
// goroutine to be scheduled, never for a timer; a RecvAsync with nothing
// else pending from its source, and a Recv, send theirs at once (a Recv
// with the batch to its source). Off, every request is sent within its
// call.
func WithBatching(on bool) Option { return func(c *config) { c.batching = on } }

// Stats are a rank's counters. Control messages are TENSOR_REQUEST,
// TENSOR_RE_REQUEST, META_DATA_RESPONSE, ERROR_STATUS, CANCEL, CANCELLED,
// ABORT and CLOSED; the notification of a put is counted apart, as the
// immediate value of an RDMA write it stands for.
type Stats struct {
	Requests, ReRequests   int64 // TENSOR_REQUESTs and TENSOR_RE_REQUESTs this rank sent (one per tensor, batched or not)
	CacheHits, CacheMisses int64 // meta-data cache look-ups on this rank's receives
	BytesWritten           int64 // tensor content this rank wrote to peers
	Errors                 int64 // ERROR_STATUS messages sent or received

	MetaResponses   int64 // META_DATA_RESPONSEs this rank sent (one per tensor)
	ControlMessages int64 // control messages this rank sent (a batch counts once)
	Notifications   int64 // NOTIFY messages this rank sent (a batch counts once)
	Puts            int64 // contents this rank wrote with a transport put
	MessageContents int64 // contents this rank sent in messages (the transport could not put)
	ProxyCopies     int64 // receives whose content came through a proxy buffer
	Cancels         int64 // receives given up because their context ended
	Gets            int64 // contents this rank read from the sender's memory (large contents over shared memory)
}

type counters struct {
	requests, reRequests, hits, misses, written, errors        atomic.Int64
	metas, control, notifies, puts, msgContents, proxies, cncl atomic.Int64
	gets                                                       atomic.Int64
	registered                                                 atomic.Int64 // contents registered for remote read (not in Stats: the tests' view)
}

// key names a tensor in a sender's table.
type key struct {
	step int64
	name string
}

// cacheKey names a receiver's cached meta-data.
type cacheKey struct {
	src  int
	name string
}

// sent is a tensor in the table: its meta-data and the bytes that travel,
// or the error that every request for it gets. pre is the content's
// registration for remote read with preMod, made by Send when the last
// request for the name read its content (expose), so that the request
// that takes it finds it registered.
type sent struct {
	m       meta
	content []byte
	err     error
	pre     btl.Registration
	preMod  btl.Module
}

// unexpose gives up s's registration made ahead of its request, into out
// (released after the outbox's writes).
func (s *sent) unexpose(out *outbox) {
	if s.pre != nil {
		out.releases = append(out.releases, exposure{s.pre, s.preMod, s.content})
		s.pre, s.preMod = nil, nil
	}
}

// exposure is a content registered for remote read: the registration,
// its module and the memory it covers.
type exposure struct {
	reg btl.Registration
	mod btl.Module
	mem []byte
}

// covers reports whether x registers exactly mem with mod.
func (x exposure) covers(mod btl.Module, mem []byte) bool {
	return x.mod == mod && len(x.mem) == len(mem) && len(mem) > 0 && &x.mem[0] == &mem[0]
}

// Rendezvous is one rank's side of a tensor rendezvous over a
// communicator. Its methods are safe for concurrent use.
type Rendezvous struct {
	cfg  config
	comm *mpi.Comm // private duplicate of the user's communicator
	pc   *pml.Comm
	rank int
	size int

	ctx     uint32      // the private communicator's context id: names this rendezvous in fragments
	slot    uint32      // this rendezvous's slot on its engine: the top byte of its request indices
	hdr     []byte      // a whole message's fragment header (the context id), read only
	toComm  map[int]int // world rank -> rank of the communicator (read only)
	ident   bool        // every rank of the communicator is its world rank (read only)
	fragMax []int       // by rank: the largest fragment the transport to it sends (read only)
	msgID   atomic.Uint32
	async   atomic.Int64 // RecvAsync receives not told yet (changed under mu)
	batched atomic.Bool  // requests wait in a batch (changed under mu)
	partMu  sync.Mutex   // guards parts
	parts   map[partKey][]byte
	stopW   func() // ends the PML's failure watch

	mu sync.Mutex // guards every field below, up to st
	// Sender side.
	table   map[key]*sent
	waiting map[key][]*resp      // requests that arrived before their tensor
	resps   map[respKey]*resp    // requests waiting for their tensor or for a TENSOR_RE_REQUEST
	exposed map[respKey]exposure // contents registered for their receiver to read, until it releases them
	spare   []exposure           // by rank: the registration of the content it released last, kept until the next write to it (which takes it when its content is in the same memory)
	pullers map[string]int       // tensor name -> the rank whose last request for it read the content (Send registers ahead)
	// Receiver side.
	reqs       map[uint32]*recvReq
	live       []int // by source rank: receives in reqs
	nextIdx    uint32
	idxWrapped bool // nextIdx went past its largest value once: indices ahead may be live
	cache      map[cacheKey]meta
	batch      []pendingBatch // by source rank (WithBatching)
	rel        [][]uint32     // by source rank: contents read, whose release waits for the next request
	relBytes   []int
	pool       bufPool
	proxies    map[btl.Module][]*proxyBuf // registered proxy buffers not in use
	// Both.
	peerErr []error // by rank: why requests to and from it fail (dead, closed)
	aborted error
	closed  bool

	sendMu sync.Mutex     // guards sends
	sends  []*mpi.Request // content sends (MPI messages) not known to be complete

	st       counters
	kick     chan struct{} // capacity 1: wakes the progress goroutine (a batch waits, RecvAsyncs pend, Close)
	stop     chan struct{} // closed by Close
	pumpDone chan struct{}
}

// New makes the rendezvous of the calling rank over c. It is collective:
// every rank of c calls it (it duplicates c, whose context id names the
// rendezvous's fragments, and synchronizes once on the duplicate, so that
// no rank's first request reaches a rank that is not ready). Close
// releases it.
func New(c *mpi.Comm, opts ...Option) (*Rendezvous, error) {
	cfg := config{batching: true, pullMin: defaultPullMin}
	for _, o := range opts {
		if o != nil {
			o(&cfg)
		}
	}
	if _, err := commx.PML(c); err != nil {
		return nil, fmt.Errorf("tensor: %w", err)
	}
	dup, err := c.Dup()
	if err != nil {
		return nil, fmt.Errorf("tensor: duplicate the communicator: %w", err)
	}
	pc, err := commx.PML(dup)
	if err != nil {
		dup.Free()
		return nil, fmt.Errorf("tensor: %w", err)
	}
	r := &Rendezvous{
		cfg: cfg, comm: dup, pc: pc, rank: dup.Rank(), size: dup.Size(), ctx: pc.Context(),
		toComm: make(map[int]int, dup.Size()), fragMax: make([]int, dup.Size()), parts: map[partKey][]byte{},
		table: map[key]*sent{}, waiting: map[key][]*resp{}, resps: map[respKey]*resp{},
		reqs: map[uint32]*recvReq{}, nextIdx: 1, cache: map[cacheKey]meta{},
		batch: make([]pendingBatch, dup.Size()), proxies: map[btl.Module][]*proxyBuf{},
		exposed: map[respKey]exposure{}, spare: make([]exposure, dup.Size()), pullers: map[string]int{}, rel: make([][]uint32, dup.Size()), relBytes: make([]int, dup.Size()),
		live:    make([]int, dup.Size()),
		peerErr: make([]error, dup.Size()),
		kick:    make(chan struct{}, 1), stop: make(chan struct{}), pumpDone: make(chan struct{}),
	}
	r.hdr = binary.LittleEndian.AppendUint32(nil, r.ctx)
	r.ident = true
	e := pc.Engine()
	for p := 0; p < r.size; p++ {
		w := pc.World(p)
		r.toComm[w] = p
		r.ident = r.ident && w == p
		if ep := e.PeerEndpoint(w); ep != nil {
			l := ep.Module().Limits()
			r.fragMax[p] = max(l.EagerLimit, l.MaxSendSize)
		}
		if r.fragMax[p] <= partHdrLen {
			dup.Free()
			return nil, fmt.Errorf("tensor: the transport to rank %d sends fragments of %d bytes: too small for control messages", p, r.fragMax[p])
		}
	}
	if !demuxOf(e).add(r) {
		dup.Free()
		return nil, fmt.Errorf("tensor: %d rendezvous are open on this rank (at most %d)", maxSlots, maxSlots)
	}
	r.stopW = e.WatchPeers(r.onFailure)
	go r.pump()
	if err := dup.Barrier(); err != nil {
		r.Close()
		return nil, fmt.Errorf("tensor: %w", err)
	}
	return r, nil
}

// rankOf returns the communicator rank of world rank w.
func (r *Rendezvous) rankOf(w int) (int, bool) {
	if r.ident {
		return w, w >= 0 && w < r.size
	}
	p, ok := r.toComm[w]
	return p, ok
}

// endpoint returns the transport endpoint for communicator rank p.
func (r *Rendezvous) endpoint(p int) btl.Endpoint {
	return r.pc.Engine().PeerEndpoint(r.pc.World(p))
}

// Send puts t in this rank's table under (step, name), or hands it at once
// to a request that is already waiting for it. It never blocks on a peer.
// A content of 32 KiB or more that goes into the table makes Send poll
// the transports once, so that a request for it already on its way is
// answered within the call.
// A (step, name) already in the table is ErrDuplicate; an invalid tensor
// (unknown DType, Data or Strings that do not match the shape) is an error
// here, and every request for that (step, name) fails with ERROR_STATUS
// carrying the same message.
//
// Ownership: from the call on, t's slices belong to the rendezvous until
// the tensor has been received (or the rendezvous is closed); the caller
// must treat them as immutable, as TensorFlow treats a sent tensor. When
// the receiver's meta-data is stale the rendezvous copies the tensor
// before answering, as TensorFlow does.
func (r *Rendezvous) Send(step int64, name string, t Tensor) error {
	if err := checkName(name); err != nil {
		return fmt.Errorf("tensor: send: %w", mpierr.Errorf(mpierr.ErrArg, "%v", err))
	}
	m, content, terr := prepare(t)
	s := &sent{m: m, content: content}
	if terr != nil {
		terr = fmt.Errorf("tensor %q step %d: %w", name, step, mpierr.Errorf(mpierr.ErrArg, "%v", terr))
		s.err = terr
	}
	k := key{step, name}
	var out outbox
	r.mu.Lock()
	switch {
	case r.aborted != nil:
		r.mu.Unlock()
		return r.aborted
	case r.closed:
		r.mu.Unlock()
		return ErrClosed
	}
	if _, dup := r.table[k]; dup {
		r.mu.Unlock()
		return fmt.Errorf("%w: %q at step %d", ErrDuplicate, name, step)
	}
	tabled := r.offerLocked(k, s, &out)
	puller := -1
	if tabled && terr == nil && len(r.pullers) > 0 && r.cfg.pullMin > 0 && len(content) >= r.cfg.pullMin {
		if p, ok := r.pullers[name]; ok && !r.exposedToLocked(p, content) {
			puller = p
		}
	}
	r.mu.Unlock()
	r.run(&out)
	if puller >= 0 {
		r.expose(k, s, puller)
	}
	if tabled && len(content) >= pollMin {
		// A request for it may be on its way, or here but not handled
		// yet (this goroutine was busy producing): one poll of the
		// transports answers it within this call instead of when a
		// waiter or the PML's background poller polls next.
		r.pc.Engine().Progress()
	}
	return terr
}

// pollMin is the smallest content whose Send polls the transports once
// after putting it in the table: one poll costs little beside the copy of
// such a content, and not a step of hundreds of small tensors.
const pollMin = 32 << 10

// exposedToLocked reports whether mem is registered for rank p to read
// already: a content in the same memory as one p has not released yet,
// or as the one it released last (a producer that sends from one buffer
// step after step), whose registration the write to p takes over.
func (r *Rendezvous) exposedToLocked(p int, mem []byte) bool {
	if x := r.spare[p]; x.reg != nil && x.covers(x.mod, mem) {
		return true
	}
	for k, x := range r.exposed {
		if k.peer == p && x.covers(x.mod, mem) {
			return true
		}
	}
	return false
}

// expose registers the content of s, which waits in the table under k,
// for remote read by rank p, whose last request for the name read the
// content: the request that takes it then answers at once instead of
// registering first. Send runs it after the tensor is in the table, while
// the request is usually on its way (a producer that sends before its
// consumer asks, as in a loop of steps), so the registration leaves the
// path from the request to the content. A request that takes s before
// the registration is in place registers for itself, and this one is
// released.
func (r *Rendezvous) expose(k key, s *sent, p int) {
	ep := r.endpoint(p)
	if !r.canPull(ep, uint64(len(s.content))) {
		return
	}
	mod := ep.Module()
	reg, err := mod.Register(s.content, btl.AccessRemoteRead)
	if err != nil {
		return
	}
	r.st.registered.Add(1)
	r.mu.Lock()
	if r.table[k] == s && s.pre == nil && !r.closed && r.aborted == nil {
		s.pre, s.preMod, reg = reg, mod, nil
	}
	r.mu.Unlock()
	if reg != nil {
		reg.Release()
	}
}

// offerLocked gives s to the first request waiting for k, or puts it in
// the table; it reports whether s went into the table.
func (r *Rendezvous) offerLocked(k key, s *sent, out *outbox) bool {
	if len(r.waiting) > 0 {
		if w := r.waiting[k]; len(w) > 0 {
			rs := w[0]
			if len(w) == 1 {
				delete(r.waiting, k)
			} else {
				r.waiting[k] = w[1:]
			}
			r.matchLocked(rs, s, out)
			return false
		}
	}
	r.table[k] = s
	return true
}

// Recv receives the tensor that rank src sends under (step, name). It
// returns when the tensor is here, the request failed, or ctx ended
// (ctx.Err(); the request is then withdrawn: nothing is written into
// memory of this rank's after the sender acknowledges, and the tensor
// stays at the sender for a later Recv). The returned tensor's slices
// belong to the caller; Recycle gives Data back for reuse.
func (r *Rendezvous) Recv(ctx context.Context, step int64, name string, src int) (Tensor, error) {
	if ctx == nil {
		ctx = context.Background()
	}
	if err := ctx.Err(); err != nil {
		return Tensor{}, err
	}
	w := &recvWaiter{wake: make(chan struct{}, 1)}
	rq, size, err := r.start(step, name, src, nil, w)
	if err != nil {
		return Tensor{}, err
	}
	// This goroutine polls the transports for the answer (and handles
	// whatever control messages they bring), as a plain Recv does.
	e := r.pc.Engine()
	wctx := ctx
	if ctx.Done() == nil {
		wctx = nil // never ends: no watch needed
	}
	if err := e.Await(wctx, size, w.ready, w.wake); err != nil {
		if r.cancel(rq) {
			return Tensor{}, err
		}
		e.Await(nil, size, w.ready, w.wake) // the outcome came first: it is being told
	}
	return w.res.t, w.res.err
}

// recvWaiter is where a Recv's outcome goes: res, then done, then a token
// on wake.
type recvWaiter struct {
	res  result
	done atomic.Bool
	wake chan struct{}
}

func (w *recvWaiter) ready() bool { return w.done.Load() }

func (w *recvWaiter) tell(t Tensor, err error) {
	w.res = result{t, err}
	w.done.Store(true)
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// RecvAsync is Recv without waiting: done is called once with the tensor
// or the error. It may be called before RecvAsync returns (an argument
// error, a closed rendezvous); otherwise it runs where the answer is
// handled: on a goroutine that polls the transports (the rendezvous's
// progress goroutine, which polls while RecvAsyncs are pending, any MPI
// call of this process waiting meanwhile, or a Send of a large tensor) or
// on the goroutine of an in-process peer. So done must be short and must not block: it must not
// call Recv, Close or blocking MPI operations (RecvAsync, Send and
// Recycle are fine). Requests are batched (WithBatching).
func (r *Rendezvous) RecvAsync(step int64, name string, src int, done func(Tensor, error)) {
	if done == nil {
		done = func(Tensor, error) {}
	}
	if _, _, err := r.start(step, name, src, done, nil); err != nil {
		done(Tensor{}, err)
	}
}

// Recycle gives the Data of a tensor returned by Recv back to the
// rendezvous, which hands it to a later Recv of the same size instead of
// allocating (and zeroing) a new buffer. The caller must not use t.Data
// afterwards. Other slices are ignored.
func (r *Rendezvous) Recycle(t Tensor) {
	if len(t.Data) == 0 {
		return
	}
	r.mu.Lock()
	r.pool.put(t.Data)
	r.mu.Unlock()
}

// Abort fails every pending and later Send and Recv of this rank with err
// and sends ABORT to every other rank, whose pending and later calls then
// fail with an error wrapping mpi.ErrAborted and carrying err's text.
// Aborting twice keeps the first error.
func (r *Rendezvous) Abort(err error) {
	if err == nil {
		err = mpierr.Errorf(mpierr.ErrAborted, "tensor: rendezvous aborted")
	}
	var out outbox
	r.mu.Lock()
	if r.aborted != nil || r.closed {
		r.mu.Unlock()
		return
	}
	// ABORT goes first: a peer then fails its receives from here with
	// mpi.ErrAborted before the ERROR_STATUS answers arrive.
	for p := 0; p < r.size; p++ {
		if p != r.rank && r.peerErr[p] == nil {
			out.msg(p, &abortMsg{text: err.Error()})
		}
	}
	r.abortLocked(err, &out)
	r.mu.Unlock()
	r.run(&out)
}

// abortLocked fails what is pending with err. Destinations stay
// registered until the sender's last word on them (NOTIFY, ERROR_STATUS or
// CANCELLED), since a write may be on its way; requests waiting here for a
// tensor are answered with ERROR_STATUS.
func (r *Rendezvous) abortLocked(err error, out *outbox) {
	r.aborted = err
	for _, rq := range r.reqs {
		r.tellLocked(rq, Tensor{}, err, out)
	}
	for _, s := range r.table {
		s.unexpose(out)
	}
	clear(r.table)
	for k, ws := range r.waiting {
		for _, rs := range ws {
			r.answerErrorLocked(rs, classAborted, err.Error(), out)
		}
		delete(r.waiting, k)
	}
	for _, rs := range r.resps {
		r.answerErrorLocked(rs, classAborted, err.Error(), out)
	}
}

// Stats returns this rank's counters so far.
func (r *Rendezvous) Stats() Stats {
	c := &r.st
	return Stats{
		Requests: c.requests.Load(), ReRequests: c.reRequests.Load(),
		CacheHits: c.hits.Load(), CacheMisses: c.misses.Load(),
		BytesWritten: c.written.Load(), Errors: c.errors.Load(),
		MetaResponses: c.metas.Load(), ControlMessages: c.control.Load(), Notifications: c.notifies.Load(),
		Puts: c.puts.Load(), MessageContents: c.msgContents.Load(), ProxyCopies: c.proxies.Load(), Cancels: c.cncl.Load(),
		Gets: c.gets.Load(),
	}
}

// Close ends this rank's rendezvous: pending receives fail with
// ErrClosed, tensors in the table are dropped, the other ranks learn (a
// CLOSED message) that receives from this rank fail, every registration
// is released and the private communicator is freed. Call it when this
// rank is done (typically after a Barrier), not from a RecvAsync callback.
// Closing twice is a no-op.
func (r *Rendezvous) Close() error {
	var out outbox
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	for _, rq := range r.reqs {
		r.tellLocked(rq, Tensor{}, ErrClosed, &out)
	}
	for p := 0; p < r.size; p++ {
		if p != r.rank && r.peerErr[p] == nil {
			out.msg(p, &abortMsg{closed: true})
		}
	}
	r.mu.Unlock()
	r.run(&out)
	demuxOf(r.pc.Engine()).remove(r)
	r.stopW()
	close(r.stop)
	r.wakePump()
	<-r.pumpDone
	r.mu.Lock()
	for idx, rq := range r.reqs {
		rq.releaseReg()
		delete(r.reqs, idx)
		r.live[rq.src]--
	}
	for m, ps := range r.proxies {
		for _, p := range ps {
			p.reg.Release()
		}
		delete(r.proxies, m)
	}
	for k, x := range r.exposed {
		x.reg.Release()
		delete(r.exposed, k)
	}
	for p, x := range r.spare {
		if x.reg != nil {
			x.reg.Release()
		}
		r.spare[p] = exposure{}
	}
	for _, s := range r.table {
		if s.pre != nil {
			s.pre.Release()
		}
	}
	clear(r.table)
	clear(r.waiting)
	clear(r.resps)
	r.pool = bufPool{}
	r.mu.Unlock()
	return r.comm.Free()
}

// ---- outbound ----

// outbox collects what a handler decided under r.mu, to be done after:
// control messages, writes and user notifications.
type outbox struct {
	msgs     []outMsg
	writes   []*resp
	gets     []pendingGet
	tells    []tell
	releases []exposure // registrations to release (contents the receiver has read), unless a write reuses one
}

// tell is a receive's outcome for its caller: Recv's waiter or
// RecvAsync's callback.
type tell struct {
	w    *recvWaiter
	done func(Tensor, error)
	t    Tensor
	err  error
}

type outMsg struct {
	peer int
	m    message
}

func (o *outbox) msg(peer int, m message) { o.msgs = append(o.msgs, outMsg{peer, m}) }

// run does what o holds: messages first (in order), then writes, reads,
// the user's completions, and last the releases. Called without r.mu.
func (r *Rendezvous) run(o *outbox) {
	for _, m := range o.msgs {
		r.send(m.peer, m.m)
	}
	if len(o.writes) > 0 {
		r.write(o.writes, o)
	}
	for _, g := range o.gets {
		r.pull(g)
	}
	for _, t := range o.tells {
		if t.w != nil {
			t.w.tell(t.t, t.err)
		} else {
			t.done(t.t, t.err)
		}
	}
	for _, x := range o.releases {
		if x.reg != nil {
			x.reg.Release()
		}
	}
}

// send encodes m and sends it to peer as a control message.
func (r *Rendezvous) send(peer int, m message) {
	b := encode(m)
	switch m.kind() {
	case kindNotify:
		r.st.notifies.Add(1)
	default:
		r.st.control.Add(1)
	}
	r.sendBytes(peer, b)
}

// track keeps a send request until it is seen complete, so that none is
// dropped unfinished; completed ones are swept out as more come.
func (r *Rendezvous) track(q *mpi.Request) {
	r.sendMu.Lock()
	r.sends = append(r.sends, q)
	if len(r.sends) >= 64 {
		n := 0
		for _, s := range r.sends {
			if _, done, _ := s.Test(); !done {
				r.sends[n] = s
				n++
			}
		}
		clear(r.sends[n:])
		r.sends = r.sends[:n]
	}
	r.sendMu.Unlock()
}

// result is a receive's outcome, for Recv's channel.
type result struct {
	t   Tensor
	err error
}

// ---- buffers ----

// bufPool keeps buffers given back by Recycle (and the serialized bytes
// of string tensors), by size, for later destinations. Guarded by r.mu.
type bufPool struct {
	free  map[int][][]byte
	bytes int
}

const (
	poolPerSize = 16
	poolBytes   = 256 << 20
)

func (p *bufPool) get(n int) []byte {
	if l := p.free[n]; len(l) > 0 {
		b := l[len(l)-1]
		l[len(l)-1] = nil
		p.free[n] = l[:len(l)-1]
		p.bytes -= n
		return b
	}
	return make([]byte, n)
}

func (p *bufPool) put(b []byte) {
	n := len(b)
	if n == 0 || p.bytes+n > poolBytes || len(p.free[n]) >= poolPerSize {
		return
	}
	if p.free == nil {
		p.free = map[int][][]byte{}
	}
	p.free[n] = append(p.free[n], b)
	p.bytes += n
}

// proxyBuf is a registered buffer that receives a put for a destination
// the transport could not register; the content is then copied over.
type proxyBuf struct {
	mem []byte
	reg btl.Registration
}

// takeProxyLocked returns a registered proxy of at least n bytes for
// module m: a free one, or a new one.
func (r *Rendezvous) takeProxyLocked(m btl.Module, n int) (*proxyBuf, error) {
	ps := r.proxies[m]
	for i, p := range ps {
		if len(p.mem) >= n {
			ps[i] = ps[len(ps)-1]
			r.proxies[m] = ps[:len(ps)-1]
			return p, nil
		}
	}
	mem := make([]byte, n)
	reg, err := m.Register(mem, btl.AccessRemoteWrite|btl.AccessLocalWrite)
	if err != nil {
		return nil, err
	}
	return &proxyBuf{mem: mem, reg: reg}, nil
}

// putProxyLocked keeps a proxy for reuse (a few per module), or releases it.
func (r *Rendezvous) putProxyLocked(m btl.Module, p *proxyBuf) {
	if r.closed || len(r.proxies[m]) >= 4 {
		p.reg.Release()
		return
	}
	r.proxies[m] = append(r.proxies[m], p)
}
