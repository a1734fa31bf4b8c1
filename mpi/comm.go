package mpi

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
	"github.com/gompi-org/gompi/pml"
)

// Comm is a communicator: a group of ranks with its own matching context.
// Messages sent on one communicator never match receives on another.
type Comm struct {
	in   *instance
	pc   *pml.Comm
	coll sync.Mutex // one collective operation at a time on this communicator
}

func newComm(in *instance, pc *pml.Comm) *Comm { return &Comm{in: in, pc: pc} }

// Rank returns the calling rank's number in c (0..Size-1); -1 for an invalid communicator.
func (c *Comm) Rank() int {
	if c == nil || c.pc == nil {
		return -1
	}
	return c.pc.Rank()
}

// Size returns the number of ranks in c; 0 for an invalid communicator.
func (c *Comm) Size() int {
	if c == nil || c.pc == nil {
		return 0
	}
	return c.pc.Size()
}

func (c *Comm) valid() error {
	if c == nil || c.pc == nil {
		return mpierr.Errorf(mpierr.ErrComm, "nil communicator")
	}
	if c.pc.Freed() {
		return mpierr.Errorf(mpierr.ErrComm, "communicator was freed")
	}
	return nil
}

// fast reports whether a call with peer rank r and tag, on a []byte, needs
// none of the checks and conversions of args: c valid, r a rank of c and
// tag a user tag (not ProcNull nor a wildcard). It is small enough to be
// inlined into Send, Recv, Isend and Irecv, which then make no call
// before the PML's (the build gorun makes with gompi's profile inlined
// the checks themselves; a plain go build did not).
func (c *Comm) fast(r, tag int) bool {
	return c != nil && c.pc != nil && uint(r) < uint(c.pc.Size()) && uint(tag) <= TagUB && !c.pc.Freed()
}

// args checks the arguments of a send (to dest) or a receive (from src,
// wildcards allowed) and returns buf's memory or convertor.
func (c *Comm) args(buf any, r, tag int, send bool) ([]byte, pml.Convertor, error) {
	var err error
	if send {
		err = c.checkDest(r, tag)
	} else {
		err = c.checkSource(r, tag)
	}
	if err != nil {
		return nil, nil, err
	}
	return bufferOf(buf, send)
}

// argsFast is args that takes a []byte with a plain rank and tag as it
// is (fast), without args' checks and conversion.
func (c *Comm) argsFast(buf any, r, tag int, send bool) ([]byte, pml.Convertor, error) {
	if mem, ok := buf.([]byte); ok && c.fast(r, tag) {
		return mem, nil, nil
	}
	return c.args(buf, r, tag, send)
}

func (c *Comm) checkDest(dest, tag int) error {
	if err := c.valid(); err != nil {
		return err
	}
	if dest != ProcNull && (dest < 0 || dest >= c.pc.Size()) {
		return mpierr.Errorf(mpierr.ErrRank, "destination %d not in 0..%d", dest, c.pc.Size()-1)
	}
	if tag < 0 || tag > TagUB {
		return mpierr.Errorf(mpierr.ErrTag, "send tag %d not in 0..%d", tag, TagUB)
	}
	return nil
}

func (c *Comm) checkSource(src, tag int) error {
	if err := c.valid(); err != nil {
		return err
	}
	if src != ProcNull && src != AnySource && (src < 0 || src >= c.pc.Size()) {
		return mpierr.Errorf(mpierr.ErrRank, "source %d not in 0..%d (or AnySource)", src, c.pc.Size()-1)
	}
	if tag != AnyTag && (tag < 0 || tag > TagUB) {
		return mpierr.Errorf(mpierr.ErrTag, "receive tag %d not in 0..%d (or AnyTag)", tag, TagUB)
	}
	return nil
}

var nullStatus = Status{Source: ProcNull, Tag: AnyTag}

// Send sends buf to rank dest with tag (standard mode): it returns when buf
// may be reused, which for a small message is at once and for a large one
// after the receiver took the data.
func (c *Comm) Send(buf any, dest, tag int) error { return c.send(buf, dest, tag, pml.Standard) }

// Ssend is a synchronous send: it returns only after the matching receive
// has started.
func (c *Comm) Ssend(buf any, dest, tag int) error { return c.send(buf, dest, tag, pml.Synchronous) }

