package mpi

import "github.com/gompi-org/gompi/convertor"

// Status describes a completed receive (or send).
type Status struct {
	Source    int  // sender's rank in the communicator (ProcNull for ProcNull receives)
	Tag       int  // the message's tag
	Count     int  // bytes received (for a send request: bytes sent)
	Cancelled bool // the request was cancelled before it matched
}

// Elements returns the number of whole elements of t in Count, or
// Undefined when Count is not a whole number of elements.
func (s Status) Elements(t convertor.Datatype) int {
	if !t.Valid() {
		return Undefined
	}
	return t.Elements(s.Count)
}
