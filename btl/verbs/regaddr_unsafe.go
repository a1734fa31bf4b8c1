package verbs

import "unsafe"

// sliceAddr returns the address of b's first byte (0 for a slice without
// one). The registration cache keys registered memory by address range;
// the address is only compared, never turned back into a pointer.
func sliceAddr(b []byte) uintptr {
	if cap(b) == 0 {
		return 0
	}
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}
