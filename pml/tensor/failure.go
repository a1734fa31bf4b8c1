package tensor

import (
	"fmt"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/mpi"
)

// peerGoneLocked fails everything that involves peer p, which died
// (mpi.ErrProcFailed) or closed its rendezvous. Its destinations are
// released: p writes no more.
func (r *Rendezvous) peerGoneLocked(p int, err error, out *outbox) {
	if r.peerErr[p] != nil {
		return
	}
	r.peerErr[p] = err
	for _, rq := range r.reqs {
		if rq.src == p {
			r.finishLocked(rq)
			r.tellLocked(rq, Tensor{}, err, out)
		}
	}
	b := &r.batch[p]
	b.req, b.re = nil, nil
	r.rel[p], r.relBytes[p] = nil, 0
	for k, x := range r.exposed { // p reads no more
		if k.peer == p {
			x.reg.Release()
			delete(r.exposed, k)
		}
	}
	if x := r.spare[p]; x.reg != nil {
		x.reg.Release()
		r.spare[p] = exposure{}
	}
	for k, rs := range r.resps {
		if k.peer == p {
			r.returnLocked(rs, out)
			delete(r.resps, k)
		}
	}
	for k, ws := range r.waiting {
		n := 0
		for _, rs := range ws {
			if rs.peer != p {
				ws[n] = rs
				n++
			}
		}
		if n == 0 {
			delete(r.waiting, k)
		} else {
			r.waiting[k] = ws[:n]
		}
	}
}

// peerFailure is the error of a receive whose source died.
func peerFailure(p int, err error) error {
	if err == nil {
		err = mpierr.Errorf(mpi.ErrProcFailed, "rank %d failed", p)
	}
	return fmt.Errorf("tensor: rank %d: %w", p, err)
}
