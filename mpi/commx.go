package mpi

import (
	"github.com/gompi-org/gompi/internal/commx"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
)

// The bridge for gompi's layers above mpi (internal/commx): they reach a
// communicator's PML state through it instead of public API.
func init() {
	commx.SetResolver(func(c any) (*pml.Comm, error) {
		mc, ok := c.(*Comm)
		if !ok {
			return nil, mpierr.Errorf(mpierr.ErrComm, "commx: %T is not an *mpi.Comm", c)
		}
		if err := mc.valid(); err != nil {
			return nil, err
		}
		return mc.pc, nil
	})
}
