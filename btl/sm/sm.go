// Package sm is gompi's shared-memory transport (btl component "sm") for
// ranks on one host, after Open MPI's vader.
//
// Open creates this process's segment in a memfd (no name in any file
// system; freed by the kernel when the last process that maps it is gone,
// however it ends), publishes where it is in the wire-up store, and returns
// one module. The first AddProc looks up the other ranks on this host in
// the store; a peer's segment is mapped on first use (the first message to
// or from it) through /proc/<pid>/fd/<fd>, which the kernel allows only to
// processes of the same user that may ptrace the owner; each mapping is
// checked against a random nonce from the store, so it is this job's.
//
// Data path (see docs/sm.md): a sender copies a fragment into its own
// segment and either enqueues its index in the receiver's FIFO (lock-free,
// multi-producer) or, after btl_sm_fbox_threshold fragments to that peer,
// writes it into a fast box (a ring per pair). Progress polls the fast boxes
// and the FIFO and hands every fragment to the Dispatcher with the sender's
// header/payload split, zero-copy from shared memory. A sender wakes a
// receiver with a futex only when the receiver announced it sleeps in
// Block. Put and Get are single copies with process_vm_writev/readv when
// the start-up probe allows them.
//
// Usage: open with btl.Component Open (needs Env.Store), AddProc per peer,
// then call Progress from the polling loop and Block when idle. Every
// error that concerns a peer wraps mpierr.ErrProcFailed (dead), btl.ErrClosed
// (closed) or mpierr.ErrProtocol (broken shared memory).
package sm

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/internal/sys"
)

// Name is the component name.
const Name = "sm"

// Parameters beyond the common btl_sm_* ones.
const (
	paramFboxThreshold = "btl_sm_fbox_threshold"
	paramFboxSize      = "btl_sm_fbox_size"
	paramFboxMax       = "btl_sm_fbox_max"
	paramSegmentSize   = "btl_sm_segment_size"
	paramSingleCopy    = "btl_sm_single_copy"
	paramSpin          = "btl_sm_spin"
	paramWireTimeout   = "btl_sm_wireup_timeout"
	paramGetSplit      = "btl_sm_get_split"
	paramGetChunk      = "btl_sm_get_chunk"
	paramHugeAfter     = "btl_sm_huge_after"
)

// have is everything the transport implements; put and get are dropped at
// Open when cross-memory attach is not permitted.
const have = btl.CapSend | btl.CapSendImmediate | btl.CapSendInPlace | btl.CapPut | btl.CapGet

// Open MPI's vader defaults with a single-copy mechanism (notes A.9),
// except the eager limit: 16 KiB of payload plus 64 bytes of room for the
// header (vader: 4k, header included). Messages up to it are copied in and
// out of shared fragments; larger ones go by rendezvous and one CMA read,
// a system call that costs a few microseconds on this project's machines.
// Where that call is slow, a 16 KiB limit won every figure at 12-16 KiB
// and changed none at 8 and 32 KiB (bench/ab.sh 6 against 8256, per mode:
// bw 12 KiB
// 3.7-4.3 -> 6.6-8.8 GB/s, 16 KiB 5.1-5.2 -> 7.6-8.3; bibw 12 KiB 6.7-6.8
// -> 10.0-14.6, 16 KiB 8.3-8.5 -> 10.1-13.2; latency 12 KiB 5.2-5.7 ->
// 2.1-2.5 us, 16 KiB 6.0-6.6 -> 2.8-3.3 (vader: 4.0 and 4.7 us). A 32 KiB
// limit (32832) gained at 32 KiB but lost bibw at 8-16 KiB. Where a single
// copy is cheap, Open lowers it to 8 KiB + 64 (fitEagerLimit).
var defaults = btl.Defaults{
	Limits: btl.Limits{
		EagerLimit:             16<<10 + 64,
		RndvEagerLimit:         32 << 10,
		MaxSendSize:            32 << 10,
		RDMAPipelineFragSize:   4 << 10,
		RDMAPipelineSendLength: 4 << 10,
		MinRDMAPipelineSize:    math.MaxInt32,
	},
	Caps:        have,
	Exclusivity: btl.ExclusivityHigh - 1,
}

