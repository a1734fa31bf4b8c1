package soft

import (
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// Counters are a device's packet statistics since it was opened.
type Counters struct {
	PacketsSent      uint64 // packets handed to the socket
	PacketsReceived  uint64 // packets taken from the socket (before faults)
	BytesSent        uint64 // UDP payload bytes sent
	Retransmits      uint64 // request packets sent again (timeout, NAK, READ gap)
	Timeouts         uint64 // local ACK timeouts that led to a retransmission
	EarlyGoBacks     uint64 // go-backs without progress for the early delay, before the timeout
	SeqNAKsSent      uint64 // PSN sequence error NAKs sent by responders
	SeqNAKsReceived  uint64
	RNRNAKsSent      uint64
	RNRNAKsReceived  uint64
	ErrNAKsSent      uint64 // invalid request, remote access and remote operational NAKs
	Duplicates       uint64 // duplicate requests seen by responders
	OutOfSequence    uint64 // packets dropped by responders for a PSN gap
	ICRCErrors       uint64 // packets dropped for a bad ICRC
	BadPackets       uint64 // packets dropped as malformed, for an unknown QP or a wrong source
	DropsInjected    uint64
	DupsInjected     uint64
	ReordersInjected uint64
	CorruptsInjected uint64
	SendErrors       uint64 // datagrams the socket refused
}

type counters struct {
	pktSent, pktRecv, bytesSent, retrans, timeouts, early       atomic.Uint64
	seqNakTx, seqNakRx, rnrNakTx, rnrNakRx, errNakTx, dups, oos atomic.Uint64
	icrc, bad, dropInj, dupInj, reordInj, corruptInj, sendErr   atomic.Uint64
}

func (c *counters) snapshot() Counters {
	return Counters{
		PacketsSent: c.pktSent.Load(), PacketsReceived: c.pktRecv.Load(), BytesSent: c.bytesSent.Load(),
		Retransmits: c.retrans.Load(), Timeouts: c.timeouts.Load(), EarlyGoBacks: c.early.Load(),
		SeqNAKsSent: c.seqNakTx.Load(), SeqNAKsReceived: c.seqNakRx.Load(),
		RNRNAKsSent: c.rnrNakTx.Load(), RNRNAKsReceived: c.rnrNakRx.Load(), ErrNAKsSent: c.errNakTx.Load(),
		Duplicates: c.dups.Load(), OutOfSequence: c.oos.Load(),
		ICRCErrors: c.icrc.Load(), BadPackets: c.bad.Load(),
		DropsInjected: c.dropInj.Load(), DupsInjected: c.dupInj.Load(),
		ReordersInjected: c.reordInj.Load(), CorruptsInjected: c.corruptInj.Load(),
		SendErrors: c.sendErr.Load(),
	}
}

// CountersOf returns the counters of a soft context's device; ok is false
// for a context of another provider.
func CountersOf(c ibv.Context) (Counters, bool) {
	x, ok := c.(*devContext)
	if !ok {
		return Counters{}, false
	}
	return x.Counters(), true
}

// device is soft0 of one Provider: the socket, its receive goroutine, the
// transmit worker, and the tables of QPs and MRs.
type device struct {
	cfg   Config
	clock Clock
	addr  netip.Addr
	port  uint16
	gid   ibv.GID
	sock  *sock
	refs  int // guarded by Provider.mu

	qps      atomic.Pointer[map[uint32]*qp] // copy-on-write: read per packet
	tblMu    sync.Mutex                     // serialises writers of qps and mrs, and nextQPN, nextIOVA
	mrs      map[uint32]*mr                 // by key; guarded by mrMu
	mrMu     sync.RWMutex
	nextQPN  uint32
	nextIOVA uint64
	keyRand  *rand.Rand // guarded by tblMu

	ctr counters

	ncq    atomic.Int32  // live CQs
	passes atomic.Uint32 // progress passes, for the socket's share of them
	idle   atomic.Uint32 // pollers' looks at the socket in a row that found it empty

	atomicMu sync.Mutex // makes the responders' atomics atomic with each other

	// Transmit worker: QPs with more to send than their pumper's budget.
	workMu   sync.Mutex
	work     []*qp // guarded by workMu
	workWake chan struct{}

	// Deferred ACKs: QPs owing an ACK that waits for a carrier
	// (qp.queueAckLater). nAcks is len(acks), read without the lock by
	// every progress pass.
	ackMu    sync.Mutex
	acks     []*qp // guarded by ackMu
	nAcks    atomic.Int32
	ackTimer Timer
	ackArmed bool // guarded by ackMu
	// Lazy ACKs: QPs owing an ACK no one asked for (qp.queueAckLazy),
	// sent by lazyTimer only.
	lazy      []*qp // guarded by ackMu
	lazyTimer Timer
	lazyArmed bool // guarded by ackMu
	lazyBound time.Duration

	done chan struct{}
	wg   sync.WaitGroup

	// rxMu serialises packet processing (the receive goroutine and
	// helping pollers); the fields below it belong to its holder.
	rxMu     sync.Mutex
	rs       *rxState
	icrc     icrcScratch
	faults   bool
	rng      *rand.Rand // fault injection
	held     []byte     // a packet held back for reordering
	heldN    int
	heldFrom netip.AddrPort
	holding  bool
	dirty    []*qp     // QPs touched in this receive batch
	rxNow    time.Time // the clock when this receive batch arrived
	rxEpoch  uint64
}

var addrCounter atomic.Uint32

// pickLoopback binds the first free 127.x.y.z (not 127.0.0.1) of a
// sequence that starts from a hash of the pid and an in-process counter.
func pickLoopback(port, bufBytes int, noGSO bool) (*sock, netip.Addr, error) {
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d", os.Getpid(), addrCounter.Add(1))
	start := h.Sum32()
	var lastErr error
	for i := uint32(0); i < 4096; i++ {
		v := (start + i*2654435761) & 0xffffff
		a := netip.AddrFrom4([4]byte{127, byte(v >> 16), byte(v >> 8), byte(v)})
		if byte(v) == 0 || byte(v) == 255 || a == netip.AddrFrom4([4]byte{127, 0, 0, 1}) {
			continue
		}
		s, err := openSock(a, port, bufBytes, noGSO)
		if err == nil {
			return s, a, nil
		}
		lastErr = err
		if !errors.Is(err, syscall.EADDRINUSE) {
			return nil, a, err
		}
	}
	return nil, netip.Addr{}, fmt.Errorf("no free loopback address for port %d: %w", port, lastErr)
}

func newDevice(cfg Config) (*device, error) {
	d := &device{
		cfg:      cfg,
		clock:    cfg.Clock,
		port:     uint16(cfg.Port),
		mrs:      map[uint32]*mr{},
		workWake: make(chan struct{}, 1),
		done:     make(chan struct{}),
		keyRand:  rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(os.Getpid()))),
	}
	var err error
	if !cfg.Addr.IsValid() {
		d.sock, d.addr, err = pickLoopback(cfg.Port, cfg.SockBuf, cfg.NoGSO)
	} else {
		d.addr = cfg.Addr.Unmap()
		d.sock, err = openSock(d.addr, cfg.Port, cfg.SockBuf, cfg.NoGSO)
	}
	if err != nil {
		return nil, err
	}
	d.gid = ibv.GIDFromAddr(d.addr)
	empty := map[uint32]*qp{}
	d.qps.Store(&empty)
	d.nextQPN = 0x10 + d.keyRand.Uint32N(0x1000)
	d.nextIOVA = 0x7f00_0000_0000 + uint64(d.keyRand.Uint32N(1<<16))<<12
	seed := cfg.Seed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	d.rng = rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	d.faults = cfg.Drop > 0 || cfg.Dup > 0 || cfg.Reorder > 0 || cfg.Corrupt > 0
	bufSize, nbuf := 16384, rxBatch
	if d.sock.gro {
		bufSize, nbuf = 65536, 16
	}
	d.rs = newRxState(nbuf, bufSize)
	d.held = make([]byte, bufSize)
	d.ackTimer = d.clock.AfterFunc(time.Hour, d.onAckTimer)
	d.ackTimer.Stop()
	d.lazyBound = min(ackLazyBound, cfg.MinTimeout/4)
	d.lazyTimer = d.clock.AfterFunc(time.Hour, d.onLazyTimer)
	d.lazyTimer.Stop()
	d.wg.Add(2)
	go d.rxLoop()
	go d.txWorker()
	return d, nil
}

