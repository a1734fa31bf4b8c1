package ibvtest

import (
	"fmt"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// Endpoint is what one side of an RC connection tells the other: the
// values the peer's INIT->RTR transition needs. A transport exchanges it
// out of band (the wire-up store); the suite passes it in memory.
type Endpoint struct {
	QPN      uint32  // the QP's number (24 bits)
	PSN      uint32  // the first PSN this side sends (24 bits)
	GID      ibv.GID // the port's GID at GIDIndex
	LID      uint16  // the port's LID (0 on RoCE)
	GIDIndex int     // the local GID table index used as source GID
	Port     uint8
	MTU      ibv.MTU // the port's active MTU
	Global   bool    // a GRH is needed (RoCE: always)
	// MaxRdAtomic and MaxDestRdAtomic are the device's limits on READs
	// outstanding as requester and as responder (0: none known); the
	// attribute builders clamp ConnOpts.RdAtomic to them.
	MaxRdAtomic, MaxDestRdAtomic uint8
}

// LocalEndpoint describes qp on port/gidIndex of c, with psn as the first
// PSN it sends. It queries the port and the GID table; errors from either
// are returned wrapped.
func LocalEndpoint(c ibv.Context, qp ibv.QP, port uint8, gidIndex int, psn uint32) (Endpoint, error) {
	pa, err := c.QueryPort(port)
	if err != nil {
		return Endpoint{}, fmt.Errorf("query port %d: %w", port, err)
	}
	gid, err := c.QueryGID(port, gidIndex)
	if err != nil {
		return Endpoint{}, fmt.Errorf("query GID %d of port %d: %w", gidIndex, port, err)
	}
	d := c.Device()
	return Endpoint{
		MaxRdAtomic:     uint8(min(d.MaxQPInitRdAtom, 255)),
		MaxDestRdAtomic: uint8(min(d.MaxQPRdAtom, 255)),
		QPN:             qp.QPN(),
		PSN:             psn & 0xFFFFFF,
		GID:             gid,
		LID:             pa.LID,
		GIDIndex:        gidIndex,
		Port:            port,
		MTU:             pa.ActiveMTU,
		Global:          pa.LinkLayer != ibv.LinkInfiniBand || pa.LID == 0,
	}, nil
}

// ConnOpts are the QP settings of a connection that are not addresses.
// Every field is used as given (a zero Timeout means no timeout, a zero
// RNRRetry no RNR retry); start from DefaultConnOpts.
type ConnOpts struct {
	// Access is the QP's inbound access (remote read/write/atomic).
	Access ibv.Access
	// MTU caps the path MTU (0: the smaller of both ports' active MTUs).
	MTU ibv.MTU
	// Timeout is the local ACK timeout code (4.096 us * 2^Timeout).
	Timeout uint8
	// RetryCnt is the number of retransmissions before RETRY_EXC_ERR.
	RetryCnt uint8
	// RNRRetry is the number of RNR retries before RNR_RETRY_EXC_ERR
	// (7: without end).
	RNRRetry uint8
	// MinRNRTimer is the RNR wait code the responder asks for (1 = 0.01 ms;
	// 0 means 655 ms in the verbs table).
	MinRNRTimer uint8
	// RdAtomic is both max_rd_atomic and max_dest_rd_atomic.
	RdAtomic uint8
	// PKeyIndex is the partition key index (normally 0).
	PKeyIndex uint16
}

// DefaultConnOpts returns full remote access (read, write, atomic),
// timeout 14 (67 ms), 7 retries, endless RNR retry with the shortest RNR
// timer, and 16 outstanding READs each way.
func DefaultConnOpts() ConnOpts {
	return ConnOpts{
		Access:      ibv.AccessRemoteWrite | ibv.AccessRemoteRead | ibv.AccessRemoteAtomic,
		Timeout:     14,
		RetryCnt:    7,
		RNRRetry:    7,
		MinRNRTimer: 1,
		RdAtomic:    16,
	}
}

// InitAttr returns the attributes and mask of RESET->INIT for a QP on
// port: exactly ibv.MaskResetToInit.
func InitAttr(port uint8, o ConnOpts) (ibv.QPAttr, ibv.AttrMask) {
	return ibv.QPAttr{
		State:       ibv.QPSInit,
		PKeyIndex:   o.PKeyIndex,
		Port:        port,
		AccessFlags: o.Access,
	}, ibv.MaskResetToInit
}

// RTRAttr returns the attributes and mask of INIT->RTR towards remote:
// exactly ibv.MaskInitToRTR. The path MTU is the smaller of the two
// ports' active MTUs (and of o.MTU when set).
func RTRAttr(local, remote Endpoint, o ConnOpts) (ibv.QPAttr, ibv.AttrMask) {
	mtu := min(local.MTU, remote.MTU)
	if mtu == 0 {
		mtu = max(local.MTU, remote.MTU)
	}
	if o.MTU != 0 && (mtu == 0 || o.MTU < mtu) {
		mtu = o.MTU
	}
	if mtu == 0 {
		mtu = ibv.MTU1024
	}
	return ibv.QPAttr{
		State:           ibv.QPSRTR,
		PathMTU:         mtu,
		DestQPN:         remote.QPN,
		RQPSN:           remote.PSN,
		MaxDestRdAtomic: clampRd(o.RdAtomic, local.MaxDestRdAtomic),
		MinRNRTimer:     o.MinRNRTimer,
		AH: ibv.AH{
			DLID:      remote.LID,
			IsGlobal:  remote.Global || local.Global,
			DGID:      remote.GID,
			SGIDIndex: uint8(local.GIDIndex),
			HopLimit:  64,
			Port:      local.Port,
		},
	}, ibv.MaskInitToRTR
}

// RTSAttr returns the attributes and mask of RTR->RTS for a side whose
// first PSN is local.PSN: exactly ibv.MaskRTRToRTS.
func RTSAttr(local Endpoint, o ConnOpts) (ibv.QPAttr, ibv.AttrMask) {
	return ibv.QPAttr{
		State:       ibv.QPSRTS,
		SQPSN:       local.PSN,
		Timeout:     o.Timeout,
		RetryCnt:    o.RetryCnt,
		RNRRetry:    o.RNRRetry,
		MaxRdAtomic: clampRd(o.RdAtomic, local.MaxRdAtomic),
	}, ibv.MaskRTRToRTS
}

func clampRd(want, limit uint8) uint8 {
	if limit != 0 && want > limit {
		return limit
	}
	return want
}

// ToInit moves qp from RESET to INIT.
func ToInit(qp ibv.QP, port uint8, o ConnOpts) error {
	a, m := InitAttr(port, o)
	if err := qp.Modify(&a, m); err != nil {
		return fmt.Errorf("QP %#x RESET->INIT: %w", qp.QPN(), err)
	}
	return nil
}

// ToRTR moves qp from INIT to RTR, receiving from remote.
func ToRTR(qp ibv.QP, local, remote Endpoint, o ConnOpts) error {
	a, m := RTRAttr(local, remote, o)
	if err := qp.Modify(&a, m); err != nil {
		return fmt.Errorf("QP %#x INIT->RTR: %w", qp.QPN(), err)
	}
	return nil
}

// ToRTS moves qp from RTR to RTS.
func ToRTS(qp ibv.QP, local Endpoint, o ConnOpts) error {
	a, m := RTSAttr(local, o)
	if err := qp.Modify(&a, m); err != nil {
		return fmt.Errorf("QP %#x RTR->RTS: %w", qp.QPN(), err)
	}
	return nil
}

// Connect moves qp from RESET through INIT and RTR to RTS, connected to
// remote. A QP already in INIT (receives pre-posted) skips the first step.
// Both sides of a connection call it, each with its own local endpoint and
// the other's; the order between the two sides does not matter, since a
// side in RTR already accepts the other's packets.
func Connect(qp ibv.QP, local, remote Endpoint, o ConnOpts) error {
	if qp.State() == ibv.QPSReset {
		if err := ToInit(qp, local.Port, o); err != nil {
			return err
		}
	}
	if err := ToRTR(qp, local, remote, o); err != nil {
		return err
	}
	return ToRTS(qp, local, o)
}
