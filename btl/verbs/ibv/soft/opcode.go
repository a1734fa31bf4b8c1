package soft

// RC opcodes of the base transport header (IBA table 38, RC group 000).
const (
	opSendFirst         uint8 = 0x00
	opSendMiddle        uint8 = 0x01
	opSendLast          uint8 = 0x02
	opSendLastImm       uint8 = 0x03
	opSendOnly          uint8 = 0x04
	opSendOnlyImm       uint8 = 0x05
	opWriteFirst        uint8 = 0x06
	opWriteMiddle       uint8 = 0x07
	opWriteLast         uint8 = 0x08
	opWriteLastImm      uint8 = 0x09
	opWriteOnly         uint8 = 0x0a
	opWriteOnlyImm      uint8 = 0x0b
	opReadRequest       uint8 = 0x0c
	opReadRespFirst     uint8 = 0x0d
	opReadRespMiddle    uint8 = 0x0e
	opReadRespLast      uint8 = 0x0f
	opReadRespOnly      uint8 = 0x10
	opAck               uint8 = 0x11
	opAtomicAck         uint8 = 0x12
	opCmpSwap           uint8 = 0x13
	opFetchAdd          uint8 = 0x14
	numOpcodes                = 0x15
	opcodeInvalidMarker       = 0xff
)

// opFlags describe which extension headers an opcode carries and where
// its packet sits in a message.
type opFlags uint16

const (
	fRETH opFlags = 1 << iota
	fAETH
	fImm
	fAtomicETH
	fAtomicAckETH
	fPayload // the packet may carry data
	fFirst
	fMiddle
	fLast
	fSend      // SEND class (consumes a receive WR)
	fWrite     // RDMA WRITE class
	fRead      // READ request
	fReadResp  // READ response
	fAtomic    // atomic request
	fAckClass  // ACK or atomic ACK
	fNeedsRecv // consumes a receive WR at this packet
)

const fOnly = fFirst | fLast

var opTable = [numOpcodes]struct {
	name  string
	flags opFlags
}{
	opSendFirst:      {"SEND_FIRST", fPayload | fFirst | fSend | fNeedsRecv},
	opSendMiddle:     {"SEND_MIDDLE", fPayload | fMiddle | fSend},
	opSendLast:       {"SEND_LAST", fPayload | fLast | fSend},
	opSendLastImm:    {"SEND_LAST_WITH_IMMEDIATE", fImm | fPayload | fLast | fSend},
	opSendOnly:       {"SEND_ONLY", fPayload | fOnly | fSend | fNeedsRecv},
	opSendOnlyImm:    {"SEND_ONLY_WITH_IMMEDIATE", fImm | fPayload | fOnly | fSend | fNeedsRecv},
	opWriteFirst:     {"RDMA_WRITE_FIRST", fRETH | fPayload | fFirst | fWrite},
	opWriteMiddle:    {"RDMA_WRITE_MIDDLE", fPayload | fMiddle | fWrite},
	opWriteLast:      {"RDMA_WRITE_LAST", fPayload | fLast | fWrite},
	opWriteLastImm:   {"RDMA_WRITE_LAST_WITH_IMMEDIATE", fImm | fPayload | fLast | fWrite | fNeedsRecv},
	opWriteOnly:      {"RDMA_WRITE_ONLY", fRETH | fPayload | fOnly | fWrite},
	opWriteOnlyImm:   {"RDMA_WRITE_ONLY_WITH_IMMEDIATE", fRETH | fImm | fPayload | fOnly | fWrite | fNeedsRecv},
	opReadRequest:    {"RDMA_READ_REQUEST", fRETH | fOnly | fRead},
	opReadRespFirst:  {"RDMA_READ_RESPONSE_FIRST", fAETH | fPayload | fFirst | fReadResp},
	opReadRespMiddle: {"RDMA_READ_RESPONSE_MIDDLE", fPayload | fMiddle | fReadResp},
	opReadRespLast:   {"RDMA_READ_RESPONSE_LAST", fAETH | fPayload | fLast | fReadResp},
	opReadRespOnly:   {"RDMA_READ_RESPONSE_ONLY", fAETH | fPayload | fOnly | fReadResp},
	opAck:            {"ACKNOWLEDGE", fAETH | fOnly | fAckClass},
	opAtomicAck:      {"ATOMIC_ACKNOWLEDGE", fAETH | fAtomicAckETH | fOnly | fAckClass},
	opCmpSwap:        {"CMP_SWAP", fAtomicETH | fOnly | fAtomic},
	opFetchAdd:       {"FETCH_ADD", fAtomicETH | fOnly | fAtomic},
}

// opInfo returns the flags of op and whether op is an RC opcode this
// device speaks.
func opInfo(op uint8) (opFlags, bool) {
	if int(op) >= numOpcodes {
		return 0, false
	}
	return opTable[op].flags, true
}

func opName(op uint8) string {
	if int(op) >= numOpcodes {
		return "UNKNOWN"
	}
	return opTable[op].name
}

// extLen is the length of the extension headers op carries after the BTH.
func extLen(f opFlags) int {
	n := 0
	if f&fRETH != 0 {
		n += rethLen
	}
	if f&fAETH != 0 {
		n += aethLen
	}
	if f&fAtomicAckETH != 0 {
		n += atomicAckLen
	}
	if f&fAtomicETH != 0 {
		n += atomicETHLen
	}
	if f&fImm != 0 {
		n += immLen
	}
	return n
}
