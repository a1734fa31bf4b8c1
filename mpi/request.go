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
// The PML request behind it is pooled. A receive posted with Irecv hands
// the PML its sink (pml.Sink): the engine writes the result there at
// completion and gives the PML request back itself when no call here holds
// it. Any other request's result is copied here by the first call that
// finds it done, which gives the PML request back. Calls on one Request
// from several goroutines at once stay safe: each holds a use count while
// it touches the PML request, and only an unused one is given back (MPI
// calls waiting twice on one request erroneous; gompi allows it).
type Request struct {
	// The result (source, tag, count; an error or a count beyond 32 bits
	// boxed in Extra) and State: the calls touching *p right now (low
	// bits), taken (one call copies the result and gives p back), gone
	// (the result is here), recycle (the last of the calls gives p back),
	// sink mode (Irecv: the engine writes the result). One word, so that
	// finishing costs few locked instructions. 32 bytes in all: the one
	// allocation of a nonblocking call, whose bytes set the garbage
	// collector's pace in a message-rate loop (48 -> 32 bytes raised sm's
	// 8 B rate by 8%). First: an Irecv's
	// Request is found from its sink (Comm.allocSink).
	s pml.Sink
	// p is the PML request, set at creation and never changed (nil for a
	// request done at once); once the sink is gone, p may be back in the
	// pool (and another's) and is not touched. A plain p saves an atomic
	// store, a locked instruction, per nonblocking call.
	p *pml.Request
}

const (
	goneBit      = pml.SinkGone
	takenBit     = pml.SinkTaken
	cancelledBit = pml.SinkCancelled
	sinkBit      = pml.SinkMode
	usersMask    = pml.SinkUsers
	// releasableBit marks an Irecv's Request from allocSink, which
	// WaitallRelease may give back for reuse.
	releasableBit = pml.SinkOwner
)

// stored returns the result copied here (acquire returned nil).
func (r *Request) stored() (Status, error) {
	st, err := r.s.Result()
	return Status(st), err
}

// release drops a use taken by acquire (giving p back when the engine left
// that to the last user).
func (r *Request) release() { r.s.Release(r.p) }

func newRequest(pr *pml.Request) *Request { return &Request{p: pr} }

func doneRequest(st Status) *Request {
	r := &Request{}
	r.s.Store(pml.Status(st), nil)
	if st.Cancelled { // none of the callers' statuses is; kept correct anyway
		r.s.State.Init(cancelledBit)
	}
	return r
}

// acquire returns the PML request with a use count held (release it with
// r.release()), or nil when the result is already here.
func (r *Request) acquire() *pml.Request {
	if r.p == nil || r.s.State.Load()&goneBit != 0 { // gone never ends: no count needed
		return nil
	}
	if r.s.State.Add(1)&goneBit != 0 {
		r.release()
		return nil
	}
	return r.p
}

// progress runs the engine of r's PML request once (nothing when the
// result is already here).
func (r *Request) progress() {
	if pr := r.acquire(); pr != nil {
		pr.Engine().Progress()
		r.release()
	}
}

func (r *Request) done() bool {
	pr := r.acquire()
	if pr == nil {
		return true
	}
	d := pr.Done()
	r.release()
	return d
}

// result returns the status and error of a request known to be done.
func (r *Request) result() (Status, error) {
	pr := r.acquire()
	if pr == nil {
		return r.stored()
	}
	return r.finish(pr)
}

// finish takes the result of pr, which is done and held by the caller (a
// use count), and gives pr back to the pool when nobody else holds it.
func (r *Request) finish(pr *pml.Request) (Status, error) {
	st, back, err := r.finishKeep(pr)
	if back != nil {
		pml.Recycle(back)
	}
	return st, err
}

