package mpi

import (
	"reflect"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
	"github.com/gompi-org/gompi/pml"
)

// TypedBuffer is count elements of a (derived) datatype laid over the
// memory of a slice, like MPI's (buf, count, datatype). Make one with Typed.
type TypedBuffer struct {
	mem   []byte
	count int
	t     convertor.Datatype
	err   error
}

// Typed lays count elements of datatype t over the memory of base (a slice
// of a fixed-size numeric type, see the package doc). Element i starts at
// byte i*t.Extent() of base. Errors (bad base type, uncommitted type,
// layout outside base) are reported by the call that uses the buffer.
func Typed(base any, count int, t convertor.Datatype) TypedBuffer {
	mem, ok := bytesOf(base)
	if !ok {
		return TypedBuffer{err: mpierr.Errorf(mpierr.ErrBuffer, "Typed over %s: want a slice of a fixed-size numeric type", typeName(base))}
	}
	return TypedBuffer{mem: mem, count: count, t: t}
}

// bytesOf returns the memory of a supported slice type.
func bytesOf(buf any) ([]byte, bool) {
	switch b := buf.(type) {
	case []byte:
		return b, true
	case []int8:
		return sys.AsBytes(b), true
	case []int16:
		return sys.AsBytes(b), true
	case []int32:
		return sys.AsBytes(b), true
	case []int64:
		return sys.AsBytes(b), true
	case []int:
		return sys.AsBytes(b), true
	case []uint16:
		return sys.AsBytes(b), true
	case []uint32:
		return sys.AsBytes(b), true
	case []uint64:
		return sys.AsBytes(b), true
	case []uint:
		return sys.AsBytes(b), true
	case []float32:
		return sys.AsBytes(b), true
	case []float64:
		return sys.AsBytes(b), true
	case []complex64:
		return sys.AsBytes(b), true
	case []complex128:
		return sys.AsBytes(b), true
	}
	return nil, false
}

// toBuffer turns a user buffer into the PML's view. send selects the
// convertor direction for typed buffers.
func toBuffer(buf any, send bool) (pml.Buffer, error) {
	mem, conv, err := bufferOf(buf, send)
	return pml.Buffer{Bytes: mem, Conv: conv}, err
}

// bufferOf is toBuffer in parts, for the calls of every message (Send,
// Recv, Isend, Irecv, through Comm.args when the buffer is not a []byte):
// they build the pml.Buffer in the call's arguments.
// A pml.Buffer is 40 bytes, more than the compiler keeps in registers, so
// one returned by value is copied through memory with 16-byte loads of
// narrower stores, which stall (perf annotate of the receiving rank of
// gompi-bench rate put 68% of mpi.Irecv's samples on that copy).
func bufferOf(buf any, send bool) ([]byte, pml.Convertor, error) {
	if buf == nil {
		return nil, nil, nil
	}
	if b, ok := bytesOf(buf); ok {
		return b, nil, nil
	}
	var tb TypedBuffer
	switch b := buf.(type) {
	case TypedBuffer:
		tb = b
	case *TypedBuffer:
		if b == nil {
			return nil, nil, mpierr.Errorf(mpierr.ErrBuffer, "nil *TypedBuffer")
		}
		tb = *b
	default:
		// The type's name comes from reflect, which does not keep buf:
		// passing buf itself to a formatting call would make every
		// caller's buffer argument escape (an allocation per call).
		return nil, nil, mpierr.Errorf(mpierr.ErrBuffer, "unsupported buffer type %s", typeName(buf))
	}
	if tb.err != nil {
		return nil, nil, tb.err
	}
	// A contiguous layout needs no convertor (an allocation per call).
	if mem, ok, err := convertor.ContiguousRange(tb.mem, tb.count, tb.t); err != nil || ok {
		return mem, nil, err
	}
	var c *convertor.Convertor
	var err error
	if send {
		c, err = convertor.NewPacker(tb.mem, tb.count, tb.t)
	} else {
		c, err = convertor.NewUnpacker(tb.mem, tb.count, tb.t)
	}
	if err != nil {
		return nil, nil, err
	}
	if b, ok := c.Contiguous(); ok {
		return b, nil, nil
	}
	return nil, c, nil
}

// typeName is fmt's %T of v.
func typeName(v any) string {
	if v == nil {
		return "<nil>"
	}
	return reflect.TypeOf(v).String()
}

func int64Bytes(v []int64) []byte { return sys.AsBytes(v) }
