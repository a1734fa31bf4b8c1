// An endpoint is a module's reliable-connected pair with one peer: its
// state, the lock that guards it and the types its operations pass around
// live here. Its work is spread by seam: endpoint_connect.go (wire-up),
// endpoint_send.go (control messages), endpoint_rdma.go (Put, Get,
// WriteWithImm), endpoint_post.go (the send queue and Flush),
// endpoint_poll.go (completions and inbound frames) and endpoint_fail.go
// (liveness, failure, close).

package verbs

import (
	"runtime"
	"sync"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// epState is an endpoint's connection state; transitions happen under
// endpoint.mu.
//
//	idle ──first operation, or the peer's address appears──▶ connecting ──both QPs up──▶ connected
//	any ──connect failure, work completion error, protocol error──▶ failed (PeerFailed)
//	any ──peer's close frame, or our Close──▶ closed
type epState int32

const (
	epIdle epState = iota
	epConnecting
	epConnected
	epFailed
	epClosed
)

// opKind is what a send work request (or a queued operation) does.
type opKind uint8

const (
	opPad   opKind = iota // the pad frame before a message
	opMsg                 // a control message (fragment)
	opClose               // the close frame
	opACK                 // an acknowledgement
	opPut
	opGet
	opImm   // a Put with an immediate
	opProbe // a zero-length RDMA WRITE checking that the peer lives
	opFence // a zero-length RDMA WRITE whose completion completes what was posted before it
)

// recvBit marks the work request ids of receives.
const recvBit = 1 << 63

// maxChunk is the largest RDMA operation posted as one work request.
const maxChunk = 1 << 30

// ackReserve send queue slots are kept for acknowledgements.
const ackReserve = 1

// wrOp is a posted send work request, in post order.
type wrOp struct {
	id   uint64
	kind opKind
	take int    // opMsg, opClose: ring bytes taken, pad included
	seq  uint64 // operation number on its last work request (0 otherwise)
	cb   btl.Completion
	reg  *regEntry // released on the operation's last work request
	last bool
}

// pendOp is an operation waiting for the connection, credits, ring room
// or send queue slots, in submission order.
type pendOp struct {
	kind  opKind
	tag   btl.Tag
	hdr   []byte // copied
	data  []byte // the caller's, until posted
	abuf  []byte // SendAlloc buffer, recycled once posted
	cb    btl.Completion
	local []byte
	raddr uint64
	rkey  uint32
	imm   uint32
	reg   *regEntry
	seq   uint64
}

type doneCB struct {
	cb  btl.Completion
	err error
}

type flushWait struct {
	seq uint64
	cb  btl.Completion
}

// endpoint is the module's pair with one peer.
type endpoint struct {
	m    *module
	peer int

	// Set by connect before the endpoint goes live; read-only after.
	cq      ibv.CQ
	qp      ibv.QP
	ring    []byte // inbound control ring
	ringMR  ibv.MR
	stage   []byte // outbound staging copy of the peer's ring
	stageMR ibv.MR
	pin     runtime.Pinner
	psn     uint32
	remote  addr

	mu       sync.Mutex // guards the fields below
	state    epState
	err      error // why failed or closed
	win      sendWindow
	sqFree   int
	ops      []wrOp // posted send work requests, oldest at opsHead
	opsHead  int
	pending  []*pendOp
	acksOwed int
	nextID   uint64
	opSeq    uint64 // operations submitted
	doneSeq  uint64 // operations completed (in order)
	flushes  []flushWait
	closeSeq uint64      // operation number of our close frame (0: none)
	probe    *time.Timer // liveness probe while operations wait for the peer
	probing  bool        // a probe is posted
	// sendsDone counts send completions; probeMark is its value at the
	// last probe tick and idleTicks the ticks since it last moved.
	sendsDone uint64
	probeMark uint64
	idleTicks int
	// unsig counts the unsignaled work requests posted since the last
	// signaled one, and unsigTake the ring bytes of their messages.
	unsig     int
	unsigTake int
	later     []doneCB
	report    error // failure to report with PeerFailed once mu is released
	reported  bool

	// Receive side: only the goroutine holding module.pollMu.
	rwin   recvWindow
	rqFree int // receives to post again
	cqDead bool
	wcs    []ibv.WC
	rwrs   []ibv.RecvWR

	// Scratch of postMsgLocked, guarded by mu.
	wrScratch [2]ibv.SendWR
	sgScratch [3]ibv.SGEntry
}

func newEndpoint(m *module, peer int) *endpoint {
	return &endpoint{m: m, peer: peer}
}

func (e *endpoint) Module() btl.Module { return e.m }
func (e *endpoint) Peer() int          { return e.peer }

// unlock releases mu, then runs the completions queued meanwhile and
// reports a failure, both with no lock held.
func (e *endpoint) unlock() {
	later, rep := e.later, e.report
	e.later, e.report = nil, nil
	e.mu.Unlock()
	for _, d := range later {
		d.cb(d.err)
	}
	if rep != nil {
		e.m.env.Logf("verbs: rank %d: %v", e.m.env.Rank, rep)
		e.m.env.Dispatch.PeerFailed(e.peer, rep)
	}
}

// checkOpen returns the error of an endpoint that cannot take operations.
func (e *endpoint) checkLocked() error {
	switch e.state {
	case epFailed, epClosed:
		return e.err
	}
	if e.m.closed.Load() {
		return e.m.errClosed()
	}
	return nil
}

func (e *endpoint) checkSize(n int) error {
	if n > e.m.cfg.maxFrag {
		return mpierr.Errorf(mpierr.ErrArg, "verbs: %d-byte fragment exceeds the %d-byte limit", n, e.m.cfg.maxFrag)
	}
	return nil
}

func (e *endpoint) completeLocked(cb btl.Completion, err error) {
	if cb != nil {
		e.later = append(e.later, doneCB{cb, err})
	}
}
