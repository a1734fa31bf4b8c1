// Package convertor is gompi's datatype engine: MPI-style datatypes that
// describe where the data of a message lies in memory, and the Convertor
// that packs such memory into a contiguous byte stream and unpacks it back.
//
// A Datatype is built from the predefined types (Byte, Int32, Float64, ...)
// with the constructors Contiguous, Vector, Hvector, Indexed, Hindexed,
// IndexedBlock, Struct, Subarray and Resized, then committed:
//
//	col, err := convertor.Vector(n, 1, n, convertor.Float64) // one column of an n×n matrix
//	if err != nil { ... }
//	col, err = col.Commit()
//
// Commit compiles the description into a flat program of loop and block
// records (adjacent blocks merged, regular blocks folded into one strided
// record, loops kept as loops) that the Convertor walks.
//
// The Convertor is the entry point of the messaging layer. NewPacker (send
// side) and NewUnpacker (receive side) lay count elements of a committed type
// over a byte slice; Pack and Unpack then move the packed stream in pieces of
// any size and can be resumed at any packed offset with SetPosition, which is
// what pipelined and multi-fragment protocols need:
//
//	c, err := convertor.NewPacker(mem, 1, col)
//	for !c.Done() {
//		n := c.Pack(frag) // frag: a fragment's payload space
//		send(frag[:n])
//	}
//
// Errors: every function returns errors that wrap one class of
// internal/mpierr (mpi.ErrType, mpi.ErrCount, ...), for errors.Is. ErrType:
// the zero Datatype, an uncommitted type given to a Convertor, slices of
// different lengths, an unknown Order. ErrCount: negative counts or block
// lengths, sizes, displacements or bounds beyond ±(MaxInt/2) (or a
// description of more than 4M records), a layout outside the buffer. The
// old datatypes of a constructor need not be committed; the result is not.
// Zero-length blocks contribute nothing to a type, not even their bounds.
// Nothing in the package panics on bad input.
//
// All byte order is the machine's own: gompi moves data between processes of
// the same architecture, so packing never converts representations.
//
// Datatype values are immutable handles and safe for concurrent use. A
// Convertor is not: one goroutine (or one lock) per Convertor.
package convertor
