// Package ibv is a Go model of the RDMA verbs objects (libibverbs): devices,
// contexts, protection domains, memory regions, completion queues with
// completion channels, and reliable-connected (RC) queue pairs.
//
// The model is a set of interfaces implemented by providers: soft (a
// software RoCEv2 device in pure Go, btl/verbs/ibv/soft) on every machine,
// and rdmacore (libibverbs through cgo, build tag rdmacore) where a NIC
// exists. The verbs transport (btl/verbs) and the conformance suite
// (btl/verbs/ibv/ibvtest) use only this package.
//
// The usage loop is the one of libibverbs: open a device (Provider.Open),
// allocate a PD, register memory, create CQs and QPs, move each QP
// RESET -> INIT -> RTR -> RTS with the peer's address, post work requests
// and poll the CQ for their completions. The semantics every provider keeps
// are those of the verbs specification as summarised in the project's
// protocol notes (section F): a QP transition with a bad attribute changes
// nothing; SEND and RDMA_WRITE_WITH_IMM consume a posted receive; remote
// access is checked against the rkey's PD, range and access flags (and the
// QP's access flags); a QP in ERR flushes every outstanding work request
// with WCWRFlushErr; completions of one QP arrive in post order.
//
// Addresses: an MR has an I/O virtual address (MR.Addr) chosen by the
// provider; scatter/gather entries and remote operations name memory by
// that address plus an offset (MR.SGE builds one). Providers may use the
// real virtual address (rdmacore) or a synthetic one (soft); users never
// assume either.
package ibv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sort"
	"sync"

	"github.com/gompi-org/gompi/internal/params"
)

// Errors returned by verb calls (not work completions). Providers wrap
// them with context; callers test with errors.Is.
var (
	// ErrInvalid: an argument or attribute the verb does not accept
	// (EINVAL). Nothing changed.
	ErrInvalid = errors.New("ibv: invalid argument")
	// ErrNoMem: a queue or table is full (ENOMEM): a post to a full send or
	// receive queue, too many MRs, QPs or CQ entries.
	ErrNoMem = errors.New("ibv: out of resources")
	// ErrBusy: the object is still in use (EBUSY): a PD with MRs or QPs, a
	// CQ with QPs attached.
	ErrBusy = errors.New("ibv: resource busy")
	// ErrCQOverrun: more completions arrived than the CQ holds; the CQ is
	// unusable (IBV_EVENT_CQ_ERR).
	ErrCQOverrun = errors.New("ibv: completion queue overrun")
	// ErrClosed: the object or its context was destroyed or closed.
	ErrClosed = errors.New("ibv: closed")
	// ErrNoDevice: the provider has no device of that name (or none at all).
	ErrNoDevice = errors.New("ibv: no such device")
)

// GID is a 128-bit port global identifier. For RoCEv2 it holds the port's
// IP address (IPv4 addresses in IPv4-mapped IPv6 form).
type GID [16]byte

// GIDFromAddr returns the GID of an IP address.
func GIDFromAddr(a netip.Addr) GID { return GID(a.As16()) }

// Addr returns the IP address a RoCEv2 GID holds (unmapped for IPv4).
func (g GID) Addr() netip.Addr { return netip.AddrFrom16(g).Unmap() }

func (g GID) String() string { return g.Addr().String() }

// MTU is a path MTU enumeration value, as in verbs (1 = 256 .. 5 = 4096).
type MTU uint8

const (
	MTU256 MTU = iota + 1
	MTU512
	MTU1024
	MTU2048
	MTU4096
)

// Bytes returns the MTU in bytes (0 for an invalid value).
func (m MTU) Bytes() int {
	if m < MTU256 || m > MTU4096 {
		return 0
	}
	return 128 << m
}

// MTUFromBytes returns the MTU enumeration value of n bytes (256..4096,
// a power of two), or 0.
func MTUFromBytes(n int) MTU {
	for m := MTU256; m <= MTU4096; m++ {
		if m.Bytes() == n {
			return m
		}
	}
	return 0
}

// PortState is a port's logical state.
type PortState uint8

const (
	PortNop PortState = iota
	PortDown
	PortInit
	PortArmed
	PortActive
	PortActiveDefer
)

