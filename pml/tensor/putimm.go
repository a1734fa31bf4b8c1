package tensor

import "github.com/gompi-org/gompi/btl"

// ImmediatePutter is an optional btl.Endpoint interface for transports
// whose write can carry a 32-bit immediate value that the target
// receives as a completion (RDMA WRITE_WITH_IMM over verbs). With it the
// notification of a put travels in the put itself instead of as a
// separate control message, as in TensorFlow's verbs transport, where the
// immediate is the request index.
//
// Contract: PutImmediate is Put (same ownership, completion and errors)
// whose arrival, after the data is in the target's memory, the target's
// module delivers as one inbound fragment of tag TagImmediate on the
// endpoint of the writer, with the 4-byte little-endian immediate as its
// header and no data. The rendezvous uses it only when the peer's
// endpoint implements it and the receiving rank registered the handler
// (a rendezvous with the immediate path enabled on both ranks); otherwise
// the notification is the NOTIFY control message.
type ImmediatePutter interface {
	PutImmediate(local, handle []byte, off int, imm uint32, cb btl.Completion) (done bool, err error)
}

// TagImmediate is the btl tag (from the tensor rendezvous's range
// 0x60-0x6f) on which a module delivers the immediate value of a write
// made with ImmediatePutter.
const TagImmediate btl.Tag = 0x60
