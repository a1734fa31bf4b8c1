package soft

import (
	"net/netip"
)

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
		largest, pkts := 0, 0
		for i := 0; i < n; i++ {
			data, seg, from, ok := d.rs.datagram(i)
			if !ok {
				d.ctr.bad.Add(1)
				continue
			}
			largest = max(largest, len(data))
			if len(data) == 0 {
				pkts++
				d.ctr.bad.Add(1)
				continue
			}
			if seg <= 0 {
				seg = len(data)
			}
			for off := 0; off < len(data); off += seg {
				pkts++
				d.inject(data[off:min(off+seg, len(data))], from)
			}
		}
		d.ctr.pktRecv.Add(uint64(pkts)) // one atomic per batch, not per packet
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

// inject applies the configured faults to one received packet, then
// processes it. The caller counts it in pktRecv.
func (d *device) inject(pkt []byte, from netip.AddrPort) {
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
	var p packet
	if _, err := p.decode(pkt); err != nil {
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