// Ranking data (vader: latency 1 us, bandwidth 20000 Mb/s, 40000 with
// single copy).
const (
	latencyUS      = 1
	bandwidthMbps  = 20000
	bandwidthSCopy = 40000
)

// fifoSlots is the FIFO length of every segment: more than the fragments
// the peers of any realistic host can have in flight to one receiver
// before fast boxes take over.
const fifoSlots = 4096

func init() {
	btl.RegisterParams(Name, defaults)
	params.Register(params.Def{Name: paramFboxThreshold, Kind: params.Int, Default: "16",
		Help: "fragments sent to a peer through the FIFO before a fast box (per-pair ring) is set up for it"})
	params.Register(params.Def{Name: paramFboxSize, Kind: params.Size, Default: "16k",
		Help: "bytes of one fast box ring (power of two, 256 to 1m); fragments up to a quarter of it go inline"})
	params.Register(params.Def{Name: paramFboxMax, Kind: params.Int, Default: "32",
		Help: "most peers that may send to this process through a fast box (0 disables fast boxes)"})
	params.Register(params.Def{Name: paramSegmentSize, Kind: params.Size, Default: "4m",
		Help: "bytes of each process's shared segment: FIFO, fast boxes and fragment buffers"})
	params.Register(params.Def{Name: paramSingleCopy, Kind: params.String, Default: "auto",
		Help: "single-copy Put/Get: auto (cross-memory attach if permitted), cma (required), none"})
	params.Register(params.Def{Name: paramSpin, Kind: params.Duration, Default: "500us",
		Help: "how long Block polls shared memory before it sleeps on a futex (0 when oversubscribed unless set)"})
	params.Register(params.Def{Name: paramGetSplit, Kind: params.Size, Default: "32k",
		Help: "Gets of at least this many bytes are shared with the owner of the memory, which copies chunks too while it waits with nothing to do (0 disables; at least 32k; 0 when oversubscribed unless set)"})
	params.Register(params.Def{Name: paramGetChunk, Kind: params.Size, Default: "512k",
		Help: "largest chunk of a shared Get (at least 16k); a Get is cut into halves of at most this"})
	params.Register(params.Def{Name: paramHugeAfter, Kind: params.Int, Default: "4",
		Help: "registrations of a 2 MiB-aligned region of memory (under a send buffer of 16k or more) after which sm asks the kernel to back it with a huge page, in the background: cross-memory copies from it then pin one page instead of 512 (0 disables)"})
	params.Register(params.Def{Name: paramWireTimeout, Kind: params.Duration, Default: "30s",
		Help: "time allowed for the other ranks on this host to publish their segments"})
	btl.RegisterComponent(component{})
}

type component struct{}

func (component) Name() string { return Name }

// config is the resolved settings of one Open.
type config struct {
	limits        btl.Limits
	caps          btl.Caps
	exclusivity   int
	maxSend       int
	fboxThreshold int
	fboxSize      int
	fboxMax       int
	segmentSize   int
	singleCopy    string
	spin          time.Duration
	wireTimeout   time.Duration
	getSplit      int
	getChunk      int
	hugeAfter     int
}

