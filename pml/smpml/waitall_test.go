package smpml

import (
	"errors"

	"github.com/gompi-org/gompi/pml"
)

// waitallRelease waits for hs and gives them back to c, making the PML
// calls that mpi.Comm.WaitallRelease(reqs, nil) makes and in the same
// order (mpi/request.go: WaitallInto, then keepHandles), so that the
// harness and the benchmarks measure mpi's path without mpi's argument
// checks. For each Handle: a result already here is read in place
// (Ready); otherwise the wait takes it (WaitAlone, or Wait when another
// call got there first), and the PML requests that come back go to their
// engine's free list in batches (RecycleAll). Last, KeepHandles keeps the
// receives' Handles for c's next receives; it clears hs.
func waitallRelease(c *pml.Comm, hs []*pml.Handle) error {
	var errs []error
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
	for i, h := range hs {
		if h == nil {
			continue
		}
		if _, ok := h.Ready(); ok {
			continue
		}
		_, back, ok, err := h.WaitAlone(i < len(hs)-1)
		if !ok {
			_, err = h.Wait(nil)
		} else if back != nil {
			if e := back.Engine(); e != be || nb == len(batch) {
				flush()
				be = e
			}
			batch[nb] = back
			nb++
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	flush()
	// mpi hands the Handles over 64 at a time; a window is 64.
	for len(hs) > 0 {
		n := min(len(hs), 64)
		c.KeepHandles(hs[:n])
		hs = hs[n:]
	}
	return errors.Join(errs...)
}
