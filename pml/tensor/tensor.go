package tensor

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"unicode/utf8"
)

// DType is the element type of a tensor. The zero value is no type: a
// tensor with it is invalid.
type DType uint8

// The element types, TensorFlow's common ones. String tensors hold Go
// strings and are serialized on the wire; every other type is fixed-size
// little-endian element bytes in Tensor.Data.
const (
	Float32 DType = iota + 1
	Float64
	Int32
	Int64
	Uint8
	Int8
	Int16
	Uint16
	Bool
	BFloat16
	Float16
	Complex64
	Complex128
	String
)

var dtypeNames = [...]string{"invalid", "float32", "float64", "int32", "int64", "uint8", "int8", "int16", "uint16", "bool",
	"bfloat16", "float16", "complex64", "complex128", "string"}

func (d DType) String() string {
	if int(d) < len(dtypeNames) {
		return dtypeNames[d]
	}
	return fmt.Sprintf("DType(%d)", uint8(d))
}

// Valid reports whether d is one of the defined types.
func (d DType) Valid() bool { return d >= Float32 && d <= String }

// Size is the bytes of one element (0 for String and invalid types).
func (d DType) Size() int {
	switch d {
	case Uint8, Int8, Bool:
		return 1
	case Int16, Uint16, BFloat16, Float16:
		return 2
	case Float32, Int32:
		return 4
	case Float64, Int64, Complex64:
		return 8
	case Complex128:
		return 16
	}
	return 0
}

// Tensor is a named value exchanged through a Rendezvous.
type Tensor struct {
	DType   DType
	Shape   []int64
	Data    []byte   // little-endian element bytes for every DType but String
	Strings []string // for String tensors (not DMA-able: serialized on the wire)
	IsDead  bool     // a tensor from an untaken branch: carries no data
}

// Limits on what a tensor may be; they bound what a peer's messages can
// make this rank allocate.
const (
	MaxRank    = 255     // dimensions of a shape
	MaxName    = 4096    // bytes of a tensor name
	MaxBytes   = 1 << 40 // bytes of a tensor's content (serialized, for strings)
	maxStrings = 1 << 32 // elements of a string tensor
)

// meta is what the receiver's cache holds and the sender compares: type,
// shape, deadness and the content's byte size (serialized size for
// strings, whose element sizes the shape does not tell).
type meta struct {
	dtype DType
	shape []int64
	dead  bool
	bytes uint64
}

func (m meta) equal(o meta) bool {
	if m.dtype != o.dtype || m.dead != o.dead || m.bytes != o.bytes || len(m.shape) != len(o.shape) {
		return false
	}
	for i, d := range m.shape {
		if o.shape[i] != d {
			return false
		}
	}
	return true
}

func (m meta) String() string {
	if m.dead {
		return fmt.Sprintf("dead %v%v", m.dtype, m.shape)
	}
	return fmt.Sprintf("%v%v (%d bytes)", m.dtype, m.shape, m.bytes)
}

// elements returns the product of shape's dimensions, or an error for a
// negative dimension, more than MaxRank dimensions or an overflow.
func elements(shape []int64) (uint64, error) {
	if len(shape) > MaxRank {
		return 0, fmt.Errorf("shape of rank %d (at most %d)", len(shape), MaxRank)
	}
	n := uint64(1)
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		hi, lo := bits.Mul64(n, uint64(d))
		if hi != 0 || lo > MaxBytes {
			return 0, fmt.Errorf("shape %v has too many elements", shape)
		}
		n = lo
	}
	return n, nil
}