// close stops the goroutines and releases the socket.
func (d *device) close() {
	d.ackMu.Lock()
	d.ackTimer.Stop()
	d.ackArmed = true // no timer from now on
	d.lazyTimer.Stop()
	d.lazyArmed = true
	d.ackMu.Unlock()
	close(d.done)
	d.sock.close()
	d.wg.Wait()
	for _, q := range *d.qps.Load() { // QPs left undestroyed: their send sockets
		q.mu.Lock()
		q.closeTxLocked()
		q.mu.Unlock()
	}
}

func (d *device) lookupQP(qpn uint32) *qp { return (*d.qps.Load())[qpn] }

// addQP gives q a free QPN and enters it in the table.
func (d *device) addQP(q *qp) {
	d.tblMu.Lock()
	defer d.tblMu.Unlock()
	old := *d.qps.Load()
	for {
		n := d.nextQPN & psnMask
		d.nextQPN++
		if n < 2 {
			continue
		}
		if _, used := old[n]; !used {
			q.qpn = n
			break
		}
	}
	m := make(map[uint32]*qp, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[q.qpn] = q
	d.qps.Store(&m)
}

func (d *device) removeQP(q *qp) {
	d.tblMu.Lock()
	defer d.tblMu.Unlock()
	old := *d.qps.Load()
	m := make(map[uint32]*qp, len(old))
	for k, v := range old {
		if k != q.qpn {
			m[k] = v
		}
	}
	d.qps.Store(&m)
}

// addMR gives m a synthetic address and a random key.
func (d *device) addMR(m *mr) {
	d.tblMu.Lock()
	m.addr = d.nextIOVA
	d.nextIOVA += (uint64(len(m.buf))+4095)&^4095 + 4096 // a guard page between regions
	d.tblMu.Unlock()
	d.mrMu.Lock()
	for {
		d.tblMu.Lock()
		k := d.keyRand.Uint32()
		d.tblMu.Unlock()
		if _, used := d.mrs[k]; k != 0 && !used {
			m.lkey, m.rkey = k, k
			d.mrs[k] = m
			break
		}
	}
	d.mrMu.Unlock()
}

func (d *device) removeMR(m *mr) {
	d.mrMu.Lock()
	delete(d.mrs, m.lkey)
	d.mrMu.Unlock()
}

func (d *device) lookupMR(key uint32) *mr {
	d.mrMu.RLock()
	m := d.mrs[key]
	d.mrMu.RUnlock()
	return m
}

// mrCovering finds a region of pd that holds [addr, addr+n) (inline data
// names memory by address only).
func (d *device) mrCovering(p *pd, addr uint64, n int) *mr {
	d.mrMu.RLock()
	defer d.mrMu.RUnlock()
	for _, m := range d.mrs {
		if m.pd == p && addr >= m.addr && addr-m.addr <= uint64(len(m.buf)) && uint64(n) <= uint64(len(m.buf))-(addr-m.addr) {
			return m
		}
	}
	return nil
}

// schedule hands q to the transmit worker.
func (d *device) schedule(q *qp) {
	d.workMu.Lock()
	if !q.queued {
		q.queued = true
		d.work = append(d.work, q)
	}
	d.workMu.Unlock()
	select {
	case d.workWake <- struct{}{}:
	default:
	}
}

// txWorker pumps QPs whose senders left work behind (large messages,
// READ responses, retransmissions).
func (d *device) txWorker() {
	defer d.wg.Done()
	var batch []*qp
	for {
		select {
		case <-d.done:
			return
		case <-d.workWake:
		}
		for {
			d.workMu.Lock()
			batch = append(batch[:0], d.work...)
			clear(d.work)
			d.work = d.work[:0]
			for _, q := range batch {
				q.queued = false
			}
			d.workMu.Unlock()
			if len(batch) == 0 {
				break
			}
			for _, q := range batch {
				q.pump(1 << 30)
			}
			clear(batch)
		}
	}
}

func isClosed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// progress is the help of a poller that found its CQ empty: the ACKs
// deferred since its last pass, one pass over the socket (if no one else
// is receiving) and one QP of the transmit worker's list.
func (d *device) progress() {
	if d.nAcks.Load() > 0 {
		d.flushAcks()
	}
	// A look at the socket costs a system call, also when it finds
	// nothing: pollers take one look per round of the device's CQs, so
	// that a user polling each of its CQs in turn makes one per round, as
	// a read per pass of a socket transport does. After idleLooks empty
	// looks in a row they look once per idleEvery rounds: a poller that
	// spins in system calls on a busy host loses its processor to the
	// other runnable tasks far more often than one that spins in user
	// space (8 B ping-pongs of hundreds of microseconds instead of tens,
	// as tcp's), and a peer that has not answered for that long is
	// likely descheduled anyway.
	n := max(1, uint32(d.ncq.Load()))
	if d.idle.Load() >= idleLooks {
		n *= idleEvery
	}
	if d.passes.Add(1)%n == 0 && d.rxMu.TryLock() {
		if d.drain(1) {
			d.idle.Store(0)
		} else {
			d.idle.Add(1)
		}
		d.rxMu.Unlock()
	}
	d.workMu.Lock()
	var q *qp
	if len(d.work) > 0 {
		q = d.work[0]
		copy(d.work, d.work[1:])
		d.work[len(d.work)-1] = nil
		d.work = d.work[:len(d.work)-1]
		q.queued = false
	}
	d.workMu.Unlock()
	if q != nil {
		q.pump(txBatchPkts)
	}
}
