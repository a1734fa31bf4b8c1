package mpi

import (
	"context"
	"errors"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
)

// Request is a nonblocking operation in progress. Complete it with Wait
// (or Test until done); the buffer it names belongs to the library until
// then.
type Request struct {
	c  *Comm
	r  *pml.Request // nil for a request that completed at once (ProcNull)
	st Status
}

func doneRequest(c *Comm, st Status) *Request { return &Request{c: c, st: st} }

func (r *Request) done() bool { return r.r == nil || r.r.Done() }

func (r *Request) result() (Status, error) {
	if r.r == nil {
		return r.st, nil
	}
	st, err := r.r.Result()
	return Status(st), err
}

// Wait blocks until the request completes and returns its status.
func (r *Request) Wait() (Status, error) {
	if r == nil {
		return Status{}, mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	if r.r != nil {
		r.c.in.engine.Wait(nil, r.r)
	}
	return r.result()
}

// WaitContext is Wait that gives up when ctx is done: it then returns
// ctx.Err() and the request stays valid (wait again, or Cancel it).
func (r *Request) WaitContext(ctx context.Context) (Status, error) {
	if r == nil {
		return Status{}, mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	if r.r != nil {
		if err := r.c.in.engine.Wait(ctx, r.r); err != nil {
			return Status{}, err
		}
	}
	return r.result()
}

// Test reports whether the request completed, without blocking; the status
// and error are valid when done is true.
func (r *Request) Test() (Status, bool, error) {
	if r == nil {
		return Status{}, false, mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	if !r.done() {
		r.c.in.engine.Progress()
		if !r.done() {
			return Status{}, false, nil
		}
	}
	st, err := r.result()
	return st, true, err
}

// Cancel cancels a receive that has not matched yet; Wait then returns a
// Status with Cancelled set. Cancelling a receive that already matched, or
// a send, has no effect (the request completes normally).
func (r *Request) Cancel() error {
	if r == nil {
		return mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	if r.r != nil {
		r.c.pc.Cancel(r.r)
	}
	return nil
}

// Waitall waits for every request (nil entries are skipped) and returns
// their statuses in order, with errors.Join of their errors.
func Waitall(reqs []*Request) ([]Status, error) {
	sts := make([]Status, len(reqs))
	var errs []error
	for i, r := range reqs {
		if r == nil {
			continue
		}
		st, err := r.Wait()
		sts[i] = st
		if err != nil {
			errs = append(errs, err)
		}
	}
	return sts, errors.Join(errs...)
}

// Waitany blocks until one of reqs completes and returns its index and
// status; that entry is set to nil (MPI's inactive request), so calling
// Waitany again waits for another. nil entries are skipped; with none left
// it returns index -1 (MPI_UNDEFINED).
func Waitany(reqs []*Request) (int, Status, error) {
	for i, r := range reqs {
		if r != nil && r.done() {
			return takeResult(reqs, i)
		}
	}
	var e *pml.Engine
	prs := make([]*pml.Request, len(reqs))
	for i, r := range reqs {
		if r != nil {
			prs[i] = r.r
			e = r.c.in.engine
		}
	}
	if e == nil {
		return -1, Status{}, nil
	}
	i := e.WaitAny(prs)
	if i < 0 {
		return -1, Status{}, nil
	}
	return takeResult(reqs, i)
}

func takeResult(reqs []*Request, i int) (int, Status, error) {
	st, err := reqs[i].result()
	reqs[i] = nil
	return i, st, err
}

// Waitsome blocks until at least one request completes and returns the
// indices and statuses of all that are complete now; their entries are set
// to nil. With no live request it returns nil slices.
func Waitsome(reqs []*Request) ([]int, []Status, error) {
	i, st, err := Waitany(reqs)
	if i < 0 {
		return nil, nil, nil
	}
	idx, sts := []int{i}, []Status{st}
	errs := []error{err}
	for j, r := range reqs {
		if r != nil && r.done() {
			_, st, err := takeResult(reqs, j)
			idx, sts, errs = append(idx, j), append(sts, st), append(errs, err)
		}
	}
	return idx, sts, errors.Join(errs...)
}

// Testall reports whether every request is complete; if so it returns
// their statuses (nil entries skipped) and errors.Join of their errors.
func Testall(reqs []*Request) ([]Status, bool, error) {
	for _, r := range reqs {
		if r != nil && !r.done() {
			r.c.in.engine.Progress()
			if !r.done() {
				return nil, false, nil
			}
		}
	}
	sts, err := Waitall(reqs)
	return sts, true, err
}

// Testany returns the index and status of a completed request (its entry
// set to nil) and ok == true, or ok == false if none is complete now.
// With no live request it returns (-1, Status{}, true, nil).
func Testany(reqs []*Request) (int, Status, bool, error) {
	live := false
	for i, r := range reqs {
		if r == nil {
			continue
		}
		live = true
		if !r.done() {
			r.c.in.engine.Progress()
		}
		if r.done() {
			i, st, err := takeResult(reqs, i)
			return i, st, true, err
		}
	}
	if !live {
		return -1, Status{}, true, nil
	}
	return -1, Status{}, false, nil
}