func readConfig(env *btl.Env) (config, error) {
	p := env.Params
	l, caps, excl, err := btl.Settings(p, Name, have)
	if err != nil {
		return config{}, err
	}
	c := config{limits: l, caps: caps, exclusivity: excl,
		maxSend:       max(l.EagerLimit, l.MaxSendSize),
		fboxThreshold: p.Int(paramFboxThreshold),
		fboxSize:      p.Int(paramFboxSize),
		fboxMax:       p.Int(paramFboxMax),
		segmentSize:   p.Int(paramSegmentSize),
		singleCopy:    strings.ToLower(strings.TrimSpace(p.String(paramSingleCopy))),
		spin:          p.Duration(paramSpin),
		wireTimeout:   p.Duration(paramWireTimeout),
		getSplit:      p.Int(paramGetSplit),
		getChunk:      p.Int(paramGetChunk),
		hugeAfter:     p.Int(paramHugeAfter),
	}
	argErr := func(f string, a ...any) (config, error) { return c, mpierr.Errorf(mpierr.ErrArg, f, a...) }
	switch {
	case c.caps&btl.CapSend == 0:
		return argErr("btl_sm_flags must include send")
	case c.maxSend < 64 || c.maxSend > 1<<30:
		return argErr("btl_sm_eager_limit/max_send_size %d: want 64..1g", c.maxSend)
	case c.fboxSize < minFboxSize || c.fboxSize > maxFboxSize || c.fboxSize&(c.fboxSize-1) != 0:
		return argErr("%s=%d: want a power of two from %d to %d", paramFboxSize, c.fboxSize, minFboxSize, maxFboxSize)
	case c.fboxMax < 0 || c.fboxMax > maxLocal:
		return argErr("%s=%d: want 0..%d", paramFboxMax, c.fboxMax, maxLocal)
	case c.fboxThreshold < 0:
		return argErr("%s=%d: want >= 0", paramFboxThreshold, c.fboxThreshold)
	case c.segmentSize < 1<<20 || c.segmentSize > maxSegment || c.segmentSize%4096 != 0:
		return argErr("%s=%d: want a multiple of 4k from 1m to 2g", paramSegmentSize, c.segmentSize)
	case c.getSplit != 0 && (c.getSplit < minSplit || c.getSplit > 1<<40):
		return argErr("%s=%d: want 0 or 32k..1t", paramGetSplit, c.getSplit)
	case c.hugeAfter < 0:
		return argErr("%s=%d: want 0 (never) or more", paramHugeAfter, c.hugeAfter)
	case c.getChunk < minChunk || c.getChunk > 1<<30:
		return argErr("%s=%d: want 16k..1g", paramGetChunk, c.getChunk)
	case c.wireTimeout <= 0:
		return argErr("%s=%v: want a positive duration", paramWireTimeout, c.wireTimeout)
	}
	switch c.singleCopy {
	case "auto", "cma", "none":
	default:
		return argErr("%s=%q: want auto, cma or none", paramSingleCopy, c.singleCopy)
	}
	if c.spin < 0 {
		c.spin = 0
	}
	if _, src := p.Value(paramSpin); env.Oversubscribed && src == params.FromDefault {
		c.spin = 0
	}
	// A reader waiting for a helper's chunk while the helper waits for a
	// core only loses time.
	if _, src := p.Value(paramGetSplit); env.Oversubscribed && src == params.FromDefault {
		c.getSplit = 0
	}
	return c, nil
}

var (
	statusMu  sync.Mutex
	statusMsg = "not opened"
)

// Status describes what the last Open of this process decided: whether sm
// is usable and, if so, the single-copy mechanism (or why there is none).
// gompi-info and --verbose print it.
func Status() string {
	statusMu.Lock()
	defer statusMu.Unlock()
	return statusMsg
}

func setStatus(f string, a ...any) {
	statusMu.Lock()
	statusMsg = fmt.Sprintf(f, a...)
	statusMu.Unlock()
}

// addStatus appends "; " and a note to the status, under one hold of its
// lock.
func addStatus(f string, a ...any) {
	statusMu.Lock()
	statusMsg += "; " + fmt.Sprintf(f, a...)
	statusMu.Unlock()
}

// Open makes this process's sm module. Without a store (singleton or
// in-process job) or without another rank on this host sm is not usable:
// the error wraps mpierr.ErrNotSupported.
func (component) Open(env *btl.Env) ([]btl.Module, error) {
	if env.Store == nil {
		setStatus("not used: needs gorun's store")
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "sm: needs gorun's store (not available to singletons and in-process jobs)")
	}
	if env.LocalSize < 2 {
		setStatus("not used: no other rank on this host")
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "sm: no other rank on this host")
	}
	if env.LocalSize > maxLocal || env.LocalRank < 0 || env.LocalRank >= env.LocalSize {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "sm: local rank %d of %d (at most %d ranks per host)", env.LocalRank, env.LocalSize, maxLocal)
	}
	cfg, err := readConfig(env)
	if err != nil {
		return nil, err
	}
	cfg.caps, err = singleCopy(env, cfg)
	if err != nil {
		return nil, err
	}
	if cfg.caps&btl.CapGet != 0 {
		cfg = fitEagerLimit(env, cfg, cmaCost(16<<10))
	}
	m, err := newModule(env, cfg)
	if err != nil {
		setStatus("not used: %v", err)
		return nil, err
	}
	return []btl.Module{m}, nil
}

