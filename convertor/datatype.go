package convertor

import (
	"sync/atomic"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// Undefined is what Elements returns when a byte count is not a whole number
// of elements (MPI_UNDEFINED; the same value as mpi.Undefined).
const Undefined = -32766

// Datatype is a handle on a predefined or derived datatype: which bytes,
// relative to the start of an element, make up one element's data, and in
// which order they are packed.
//
// Datatype is comparable: two handles are equal when they come from the same
// constructor call (or are the same predefined type). The zero value is not a
// valid datatype: every function given one returns an error wrapping
// mpierr.ErrType, and its accessors return zero values.
//
// A Datatype never changes after construction except that Commit attaches its
// compiled program; it is safe for concurrent use.
type Datatype struct{ d *desc }

// desc is the immutable description of a datatype.
type desc struct {
	name string // constructor expression, for String
	lay  layout // the uncompiled description and its bounds
	prog atomic.Pointer[program]
}

// The predefined datatypes. They are committed already. Each is one basic
// element of the named Go type; Byte and Uint8 both move single bytes.
var (
	Byte       = predefined("Byte", 1)
	Int8       = predefined("Int8", 1)
	Int16      = predefined("Int16", 2)
	Int32      = predefined("Int32", 4)
	Int64      = predefined("Int64", 8)
	Uint8      = predefined("Uint8", 1)
	Uint16     = predefined("Uint16", 2)
	Uint32     = predefined("Uint32", 4)
	Uint64     = predefined("Uint64", 8)
	Float32    = predefined("Float32", 4)
	Float64    = predefined("Float64", 8)
	Complex64  = predefined("Complex64", 8)
	Complex128 = predefined("Complex128", 16)
)

func predefined(name string, size int) Datatype {
	d := &desc{name: name, lay: layout{
		ops:     []op{{kind: kData, esz: size, blen: size, count: 1, stride: size}},
		size:    size,
		ub:      size,
		bounded: true,
		tub:     size,
		dense:   true,
	}}
	d.prog.Store(compile(&d.lay, true))
	return Datatype{d}
}

// Valid reports whether t is a datatype (not the zero Datatype).
func (t Datatype) Valid() bool { return t.d != nil }

// Committed reports whether t is valid and committed (predefined types
// always are).
func (t Datatype) Committed() bool { return t.d != nil && t.d.prog.Load() != nil }

// Commit compiles t so that it can be used to pack and unpack (NewPacker,
// NewUnpacker, and every communication call). It returns t itself: the
// handle is committed in place, so t.Commit() with the result ignored also
// commits t. Commit is idempotent and safe to call concurrently. The only
// error is ErrType for the zero Datatype.
func (t Datatype) Commit() (Datatype, error) {
	if t.d == nil {
		return t, mpierr.Errorf(mpierr.ErrType, "commit of the zero Datatype")
	}
	if t.d.prog.Load() == nil {
		t.d.prog.CompareAndSwap(nil, compile(&t.d.lay, true))
	}
	return t, nil
}

// Size returns the number of data bytes in one element of t (its packed
// size). Zero for the zero Datatype.
func (t Datatype) Size() int {
	if t.d == nil {
		return 0
	}
	return t.d.lay.size
}

// LB returns the lower bound of t: the displacement of its lowest byte, or
// the lower bound set by Resized. Zero for the zero Datatype and for types
// with no entries.
func (t Datatype) LB() int {
	if t.d == nil {
		return 0
	}
	return t.d.lay.lb
}

// Extent returns ub - lb: the distance from one element of t to the next
// when count > 1 elements are laid out in memory. Zero for the zero Datatype.
func (t Datatype) Extent() int {
	if t.d == nil {
		return 0
	}
	return t.d.lay.ub - t.d.lay.lb
}

// TrueLB returns the displacement of the lowest data byte of t, ignoring
// bounds set by Resized. Zero for types without data.
func (t Datatype) TrueLB() int {
	if t.d == nil {
		return 0
	}
	return t.d.lay.tlb
}

// TrueExtent returns the span from the lowest to one past the highest data
// byte of t, ignoring bounds set by Resized. Zero for types without data.
func (t Datatype) TrueExtent() int {
	if t.d == nil {
		return 0
	}
	return t.d.lay.tub - t.d.lay.tlb
}

// IsContiguous reports whether count elements of t, for any count, are one
// contiguous run of memory packed in memory order: the data of an element is
// gap-free and ascending, and Size() == Extent(). The zero Datatype is not
// contiguous.
func (t Datatype) IsContiguous() bool {
	if t.d == nil {
		return false
	}
	l := &t.d.lay
	return l.dense && l.size == l.ub-l.lb
}

// Elements returns how many whole elements of t make up bytes packed bytes
// (what MPI_Get_count reports for a received message), or Undefined when
// bytes is negative or not a multiple of t.Size(), or t is invalid. For a
// type of size 0 it returns 0 when bytes is 0 and Undefined otherwise.
func (t Datatype) Elements(bytes int) int {
	if t.d == nil || bytes < 0 {
		return Undefined
	}
	s := t.d.lay.size
	if s == 0 {
		if bytes == 0 {
			return 0
		}
		return Undefined
	}
	if bytes%s != 0 {
		return Undefined
	}
	return bytes / s
}

// String returns the constructor expression of t, such as
// "Vector(4096, 1, 4096, Float64)", for debugging. Long argument lists are
// shortened.
func (t Datatype) String() string {
	if t.d == nil {
		return "Datatype(invalid)"
	}
	return t.d.name
}
