package soft

import (
	"bytes"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// readReplay drives the two halves of a large RDMA READ's data path
// without the socket: the responder building its response packets
// (buildResponse: headers, ICRC) and the requester taking them in
// (inject: ICRC check, decode, placement), on packets the responder's QP
// built. The responder's device never sees the READ request (its receive
// lock is held), so the only response packets the requester gets are the
// replayed ones; the QPs have no retransmission timer (timeout 0).
type readReplay struct {
	a, b *end           // requester, responder
	from netip.AddrPort // the responder QP's source address
	size int
	pkts [][]byte // the packets of the current READ, contiguous
}

func newReadReplay(t testing.TB, size int) *readReplay {
	o := defaultOpts()
	o.bufSize = size
	o.timeout = 0
	a, b := newPair(t, Config{}, Config{}, o)
	for i := range b.buf {
		b.buf[i] = byte(i*7 + i>>12)
	}
	bq := b.qp.(*qp)
	bq.mu.Lock()
	from := netip.AddrPortFrom(bq.flow.src, bq.flow.sport)
	bq.mu.Unlock()
	bd := bq.dev
	bd.rxMu.Lock()
	t.Cleanup(func() {
		// The READ requests queued at the responder go nowhere: its QP
		// is gone before its receive goroutine may run again.
		require.NoError(t, b.qp.Destroy())
		b.qp = nil
		bd.rxMu.Unlock()
	})
	return &readReplay{a: a, b: b, from: from, size: size}
}

// post posts the READ on the requester and has the responder's QP build
// its response packets into r.pkts (cgReadBuild), with the PSNs the
// request got.
func (r *readReplay) post(t testing.TB) {
	aq := r.a.qp.(*qp)
	aq.mu.Lock()
	psn := aq.nextPSN
	aq.mu.Unlock()
	clear(r.a.buf)
	_, err := r.a.qp.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(r.a.mr, 0, r.size)}, RemoteAddr: r.b.mr.Addr(), RKey: r.b.mr.RKey()}})
	require.NoError(t, err)
	n := 0 // packets built; their buffers are reused from the last READ
	bq := r.b.qp.(*qp)
	bq.mu.Lock()
	rr := readResp{psn: psn, npkts: readPkts(r.size, bq.mtu), buf: r.b.buf[:r.size]}
	for rr.next < rr.npkts {
		bq.tx.reset()
		cgReadBuild(bq, &rr)
		for i := range bq.tx.pkts {
			if n == len(r.pkts) {
				r.pkts = append(r.pkts, nil)
			}
			pkt := r.pkts[n][:0]
			for _, part := range bq.tx.packetParts(i) {
				pkt = append(pkt, part...)
			}
			r.pkts[n] = pkt
			n++
		}
	}
	r.pkts = r.pkts[:n]
	bq.tx.reset()
	bq.mu.Unlock()
}

// cgReadBuild builds a batch of READ response packets, as the responder's
// pump does before handing them to the socket.
//
//go:noinline
func cgReadBuild(q *qp, rr *readResp) {
	for rr.next < rr.npkts && !q.tx.full() {
		q.buildResponse(rr)
	}
}

// cgReadInput hands the requester's device the response packets in
// receive batches of 16, as its receive goroutine does with a recvmmsg
// batch.
//
//go:noinline
func cgReadInput(d *device, pkts [][]byte, from netip.AddrPort) {
	d.rxMu.Lock()
	for i, p := range pkts {
		d.inject(p, from)
		if i%16 == 15 || i == len(pkts)-1 {
			d.flushDirty()
		}
	}
	d.rxMu.Unlock()
}

// finish checks that the READ completed with the responder's bytes.
func (r *readReplay) finish(t testing.TB) {
	wc := poll(t, r.a.scq, 1, 10*time.Second)[0]
	require.Equal(t, ibv.WCSuccess, wc.Status)
	if !bytes.Equal(r.a.buf, r.b.buf[:r.size]) {
		t.Fatal("READ destination differs from the source")
	}
}

// TestReadReplay checks the harness: a READ whose responses are replayed
// completes with the responder's bytes, and a replayed response with a
// bad ICRC is dropped, counted, and overwritten by the good one.
func TestReadReplay(t *testing.T) {
	r := newReadReplay(t, 1<<20)
	ad := r.a.qp.(*qp).dev
	for range 2 {
		r.post(t)
		cgReadInput(ad, r.pkts, r.from)
		r.finish(t)
	}
	r.post(t)
	bad := make([][]byte, 0, len(r.pkts)+1)
	for i, p := range r.pkts {
		if i == 5 {
			c := append([]byte(nil), p...)
			c[len(c)/2] ^= 0x10
			bad = append(bad, c)
		}
		bad = append(bad, p)
	}
	before := ad.ctr.icrc.Load()
	cgReadInput(ad, bad, r.from)
	r.finish(t)
	require.Equal(t, before+1, ad.ctr.icrc.Load())
}

// TestCGReadPath is the harness callgrind runs (CG_READS=n READs of 4
// MiB, 1024 packets each; unset: skipped): the responder's QP building
// each READ's response packets and the requester's device taking them in.
// Counted with
//
//	go test -c -o /tmp/soft.test ./btl/verbs/ibv/soft
//	CG_READS=12 GOMAXPROCS=1 GODEBUG=asyncpreemptoff=1 valgrind --tool=callgrind \
//	  --callgrind-out-file=/tmp/cg.out /tmp/soft.test -test.run TestCGReadPath
//	callgrind_annotate --auto=no --threshold=100 /tmp/cg.out
//
// summing the self cost of the soft package's functions (this file's
// excluded), hash/crc32, runtime.memmove (which includes this harness's
// copy of each packet), map lookups and sync, over 12*1024 packets. Self
// costs, not a collection toggled on a function: callgrind loses track
// of a toggled function when the Go scheduler switches goroutines inside
// it.
func TestCGReadPath(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CG_READS"))
	if n == 0 {
		t.Skip("CG_READS not set")
	}
	r := newReadReplay(t, 4<<20)
	ad := r.a.qp.(*qp).dev
	for range n {
		r.post(t)
		cgReadInput(ad, r.pkts, r.from)
		r.finish(t)
	}
}

// BenchmarkReadPath replays 4 MiB READs (1024 packets each): ns/pkt is
// the requester's taking in of one response packet (cgReadInput), ns/op
// the whole READ with the responder's building of its packets and this
// harness's copies of them.
func BenchmarkReadPath(b *testing.B) {
	r := newReadReplay(b, 4<<20)
	ad := r.a.qp.(*qp).dev
	b.Run("part=input", func(b *testing.B) {
		b.SetBytes(int64(r.size))
		var d time.Duration
		for b.Loop() {
			r.post(b)
			t0 := time.Now()
			cgReadInput(ad, r.pkts, r.from)
			d += time.Since(t0)
			r.finish(b)
		}
		b.ReportMetric(float64(d.Nanoseconds())/float64(b.N*len(r.pkts)), "ns/pkt")
	})
}