func (s PortState) String() string {
	switch s {
	case PortDown:
		return "PORT_DOWN"
	case PortInit:
		return "PORT_INIT"
	case PortArmed:
		return "PORT_ARMED"
	case PortActive:
		return "PORT_ACTIVE"
	case PortActiveDefer:
		return "PORT_ACTIVE_DEFER"
	}
	return "PORT_NOP"
}

// LinkLayer of a port.
const (
	LinkInfiniBand = "InfiniBand"
	LinkEthernet   = "Ethernet"
)

// DeviceAttr describes a device (ibv_query_device and what ibv_devinfo
// prints).
type DeviceAttr struct {
	Name            string // e.g. "mlx5_0", "soft0"
	Provider        string // provider name: soft, rdmacore
	NodeGUID        uint64
	FWVersion       string
	VendorID        uint32
	VendorPartID    uint32
	HWVersion       uint32
	MaxMRSize       uint64
	MaxQP           int
	MaxQPWR         int // largest send or receive queue
	MaxSGE          int // scatter/gather entries per work request
	MaxCQ           int
	MaxCQE          int // largest CQ
	MaxMR           int
	MaxPD           int
	MaxQPRdAtom     int // RDMA READs a QP may have outstanding as responder
	MaxQPInitRdAtom int // ... as requester
	MaxInline       int // largest inline send
	PhysPortCnt     int
}

// PortAttr describes a port (ibv_query_port).
type PortAttr struct {
	State      PortState
	MaxMTU     MTU
	ActiveMTU  MTU
	LID        uint16 // 0 on Ethernet (RoCE) ports
	GIDTblLen  int
	LinkLayer  string
	PKeyTblLen int
}

// Access flags of a memory region or of a QP's inbound operations.
type Access uint32

const (
	AccessLocalWrite   Access = 1 << 0
	AccessRemoteWrite  Access = 1 << 1
	AccessRemoteRead   Access = 1 << 2
	AccessRemoteAtomic Access = 1 << 3
)

// Provider is one implementation of the verbs.
type Provider interface {
	// Name is the provider's name (soft, rdmacore).
	Name() string
	// Devices lists the devices this provider can open; none and an error
	// wrapping ErrNoDevice when there are none.
	Devices() ([]DeviceAttr, error)
	// Open opens the named device ("" = the first one).
	Open(device string) (Context, error)
}

// Context is an open device (ibv_context).
type Context interface {
	Device() DeviceAttr
	QueryPort(port uint8) (PortAttr, error)
	QueryGID(port uint8, index int) (GID, error)
	AllocPD() (PD, error)
	CreateCompChannel() (CompChannel, error)
	// CreateCQ makes a CQ of at least cqe entries; ch may be nil (no
	// completion events, only polling).
	CreateCQ(cqe int, ch CompChannel) (CQ, error)
	// Close releases the device; every object made from it must have been
	// destroyed first (ErrBusy otherwise).
	Close() error
}

// PD is a protection domain: MRs and QPs of one PD may name each other;
// an rkey of another PD is a remote access error.
type PD interface {
	// RegMR registers buf for the given access. buf must stay valid and
	// unmoved until Dereg (providers that hand it to hardware pin it). A
	// zero-length buf registers an empty region. Remote write or atomic
	// access without AccessLocalWrite is ErrInvalid.
	RegMR(buf []byte, access Access) (MR, error)
	CreateQP(attr QPInitAttr) (QP, error)
	// Dealloc releases the PD (ErrBusy while MRs or QPs remain).
	Dealloc() error
}

// MR is a registered memory region.
type MR interface {
	LKey() uint32
	RKey() uint32
	Addr() uint64 // the region's I/O virtual address
	Len() int
	Access() Access
	// Buf is the registered memory.
	Buf() []byte
	// Dereg ends the registration; later work requests naming its keys
	// fail (LOC_PROT_ERR locally, REM_ACCESS_ERR remotely).
	Dereg() error
}

// SGE returns a scatter/gather entry for bytes [off, off+n) of mr.
func SGE(mr MR, off, n int) SGEntry {
	return SGEntry{Addr: mr.Addr() + uint64(off), Length: uint32(n), LKey: mr.LKey()}
}

// SGEntry is a scatter/gather entry (ibv_sge).
type SGEntry struct {
	Addr   uint64
	Length uint32
	LKey   uint32
}