// Bsend copies buf into the attached buffer (BufferAttach) and returns; the
// message is delivered from there. ErrBuffer if it does not fit.
func (c *Comm) Bsend(buf any, dest, tag int) error {
	r, err := c.Ibsend(buf, dest, tag)
	if err != nil {
		return err
	}
	_, err = r.Wait()
	return err
}

// Rsend is a ready-mode send: the program promises the matching receive is
// already posted. gompi treats it as a standard send.
func (c *Comm) Rsend(buf any, dest, tag int) error { return c.send(buf, dest, tag, pml.Ready) }

func (c *Comm) send(buf any, dest, tag int, mode pml.Mode) error {
	mem, plain := buf.([]byte)
	var conv pml.Convertor
	if !plain || !c.fast(dest, tag) {
		var err error
		if mem, conv, err = c.args(buf, dest, tag, true); err != nil {
			return err
		}
	}
	if dest == ProcNull {
		return nil
	}
	return c.pc.Send(pml.Buffer{Bytes: mem, Conv: conv}, dest, tag, mode)
}

// Recv receives a message from rank source (or AnySource) with tag (or
// AnyTag) into buf. A message longer than buf fills buf with its prefix
// and returns ErrTruncate; Status.Count is then the bytes stored.
func (c *Comm) Recv(buf any, source, tag int) (Status, error) {
	mem, plain := buf.([]byte)
	var conv pml.Convertor
	if !plain || !c.fast(source, tag) {
		var err error
		if mem, conv, err = c.args(buf, source, tag, false); err != nil {
			return Status{}, err
		}
	}
	if source == ProcNull {
		return nullStatus, nil
	}
	st, err := c.pc.Recv(pml.Buffer{Bytes: mem, Conv: conv}, source, tag)
	return Status(st), err
}

// RecvContext is Recv that gives up when ctx is done: it then cancels the
// receive and returns ctx.Err(), and the message it would have taken stays
// for a later receive. A message that matched before the cancel took
// effect is received as Recv would: the status and a nil error (or
// ErrTruncate). A receive with a deadline:
//
//	ctx, cancel := context.WithTimeout(ctx, time.Second)
//	defer cancel()
//	st, err := world.RecvContext(ctx, buf, mpi.AnySource, tag)
func (c *Comm) RecvContext(ctx context.Context, buf any, source, tag int) (Status, error) {
	r, err := c.Irecv(buf, source, tag)
	if err != nil {
		return Status{}, err
	}
	st, err := r.WaitContext(ctx)
	if err == nil || !errors.Is(err, ctx.Err()) { // done, or failed on its own
		return st, err
	}
	r.Cancel()
	if st, err := r.Wait(); err != nil || !st.Cancelled {
		return st, err // matched first: the message is here
	}
	return Status{}, ctx.Err()
}

// Sendrecv sends sendBuf to dest and receives into recvBuf from source,
// concurrently (so a ring exchange cannot deadlock). The two buffers must
// not overlap, since the receive may write while the send still reads:
// when both are contiguous and share memory, Sendrecv returns ErrBuffer
// and starts nothing. SendrecvReplace sends and receives in one buffer.
func (c *Comm) Sendrecv(sendBuf any, dest, sendTag int, recvBuf any, source, recvTag int) (Status, error) {
	// Both sides are checked and converted once, before either starts.
	rmem, rconv, err := c.argsFast(recvBuf, source, recvTag, false)
	if err != nil {
		return Status{}, err
	}
	smem, sconv, err := c.argsFast(sendBuf, dest, sendTag, true)
	if err != nil {
		return Status{}, err
	}
	switch {
	case dest != ProcNull && source != ProcNull:
		// A contiguous buffer's memory is its message (mem); a
		// non-contiguous one's is nil here and not compared.
		if sys.Overlap(smem, rmem) {
			return Status{}, mpierr.Errorf(mpierr.ErrBuffer, "Sendrecv: the send and receive buffers overlap (SendrecvReplace sends and receives in one buffer)")
		}
		// The receive is posted, then the send blocks as Send does: a
		// peer doing the same finds the receive, and waiting for the
		// send polls for both (MPI_Sendrecv is Irecv, Send, Wait in Open
		// MPI).
		st, err := c.pc.Sendrecv(pml.Buffer{Bytes: smem, Conv: sconv}, dest, sendTag, pml.Buffer{Bytes: rmem, Conv: rconv}, source, recvTag)
		return Status(st), err
	case source != ProcNull:
		st, err := c.pc.Recv(pml.Buffer{Bytes: rmem, Conv: rconv}, source, recvTag)
		return Status(st), err
	case dest != ProcNull:
		return nullStatus, c.pc.Send(pml.Buffer{Bytes: smem, Conv: sconv}, dest, sendTag, pml.Standard)
	}
	return nullStatus, nil
}