// singleCopy decides put/get: the caps Open starts with. AddProc probes
// every peer again and drops put/get if one refuses.
func singleCopy(env *btl.Env, cfg config) (btl.Caps, error) {
	caps := cfg.caps
	if cfg.caps&btl.CapRDMA == 0 || cfg.singleCopy == "none" {
		setStatus("single copy: none (%s=%s, btl_sm_flags=%v)", paramSingleCopy, cfg.singleCopy, cfg.caps)
		return caps &^ btl.CapRDMA, nil
	}
	err := sys.CMAPermitted(os.Getpid())
	if err == nil {
		err = yamaAllows()
	}
	if err != nil {
		if cfg.singleCopy == "cma" {
			setStatus("not used: %s=cma but %v", paramSingleCopy, err)
			return 0, fmt.Errorf("sm: %s=cma: %w", paramSingleCopy, err)
		}
		setStatus("single copy: none (%v)", err)
		env.Logf("sm: no single-copy put/get, pipelines copy through shared memory instead: %v", err)
		return caps &^ btl.CapRDMA, nil
	}
	setStatus("single copy: cma (process_vm_readv/writev)")
	return caps, nil
}

// The eager limit when a single copy is cheap: 8 KiB of payload plus 64
// bytes, so that 16 KiB messages go by one CMA read. Which limit wins
// depends on the cost of that system call: where a 16 KiB read cost a few
// microseconds, 16 KiB by copy in and out won every figure at 12-16 KiB
// (see defaults); where it cost 0.85 us (the mean of 20,000 reads of own
// memory; cmaCost reads 0.86-1.29 us at start-up) the 8 KiB limit won
// bidirectional bandwidth at 4-16 KiB (bibw 16 KiB 10.5 -> 13.1 GB/s, 4
// KiB 5.3 -> 5.7; bw 16 KiB unchanged, 4 KiB 5.5 -> 6.2; 7 alternated
// rounds of bench/ab.sh per mode), for 16 KiB latency 4.56 -> 5.15 us
// (vader: 4.9-5.2).
const (
	cheapEagerLimit = 8<<10 + 64
	// cheapCMA is the most a 16 KiB read of own memory may take for the
	// cheap limit: between the two guests' costs.
	cheapCMA = 1500 * time.Nanosecond
)

// fitEagerLimit lowers the default eager limit to cheapEagerLimit when a
// 16 KiB single copy costs at most cheapCMA (cost, from cmaCost). A limit
// set by the user is kept. Every process decides for itself: its peers
// read its fragment sizes from its segment's header.
func fitEagerLimit(env *btl.Env, cfg config, cost time.Duration) config {
	if _, src := env.Params.Value("btl_" + Name + "_eager_limit"); src != params.FromDefault {
		addStatus("eager limit %d (set)", cfg.limits.EagerLimit)
		return cfg
	}
	if cost <= 0 || cost > cheapCMA || cfg.limits.EagerLimit <= cheapEagerLimit {
		addStatus("eager limit %d (a 16 KiB read took %v)", cfg.limits.EagerLimit, cost)
		return cfg
	}
	cfg.limits.EagerLimit = cheapEagerLimit
	cfg.maxSend = max(cfg.limits.EagerLimit, cfg.limits.MaxSendSize)
	addStatus("eager limit %d (a 16 KiB read took %v, at most %v: 16 KiB messages by single copy)", cfg.limits.EagerLimit, cost, cheapCMA)
	return cfg
}

// yamaAllows reads kernel.yama.ptrace_scope: from 1 up, a process may not
// attach to its siblings, so cross-memory attach between ranks fails.
func yamaAllows() error {
	b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err != nil {
		return nil // no Yama
	}
	if s := strings.TrimSpace(string(b)); s != "0" {
		return mpierr.Errorf(mpierr.ErrNotSupported, "cross-memory attach between ranks denied: kernel.yama.ptrace_scope=%s (0 allows it)", s)
	}
	return nil
}

func randomNonce() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("sm: no randomness: " + err.Error())
	}
	return binary.LittleEndian.Uint64(b[:]) | 1
}
