package mpi

import (
	"unsafe"

	"github.com/gompi-org/gompi/pml"
)

// A sink must be its Request's first field (allocSink): a non-zero
// offset makes this constant negative, which does not compile.
const _ = -unsafe.Offsetof(Request{}.s)

// requestOfSink returns the Request whose sink s is. s must come from
// allocSink (the PML hands back the sink allocSink made for an Irecv it
// posted), so it is the first field of a Request.
func requestOfSink(s *pml.Sink) *Request {
	return (*Request)(unsafe.Pointer(s))
}
