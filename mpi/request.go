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
//
// It is the PML's Handle (pml/handle.go), which keeps the result and the
// PML request behind it and alone reads and writes its state: the
// methods here check their arguments and convert.
type Request pml.Handle

// h is r as the PML's Handle.
func (r *Request) h() *pml.Handle { return (*pml.Handle)(r) }

func doneRequest(st Status) *Request { return (*Request)(pml.DoneHandle(pml.Status(st))) }

// Wait blocks until the request completes and returns its status.
func (r *Request) Wait() (Status, error) { return r.wait(nil) }

// WaitContext is Wait that gives up when ctx is done: it then returns
// ctx.Err() and the request stays valid (wait again, or Cancel it).
func (r *Request) WaitContext(ctx context.Context) (Status, error) { return r.wait(ctx) }

// wait is Wait (ctx nil) and WaitContext.
func (r *Request) wait(ctx context.Context) (Status, error) {
	if r == nil {
		return Status{}, mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	st, err := r.h().Wait(ctx)
	return Status(st), err
}

// Test reports whether the request completed, without blocking; the status
// and error are valid when done is true.
func (r *Request) Test() (Status, bool, error) {
	if r == nil {
		return Status{}, false, mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	st, done, err := r.h().Test()
	return Status(st), done, err
}

// Cancel cancels a receive that has not matched yet; Wait then returns a
// Status with Cancelled set. Cancelling a receive that already matched, or
// a send, has no effect (the request completes normally).
func (r *Request) Cancel() error {
	if r == nil {
		return mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	r.h().Cancel()
	return nil
}

// Waitall waits for every request (nil entries are skipped) and returns
// their statuses in order, with errors.Join of their errors.
//
// Up to 8 requests (a halo exchange's in one or two dimensions), the
// statuses are an array of the caller's once the call is inlined, on its
// stack unless the caller lets the slice escape: most callers drop it or
// read it in place (`_, err := mpi.Waitall(reqs)`), and their loops then
// allocate nothing and leave the collector nothing to do.
func Waitall(reqs []*Request) ([]Status, error) {
	var a [8]Status
	return waitallIn(reqs, a[:0])
}

// waitallIn is Waitall with buf's array for the statuses when it holds
// them all. It returns the statuses.
func waitallIn(reqs []*Request, buf []Status) ([]Status, error) {
	var sts []Status
	if cap(buf) >= len(reqs) {
		sts = buf[:len(reqs)]
	} else {
		sts = make([]Status, len(reqs))
	}
	return sts, WaitallInto(reqs, sts)
}

// WaitallRelease is WaitallInto that then gives the requests back, as
// MPI_Waitall frees its requests and sets the handles to
// MPI_REQUEST_NULL: reqs[i] is set to nil, and a request of an Irecv that
// completed without an error may be reused by a later Irecv on c. The
// caller must keep no other reference to them and no other goroutine may
// be using them. A loop of windows of Irecvs (gompi-bench rate) then
// allocates nothing for its requests and keeps reusing memory that is in
// the cache (with pml.Request's layout it raised gompi-bench rate 8 B over
// sm by 9%). Requests of other calls are only set to nil. The requests
// may come from any communicator; those given back serve c's Irecvs.
func (c *Comm) WaitallRelease(reqs []*Request, sts []Status) error {
	err := WaitallInto(reqs, sts)
	if sts != nil && len(sts) < len(reqs) {
		return err // ErrArg: nothing was waited for
	}
	var keep [64]*pml.Handle
	n := 0
	for i, r := range reqs {
		if r == nil {
			continue
		}
		reqs[i] = nil
		keep[n] = r.h()
		if n++; n == len(keep) {
			c.keepHandles(keep[:n])
			n = 0
		}
	}
	c.keepHandles(keep[:n])
	return err
}

// keepHandles gives hs to the PML, which keeps those that no call, nor
// the engine, touches any more for c's Irecvs (pml.Comm.KeepHandles).
func (c *Comm) keepHandles(hs []*pml.Handle) {
	if len(hs) == 0 || c == nil || c.pc == nil {
		clear(hs)
		return
	}
	c.pc.KeepHandles(hs)
}

// streamMin is the largest Waitall whose waits do not pause between
// polls (WaitallInto).
const streamMin = 8

// WaitallInto is Waitall writing the statuses into sts (sts[i] for
// reqs[i]; entries of nil requests are left alone), or ignoring them when
// sts is nil, as MPI_STATUSES_IGNORE does: a loop of windows then
// allocates nothing for them. A non-nil sts shorter than reqs is ErrArg,
// with nothing waited for.
func WaitallInto(reqs []*Request, sts []Status) error {
	if sts != nil && len(sts) < len(reqs) {
		return mpierr.Errorf(mpierr.ErrArg, "WaitallInto: %d statuses for %d requests", len(sts), len(reqs))
	}
	var errs []error
	// The PML requests are given back in batches, to their engine's free
	// list under one hold of its lock (pml.Engine.RecycleAll), rather
	// than one by one to the sync.Pool, whose shared queue costs a locked
	// instruction each way once a window overflows its per-processor slot.
	// Most requests need no giving back (the engine recycled them at
	// completion: only those whose wait held them then come back here),
	// so the batch is small: the array is cleared at every call.
	var batch [16]*pml.Request
	nb := 0
	var be *pml.Engine
	flush := func() {
		if nb > 0 {
			be.RecycleAll(batch[:nb])
			clear(batch[:nb])
			nb = 0
		}
	}
	for i, r := range reqs {
		if r == nil {
			continue
		}
		// The result already here without an error: read in place,
		// nothing to wait for or give back.
		if st, ok := r.h().Ready(); ok {
			if sts != nil {
				sts[i] = Status(st)
			}
			continue
		}
		// more: the requests after this one stream in behind it, and
		// polls that find nothing pause (pml's waitMore); for a window of
		// streamMin requests or fewer (a halo exchange's) the pause only
		// delays each message's turn (bench/ring -mode nb over sm: 0.55
		// -> 0.46 us a step without it).
		pst, back, ok, err := r.h().WaitAlone(len(reqs) > streamMin && i < len(reqs)-1)
		st := Status(pst)
		if !ok {
			st, err = r.Wait()
		} else if back != nil {
			if e := back.Engine(); e != be || nb == len(batch) {
				flush()
				be = e
			}
			batch[nb] = back
			nb++
		}
		if sts != nil {
			sts[i] = st
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	flush()
	return errors.Join(errs...)
}

// Waitany blocks until one of reqs completes and returns its index and
// status; that entry is set to nil (MPI's inactive request), so calling
// Waitany again waits for another. nil entries are skipped; with none left
// it returns index -1 (MPI_UNDEFINED).
func Waitany(reqs []*Request) (int, Status, error) {
	for i, r := range reqs {
		if r != nil && r.h().Done() {
			return takeResult(reqs, i)
		}
	}
	if i := pml.SpinAny(len(reqs), func(i int) *pml.Handle { return reqs[i].h() }); i >= 0 {
		return takeResult(reqs, i)
	}
	var e *pml.Engine
	prs := make([]*pml.Request, len(reqs))
	for i, r := range reqs {
		if r != nil {
			prs[i] = r.h().Acquire() // nil: its result is here, so it is done
			if prs[i] == nil {
				releaseAll(reqs, prs)
				return takeResult(reqs, i)
			}
			e = prs[i].Engine()
		}
	}
	if e == nil {
		return -1, Status{}, nil
	}
	i := e.WaitAny(prs)
	releaseAll(reqs, prs)
	if i < 0 {
		return -1, Status{}, nil
	}
	return takeResult(reqs, i)
}

// releaseAll drops the use counts Acquire took on the non-nil prs.
func releaseAll(reqs []*Request, prs []*pml.Request) {
	for i, pr := range prs {
		if pr != nil {
			reqs[i].h().Release()
		}
	}
}

func takeResult(reqs []*Request, i int) (int, Status, error) {
	st, err := reqs[i].h().Result()
	reqs[i] = nil
	return i, Status(st), err
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
		if r != nil && r.h().Done() {
			_, st, err := takeResult(reqs, j)
			idx, sts, errs = append(idx, j), append(sts, st), append(errs, err)
		}
	}
	return idx, sts, errors.Join(errs...)
}

// Testsome is the nonblocking Waitsome (MPI_Testsome): the indices and
// statuses of the requests complete now, their entries set to nil, and
// errors.Join of their errors; empty slices when none is. With no live
// request it returns nil slices.
func Testsome(reqs []*Request) ([]int, []Status, error) {
	live := false
	for _, r := range reqs {
		if r == nil {
			continue
		}
		live = true
		if !r.h().Done() {
			r.h().Progress() // the engine's, once for all of them
			break
		}
	}
	if !live {
		return nil, nil, nil
	}
	idx, sts := []int{}, []Status{}
	var errs []error
	for j, r := range reqs {
		if r != nil && r.h().Done() {
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
		if r != nil && !r.h().Done() {
			r.h().Progress()
			if !r.h().Done() {
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
		if !r.h().Done() {
			r.h().Progress()
		}
		if r.h().Done() {
			i, st, err := takeResult(reqs, i)
			return i, st, true, err
		}
	}
	if !live {
		return -1, Status{}, true, nil
	}
	return -1, Status{}, false, nil
}
