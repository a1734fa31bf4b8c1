package tensor

import (
	"context"
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

// Tags of the private communicator.
const (
	tagControl  = 1 // every control message
	tagSentinel = 2 // never sent: a receive of it from a peer ends only when the peer fails
	dataTagBase = 1 << 29
)

// dataTag is the tag of a content that travels as a separate message.
func dataTag(index uint32) int { return dataTagBase | int(index&(dataTagBase-1)) }

// inlineMax is the largest content a NOTIFY carries inline when the
// transport cannot put; larger contents travel as a separate message.
const inlineMax = 4 << 10

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Option configures New.
type Option func(*config)

type config struct {
	checksum   bool
	batching   bool
	forceProxy bool // tests: every destination goes through a proxy buffer
}

// WithChecksum turns data validation on or off: every transfer carries a
// CRC-32C of the content, which the receiver verifies; a mismatch fails the
// Recv with ErrChecksum. Give every rank the same setting.
func WithChecksum(on bool) Option { return func(c *config) { c.checksum = on } }

// WithBatching turns request batching on or off (default off): requests
// to one source made while an earlier batch is being sent travel together
// in one TENSOR_REQUEST (and the sender notifies the writes of a batch
// with one message), which pays when a step receives hundreds of small
// tensors. A request waits at most for the batch before it.
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
}

type counters struct {
	requests, reRequests, hits, misses, written, errors        atomic.Int64
	metas, control, notifies, puts, msgContents, proxies, cncl atomic.Int64
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
// or the error that every request for it gets.
type sent struct {
	m       meta
	content []byte
	err     error
}

// Rendezvous is one rank's side of a tensor rendezvous over a
// communicator. Its methods are safe for concurrent use.
type Rendezvous struct {
	cfg  config
	comm *mpi.Comm // private duplicate of the user's communicator
	pc   *pml.Comm
	rank int
	size int

	mu sync.Mutex // guards every field below, up to st
	// Sender side.
	table   map[key]*sent
	waiting map[key][]*resp   // requests that arrived before their tensor
	resps   map[respKey]*resp // requests waiting for their tensor or for a TENSOR_RE_REQUEST
	// Receiver side.
	reqs    map[uint32]*recvReq
	nextIdx uint32
	cache   map[cacheKey]meta
	batch   []pendingBatch // by source rank (WithBatching)
	pool    bufPool
	proxies map[btl.Module][]*proxyBuf // registered proxy buffers not in use
	// Both.
	peerErr []error // by rank: why requests to and from it fail (dead, closed)
	aborted error
	closed  bool
	wild    [2]*mpi.Request // the loop's posted control receives (the loop knows which is older)
	wildMem [2][]byte       // their buffers, maxMessage bytes each
	sentry  []*mpi.Request  // the loop's sentinel receives, by rank

	sendMu sync.Mutex     // guards sends
	sends  []*mpi.Request // control sends not known to be complete

	st       counters
	flush    chan struct{} // capacity 1: a batch waits (WithBatching)
	stop     chan struct{} // closed by Close
	loopDone chan struct{}
}

// New makes the rendezvous of the calling rank over c. It is collective:
// every rank of c calls it (it duplicates c, so its messages never meet
// the program's). Close releases it.
func New(c *mpi.Comm, opts ...Option) (*Rendezvous, error) {
	var cfg config
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
		cfg: cfg, comm: dup, pc: pc, rank: dup.Rank(), size: dup.Size(),
		table: map[key]*sent{}, waiting: map[key][]*resp{}, resps: map[respKey]*resp{},
		reqs: map[uint32]*recvReq{}, nextIdx: 1, cache: map[cacheKey]meta{},
		batch: make([]pendingBatch, dup.Size()), proxies: map[btl.Module][]*proxyBuf{},
		peerErr: make([]error, dup.Size()), sentry: make([]*mpi.Request, dup.Size()),
		flush: make(chan struct{}, 1), stop: make(chan struct{}), loopDone: make(chan struct{}),
	}
	if err := r.postReceives(); err != nil {
		dup.Free()
		return nil, fmt.Errorf("tensor: %w", err)
	}
	go r.loop()
	if cfg.batching {
		go r.flusher()
	}
	return r, nil
}

