// Package verbs is gompi's RDMA transport (btl component "verbs"), written
// against the verbs model of package ibv and run on one of its providers:
// rdmacore (a real NIC, build tag rdmacore) or soft (a software RoCEv2
// device in pure Go).
//
// Open picks the provider (btl_verbs_provider), opens the device and port,
// and returns one module. The module makes one reliable-connected QP per
// peer when the pair is first used: each side publishes its address (LID,
// GID, QPN, first PSN, MTU and its control ring's address and rkey) in the
// wire-up store under "btl.verbs.<from>.<to>" and reads the other's; a
// side that sees the peer's address first (a watcher goroutine per peer
// waits for it) publishes its own, so a pair connects whichever side
// starts, and two sides starting at once meet on the same pair of QPs.
// Each side then moves its QP to RTR and RTS and says so under
// "btl.verbs.<from>.<to>.up"; traffic starts when both have.
//
// Fragments (Send, SendAlloc, SendImmediate) are copied into a registered
// staging ring and written with RDMA WRITE_WITH_IMM (immediate 0xFFFFFFFF)
// into the peer's control ring at the same offset; the receiver dispatches
// them from the ring in place and acknowledges with zero-length writes of
// immediate 0xFFFFFFFE (credit.go). Put is RDMA WRITE and Get RDMA READ,
// between memory registered through a registration cache (regcache.go).
// WriteWithImm is a Put whose arrival the peer is told about: immediates
// below 0xFFFFFFFE are dispatched to the peer's handler of TagImm
// (TensorFlow's request-index notification).
//
// Threading: the module is a btl.Poller. Progress polls the pairs'
// completion queues on the calling goroutine and dispatches there. A
// watcher goroutine sleeps on the completion channel and does the same
// while nobody polls, so messages are delivered when the PML blocks in
// another transport. Completion callbacks and handlers run with no lock
// held that an operation on the endpoint needs.
package verbs

