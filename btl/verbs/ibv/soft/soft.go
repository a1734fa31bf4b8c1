// Package soft is a software RDMA device: an RC (reliable connected)
// transport that speaks the InfiniBand transport protocol in the RoCEv2
// packet layout (BTH, RETH, AETH, ImmDt, ICRC) over UDP, in user space and
// pure Go. It implements the verbs model of package ibv and registers
// itself as the provider "soft".
//
// Entry point: ibv.NewProvider("soft", params) or New(Config) in tests;
// Provider.Open("soft0") gives the device's context, and from there the
// usual verbs loop applies (PD, MR, CQ, QP RESET -> INIT -> RTR -> RTS,
// PostSend/PostRecv, Poll).
//
// # Device and addressing
//
// One Provider has one device, soft0, created on the first Open and
// closed with the last Context. The device owns a UDP socket bound to its
// own IP address on the RoCEv2 port (4791 unless configured): with the
// default address, a free 127.x.y.z other than 127.0.0.1, so that every
// process (every rank of a job) on one host has its own device on the
// same port. The device's GID (port 1, index 0) is that address in
// IPv4-mapped form; a QP sends to (its peer GID's address, the configured
// port) from a socket of its own, connected to that peer (the kernel
// keeps the route, where a send with an address looks it up each time)
// and bound to the pair's UDP source port, which both ends derive from
// the QPNs as RoCEv2 NICs do (0xC000 and up); when that port is taken
// (the two QPs of a loopback pair on one device) it sends from the
// device's socket. A responder takes a packet only from its peer's
// address and one of those two ports. QPs of one device may connect to
// each other.
//
// # Transport
//
// Requests are cut into packets of the path MTU (FIRST/MIDDLE/LAST/ONLY
// opcodes) with 24-bit PSNs. The responder checks PSN, opcode sequence,
// access (the QP's access flags and the MR's), resources and lengths in
// that order; it answers in-order requests with coalesced ACKs (one per
// QP per receive batch, for the packets that asked for one; the ACK of a
// packet that completed a receive waits for a carrier: it leaves behind
// the QP's next request packets, at the device's next progress pass, or
// after 100 us, whichever comes first; the last packet of a message that
// asked for none is acknowledged lazily, within a quarter of
// Config.MinTimeout (at most 250 us), or behind the next requests once 16
// packets are unacknowledged), duplicates
// with a repeated ACK or, for READ, a repeated response, a PSN gap with
// one sequence-error NAK, a missing receive with an RNR NAK carrying the
// QP's min_rnr_timer, and errors with the NAK of their class, after which
// its QP is in ERR. The requester goes back N on a sequence NAK, on a
// timeout (4.096 us * 2^timeout, at least Config.MinTimeout; retry_cnt
// times, then IBV_WC_RETRY_EXC_ERR) and on a READ response gap; it waits
// out RNR NAKs rnr_retry times (7: forever), then IBV_WC_RNR_RETRY_EXC_ERR.
//
// Requester pacing, which the verbs leave to the implementation: a QP
// sends at most a window of packets ahead of acknowledgement (Config.Window;
// halved on each loss it learns of, grown back as windows are
// acknowledged), asks for an ACK at the end of a signaled request, of any
// request once its send queue is half full, and every quarter window
// (at most every 32 packets), and asks for a READ
// longer than the window in window-sized parts, since READ responses have
// no acknowledgement to pace them. The local ACK timeout in force is the
// QP's, or the measured round trip plus four times its variation when that
// is longer (Jacobson's estimator); it never backs off, so retry_cnt
// timeouts after the peer went silent the request fails. Ahead of it, once
// the measured round trip (plus four times its variation, at least
// Config.MinTimeout) has passed without progress, the requester goes back
// once to the oldest unacknowledged packet without counting a retry, so
// that a lost NAK or a lost last packet costs about a round trip, not the
// timeout. After a timeout or such a go-back the window restarts small:
// the answer to the first packet sent again names the last PSN the
// responder has, and the requester skips what it covers.
//
// Memory regions get synthetic I/O virtual addresses (non-overlapping
// page-aligned ranges per device) and random keys (lkey = rkey). Payloads
// go from registered memory to the kernel through iovecs (sendmmsg, with
// UDP GSO where the kernel has it) and from the receive buffer (recvmmsg,
// with UDP GRO) into registered memory by one copy. The steady state
// allocates nothing per packet.
//
// # Progress
//
// A receive goroutine per device is woken by Go's network poller, and a
// poller of an empty CQ does the same work itself (the deferred ACKs, one
// non-blocking pass over the socket per round of the device's CQs, fewer
// once many passes in a row found nothing, and one QP of the transmit
// worker's list): a user
// spinning on Poll on a busy machine does not wait for the device's
// goroutines to be scheduled. Posting sends from the caller's goroutine.
// A transmit worker goroutine per device sends what exceeds a caller's
// budget (long messages, READ responses, retransmissions).
//
// # Faults
//
// Config.Drop, Dup, Reorder and Corrupt (parameters verbs_soft_drop, ...)
// make the receive path drop, duplicate, delay past the next packet, or
// flip a bit of that fraction of packets. Corrupted packets fail the ICRC
// and are dropped and counted. The transport recovers from all of them;
// the verbs user sees every operation once, in order. Counters (through
// CountersOf) report what happened.
//
// # Wireshark
//
// The traffic is what Wireshark's InfiniBand dissector (RRoCE, UDP 4791)
// reads: TestWiresharkDissects captures every opcode, ACKs and NAKs on lo
// with dumpcap and checks with tshark that no packet is malformed or
// warned about and that the ICRC of every packet, recomputed over the
// captured IP and UDP headers, is right; it skips, saying why, when
// tshark or capture rights are missing. By hand, with verbs_soft_gso=false
// (over lo the kernel passes GSO runs of packets unsplit, so a capture
// shows 64 KiB "packets"): capture with
// `dumpcap -i lo -f 'udp port 4791' -w f.pcap` during a run, then
// `tshark -r f.pcap --disable-protocol rpcordma -Y '_ws.malformed'`
// prints nothing (the RPC-over-RDMA heuristic parses SEND payloads as its
// own protocol and calls them malformed).
package soft

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

