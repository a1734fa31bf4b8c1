package soft

import "encoding/binary"

// immLen is the size of the immediate data header.
const immLen = 4

// The immediate value travels big-endian; the value the sender posts is
// the value the receiver's completion reports (the model's contract).
func encodeImm(b []byte, imm uint32) int {
	binary.BigEndian.PutUint32(b[:immLen], imm)
	return immLen
}

func decodeImm(b []byte) (uint32, int, error) {
	if len(b) < immLen {
		return 0, 0, errShort
	}
	return binary.BigEndian.Uint32(b), immLen, nil
}
