package tensor

import (
	"encoding/binary"
	"fmt"

	"github.com/gompi-org/gompi/btl"
)

// ImmediatePutter is an optional btl.Endpoint interface for transports
// whose write can carry a 32-bit immediate value that the target
// receives as a completion (RDMA WRITE_WITH_IMM; btl/verbs's endpoints
// implement it). With it the notification of a put travels in the put
// itself instead of as a NOTIFY control message, as in TensorFlow's verbs
// transport, where the immediate is the request index: a steady-state
// tensor then costs one control message (TENSOR_REQUEST) and one write.
//
// Contract: WriteWithImm is Put (same ownership, completion and errors)
// whose arrival, once the data is in the target's memory, the target's
// module delivers as one inbound fragment of tag TagImmediate on the
// writer's endpoint: the header holds the immediate and the byte count
// as two little-endian u32s, the data is empty. The rendezvous uses it
// for writes without a checksum (the CRC travels in a NOTIFY) when
// nothing waits in the PML's queue to that peer; a refusal
// (btl.ErrWouldBlock) falls back to Put and NOTIFY.
type ImmediatePutter interface {
	WriteWithImm(local, handle []byte, off int, imm uint32, cb btl.Completion) (done bool, err error)
}

// TagImmediate is the btl tag (of the tensor rendezvous's range
// 0x60-0x6f) on which a module delivers the immediate of a write made
// with ImmediatePutter.
const TagImmediate btl.Tag = 0x6f

// immHdrLen is the size of a TagImmediate fragment's header.
const immHdrLen = 8

// decodeImmHdr parses a TagImmediate header: the immediate (a request
// index) and the byte count written.
func decodeImmHdr(b []byte) (imm, count uint32, n int, err error) {
	if len(b) != immHdrLen {
		return 0, 0, 0, fmt.Errorf("%w: immediate header of %d bytes (want %d)", ErrBadMessage, len(b), immHdrLen)
	}
	return binary.LittleEndian.Uint32(b), binary.LittleEndian.Uint32(b[4:]), immHdrLen, nil
}
