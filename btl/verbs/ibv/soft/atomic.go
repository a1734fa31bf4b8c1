package soft

import "encoding/binary"

// Atomic extended transport headers.
const (
	atomicETHLen = 28
	atomicAckLen = 8
)

// atomicETH is the request header of CMP_SWAP and FETCH_ADD: the remote
// 8-byte word, its rkey, the swap (or add) value and the compare value.
type atomicETH struct {
	va      uint64
	rkey    uint32
	swapAdd uint64
	compare uint64
}

func (a *atomicETH) encode(b []byte) int {
	_ = b[atomicETHLen-1]
	binary.BigEndian.PutUint64(b[0:], a.va)
	binary.BigEndian.PutUint32(b[8:], a.rkey)
	binary.BigEndian.PutUint64(b[12:], a.swapAdd)
	binary.BigEndian.PutUint64(b[20:], a.compare)
	return atomicETHLen
}

func decodeAtomicETH(b []byte) (atomicETH, int, error) {
	if len(b) < atomicETHLen {
		return atomicETH{}, 0, errShort
	}
	return atomicETH{
		va:      binary.BigEndian.Uint64(b[0:]),
		rkey:    binary.BigEndian.Uint32(b[8:]),
		swapAdd: binary.BigEndian.Uint64(b[12:]),
		compare: binary.BigEndian.Uint64(b[20:]),
	}, atomicETHLen, nil
}

// The atomic ACK carries the original value of the remote word.
func encodeAtomicAck(b []byte, orig uint64) int {
	binary.BigEndian.PutUint64(b[:atomicAckLen], orig)
	return atomicAckLen
}

func decodeAtomicAck(b []byte) (uint64, int, error) {
	if len(b) < atomicAckLen {
		return 0, 0, errShort
	}
	return binary.BigEndian.Uint64(b), atomicAckLen, nil
}
