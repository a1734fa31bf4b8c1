// Package sys holds gompi's unsafe and syscall code: byte views of typed
// slices, and (on Linux) mmap, memfd, futex and cross-memory attach wrappers.
// Everything else in gompi is safe Go.
package sys

import "unsafe"

// Number is every fixed-size element type a message buffer may hold.
type Number interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~int | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uint |
		~float32 | ~float64 | ~complex64 | ~complex128
}

// AsBytes returns the memory of s as a byte slice of len(s)*sizeof(T) bytes.
// The result aliases s: it keeps s's backing array alive and writes through.
func AsBytes[T Number](s []T) []byte {
	if len(s) == 0 {
		return s0[:0:0]
	}
	var z T
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), len(s)*int(unsafe.Sizeof(z)))
}

// AsBytesCap is AsBytes over the full capacity of s (len(s) elements stay the
// message; the capacity lets datatypes with holes reach past len).
func AsBytesCap[T Number](s []T) []byte {
	return AsBytes(s[:cap(s)])
}

var s0 [1]byte

// Addr returns the address of the first byte of b (0 for an empty slice).
// It is used as an opaque key (registration caches, debugging), never to
// rebuild a pointer.
func Addr(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// Overlap reports whether a and b share at least one byte of memory.
func Overlap(a, b []byte) bool {
	if len(a) == 0 || len(b) == 0 {
		return false
	}
	pa, pb := uintptr(unsafe.Pointer(unsafe.SliceData(a))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	return pa < pb+uintptr(len(b)) && pb < pa+uintptr(len(a))
}
