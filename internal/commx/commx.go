// Package commx is the narrow bridge from a public *mpi.Comm to the PML
// communicator under it, for gompi's own layers built on top of mpi (the
// tensor rendezvous, pml/tensor). It is internal: user programs reach
// communicators only through package mpi.
//
// Package mpi installs the resolver from its init function, so any
// package that imports mpi can call PML. The bridge exposes nothing that
// a layer could not otherwise reach without copying mpi's internals: the
// PML communicator gives the world rank of a communicator rank and the
// engine, whose PeerEndpoint names the transport endpoint used for a peer.
package commx

import (
	"sync/atomic"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
)

// Resolver returns the PML communicator of c, which must be an *mpi.Comm
// that is neither nil nor freed (otherwise an error wrapping ErrComm).
type Resolver func(c any) (*pml.Comm, error)

var resolver atomic.Pointer[Resolver]

// SetResolver installs the resolver; package mpi calls it once, from init.
func SetResolver(f Resolver) { resolver.Store(&f) }

// PML returns the PML communicator under c (an *mpi.Comm).
func PML(c any) (*pml.Comm, error) {
	f := resolver.Load()
	if f == nil {
		return nil, mpierr.Errorf(mpierr.ErrNotInit, "commx: package mpi is not linked in")
	}
	return (*f)(c)
}