// DefaultPort is the RoCEv2 UDP destination port.
const DefaultPort = 4791

// Config sets up a soft provider. The zero value is the default device:
// a free loopback address, port 4791, no faults.
type Config struct {
	// Addr is the IP address the device binds and publishes as its GID;
	// the zero Addr picks a free 127.x.y.z.
	Addr netip.Addr
	// Port is the UDP port of every device (0: DefaultPort).
	Port int
	// Drop, Dup, Reorder and Corrupt are the fractions (0..1) of received
	// packets dropped, processed twice, held back behind the next packet,
	// or bit-flipped (then dropped by the ICRC check).
	Drop, Dup, Reorder, Corrupt float64
	// Seed seeds the fault injection (0: from the clock).
	Seed int64
	// MinTimeout is the floor of a QP's local ACK timeout (0: 1 ms): the
	// verbs value 4.096 us * 2^timeout is below what a user-space
	// transport on a shared machine can answer within for small timeouts.
	MinTimeout time.Duration
	// Window is the most packets a QP has in flight unacknowledged
	// (0: 1024).
	Window int
	// SockBuf is the socket buffer size asked for, in bytes (0: 16 MiB).
	SockBuf int
	// NoGSO keeps the socket from UDP segmentation offload and GRO, so
	// that a capture on lo shows each packet on its own (the kernel
	// otherwise passes 64 KiB runs of packets over lo unsplit).
	NoGSO bool
	// Clock runs the retransmission and RNR timers (nil: real time).
	Clock Clock
}

// Clock is the time source of the device's timers.
type Clock interface {
	Now() time.Time
	// AfterFunc calls f in its own goroutine after d.
	AfterFunc(d time.Duration, f func()) Timer
}

// Timer is a Clock's timer (time.Timer satisfies it).
type Timer interface {
	Reset(d time.Duration) bool
	Stop() bool
}

type realClock struct{}

func (realClock) Now() time.Time                            { return time.Now() }
func (realClock) AfterFunc(d time.Duration, f func()) Timer { return time.AfterFunc(d, f) }

func (c Config) withDefaults() Config {
	if c.Port == 0 {
		c.Port = DefaultPort
	}
	if c.MinTimeout == 0 {
		c.MinTimeout = time.Millisecond
	}
	if c.Window == 0 {
		c.Window = 1024
	}
	if c.SockBuf == 0 {
		c.SockBuf = 16 << 20
	}
	if c.Clock == nil {
		c.Clock = realClock{}
	}
	return c
}