// finishKeep is finish that returns pr to the caller to give back (nil
// when it is not this call's to give back), as finishTakenKeep does.
func (r *Request) finishKeep(pr *pml.Request) (Status, *pml.Request, error) {
	// Sink mode: the engine stores the result (maybe not quite yet: it
	// marks the sink gone just after completing pr); held, pr is still
	// ours. Or another call takes the result.
	if r.s.State.Load()&sinkBit != 0 || r.s.State.Or(takenBit)&takenBit != 0 {
		st, err := pr.Result()
		return Status(st), r.s.ReleaseKeep(pr), err
	}
	return r.finishTakenKeep(pr)
}

// finishTaken stores the result of pr, which is done, taken by this call
// and held with a use count, and gives pr back when nobody else holds it.
func (r *Request) finishTaken(pr *pml.Request) (Status, error) {
	st, back, err := r.finishTakenKeep(pr)
	if back != nil {
		pml.Recycle(back)
	}
	return st, err
}

// finishTakenKeep is finishTaken that returns pr to the caller to give
// back (nil when another call still holds it).
func (r *Request) finishTakenKeep(pr *pml.Request) (Status, *pml.Request, error) {
	pst, err := pr.Result()
	r.s.Store(pst, err)
	st := Status(pst)
	// Gone (later calls read st and err) and this call's use dropped, at
	// once. A call that looks from now on sees gone: once the count is
	// zero, nobody can reach pr any more.
	add := uint32(goneBit - 1)
	if st.Cancelled {
		add += cancelledBit
	}
	if r.s.State.Add(add)&usersMask == 0 {
		return st, pr, err
	}
	return st, nil, err
}

// waitAlone is Wait's common case: no other call on r yet. For an Irecv's
// request whose sink is gone, the result is read with no locked
// instruction and nothing to give back. Otherwise this call takes the
// result (later calls see taken and leave it), with one use held: two
// locked instructions per request (the swap and finishTakenKeep's add)
// instead of three (acquire, taken, gone). A Wait without a context always
// ends with the result, so taking it first is safe; a WaitContext may give
// up, so it takes it at the end. back is the PML request for the caller to
// give back; ok false: not the common case, nothing done.
func (r *Request) waitAlone(more bool) (st Status, back *pml.Request, ok bool, err error) {
	pr := r.p
	if pr == nil { // done at once (an eager send, say): the result is here
		st, err = r.stored()
		return st, nil, true, err
	}
	if s := r.s.State.Load(); s&sinkBit != 0 {
		if s&goneBit != 0 {
			st, err = r.stored()
			return st, nil, true, err
		}
		if pr = r.acquire(); pr == nil {
			st, err = r.stored()
			return st, nil, true, err
		}
		waitPML(pr, more) // without a context it returns once pr is done
		if r.s.State.Load()&usersMask > 1 {
			pr.Wake() // another goroutine may be parked on pr too
		}
		// pr, when this call must give it back, goes to the caller
		// (Waitall: in a batch to the engine's free list, which the next
		// Irecvs take from, not the sync.Pool).
		st, back, err = r.finishKeep(pr)
		return st, back, true, err
	}
	if !r.s.State.CompareAndSwap(0, takenBit|1) {
		return Status{}, nil, false, nil
	}
	waitPML(pr, more) // without a context it returns once pr is done
	if r.s.State.Load()&usersMask > 1 {
		pr.Wake() // another goroutine may be parked on pr too
	}
	st, back, err = r.finishTakenKeep(pr)
	return st, back, true, err
}

// waitPML waits for pr; more: the caller has more requests to wait for
// after this one (pml.Engine.WaitMore).
func waitPML(pr *pml.Request, more bool) {
	if more {
		pr.Engine().WaitMore(pr)
	} else {
		pr.Engine().Wait(nil, pr)
	}
}

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
	if ctx == nil {
		if st, back, ok, err := r.waitAlone(false); ok {
			if back != nil {
				pml.Recycle(back)
			}
			return st, err
		}
	}
	pr := r.acquire()
	if pr == nil {
		return r.stored()
	}
	if err := pr.Engine().Wait(ctx, pr); err != nil {
		r.release()
		return Status{}, err
	}
	// Alone on r (one use, ours, not taken): take it with one swap.
	if r.s.State.Load()&sinkBit == 0 && r.s.State.CompareAndSwap(1, takenBit|1) {
		return r.finishTaken(pr)
	}
	// One completion rings one parked waiter: pass it on when another
	// goroutine may be parked on pr too.
	if r.s.State.Load()&usersMask > 1 {
		pr.Wake()
	}
	return r.finish(pr)
}

