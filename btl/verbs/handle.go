package verbs

import (
	"encoding/binary"
	"fmt"

	"github.com/gompi-org/gompi/btl"
)

// A registration handle, 24 bytes little-endian: the I/O virtual address
// of the registered memory's first byte (u64), its length (u64), its rkey
// (u32) and the magic "GVH1".
const handleLen = 24

var handleMagic = [4]byte{'G', 'V', 'H', '1'}

func encodeHandle(b []byte, iova uint64, n int, rkey uint32) {
	le := binary.LittleEndian
	le.PutUint64(b[0:], iova)
	le.PutUint64(b[8:], uint64(n))
	le.PutUint32(b[16:], rkey)
	copy(b[20:], handleMagic[:])
}

// decodeHandle returns the remote address and rkey of n bytes at off of
// the registration handle names, or an error wrapping btl.ErrBadHandle (a
// handle that does not decode, or a range outside the registration).
func decodeHandle(h []byte, off, n int) (uint64, uint32, error) {
	if len(h) != handleLen || [4]byte(h[20:24]) != handleMagic {
		return 0, 0, fmt.Errorf("verbs: %d-byte registration handle that is not a verbs one: %w", len(h), btl.ErrBadHandle)
	}
	le := binary.LittleEndian
	iova, size, rkey := le.Uint64(h[0:]), le.Uint64(h[8:]), le.Uint32(h[16:])
	if off < 0 || n < 0 || uint64(off) > size || uint64(n) > size-uint64(off) {
		return 0, 0, fmt.Errorf("verbs: range %d+%d outside the %d-byte registration: %w", off, n, size, btl.ErrBadHandle)
	}
	if iova+size < iova {
		return 0, 0, fmt.Errorf("verbs: registration at %#x+%d wraps the address space: %w", iova, size, btl.ErrBadHandle)
	}
	return iova + uint64(off), rkey, nil
}