func (c Config) validate() error {
	for _, f := range []struct {
		n string
		v float64
	}{{"drop", c.Drop}, {"dup", c.Dup}, {"reorder", c.Reorder}, {"corrupt", c.Corrupt}} {
		if !(f.v >= 0 && f.v <= 1) {
			return fmt.Errorf("soft: %s fraction %v not in [0, 1]: %w", f.n, f.v, ibv.ErrInvalid)
		}
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("soft: port %d: %w", c.Port, ibv.ErrInvalid)
	}
	if c.Window < 1 || c.Window > 1<<22 {
		return fmt.Errorf("soft: window %d: %w", c.Window, ibv.ErrInvalid)
	}
	return nil
}

// Parameter names.
const (
	ParamPort       = "verbs_soft_port"
	ParamAddr       = "verbs_soft_addr"
	ParamDrop       = "verbs_soft_drop"
	ParamDup        = "verbs_soft_dup"
	ParamReorder    = "verbs_soft_reorder"
	ParamCorrupt    = "verbs_soft_corrupt"
	ParamSeed       = "verbs_soft_seed"
	ParamMinTimeout = "verbs_soft_min_timeout"
	ParamWindow     = "verbs_soft_window"
	ParamSockBuf    = "verbs_soft_sockbuf"
	ParamGSO        = "verbs_soft_gso"
)

func init() {
	params.Register(params.Def{Name: ParamPort, Kind: params.Int, Default: "4791",
		Help: "UDP port of the soft verbs device (RoCEv2 uses 4791); every device of a job uses the same port on its own address"})
	params.Register(params.Def{Name: ParamAddr, Kind: params.String, Default: "",
		Help: "IP address the soft verbs device binds and publishes as its GID (empty: a free 127.x.y.z)"})
	params.Register(params.Def{Name: ParamDrop, Kind: params.String, Default: "0",
		Help: "fraction (0..1) of received packets the soft verbs device drops, for fault tests"})
	params.Register(params.Def{Name: ParamDup, Kind: params.String, Default: "0",
		Help: "fraction (0..1) of received packets the soft verbs device processes twice"})
	params.Register(params.Def{Name: ParamReorder, Kind: params.String, Default: "0",
		Help: "fraction (0..1) of received packets the soft verbs device processes after the next one"})
	params.Register(params.Def{Name: ParamCorrupt, Kind: params.String, Default: "0",
		Help: "fraction (0..1) of received packets the soft verbs device corrupts (the ICRC check drops them)"})
	params.Register(params.Def{Name: ParamSeed, Kind: params.Int, Default: "0",
		Help: "seed of the soft verbs fault injection (0: from the clock)"})
	params.Register(params.Def{Name: ParamMinTimeout, Kind: params.Duration, Default: "1ms",
		Help: "floor of a soft verbs QP's local ACK timeout (the QP's timeout attribute is 4.096us*2^timeout)"})
	params.Register(params.Def{Name: ParamWindow, Kind: params.Int, Default: "1024",
		Help: "packets a soft verbs QP sends ahead of acknowledgement"})
	params.Register(params.Def{Name: ParamSockBuf, Kind: params.Size, Default: "16m",
		Help: "socket buffer size of the soft verbs device"})
	params.Register(params.Def{Name: ParamGSO, Kind: params.Bool, Default: "true",
		Help: "use UDP GSO/GRO where the kernel has them (false: one packet per datagram, e.g. for captures)"})
	ibv.RegisterProvider("soft", func(p *params.Set) (ibv.Provider, error) {
		c, err := ConfigFromParams(p)
		if err != nil {
			return nil, err
		}
		return New(c), nil
	})
}

