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

// Pollers look at the socket once per round of CQs until idleLooks looks
// in a row found nothing, then once per idleEvery rounds until one finds
// something.
const (
	idleLooks = 64
	idleEvery = 8
)

// rxBatch is how many datagrams one recvmmsg takes at most.
const rxBatch = 32

// rxBatchBytes bounds the bytes one recvmmsg asks for, by the size of the
// largest datagram of the previous batch: the kernel writes the batch
// into the buffers, and the ICRC check and the copy into registered
// memory then read it, which finds it in the core's L2 cache only if the
// batch is well below the cache's size (a GRO batch of 64 KiB datagrams
// would otherwise be as large as the L2).
const rxBatchBytes = 256 << 10

// rxLimit is how many datagrams the next recvmmsg offers to take, after
// one that took n of limit with the largest datagram of largest bytes: a
// call that took all it offered may have left more, so the next offers
// twice as many; one that emptied the socket offers as many as it took
// (the kernel tries one more datagram than it finds, which costs a
// second look at the queue per call); never more than rxBatchBytes of
// datagrams of that size, nor more than most.
func rxLimit(n, limit, largest, most int) int {
	if n == limit {
		limit *= 2
	} else {
		limit = n
	}
	return max(1, min(most, rxBatchBytes/max(largest, 1), limit))
}

// rxLoop waits for the socket to be readable and processes what arrived.
// Pollers of an empty CQ do the same work (progress), so that a user
// spinning on Poll with every P busy does not wait for this goroutine to
// be scheduled.
func (d *device) rxLoop() {
	defer d.wg.Done()
	d.sock.readLoop(func() bool {
		d.rxMu.Lock()
		got := d.drain(8)
		d.rxMu.Unlock()
		return got
	})
}

// drain receives and processes up to batches batches of datagrams
// without blocking and reports whether any arrived. Called with rxMu held.
func (d *device) drain(batches int) bool {
	got := false
	for range batches {
		n, err := d.sock.recv(d.rs, false)
		if err != nil || n == 0 {
			break
		}
		got = true
		d.rxNow = d.clock.Now() // one clock read per batch, not per packet
		more := n == d.rs.limit // a short batch emptied the socket
		largest := 0
		for i := 0; i < n; i++ {
			data, seg, from, ok := d.rs.datagram(i)
			if !ok {
				d.ctr.bad.Add(1)
				continue
			}
			largest = max(largest, len(data))
			if len(data) == 0 {
				d.ctr.pktRecv.Add(1)
				d.ctr.bad.Add(1)
				continue
			}
			if seg <= 0 {
				seg = len(data)
			}
			for off := 0; off < len(data); off += seg {
				d.inject(data[off:min(off+seg, len(data))], from)
			}
		}
		d.flushDirty()
		d.rs.limit = rxLimit(n, d.rs.limit, largest, len(d.rs.msgs))
		if !more {
			break
		}
	}
	if d.holding {
		d.releaseHeld()
		d.flushDirty()
	}
	return got
}

// ackDeferBound is the longest a deferred ACK waits for a carrier when
// no one polls the device: well below the least local ACK timeout
// (Config.MinTimeout), so that deferring never costs a retransmission.
const ackDeferBound = 100 * time.Microsecond

// deferAck notes that q owes an ACK that waits for a carrier: q's next
// request packets, the next progress pass, or the timer. Called with
// q.mu held.
func (d *device) deferAck(q *qp) {
	d.ackMu.Lock()
	if !q.ackQueued {
		q.ackQueued = true
		d.acks = append(d.acks, q)
		d.nAcks.Store(int32(len(d.acks)))
	}
	if !d.ackArmed {
		d.ackArmed = true
		d.ackTimer.Reset(ackDeferBound)
	}
	d.ackMu.Unlock()
}

// flushAcks sends the deferred ACKs still owed.
func (d *device) flushAcks() {
	var buf [8]*qp
	for d.nAcks.Load() > 0 {
		d.ackMu.Lock()
		n := copy(buf[:], d.acks)
		for _, q := range buf[:n] {
			q.ackQueued = false
		}
		rest := copy(d.acks, d.acks[n:])
		clear(d.acks[rest:])
		d.acks = d.acks[:rest]
		d.nAcks.Store(int32(rest))
		d.ackMu.Unlock()
		for i, q := range buf[:n] {
			q.sendAckNow(false)
			buf[i] = nil
		}
	}
}

// ackLazyBound is the longest an ACK no one asked for waits (at most a
// quarter of Config.MinTimeout, so that the requester's early go-back
// never fires for want of it).
const ackLazyBound = 250 * time.Microsecond

// deferLazy notes that q owes a lazy ACK (qp.queueAckLazy), due within
// wait, and arms the lazy timer if it is not. Called with q.mu held.
func (d *device) deferLazy(q *qp, wait time.Duration) {
	d.ackMu.Lock()
	if !q.lazyQueued {
		q.lazyQueued = true
		d.lazy = append(d.lazy, q)
	}
	if !d.lazyArmed {
		d.lazyArmed = true
		d.lazyTimer.Reset(wait)
	}
	d.ackMu.Unlock()
}