// endpoint returns the transport endpoint for communicator rank p.
func (r *Rendezvous) endpoint(p int) btl.Endpoint {
	return r.pc.Engine().PeerEndpoint(r.pc.World(p))
}

// Send puts t in this rank's table under (step, name), or hands it at once
// to a request that is already waiting for it. It never blocks on a peer.
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
	r.offerLocked(k, s, &out)
	r.mu.Unlock()
	r.run(&out)
	return terr
}

// offerLocked gives s to the first request waiting for k, or puts it in
// the table.
func (r *Rendezvous) offerLocked(k key, s *sent, out *outbox) {
	if w := r.waiting[k]; len(w) > 0 {
		rs := w[0]
		if len(w) == 1 {
			delete(r.waiting, k)
		} else {
			r.waiting[k] = w[1:]
		}
		r.matchLocked(rs, s, out)
		return
	}
	r.table[k] = s
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
	ch := make(chan result, 1)
	rq, err := r.start(step, name, src, nil, ch)
	if err != nil {
		return Tensor{}, err
	}
	select {
	case res := <-ch:
		return res.t, res.err
	case <-ctx.Done():
		if r.cancel(rq) {
			return Tensor{}, ctx.Err()
		}
		res := <-ch
		return res.t, res.err
	}
}

// RecvAsync is Recv without waiting: done is called once with the tensor
// or the error. It may be called before RecvAsync returns (an argument
// error, a closed rendezvous) and otherwise runs on the rendezvous's own
// goroutine, so it must not block: in particular it must not call Recv
// or Close.
func (r *Rendezvous) RecvAsync(step int64, name string, src int, done func(Tensor, error)) {
	if done == nil {
		done = func(Tensor, error) {}
	}
	if _, err := r.start(step, name, src, done, nil); err != nil {
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
	clear(r.table)
	for k, ws := range r.waiting {
		for _, rs := range ws {
			r.answerErrorLocked(rs, err.Error(), out)
		}
		delete(r.waiting, k)
	}
	for _, rs := range r.resps {
		r.answerErrorLocked(rs, err.Error(), out)
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
	posted := append([]*mpi.Request{r.wild[0], r.wild[1]}, r.sentry...)
	r.mu.Unlock()
	r.run(&out)
	close(r.stop)
	for _, q := range posted {
		if q != nil {
			q.Cancel()
		}
	}
	<-r.loopDone
	r.mu.Lock()
	for idx, rq := range r.reqs {
		rq.releaseReg()
		delete(r.reqs, idx)
	}
	for m, ps := range r.proxies {
		for _, p := range ps {
			p.reg.Release()
		}
		delete(r.proxies, m)
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
	msgs   []outMsg
	writes []*resp
	tells  []func()
}

type outMsg struct {
	peer int
	m    message
}

func (o *outbox) msg(peer int, m message) { o.msgs = append(o.msgs, outMsg{peer, m}) }

// run does what o holds: messages first (in order), then writes, then the
// user's completions. Called without r.mu.
func (r *Rendezvous) run(o *outbox) {
	for _, m := range o.msgs {
		r.send(m.peer, m.m)
	}
	if len(o.writes) > 0 {
		r.write(o.writes)
	}
	for _, f := range o.tells {
		f()
	}
}

// send encodes m and sends it to peer as a control message. A send that
// fails is ignored here: a dead peer is noticed by the loop's sentinel.
func (r *Rendezvous) send(peer int, m message) {
	b := encode(m)
	switch m.kind() {
	case kindNotify:
		r.st.notifies.Add(1)
	default:
		r.st.control.Add(1)
	}
	q, err := r.comm.Isend(b, peer, tagControl)
	if err != nil {
		return
	}
	r.track(q)
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