// ConfigFromParams reads the verbs_soft_* parameters of p (nil: the
// defaults). A value that does not parse is an error wrapping
// mpierr.ErrArg.
func ConfigFromParams(p *params.Set) (Config, error) {
	var c Config
	if p == nil {
		return c.withDefaults(), nil
	}
	has := p.Has
	if has(ParamPort) {
		c.Port = p.Int(ParamPort)
		if c.Port < 1 || c.Port > 65535 {
			return c, mpierr.Errorf(mpierr.ErrArg, "%s=%d: not a UDP port", ParamPort, c.Port)
		}
	}
	if has(ParamAddr) {
		if s := strings.TrimSpace(p.String(ParamAddr)); s != "" {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return c, mpierr.Errorf(mpierr.ErrArg, "%s=%q: %v", ParamAddr, s, err)
			}
			c.Addr = a.Unmap()
		}
	}
	for _, f := range []struct {
		name string
		dst  *float64
	}{{ParamDrop, &c.Drop}, {ParamDup, &c.Dup}, {ParamReorder, &c.Reorder}, {ParamCorrupt, &c.Corrupt}} {
		if !has(f.name) {
			continue
		}
		s := strings.TrimSpace(p.String(f.name))
		v, err := strconv.ParseFloat(s, 64)
		if err != nil || !(v >= 0 && v <= 1) {
			return c, mpierr.Errorf(mpierr.ErrArg, "%s=%q: want a fraction between 0 and 1 (e.g. 0.02)", f.name, s)
		}
		*f.dst = v
	}
	if has(ParamSeed) {
		c.Seed = int64(p.Int(ParamSeed))
	}
	if has(ParamMinTimeout) {
		c.MinTimeout = p.Duration(ParamMinTimeout)
		if c.MinTimeout <= 0 {
			return c, mpierr.Errorf(mpierr.ErrArg, "%s=%v: must be positive", ParamMinTimeout, c.MinTimeout)
		}
	}
	if has(ParamWindow) {
		c.Window = p.Int(ParamWindow)
		if c.Window < 1 || c.Window > 1<<22 {
			return c, mpierr.Errorf(mpierr.ErrArg, "%s=%d: want 1..%d packets", ParamWindow, c.Window, 1<<22)
		}
	}
	if has(ParamSockBuf) {
		c.SockBuf = p.Int(ParamSockBuf)
	}
	if has(ParamGSO) {
		c.NoGSO = !p.Bool(ParamGSO)
	}
	return c.withDefaults(), nil
}

// Provider is the soft verbs provider. Its one device, soft0, is created
// on the first Open and closed with the last Context.
type Provider struct {
	cfg Config
	err error

	mu  sync.Mutex
	dev *device // guarded by mu; nil while no context is open
}

var _ ibv.Provider = (*Provider)(nil)

// New makes a provider with cfg (zero fields take their defaults). A bad
// cfg makes every Open fail with an error wrapping ibv.ErrInvalid.
func New(cfg Config) *Provider {
	return &Provider{cfg: cfg.withDefaults(), err: cfg.withDefaults().validate()}
}

// Name returns "soft".
func (p *Provider) Name() string { return "soft" }

// DeviceName is the name of the provider's device.
const DeviceName = "soft0"

// Devices lists soft0.
func (p *Provider) Devices() ([]ibv.DeviceAttr, error) {
	return []ibv.DeviceAttr{deviceAttr()}, nil
}

// Open opens soft0 ("" names it too): the first Open binds the device's
// socket and starts its goroutines; later ones share the device.
func (p *Provider) Open(name string) (ibv.Context, error) {
	if name != "" && name != DeviceName {
		return nil, fmt.Errorf("soft: device %q (have %s): %w", name, DeviceName, ibv.ErrNoDevice)
	}
	if p.err != nil {
		return nil, p.err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dev == nil {
		d, err := newDevice(p.cfg)
		if err != nil {
			return nil, fmt.Errorf("soft: open %s: %w", DeviceName, err)
		}
		p.dev = d
	}
	p.dev.refs++
	return &devContext{dev: p.dev, prov: p}, nil
}

// release drops a context's reference; the last one closes the device.
func (p *Provider) release(d *device) {
	p.mu.Lock()
	d.refs--
	last := d.refs == 0
	if last && p.dev == d {
		p.dev = nil
	}
	p.mu.Unlock()
	if last {
		d.close()
	}
}

func deviceAttr() ibv.DeviceAttr {
	return ibv.DeviceAttr{
		Name:            DeviceName,
		Provider:        "soft",
		NodeGUID:        0x02_00_5e_ff_fe_00_00_01,
		FWVersion:       "gompi-soft 1",
		VendorID:        0,
		VendorPartID:    0,
		HWVersion:       1,
		MaxMRSize:       1 << 40,
		MaxQP:           1 << 16,
		MaxQPWR:         1 << 15,
		MaxSGE:          32,
		MaxCQ:           1 << 16,
		MaxCQE:          1 << 22,
		MaxMR:           1 << 20,
		MaxPD:           1 << 16,
		MaxQPRdAtom:     16,
		MaxQPInitRdAtom: 16,
		MaxInline:       1024,
		PhysPortCnt:     1,
	}
}