// onLazyTimer sends the lazy ACKs that have waited for most of the lazy
// bound; the younger ones wait for a later pass (in a ping-pong the
// replies carry them before: ackLazyMax).
func (d *device) onLazyTimer() {
	var buf [8]*qp
	d.ackMu.Lock()
	if isClosed(d.done) {
		d.ackMu.Unlock()
		return
	}
	d.lazyArmed = false
	todo := len(d.lazy) // the QPs put back below wait for the next pass
	now := d.clock.Now()
	for todo > 0 {
		n := copy(buf[:min(todo, len(buf))], d.lazy)
		todo -= n
		for _, q := range buf[:n] {
			q.lazyQueued = false
		}
		rest := copy(d.lazy, d.lazy[n:])
		clear(d.lazy[rest:])
		d.lazy = d.lazy[:rest]
		d.ackMu.Unlock()
		for i, q := range buf[:n] {
			q.mu.Lock()
			owed := q.r.ctl && q.r.ackLazy
			age := now.Sub(q.lazySince)
			if owed && age < d.lazyBound*3/4 {
				d.deferLazy(q, d.lazyBound-age)
				owed = false
			}
			q.mu.Unlock()
			if owed {
				q.sendAckNow(true)
			}
			buf[i] = nil
		}
		d.ackMu.Lock()
	}
	d.ackMu.Unlock()
}

// onAckTimer sends the ACKs that no carrier took within ackDeferBound.
func (d *device) onAckTimer() {
	d.ackMu.Lock()
	closed := d.ackArmed && isClosed(d.done)
	if !closed {
		d.ackArmed = false
	}
	d.ackMu.Unlock()
	if !closed {
		d.flushAcks()
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

// inject applies the configured faults to one received packet, then
// processes it.
func (d *device) inject(pkt []byte, from netip.AddrPort) {
	d.ctr.pktRecv.Add(1)
	if !d.faults {
		d.input(pkt, from)
		return
	}
	c := &d.cfg
	if c.Drop > 0 && d.rng.Float64() < c.Drop {
		d.ctr.dropInj.Add(1)
		return
	}
	if c.Corrupt > 0 && len(pkt) > 0 && d.rng.Float64() < c.Corrupt {
		d.ctr.corruptInj.Add(1)
		i := d.rng.IntN(len(pkt))
		pkt[i] ^= 1 << d.rng.IntN(8)
	}
	if !d.holding && c.Reorder > 0 && len(pkt) <= len(d.held) && d.rng.Float64() < c.Reorder {
		d.ctr.reordInj.Add(1)
		d.heldN = copy(d.held, pkt)
		d.heldFrom = from
		d.holding = true
		return
	}
	d.input(pkt, from)
	if c.Dup > 0 && d.rng.Float64() < c.Dup {
		d.ctr.dupInj.Add(1)
		d.input(pkt, from)
	}
	d.releaseHeld()
}

func (d *device) releaseHeld() {
	if d.holding {
		d.holding = false
		d.input(d.held[:d.heldN], d.heldFrom)
	}
}

// input decodes and checks one packet and hands it to its QP.
func (d *device) input(pkt []byte, from netip.AddrPort) {
	wireSync()
	d.input1(pkt, from)
	wireSync()
}

func (d *device) input1(pkt []byte, from netip.AddrPort) {
	f := flow{src: from.Addr(), dst: d.addr, sport: from.Port(), dport: d.port}
	if err := d.icrc.check(&f, pkt); err != nil {
		if err == errICRC {
			d.ctr.icrc.Add(1)
		} else {
			d.ctr.bad.Add(1)
		}
		return
	}
	p, _, err := decodePacket(pkt)
	if err != nil {
		d.ctr.bad.Add(1)
		return
	}
	if p.bth.pkey != defaultPKey {
		d.ctr.bad.Add(1)
		return
	}
	q := d.lookupQP(p.bth.destQP)
	if q == nil {
		d.ctr.bad.Add(1)
		return
	}
	q.mu.Lock()
	if q.destroyed || !q.fromPeer(from) {
		q.mu.Unlock()
		d.ctr.bad.Add(1)
		return
	}
	if p.flags&(fReadResp|fAckClass) != 0 {
		q.requesterInput(&p)
	} else {
		q.responderInput(&p)
	}
	q.mu.Unlock()
	if q.rxEpoch != d.rxEpoch+1 {
		q.rxEpoch = d.rxEpoch + 1
		d.dirty = append(d.dirty, q)
	}
}

// flushDirty sends what the batch's packets made the touched QPs owe:
// their coalesced ACKs, READ responses and requests the window let go.
func (d *device) flushDirty() {
	for _, q := range d.dirty {
		q.pump(rxPumpBudget)
	}
	clear(d.dirty)
	d.dirty = d.dirty[:0]
	d.rxEpoch++
}

// rxPumpBudget is how many packets the receive goroutine sends for one QP
// before it hands the rest to the transmit worker.
const rxPumpBudget = 64