import (
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

// Name is the component's name.
const Name = "verbs"

// Immediate values (TensorFlow's convention, notes D.3).
const (
	immMsg uint32 = 0xFFFFFFFF // a control message in the ring
	immACK uint32 = 0xFFFFFFFE // an acknowledgement (zero-length write)
	// MaxImm is the largest immediate WriteWithImm may carry.
	MaxImm uint32 = 0xFFFFFFFD
)

// TagImm is the tag under which an endpoint dispatches the arrival of a
// WriteWithImm: hdr holds the immediate and the byte count as two
// little-endian u32s, data is empty. It lies in the tensor rendezvous's
// range (btl.Tag docs); the layer that uses WriteWithImm registers it. An
// immediate arriving with no handler registered is a protocol error on
// that peer.
const TagImm btl.Tag = 0x6f

// ImmWriter is implemented by verbs endpoints.
type ImmWriter interface {
	// WriteWithImm is Put (same ownership, completion and errors) that
	// also tells the peer: once the data is in its memory, the peer's
	// handler of TagImm runs with imm and len(local). imm must be at most
	// MaxImm (mpierr.ErrArg otherwise). It needs CapPut.
	WriteWithImm(local []byte, handle []byte, off int, imm uint32, cb btl.Completion) (done bool, err error)
}

// Open MPI openib's defaults (notes A.9).
var defaults = btl.Defaults{
	Limits: btl.Limits{
		EagerLimit:             12 << 10,
		RndvEagerLimit:         12 << 10,
		MaxSendSize:            64 << 10,
		RDMAPipelineFragSize:   1 << 20,
		RDMAPipelineSendLength: 1 << 20,
		// openib's 256 KiB pipelines messages so that registering them
		// overlaps the transfer; here memory is registered once and kept
		// (regcache.go), so a contiguous rendezvous is one RDMA operation:
		// 4 MiB bandwidth over soft 1.81-1.87 -> 2.08-2.41 GB/s (two
		// alternated runs of gompi-bench bw; docs/PERFORMANCE.md).
		MinRDMAPipelineSize: math.MaxInt32,
	},
	Caps:        have,
	Exclusivity: btl.ExclusivityDefault,
}

const have = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut | btl.CapGet

// Ranking data (Open MPI openib's defaults for a 4x QDR link).
const (
	latencyUS     = 10
	bandwidthMbps = 10000
)

const (
	paramProvider       = "btl_verbs_provider"
	paramDevice         = "btl_verbs_device"
	paramPort           = "btl_verbs_port"
	paramGIDIndex       = "btl_verbs_gid_index"
	paramPKeyIndex      = "btl_verbs_pkey_index"
	paramQueueDepth     = "btl_verbs_qp_queue_depth"
	paramTimeout        = "btl_verbs_qp_timeout"
	paramRetryCount     = "btl_verbs_qp_retry_count"
	paramRNRRetry       = "btl_verbs_qp_rnr_retry"
	paramSL             = "btl_verbs_qp_sl"
	paramMTU            = "btl_verbs_mtu"
	paramTrafficClass   = "btl_verbs_traffic_class"
	paramCredits        = "btl_verbs_send_credits"
	paramRingSize       = "btl_verbs_ring_size"
	paramRegCacheSize   = "btl_verbs_reg_cache_size"
	paramConnectTimeout = "btl_verbs_connect_timeout"
)

// envAliases are TensorFlow's RDMA_* variables, read for a parameter that
// was not set (neither GOMPI_<NAME>, gorun flag nor mpi.WithParam).
var envAliases = map[string]string{
	paramDevice:       "RDMA_DEVICE",
	paramPort:         "RDMA_DEVICE_PORT",
	paramGIDIndex:     "RDMA_GID_INDEX",
	paramPKeyIndex:    "RDMA_QP_PKEY_INDEX",
	paramQueueDepth:   "RDMA_QP_QUEUE_DEPTH",
	paramTimeout:      "RDMA_QP_TIMEOUT",
	paramRetryCount:   "RDMA_QP_RETRY_COUNT",
	paramSL:           "RDMA_QP_SL",
	paramMTU:          "RDMA_QP_MTU",
	paramTrafficClass: "RDMA_TRAFFIC_CLASS",
}

func init() {
	btl.RegisterParams(Name, defaults)
	reg := func(name string, k params.Kind, def, help string) {
		if a := envAliases[name]; a != "" {
			help += " (TensorFlow's " + a + " is read when this is not set)"
		}
		params.Register(params.Def{Name: name, Kind: k, Default: def, Help: help})
	}
	reg(paramProvider, params.String, "auto", "ibv provider of the verbs transport: rdmacore (a NIC through libibverbs; build tag rdmacore), soft (the pure-Go RoCEv2 device, over UDP), or auto: rdmacore when built in and a device exists, else soft when verbs is named in the btl list")
	reg(paramDevice, params.String, "", "verbs device to open (default: the provider's first)")
	reg(paramPort, params.Int, "1", "port of the device")
	reg(paramGIDIndex, params.Int, "0", "GID table index of the port used as the source GID")
	reg(paramPKeyIndex, params.Int, "0", "P_Key table index of the QPs")
	reg(paramQueueDepth, params.Int, "1024", "send and receive queue depth of each QP")
	reg(paramTimeout, params.Int, "14", "local ACK timeout of the QPs: 4.096 us * 2^value (0: infinite)")
	reg(paramRetryCount, params.Int, "7", "retransmissions before a QP gives up on a silent peer (0-7)")
	reg(paramRNRRetry, params.Int, "7", "receiver-not-ready retries (0-7; 7: forever)")
	reg(paramSL, params.Int, "0", "service level of the QPs")
	reg(paramMTU, params.Int, "0", "path MTU in bytes (256-4096; 0: the port's active MTU)")
	reg(paramTrafficClass, params.Int, "0", "traffic class of the QPs' global route header")
	reg(paramCredits, params.Int, strconv.Itoa(defaultCredits), "control messages in flight to one peer before the sender waits for its ACK (1: TensorFlow's one message in flight; the default is lowered to fit a smaller queue depth)")
	reg(paramRingSize, params.Size, "256k", "bytes of the control ring each side keeps per connected peer (raised to 4x the largest fragment)")
	reg(paramRegCacheSize, params.Size, "256m", "bytes of user memory the registration cache keeps registered after use (least recently used goes first)")
	reg(paramConnectTimeout, params.Duration, "30s", "time allowed for a peer to publish its address and bring its QP up")
	btl.RegisterComponent(component{})
}

type component struct{}

func (component) Name() string { return Name }

// config is the resolved settings of one Open.
type config struct {
	limits         btl.Limits
	caps           btl.Caps
	exclusivity    int
	provider       string
	device         string
	port           uint8
	gidIndex       int
	pkeyIndex      uint16
	depth          int
	timeout        uint8
	retry          uint8
	rnrRetry       uint8
	sl             uint8
	mtu            ibv.MTU // 0: the port's
	trafficClass   uint8
	credits        int
	ringSize       int
	regCache       int
	connectTimeout time.Duration
	maxFrag        int // largest fragment: max(eager_limit, max_send_size)
}

// intParam returns an integer parameter, taking TensorFlow's variable when
// the parameter has its default.
// defaultCredits is btl_verbs_send_credits's default. The receiver
// acknowledges every defaultCredits/2 messages with a write of its own (a
// packet, a completion and a poll at each end): at 256 that is one in 128
// messages, which a ping-pong of small messages no longer feels (at 64,
// one in 32 cost about 0.15 us per message on the soft device).
const defaultCredits = 256

func intParam(p *params.Set, name string) (int, error) {
	if a := envAliases[name]; a != "" {
		if _, src := p.Value(name); src == params.FromDefault {
			if s, ok := os.LookupEnv(a); ok {
				v, err := strconv.Atoi(strings.TrimSpace(s))
				if err != nil {
					return 0, mpierr.Errorf(mpierr.ErrArg, "%s=%q (for %s): not an integer", a, s, name)
				}
				return v, nil
			}
		}
	}
	return p.Int(name), nil
}

func stringParam(p *params.Set, name string) string {
	if a := envAliases[name]; a != "" {
		if _, src := p.Value(name); src == params.FromDefault {
			if s, ok := os.LookupEnv(a); ok {
				return strings.TrimSpace(s)
			}
		}
	}
	return p.String(name)
}

func readConfig(p *params.Set) (config, error) {
	l, caps, excl, err := btl.Settings(p, Name, have)
	if err != nil {
		return config{}, err
	}
	c := config{limits: l, caps: caps, exclusivity: excl,
		provider:       strings.TrimSpace(p.String(paramProvider)),
		device:         stringParam(p, paramDevice),
		ringSize:       p.Int(paramRingSize),
		regCache:       p.Int(paramRegCacheSize),
		connectTimeout: p.Duration(paramConnectTimeout),
		maxFrag:        max(l.EagerLimit, l.MaxSendSize),
	}
	ints := map[string]*int{}
	var port, pkey, timeout, retry, rnr, sl, mtu, tc int
	for name, dst := range map[string]*int{paramPort: &port, paramGIDIndex: &c.gidIndex, paramPKeyIndex: &pkey,
		paramQueueDepth: &c.depth, paramTimeout: &timeout, paramRetryCount: &retry, paramRNRRetry: &rnr,
		paramSL: &sl, paramMTU: &mtu, paramTrafficClass: &tc, paramCredits: &c.credits} {
		v, err := intParam(p, name)
		if err != nil {
			return c, err
		}
		*dst = v
		ints[name] = dst
	}
	bad := func(name string, lo, hi int) error {
		if v := *ints[name]; v < lo || v > hi {
			return mpierr.Errorf(mpierr.ErrArg, "%s=%d: want %d..%d", name, v, lo, hi)
		}
		return nil
	}
	for _, chk := range []struct {
		name   string
		lo, hi int
	}{{paramPort, 1, 255}, {paramGIDIndex, 0, 255}, {paramPKeyIndex, 0, 65535}, {paramQueueDepth, 16, 1 << 16},
		{paramTimeout, 0, 31}, {paramRetryCount, 0, 7}, {paramRNRRetry, 0, 7}, {paramSL, 0, 15},
		{paramTrafficClass, 0, 255}, {paramCredits, 1, maxCredits}} {
		if err := bad(chk.name, chk.lo, chk.hi); err != nil {
			return c, err
		}
	}
	c.port, c.pkeyIndex, c.timeout, c.retry, c.rnrRetry, c.sl, c.trafficClass =
		uint8(port), uint16(pkey), uint8(timeout), uint8(retry), uint8(rnr), uint8(sl), uint8(tc)
	switch {
	case mtu == 0:
	case mtu >= 1 && mtu <= 5: // TensorFlow's RDMA_QP_MTU may be the enumeration value
		c.mtu = ibv.MTU(mtu)
	default:
		if c.mtu = ibv.MTUFromBytes(mtu); c.mtu == 0 {
			return c, mpierr.Errorf(mpierr.ErrArg, "%s=%d: want 256, 512, 1024, 2048 or 4096 (or 0: the port's)", paramMTU, mtu)
		}
	}
	if _, src := p.Value(paramCredits); src == params.FromDefault && c.credits == defaultCredits && c.credits+4 > c.depth {
		c.credits = c.depth - 4 // the default, not asked for: fit the queues
	}
	if c.credits+4 > c.depth {
		return c, mpierr.Errorf(mpierr.ErrArg, "%s=%d needs %s of at least %d (is %d)", paramCredits, c.credits, paramQueueDepth, c.credits+4, c.depth)
	}
	if c.credits == 1 {
		// One message in flight (TensorFlow's buffer): an immediate send
		// finds the credit taken until the peer's ACK is back, so nearly
		// every one would be refused and then sent again by Send.
		c.caps &^= btl.CapSendImmediate
	}
	if c.maxFrag <= 0 || c.maxFrag > maxRingSize/8 {
		return c, mpierr.Errorf(mpierr.ErrArg, "btl_verbs_eager_limit/max_send_size %d: want 1..%d", c.maxFrag, maxRingSize/8)
	}
	if c.connectTimeout <= 0 {
		return c, mpierr.Errorf(mpierr.ErrArg, "%s=%v: want a positive duration", paramConnectTimeout, c.connectTimeout)
	}
	if c.ringSize < 0 || c.ringSize > maxRingSize {
		return c, mpierr.Errorf(mpierr.ErrArg, "%s=%d: want at most %d", paramRingSize, c.ringSize, maxRingSize)
	}
	// A ring takes frames of up to a quarter of its size (credit.go).
	c.ringSize = max(alignUp(c.ringSize), 4*alignUp(c.maxFrag+frameHdrLen), minRingSize)
	if c.regCache < 0 {
		c.regCache = 0
	}
	return c, nil
}

// pickProvider resolves btl_verbs_provider. auto takes rdmacore when it is
// built in and has a device, else soft, but soft only when the btl list
// names verbs: a job that did not ask for verbs gets no software device.
func pickProvider(c config, p *params.Set, btlList string) (ibv.Provider, error) {
	switch c.provider {
	case "auto", "":
		if pr, err := ibv.NewProvider("rdmacore", p); err == nil {
			if devs, err := pr.Devices(); err == nil && len(devs) > 0 {
				return pr, nil
			}
		}
		if !named(btlList) {
			return nil, mpierr.Errorf(mpierr.ErrNotSupported, "verbs: no RDMA device (the soft provider is used when the btl list names verbs or %s=soft)", paramProvider)
		}
		c.provider = "soft"
	}
	pr, err := ibv.NewProvider(c.provider, p)
	if err != nil {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "verbs: %s=%s: %v", paramProvider, c.provider, err)
	}
	return pr, nil
}

// named reports whether an include list names verbs.
func named(list string) bool {
	list = strings.TrimSpace(list)
	return list != "" && !strings.HasPrefix(list, "^") && btl.Selected(list, Name)
}

func (c config) String() string {
	return fmt.Sprintf("port %d gid index %d depth %d timeout %d retry %d rnr %d sl %d credits %d ring %d",
		c.port, c.gidIndex, c.depth, c.timeout, c.retry, c.rnrRetry, c.sl, c.credits, c.ringSize)
}