// CompChannel delivers CQ events (ibv_comp_channel): a CQ armed with
// ReqNotify produces one event on its next completion.
type CompChannel interface {
	// GetEvent waits for the next event and returns its CQ; ctx ends the
	// wait (ctx.Err()). After an event the consumer re-arms the CQ, then
	// polls it empty, then acknowledges the events (CQ.AckEvents).
	GetEvent(ctx context.Context) (CQ, error)
	// Close destroys the channel (ErrBusy while CQs use it).
	Close() error
}

// CQ is a completion queue.
type CQ interface {
	// Poll moves up to len(wc) completions into wc, oldest first, and
	// returns how many. ErrCQOverrun once completions were lost.
	Poll(wc []WC) (int, error)
	// ReqNotify arms the CQ: the next completion (the next solicited one
	// if solicitedOnly) produces one event on its channel.
	ReqNotify(solicitedOnly bool) error
	// AckEvents acknowledges n events taken with GetEvent.
	AckEvents(n int)
	// Destroy releases the CQ (ErrBusy while QPs use it).
	Destroy() error
}

// QPType: only reliable connected is modelled.
type QPType uint8

const QPTypeRC QPType = 2

// QPCap are a QP's queue sizes.
type QPCap struct {
	MaxSendWR, MaxRecvWR   int
	MaxSendSGE, MaxRecvSGE int
	MaxInlineData          int
}

// QPInitAttr creates a QP (ibv_qp_init_attr).
type QPInitAttr struct {
	SendCQ, RecvCQ CQ
	Cap            QPCap
	Type           QPType // QPTypeRC (0 means RC)
	// SigAll: every send work request produces a completion, signalled
	// or not.
	SigAll bool
}

// QPState is a QP's state.
type QPState uint8

const (
	QPSReset QPState = iota
	QPSInit
	QPSRTR
	QPSRTS
	QPSSQD
	QPSSQE
	QPSErr
)

func (s QPState) String() string {
	return [...]string{"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"}[min(int(s), 6)]
}

// AH is an address vector: where a QP's peer is.
type AH struct {
	DLID         uint16
	SL           uint8
	IsGlobal     bool // a GRH is used (always for RoCE)
	DGID         GID
	SGIDIndex    uint8
	HopLimit     uint8
	TrafficClass uint8
	FlowLabel    uint32
	Port         uint8
}

// QPAttr are a QP's modifiable attributes (ibv_qp_attr); AttrMask says
// which fields a Modify sets.
type QPAttr struct {
	State           QPState
	CurState        QPState
	PathMTU         MTU
	QKey            uint32
	RQPSN           uint32 // 24 bits: the first PSN the responder expects
	SQPSN           uint32 // 24 bits: the requester's first PSN
	DestQPN         uint32 // 24 bits
	AccessFlags     Access // inbound operations allowed: remote read/write/atomic
	Cap             QPCap
	AH              AH
	PKeyIndex       uint16
	SQDrainNotify   bool
	MaxRdAtomic     uint8 // outstanding READs/atomics as requester
	MaxDestRdAtomic uint8 // ... as responder
	MinRNRTimer     uint8 // 5-bit code (IB spec table): the wait the responder asks for after an RNR NAK
	Port            uint8
	Timeout         uint8 // local ACK timeout: 4.096 us * 2^Timeout (0 = infinite)
	RetryCnt        uint8 // retransmissions before RETRY_EXC_ERR (0..7)
	RNRRetry        uint8 // RNR retries before RNR_RETRY_EXC_ERR (7 = infinite)
}

// AttrMask selects QPAttr fields (ibv_qp_attr_mask).
type AttrMask uint32