// SendrecvReplace sends the content of buf to dest and receives a message
// from source into buf (MPI_Sendrecv_replace): the message sent is buf as it
// was at the call, packed into a copy first, so the receive may overwrite
// buf at once. Truncation and the status are as for Recv.
func (c *Comm) SendrecvReplace(buf any, dest, sendTag, source, recvTag int) (Status, error) {
	if err := c.checkDest(dest, sendTag); err != nil {
		return Status{}, err
	}
	mem, conv, err := bufferOf(buf, true)
	if err != nil {
		return Status{}, err
	}
	var out []byte
	if dest != ProcNull {
		if conv != nil {
			out = make([]byte, conv.Size())
			conv.Pack(out)
		} else {
			out = append([]byte(nil), mem...)
		}
	}
	return c.Sendrecv(out, dest, sendTag, buf, source, recvTag)
}

// Isend starts a standard-mode send. buf must not be modified until the
// request completes.
func (c *Comm) Isend(buf any, dest, tag int) (*Request, error) {
	return c.isend(buf, dest, tag, pml.Standard)
}

// Issend starts a synchronous send: it completes once the receive matched.
func (c *Comm) Issend(buf any, dest, tag int) (*Request, error) {
	return c.isend(buf, dest, tag, pml.Synchronous)
}

// Irsend starts a ready-mode send (treated as standard).
func (c *Comm) Irsend(buf any, dest, tag int) (*Request, error) {
	return c.isend(buf, dest, tag, pml.Ready)
}

// Ibsend copies buf into the attached buffer and returns a request that is
// already complete; ErrBuffer if no buffer is attached or it has no room.
func (c *Comm) Ibsend(buf any, dest, tag int) (*Request, error) {
	if err := c.checkDest(dest, tag); err != nil {
		return nil, err
	}
	b, err := toBuffer(buf, true)
	if err != nil {
		return nil, err
	}
	if dest == ProcNull {
		return doneRequest(nullStatus), nil
	}
	packed, release, err := bsendReserve(b)
	if err != nil {
		return nil, err
	}
	h, err := c.pc.IsendHandle(pml.Buffer{Bytes: packed}, dest, tag, pml.Buffered, release)
	if err != nil {
		release()
		return nil, err
	}
	return (*Request)(h), nil
}

func (c *Comm) isend(buf any, dest, tag int, mode pml.Mode) (*Request, error) {
	mem, plain := buf.([]byte)
	var conv pml.Convertor
	if !plain || !c.fast(dest, tag) {
		var err error
		if mem, conv, err = c.args(buf, dest, tag, true); err != nil {
			return nil, err
		}
	}
	if dest == ProcNull {
		return doneRequest(Status{Source: ProcNull, Tag: tag}), nil
	}
	h, err := c.pc.IsendHandle(pml.Buffer{Bytes: mem, Conv: conv}, dest, tag, mode, nil)
	if err != nil {
		return nil, err
	}
	return (*Request)(h), nil
}

// Irecv starts a receive; buf must not be touched until the request completes.
func (c *Comm) Irecv(buf any, source, tag int) (*Request, error) {
	mem, plain := buf.([]byte)
	var conv pml.Convertor
	if !plain || !c.fast(source, tag) {
		var err error
		if mem, conv, err = c.args(buf, source, tag, false); err != nil {
			return nil, err
		}
	}
	if source == ProcNull {
		return doneRequest(nullStatus), nil
	}
	h, err := c.pc.IrecvHandle(pml.Buffer{Bytes: mem, Conv: conv}, source, tag)
	if err != nil {
		return nil, err
	}
	return (*Request)(h), nil
}

// Probe blocks until a message from source with tag can be received and
// describes it without receiving it.
func (c *Comm) Probe(source, tag int) (Status, error) {
	return c.ProbeContext(context.Background(), source, tag)
}

// ProbeContext is Probe that gives up when ctx is done: it then returns
// ctx.Err().
func (c *Comm) ProbeContext(ctx context.Context, source, tag int) (Status, error) {
	if err := c.checkSource(source, tag); err != nil {
		return Status{}, err
	}
	if source == ProcNull {
		return nullStatus, nil
	}
	st, err := c.pc.Probe(ctx, source, tag)
	return Status(st), err
}

