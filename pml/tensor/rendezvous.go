package tensor

import (
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
	table        map[key]*sent
	waiting      map[key][]*resp      // requests that arrived before their tensor
	spareWaiting []*resp              // an emptied list of waiting, for the next request that waits (no allocation)
	resps        map[respKey]*resp    // requests waiting for their tensor or for a TENSOR_RE_REQUEST
	exposed      map[respKey]exposure // contents registered for their receiver to read, until it releases them
	spare        []exposure           // by rank: the registration of the content it released last, kept until the next write to it (which takes it when its content is in the same memory)
	pullers      map[string]int       // tensor name -> the rank whose last request for it read the content (Send registers ahead)
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