const (
	AttrState            AttrMask = 1 << 0
	AttrCurState         AttrMask = 1 << 1
	AttrEnSQDAsyncNotify AttrMask = 1 << 2
	AttrAccessFlags      AttrMask = 1 << 3
	AttrPKeyIndex        AttrMask = 1 << 4
	AttrPort             AttrMask = 1 << 5
	AttrQKey             AttrMask = 1 << 6
	AttrAV               AttrMask = 1 << 7
	AttrPathMTU          AttrMask = 1 << 8
	AttrTimeout          AttrMask = 1 << 9
	AttrRetryCnt         AttrMask = 1 << 10
	AttrRNRRetry         AttrMask = 1 << 11
	AttrRQPSN            AttrMask = 1 << 12
	AttrMaxQPRdAtomic    AttrMask = 1 << 13
	AttrAltPath          AttrMask = 1 << 14
	AttrMinRNRTimer      AttrMask = 1 << 15
	AttrSQPSN            AttrMask = 1 << 16
	AttrMaxDestRdAtomic  AttrMask = 1 << 17
	AttrPathMigState     AttrMask = 1 << 18
	AttrCap              AttrMask = 1 << 19
	AttrDestQPN          AttrMask = 1 << 20
)

// The masks an RC QP transition requires (ibv_modify_qp(3)); a transition
// may add optional attributes but must give all of these.
const (
	MaskResetToInit = AttrState | AttrPKeyIndex | AttrPort | AttrAccessFlags
	MaskInitToRTR   = AttrState | AttrAV | AttrPathMTU | AttrDestQPN | AttrRQPSN | AttrMaxDestRdAtomic | AttrMinRNRTimer
	MaskRTRToRTS    = AttrState | AttrSQPSN | AttrTimeout | AttrRetryCnt | AttrRNRRetry | AttrMaxQPRdAtomic
)

// QP is a queue pair.
type QP interface {
	QPN() uint32
	State() QPState
	// Modify applies the attributes named by mask. A transition that is
	// not allowed, or that lacks a required attribute or has one out of
	// range, returns ErrInvalid and changes nothing.
	Modify(attr *QPAttr, mask AttrMask) error
	Query() (QPAttr, error)
	// PostSend queues wrs in order. It stops at the first request it can
	// refuse at once (QP in RESET, INIT or RTR: ErrInvalid; queue full:
	// ErrNoMem; too many SGEs; inline data too large) and returns its
	// index and the error; the requests before it are posted. A request
	// posted to a QP in ERR is accepted and completes with WCWRFlushErr.
	// Without FlagInline the memory named by the SGEs must stay untouched
	// until the completion (or a later signalled completion) is polled.
	PostSend(wrs []SendWR) (bad int, err error)
	// PostRecv queues receive requests (from INIT on; in RESET:
	// ErrInvalid; in ERR they complete with WCWRFlushErr), as PostSend.
	PostRecv(wrs []RecvWR) (bad int, err error)
	// Destroy releases the QP; outstanding requests are dropped.
	Destroy() error
}

// WROpcode is a send work request's operation.
type WROpcode uint8

const (
	WRRDMAWrite WROpcode = iota
	WRRDMAWriteWithImm
	WRSend
	WRSendWithImm
	WRRDMARead
	WRAtomicCmpAndSwp
	WRAtomicFetchAndAdd
)

func (o WROpcode) String() string {
	switch o {
	case WRRDMAWrite:
		return "RDMA_WRITE"
	case WRRDMAWriteWithImm:
		return "RDMA_WRITE_WITH_IMM"
	case WRSend:
		return "SEND"
	case WRSendWithImm:
		return "SEND_WITH_IMM"
	case WRRDMARead:
		return "RDMA_READ"
	case WRAtomicCmpAndSwp:
		return "ATOMIC_CMP_AND_SWP"
	case WRAtomicFetchAndAdd:
		return "ATOMIC_FETCH_AND_ADD"
	}
	return fmt.Sprintf("WR_OPCODE(%d)", uint8(o))
}

// SendFlags of a send work request.
type SendFlags uint8

const (
	FlagFence     SendFlags = 1 << 0 // wait for earlier READs/atomics to complete first
	FlagSignaled  SendFlags = 1 << 1 // produce a completion
	FlagSolicited SendFlags = 1 << 2
	FlagInline    SendFlags = 1 << 3 // copy the data at post time; lkeys are not checked
)

// SendWR is a send work request (ibv_send_wr).
type SendWR struct {
	ID     uint64
	Opcode WROpcode
	Flags  SendFlags
	SGList []SGEntry
	// Imm is the immediate data of *_WITH_IMM: verbs carries it as a
	// 32-bit big-endian field; the model passes the value through
	// unchanged, so the receiver's WC.Imm equals the sender's Imm.
	Imm        uint32
	RemoteAddr uint64 // RDMA and atomics
	RKey       uint32
	CompareAdd uint64 // atomics
	Swap       uint64
}