// Test reports whether the request completed, without blocking; the status
// and error are valid when done is true.
func (r *Request) Test() (Status, bool, error) {
	if r == nil {
		return Status{}, false, mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	pr := r.acquire()
	if pr == nil {
		st, err := r.stored()
		return st, true, err
	}
	if !pr.Done() {
		pr.Engine().Progress()
		if !pr.Done() {
			r.release()
			return Status{}, false, nil
		}
	}
	st, err := r.finish(pr)
	return st, true, err
}

// Cancel cancels a receive that has not matched yet; Wait then returns a
// Status with Cancelled set. Cancelling a receive that already matched, or
// a send, has no effect (the request completes normally).
func (r *Request) Cancel() error {
	if r == nil {
		return mpierr.Errorf(mpierr.ErrArg, "nil request")
	}
	if pr := r.acquire(); pr != nil {
		pr.Comm().Cancel(pr)
		r.release()
	}
	return nil
}

// Waitall waits for every request (nil entries are skipped) and returns
// their statuses in order, with errors.Join of their errors.
func Waitall(reqs []*Request) ([]Status, error) {
	sts := make([]Status, len(reqs))
	return sts, WaitallInto(reqs, sts)
}

// maxRFree bounds the Requests a communicator keeps for reuse.
const maxRFree = 1024

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
	var keep [64]*Request
	n := 0
	for i, r := range reqs {
		if r == nil {
			continue
		}
		reqs[i] = nil
		// Done, no call holding it, no error: nobody, the engine
		// included, touches it any more.
		if r.s.State.Load() == goneBit|sinkBit|releasableBit && r.s.Extra == nil {
			keep[n] = r
			if n++; n == len(keep) {
				c.keepFree(keep[:n])
				n = 0
			}
		}
	}
	c.keepFree(keep[:n])
	return err
}

// keepFree adds rs to the requests allocSink hands out.
func (c *Comm) keepFree(rs []*Request) {
	if len(rs) == 0 || c == nil || c.pc == nil {
		return
	}
	c.pc.LockAlloc()
	k := min(len(rs), maxRFree-len(c.rfree))
	c.rfree = append(c.rfree, rs[:k]...)
	c.pc.UnlockAlloc()
	clear(rs)
}

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
	var batch [64]*pml.Request
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
		// The result already here without an error (an eager send done at
		// once, an Irecv whose sink the engine filled): read in place,
		// nothing to wait for or give back: about 30 instructions a
		// request of a rate window, against about 100 through waitAlone
		// (callgrind of gompi-bench rate 8 B under gorun).
		if s := r.s.State.Load(); (r.p == nil || s&goneBit != 0) && r.s.Extra == nil {
			if sts != nil {
				sts[i] = Status{Source: int(r.s.Source), Tag: int(r.s.Tag), Count: int(r.s.Count), Cancelled: s&cancelledBit != 0}
			}
			continue
		}
		st, back, ok, err := r.waitAlone(i < len(reqs)-1)
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
		if r != nil && r.done() {
			return takeResult(reqs, i)
		}
	}
	var e *pml.Engine
	prs := make([]*pml.Request, len(reqs))
	for i, r := range reqs {
		if r != nil {
			prs[i] = r.acquire() // nil: its result is here, so it is done
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

// releaseAll drops the use counts acquire took on the non-nil prs.
func releaseAll(reqs []*Request, prs []*pml.Request) {
	for i, pr := range prs {
		if pr != nil {
			reqs[i].release()
		}
	}
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
			r.progress()
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
			r.progress()
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