// check validates m as it arrives from a peer: a known type, a valid
// shape and, for fixed-size types, a byte size that matches the shape.
func (m meta) check() error {
	if !m.dtype.Valid() {
		return fmt.Errorf("unknown dtype %d", uint8(m.dtype))
	}
	n, err := elements(m.shape)
	if err != nil {
		return err
	}
	if m.bytes > MaxBytes {
		return fmt.Errorf("%d bytes (at most %d)", m.bytes, uint64(MaxBytes))
	}
	if m.dead {
		if m.bytes != 0 {
			return fmt.Errorf("dead tensor with %d bytes", m.bytes)
		}
		return nil
	}
	if s := m.dtype.Size(); s > 0 {
		hi, lo := bits.Mul64(n, uint64(s))
		if hi != 0 || lo != m.bytes {
			return fmt.Errorf("%v%v needs %d bytes, not %d", m.dtype, m.shape, n*uint64(s), m.bytes)
		}
	} else if n > 0 && m.bytes < n {
		return fmt.Errorf("%d strings cannot fit in %d bytes", n, m.bytes)
	}
	return nil
}

// prepare validates a tensor given to Send and returns its meta-data and
// the bytes that travel: Data, the serialized strings, or nothing for a
// dead tensor.
func prepare(t Tensor) (meta, []byte, error) { return prepareInto(t, nil) }

// prepareInto is prepare with the meta-data's copy of the shape appended
// to shape (room the caller has, so that the usual short shape costs no
// allocation).
func prepareInto(t Tensor, shape []int64) (meta, []byte, error) {
	m := meta{dtype: t.DType, shape: t.Shape, dead: t.IsDead}
	if !t.DType.Valid() {
		return m, nil, fmt.Errorf("invalid dtype %d", uint8(t.DType))
	}
	n, err := elements(t.Shape)
	if err != nil {
		return m, nil, err
	}
	m.shape = append(shape, t.Shape...)
	if t.IsDead {
		return m, nil, nil
	}
	if t.DType == String {
		if uint64(len(t.Strings)) != n {
			return m, nil, fmt.Errorf("string tensor of shape %v holds %d strings, want %d", t.Shape, len(t.Strings), n)
		}
		b := encodeStrings(t.Strings)
		if uint64(len(b)) > MaxBytes {
			return m, nil, fmt.Errorf("serialized strings take %d bytes (at most %d)", len(b), uint64(MaxBytes))
		}
		m.bytes = uint64(len(b))
		return m, b, nil
	}
	want := n * uint64(t.DType.Size())
	if uint64(len(t.Data)) != want {
		return m, nil, fmt.Errorf("%v tensor of shape %v has %d data bytes, want %d", t.DType, t.Shape, len(t.Data), want)
	}
	m.bytes = want
	return m, t.Data, nil
}

// encodeStrings serializes strings as a sequence of (uvarint length,
// bytes): the non-DMA-able path of TensorFlow's string tensors.
func encodeStrings(ss []string) []byte {
	n := 0
	for _, s := range ss {
		n += binary.MaxVarintLen64 + len(s)
	}
	b := make([]byte, 0, n)
	for _, s := range ss {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return b
}

// decodeStrings parses exactly count strings that fill b.
func decodeStrings(b []byte, count uint64) ([]string, error) {
	if count > uint64(len(b)) && count > 0 {
		return nil, fmt.Errorf("%d strings cannot fit in %d bytes", count, len(b))
	}
	out := make([]string, 0, count)
	for i := uint64(0); i < count; i++ {
		l, k := binary.Uvarint(b)
		// A length ending in a zero byte after the first is an overlong
		// varint: one value, one encoding.
		if k <= 0 || k > 1 && b[k-1] == 0 || l > uint64(len(b)-k) {
			return nil, fmt.Errorf("string %d of %d: bad length", i, count)
		}
		out = append(out, string(b[k:k+int(l)]))
		b = b[k+int(l):]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%d bytes after the last string", len(b))
	}
	return out, nil
}

// checkName validates a tensor name.
func checkName(name string) error {
	if name == "" || len(name) > MaxName {
		return fmt.Errorf("tensor name of %d bytes (want 1 to %d)", len(name), MaxName)
	}
	if !utf8.ValidString(name) {
		return fmt.Errorf("tensor name %q is not UTF-8", name)
	}
	return nil
}