// RecvWR is a receive work request (ibv_recv_wr).
type RecvWR struct {
	ID     uint64
	SGList []SGEntry
}

// WCStatus is a work completion's status (values of verbs.h).
type WCStatus uint8

const (
	WCSuccess WCStatus = iota
	WCLocLenErr
	WCLocQPOpErr
	WCLocEECOpErr
	WCLocProtErr
	WCWRFlushErr
	WCMWBindErr
	WCBadRespErr
	WCLocAccessErr
	WCRemInvReqErr
	WCRemAccessErr
	WCRemOpErr
	WCRetryExcErr
	WCRNRRetryExcErr
	WCLocRDDViolErr
	WCRemInvRdReqErr
	WCRemAbortErr
	WCInvEECNErr
	WCInvEECStateErr
	WCFatalErr
	WCRespTimeoutErr
	WCGeneralErr
)

var wcStatusNames = [...]string{
	"success", "local length error", "local QP operation error", "local EE context operation error",
	"local protection error", "Work Request Flushed Error", "memory management operation error",
	"bad response error", "local access error", "remote invalid request error", "remote access error",
	"remote operation error", "transport retry counter exceeded", "RNR retry counter exceeded",
	"local RDD violation error", "remote invalid RD request", "aborted error", "invalid EE context number",
	"invalid EE context state", "fatal error", "response timeout error", "general error",
}

func (s WCStatus) String() string {
	if int(s) < len(wcStatusNames) {
		return wcStatusNames[s]
	}
	return fmt.Sprintf("status %d", uint8(s))
}

// WCOpcode is a work completion's operation; receive completions have
// bit 0x80.
type WCOpcode uint8

const (
	WCSend            WCOpcode = 0
	WCRDMAWrite       WCOpcode = 1
	WCRDMARead        WCOpcode = 2
	WCCompSwap        WCOpcode = 3
	WCFetchAdd        WCOpcode = 4
	WCRecv            WCOpcode = 0x80
	WCRecvRDMAWithImm WCOpcode = 0x81
)

// WCFlags of a work completion.
type WCFlags uint8

const (
	WCWithImm WCFlags = 1 << 1 // Imm is valid
)

// WC is a work completion (ibv_wc). For an error completion only ID,
// Status, QPNum and VendorErr are meaningful.
type WC struct {
	ID        uint64
	Status    WCStatus
	Opcode    WCOpcode
	VendorErr uint32
	ByteLen   uint32
	Imm       uint32
	QPNum     uint32
	SrcQP     uint32
	Flags     WCFlags
}

// WCError is a failed work completion as an error.
type WCError struct {
	Status WCStatus
	Opcode WCOpcode
	QPNum  uint32
}

func (e *WCError) Error() string {
	return fmt.Sprintf("ibv: work completion on QP %#x: %v", e.QPNum, e.Status)
}

// Err returns nil for a successful completion, else a *WCError.
func (wc *WC) Err() error {
	if wc.Status == WCSuccess {
		return nil
	}
	return &WCError{Status: wc.Status, Opcode: wc.Opcode, QPNum: wc.QPNum}
}

// Factory makes a provider from the job's parameters.
type Factory func(p *params.Set) (Provider, error)

var (
	regMu     sync.Mutex
	factories = map[string]Factory{}
)

// RegisterProvider makes a provider available by name (called from the
// provider package's init).
func RegisterProvider(name string, f Factory) {
	regMu.Lock()
	defer regMu.Unlock()
	factories[name] = f
}

// ProviderNames lists the registered providers, sorted.
func ProviderNames() []string {
	regMu.Lock()
	defer regMu.Unlock()
	var out []string
	for n := range factories {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// NewProvider makes the named provider from p (params.Set may be nil for
// the defaults).
func NewProvider(name string, p *params.Set) (Provider, error) {
	regMu.Lock()
	f := factories[name]
	regMu.Unlock()
	if f == nil {
		return nil, fmt.Errorf("ibv: provider %q is not built in (have %v): %w", name, ProviderNames(), ErrNoDevice)
	}
	return f(p)
}
