package mpi

import (
	"context"
	"sync"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
)

// Persistent is a persistent request (MPI_Send_init, MPI_Recv_init,
// MPI_Start): the arguments of one send or receive, checked once, then
// started any number of times, as a loop that exchanges the same buffers
// every iteration does. A round runs from Start until its request
// completes; starting p again before then is ErrArg, with nothing started.
// Wait, Test and Cancel act on the round in progress; Request returns its
// *Request, to wait for it together with others (Waitall, Waitany).
//
// The buffer belongs to the library during a round, as an Isend's or
// Irecv's does until it completes; between rounds it is the caller's, and
// each round sends (or receives into) what it holds at Start. A Persistent
// is safe for use by several goroutines, and needs no freeing: drop it
// once no round is in progress.
type Persistent struct {
	c    *Comm
	buf  any
	peer int
	tag  int
	mode pml.Mode
	recv bool

	mu  sync.Mutex
	cur *Request // the last round's request (nil before the first)
}

// SendInit makes a persistent standard-mode send of buf to dest with tag
// (MPI_Send_init). Argument errors are reported here, as Isend would
// report them.
func (c *Comm) SendInit(buf any, dest, tag int) (*Persistent, error) {
	return c.sendInit(buf, dest, tag, pml.Standard)
}

// SsendInit makes a persistent synchronous send (MPI_Ssend_init): each
// round completes once its receive matched.
func (c *Comm) SsendInit(buf any, dest, tag int) (*Persistent, error) {
	return c.sendInit(buf, dest, tag, pml.Synchronous)
}

// BsendInit makes a persistent buffered send (MPI_Bsend_init): each Start
// copies buf into the attached buffer (ErrBuffer from Start when it has
// no room) and the round is complete at once.
func (c *Comm) BsendInit(buf any, dest, tag int) (*Persistent, error) {
	return c.sendInit(buf, dest, tag, pml.Buffered)
}

// RsendInit makes a persistent ready-mode send (MPI_Rsend_init), treated
// as standard.
func (c *Comm) RsendInit(buf any, dest, tag int) (*Persistent, error) {
	return c.sendInit(buf, dest, tag, pml.Ready)
}

func (c *Comm) sendInit(buf any, dest, tag int, mode pml.Mode) (*Persistent, error) {
	if _, _, err := c.args(buf, dest, tag, true); err != nil {
		return nil, err
	}
	return &Persistent{c: c, buf: buf, peer: dest, tag: tag, mode: mode}, nil
}

// RecvInit makes a persistent receive into buf from source (or AnySource)
// with tag (or AnyTag) (MPI_Recv_init). Argument errors are reported
// here, as Irecv would report them.
func (c *Comm) RecvInit(buf any, source, tag int) (*Persistent, error) {
	if _, _, err := c.args(buf, source, tag, false); err != nil {
		return nil, err
	}
	return &Persistent{c: c, buf: buf, peer: source, tag: tag, recv: true}, nil
}

// Start starts a round (MPI_Start): the send or receive with p's
// arguments, as Isend or Irecv would start it. ErrArg if the last round
// has not completed; ErrComm once the communicator was freed.
func (p *Persistent) Start() error {
	if p == nil {
		return mpierr.Errorf(mpierr.ErrArg, "nil persistent request")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cur != nil {
		if _, done, _ := p.cur.Test(); !done {
			return mpierr.Errorf(mpierr.ErrArg, "Start: the last round of this persistent request has not completed")
		}
	}
	var r *Request
	var err error
	switch {
	case p.recv:
		r, err = p.c.Irecv(p.buf, p.peer, p.tag)
		if err == nil {
			r.h().Pin()
		}
	case p.mode == pml.Buffered:
		r, err = p.c.Ibsend(p.buf, p.peer, p.tag)
	default:
		r, err = p.c.isend(p.buf, p.peer, p.tag, p.mode)
	}
	if err != nil {
		return err
	}
	p.cur = r
	return nil
}

// Startall starts a round of every non-nil entry of ps (MPI_Startall), in
// order; at the first error it stops and returns it, with the entries
// before it started.
func Startall(ps []*Persistent) error {
	for _, p := range ps {
		if p == nil {
			continue
		}
		if err := p.Start(); err != nil {
			return err
		}
	}
	return nil
}

// Request returns the request of p's last round, nil before the first
// Start. Wait for it with the other calls on requests (Waitall, Waitany,
// Test...), but not with WaitallRelease: p keeps referring to it.
func (p *Persistent) Request() *Request {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

// inactive is the status of a persistent request with no round started:
// MPI's empty status.
var inactive = Status{Source: AnySource, Tag: AnyTag}

// Wait blocks until the last round completes and returns its status;
// before the first Start it returns at once, with Source AnySource and
// Tag AnyTag (MPI's empty status).
func (p *Persistent) Wait() (Status, error) { return p.wait(nil) }

// WaitContext is Wait that gives up when ctx is done: it then returns
// ctx.Err() and the round goes on (wait again, or Cancel it).
func (p *Persistent) WaitContext(ctx context.Context) (Status, error) { return p.wait(ctx) }

// wait is Wait (ctx nil) and WaitContext.
func (p *Persistent) wait(ctx context.Context) (Status, error) {
	r := p.Request()
	if r == nil {
		return inactive, p.valid()
	}
	return r.wait(ctx)
}

// Test reports whether the last round completed, without blocking (done
// and the empty status before the first Start).
func (p *Persistent) Test() (Status, bool, error) {
	r := p.Request()
	if r == nil {
		return inactive, true, p.valid()
	}
	return r.Test()
}

// Cancel cancels the last round's receive if it has not matched yet (see
// Request.Cancel); the round then completes with Status.Cancelled set.
func (p *Persistent) Cancel() error {
	if r := p.Request(); r != nil {
		return r.Cancel()
	}
	return p.valid()
}

// valid reports a nil p as ErrArg.
func (p *Persistent) valid() error {
	if p == nil {
		return mpierr.Errorf(mpierr.ErrArg, "nil persistent request")
	}
	return nil
}
