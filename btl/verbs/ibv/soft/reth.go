package soft

import "encoding/binary"

// rethLen is the size of the RDMA extended transport header.
const rethLen = 16

// reth names the remote memory of an RDMA WRITE or READ: virtual address,
// rkey and the length of the whole operation.
type reth struct {
	va     uint64
	rkey   uint32
	dmaLen uint32
}

func (r *reth) encode(b []byte) int {
	_ = b[rethLen-1]
	binary.BigEndian.PutUint64(b[0:], r.va)
	binary.BigEndian.PutUint32(b[8:], r.rkey)
	binary.BigEndian.PutUint32(b[12:], r.dmaLen)
	return rethLen
}

func decodeRETH(b []byte) (reth, int, error) {
	if len(b) < rethLen {
		return reth{}, 0, errShort
	}
	return reth{
		va:     binary.BigEndian.Uint64(b[0:]),
		rkey:   binary.BigEndian.Uint32(b[8:]),
		dmaLen: binary.BigEndian.Uint32(b[12:]),
	}, rethLen, nil
}
