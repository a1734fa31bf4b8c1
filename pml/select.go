package pml

import (
	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/pml/hdr"
)

// Mode is an MPI send mode.
type Mode uint8

const (
	Standard    Mode = iota // MPI_Send: eager when small, rendezvous otherwise
	Buffered                // MPI_Bsend: packed into the attached buffer, completes locally
	Synchronous             // MPI_Ssend: completes only after the receive matched (always a rendezvous)
	Ready                   // MPI_Rsend: treated as Standard (the promise is not checked)
)

func (m Mode) String() string {
	return [...]string{"standard", "buffered", "synchronous", "ready"}[m]
}

// Protocol is how one message travels: Open MPI ob1's protocols.
type Protocol uint8

const (
	EagerImmediate   Protocol = iota // MATCH + data in one immediate send, no request kept
	EagerPrepared                    // MATCH + data sent from the user buffer (in place)
	EagerAllocated                   // MATCH + data packed into a transport buffer
	RDMADirectPut                    // RNDV (pinned, no data); receiver asks for one PUT of everything
	RDMADirectGet                    // RGET with the sender's registration; receiver GETs everything
	SendPipeline                     // RNDV with a first chunk, ACK, then FRAGs (copy in/out)
	RDMAPipeline                     // RNDV with a first chunk; receiver PUT-pipelines the middle, FRAGs for the tail
	BufferedPipeline                 // like SendPipeline, from a packed copy in the attached buffer
)

var protoNames = [...]string{"eager_immediate", "eager_prepared", "eager_allocated", "rdma_put", "rdma_get", "send_pipeline", "rdma_pipeline", "buffered_pipeline"}

func (p Protocol) String() string {
	if int(p) < len(protoNames) {
		return protoNames[p]
	}
	return "protocol?"
}

// Eager reports whether p sends the whole message in one MATCH fragment.
func (p Protocol) Eager() bool { return p <= EagerAllocated }

// Force is the value of pml_force_protocol.
type Force uint8

const (
	ForceNone Force = iota
	ForceEager
	ForceRDMAPut
	ForceRDMAGet
	ForceSendPipeline
	ForceRDMAPipeline
)

// ParseForce parses pml_force_protocol.
func ParseForce(s string) (Force, bool) {
	switch s {
	case "", "auto", "none":
		return ForceNone, true
	case "eager":
		return ForceEager, true
	case "rdma_put":
		return ForceRDMAPut, true
	case "rdma_get":
		return ForceRDMAGet, true
	case "send_pipeline":
		return ForceSendPipeline, true
	case "rdma_pipeline":
		return ForceRDMAPipeline, true
	}
	return 0, false
}

// ImmediateMax is the largest payload tried with a send-immediate (ob1: 256).
const ImmediateMax = 256

// SendInfo is everything protocol selection looks at.
type SendInfo struct {
	Mode        Mode
	Size        int  // packed bytes
	Contiguous  bool // the sender's data is one contiguous block
	Caps        btl.Caps
	Limits      btl.Limits
	LeavePinned bool
	Force       Force
}

// EagerMax is the largest payload of an eager fragment on a transport.
func EagerMax(l btl.Limits) int { return max(0, l.EagerLimit-hdr.MatchLen) }

// FirstChunk is the payload of a RNDV: min(eager_limit - header, rndv_eager_limit).
func FirstChunk(l btl.Limits) int { return max(0, min(l.EagerLimit-hdr.RndvLen, l.RndvEagerLimit)) }

// Select chooses the sender's protocol for one message: a pure function of
// the send mode, the size, the layout and the transport, as ob1 chooses
// (docs/protocols.md). A forced protocol (pml_force_protocol) is used for every
// message it can carry; others fall back to the automatic choice.
func Select(s SendInfo) Protocol {
	rdma := s.Contiguous && s.Caps&btl.CapRDMA != 0
	switch s.Force {
	case ForceRDMAGet:
		if s.Contiguous && s.Caps&btl.CapGet != 0 && s.Mode != Buffered {
			return RDMADirectGet
		}
	case ForceRDMAPut:
		if s.Contiguous && s.Caps&btl.CapPut != 0 && s.Mode != Buffered {
			return RDMADirectPut
		}
	case ForceRDMAPipeline:
		if s.Contiguous && s.Caps&btl.CapPut != 0 && s.Mode != Buffered {
			return RDMAPipeline
		}
	case ForceSendPipeline:
		if s.Mode != Buffered {
			return SendPipeline
		}
		return BufferedPipeline
	}
	if s.Mode != Synchronous && s.Caps&btl.CapSendImmediate != 0 && s.Size <= ImmediateMax && s.Size <= EagerMax(s.Limits) {
		return EagerImmediate
	}
	if s.Size <= EagerMax(s.Limits) {
		switch s.Mode {
		case Synchronous:
			return SendPipeline
		case Buffered:
			return EagerAllocated
		}
		if s.Size != 0 && s.Contiguous && s.Caps&btl.CapSendInPlace != 0 {
			return EagerPrepared
		}
		return EagerAllocated
	}
	if s.Mode == Buffered {
		return BufferedPipeline
	}
	if rdma && (s.LeavePinned || s.Caps&btl.CapPut == 0 || s.Size <= s.Limits.MinRDMAPipelineSize) {
		if s.Caps&btl.CapGet != 0 {
			return RDMADirectGet
		}
		return RDMADirectPut
	}
	if s.Contiguous && s.Caps&btl.CapPut != 0 {
		return RDMAPipeline
	}
	return SendPipeline
}

// RecvChoice is the receiver's answer to a RNDV (docs/protocols.md).
type RecvChoice uint8

const (
	RecvCopy         RecvChoice = iota // ACK(first chunk, NORDMA): the rest by FRAGs
	RecvDirectPut                      // one PUT of everything that remains (stands for the ACK)
	RecvRDMAPipeline                   // ACK(tail), PUTs for the middle
)

// RecvInfo is what the receiver's choice looks at.
type RecvInfo struct {
	MsgLen, Received int
	Flags            uint8 // of the RNDV
	Contiguous       bool  // the receive buffer is contiguous and large enough
	Caps             btl.Caps
	Limits           btl.Limits
	Force            Force
}

// Choose is the receiver's pure protocol choice for a RNDV.
func Choose(r RecvInfo) RecvChoice {
	if r.Received >= r.MsgLen || !r.Contiguous || r.Flags&hdr.FlagContig == 0 || r.Caps&btl.CapPut == 0 {
		return RecvCopy
	}
	if r.Force == ForceSendPipeline {
		return RecvCopy
	}
	if r.Flags&hdr.FlagPin != 0 {
		return RecvDirectPut
	}
	if r.Force == ForceRDMAPipeline || r.MsgLen > r.Limits.MinRDMAPipelineSize {
		return RecvRDMAPipeline
	}
	return RecvCopy
}