// Iprobe reports whether a message from source with tag can be received now.
func (c *Comm) Iprobe(source, tag int) (Status, bool, error) {
	if err := c.checkSource(source, tag); err != nil {
		return Status{}, false, err
	}
	if source == ProcNull {
		return nullStatus, true, nil
	}
	st, ok, err := c.pc.Iprobe(source, tag)
	return Status(st), ok, err
}

// Message is a message taken out of matching by Mprobe or Improbe; receive
// it with Recv or Irecv (exactly once).
type Message struct {
	c    *Comm
	m    pml.Matched
	null bool
}

// Mprobe blocks until a matching message arrives and removes it from
// matching: no other receive can take it.
func (c *Comm) Mprobe(source, tag int) (*Message, Status, error) {
	return c.MprobeContext(context.Background(), source, tag)
}

// MprobeContext is Mprobe that gives up when ctx is done: it then returns
// ctx.Err() and takes no message. A message that matched before the
// probe could withdraw is returned as Mprobe would.
func (c *Comm) MprobeContext(ctx context.Context, source, tag int) (*Message, Status, error) {
	if err := c.checkSource(source, tag); err != nil {
		return nil, Status{}, err
	}
	if source == ProcNull {
		return &Message{c: c, null: true}, nullStatus, nil
	}
	m, st, err := c.pc.Mprobe(ctx, source, tag)
	if err != nil {
		return nil, Status{}, err
	}
	msg := newMessage()
	msg.c, msg.m = c, m
	return msg, Status(st), nil
}

// messageSlab is a chunk of Messages that Mprobe and Improbe hand out,
// n of them taken.
type messageSlab struct {
	s [32]Message
	n int
}

// messageFree is the slab being handed out; a goroutine takes it out while
// it takes a Message (one that finds none starts a new slab).
var messageFree atomic.Pointer[messageSlab]

// newMessage returns a zero Message from the current slab. An allocation
// of its own, on the path from a matched probe to the receive, made a
// ping-pong of Mprobe and Message.Recv over sm 10% slower (0.29-0.37
// against 0.26 us, six alternated gated runs of bench/shapes -mode
// mprobe). A Message keeps its slab (about 800 bytes) alive.
func newMessage() *Message {
	sl := messageFree.Swap(nil)
	if sl == nil || sl.n == len(sl.s) {
		sl = new(messageSlab)
	}
	m := &sl.s[sl.n]
	sl.n++
	messageFree.Store(sl)
	return m
}

// Improbe is the nonblocking Mprobe: ok is false when no message matches now.
func (c *Comm) Improbe(source, tag int) (*Message, Status, bool, error) {
	if err := c.checkSource(source, tag); err != nil {
		return nil, Status{}, false, err
	}
	if source == ProcNull {
		return &Message{c: c, null: true}, nullStatus, true, nil
	}
	m, st, ok, err := c.pc.Improbe(source, tag)
	if err != nil || !ok {
		return nil, Status{}, ok, err
	}
	msg := newMessage()
	msg.c, msg.m = c, m
	return msg, Status(st), true, nil
}

// Recv receives the message into buf.
func (m *Message) Recv(buf any) (Status, error) {
	r, err := m.Irecv(buf)
	if err != nil {
		return Status{}, err
	}
	return r.Wait()
}

// Irecv starts receiving the message into buf.
func (m *Message) Irecv(buf any) (*Request, error) {
	if m == nil || m.c == nil {
		return nil, mpierr.Errorf(mpierr.ErrArg, "nil message")
	}
	// The buffer's parts, built into the call's argument: a pml.Buffer
	// returned by value (toBuffer) goes through memory (bufferOf).
	mem, conv, err := bufferOf(buf, false)
	if err != nil {
		return nil, err
	}
	if m.null {
		return doneRequest(nullStatus), nil
	}
	h, err := m.c.pc.Mrecv(&m.m, pml.Buffer{Bytes: mem, Conv: conv})
	if err != nil {
		return nil, err
	}
	return (*Request)(h), nil
}

// Abort ends every rank of the job: in-process (Run), every rank's pending
// and later calls fail with ErrAborted and Run returns; under gorun every
// process exits and gorun exits with code.
func (c *Comm) Abort(code int) error {
	if err := c.valid(); err != nil {
		return err
	}
	c.in.abort(code, mpierr.Errorf(mpierr.ErrAborted, "rank %d called Abort(%d)", c.in.rank, code))
	return nil
}
