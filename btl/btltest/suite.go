package btltest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// Peer is one world rank of a test job.
type Peer struct {
	Module   btl.Module
	Dispatch *btl.Dispatcher // the Dispatcher of the Env the module was opened with
	// Kill, if set, ends the module as a crash of its process would: no
	// goodbye to the peers. The failure tests are skipped without it.
	Kill func()
	// WouldBlock, if set, makes the module's next n Send, SendAlloc, Put
	// and Get calls refuse with ErrWouldBlock (its queues full), n < 0
	// every call until WouldBlock(0). The WouldBlock test is skipped
	// without it.
	WouldBlock func(n int)
}

// The tags the suite registers.
const (
	TagData   btl.Tag = 0x41
	TagMarker btl.Tag = 0x42
	TagCheck  btl.Tag = 0x43 // PutVisible's: its handler looks at the registered memory
)

// Timeout bounds every wait of the suite.
var Timeout = 30 * time.Second

// Run runs the conformance suite. mk builds n modules, one per world rank
// 0..n-1, able to reach one another; it is called once per subtest and
// must arrange their Close with t.Cleanup (the suite may Close or Kill some
// of them first, so Close must tolerate both).
//
// The subtests check: per-endpoint order and payload bytes of many
// fragments of random sizes up to MaxSendSize between 3 ranks; the exact
// hdr/data split; SendImmediate delivers or refuses with ErrWouldBlock (and
// then nothing arrives) and keeps no reference to its buffers;
// Alloc/SendAlloc/Free; exactly-once, per-sender-ordered delivery from 8
// concurrent goroutines; Put and Get (as the caps allow) of 0 B to 16 MiB at
// offsets, leaving the bytes outside the range untouched; undecodable
// handles and out-of-range offsets fail with ErrBadHandle and write nothing;
// after Close every operation fails with ErrClosed; a killed peer is
// reported with PeerFailed (an error wrapping mpierr.ErrProcFailed) once,
// sends in flight to it complete, later ones fail, and other peers are
// unaffected. Flush completes at once on an endpoint where nothing was
// posted, and otherwise only after every Send, SendAlloc, Put and Get
// posted before it completed, once. A fragment sent after a Put completed
// (its completion, or a Flush's) finds the Put's data in the peer's
// memory when its handler runs. An operation refused with ErrWouldBlock
// (Peer.WouldBlock) delivers and writes nothing and calls no completion.
// Every wait is bounded by Timeout; the suite retries operations refused
// with ErrWouldBlock.
//
// The Polled subtests repeat some of these while a goroutine per rank
// calls Progress in a loop, for modules that implement btl.Poller.
func Run(t *testing.T, mk func(t *testing.T, n int) []Peer) {
	t.Run("Ordered", func(t *testing.T) { testOrdered(t, mk) })
	t.Run("HdrDataSplit", func(t *testing.T) { testSplit(t, mk) })
	t.Run("SendImmediate", func(t *testing.T) { testSendImmediate(t, mk) })
	t.Run("Alloc", func(t *testing.T) { testAlloc(t, mk) })
	t.Run("ConcurrentSenders", func(t *testing.T) { testConcurrent(t, mk) })
	t.Run("PutGet", func(t *testing.T) { testPutGet(t, mk) })
	t.Run("BadHandle", func(t *testing.T) { testBadHandle(t, mk) })
	t.Run("Close", func(t *testing.T) { testClose(t, mk) })
	t.Run("PeerKilled", func(t *testing.T) { testPeerKilled(t, mk) })
	t.Run("PeerKilledBeforeConnect", func(t *testing.T) { testKilledBeforeConnect(t, mk) })
	t.Run("FlushIdle", func(t *testing.T) { testFlushIdle(t, mk) })
	t.Run("Flush", func(t *testing.T) { testFlush(t, mk) })
	t.Run("PutVisible", func(t *testing.T) { testPutVisible(t, mk) })
	t.Run("WouldBlock", func(t *testing.T) { testWouldBlock(t, mk) })
	t.Run("Polled", func(t *testing.T) {
		pmk := polled(mk)
		t.Run("Ordered", func(t *testing.T) { testOrdered(t, pmk) })
		t.Run("ConcurrentSenders", func(t *testing.T) { testConcurrent(t, pmk) })
		t.Run("PutGet", func(t *testing.T) { testPutGet(t, pmk) })
		t.Run("PeerKilled", func(t *testing.T) { testPeerKilled(t, pmk) })
		t.Run("Flush", func(t *testing.T) { testFlush(t, pmk) })
		t.Run("PutVisible", func(t *testing.T) { testPutVisible(t, pmk) })
	})
}

// polled wraps mk so that, for every module that is a btl.Poller, a
// goroutine calls Progress in a loop (as a PML spinning in a wait does)
// while the module's own goroutines deliver too; Block is called now and
// then. The subtests then check that polling changes nothing a user sees:
// bytes, order, exactly-once delivery, failure reports. Modules that are
// not Pollers run as in the plain subtests.
func polled(mk func(*testing.T, int) []Peer) func(*testing.T, int) []Peer {
	return func(t *testing.T, n int) []Peer {
		peers := mk(t, n)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, p := range peers {
			pl, ok := p.Module.(btl.Poller)
			if !ok {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				idle := 0
				for {
					select {
					case <-stop:
						return
					default:
					}
					if pl.Progress() > 0 {
						idle = 0
						continue
					}
					if idle++; idle%4096 == 0 {
						pl.Block(stop)
					} else {
						runtime.Gosched()
					}
				}
			}()
		}
		t.Cleanup(func() { close(stop); wg.Wait() }) // before mk's cleanups close the modules
		return peers
	}
}

// pattern is the source of every payload: data for (sender, seq, size) is
// pattern[patOff(sender, seq):][:size].
var pattern = func() []byte {
	r := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, 16<<20+8192)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b
}()

func patOff(sender, seq int) int { return (sender*7919 + seq*104729) % 8192 }

func payload(sender, seq, size int) []byte {
	o := patOff(sender, seq)
	return pattern[o : o+size : o+size]
}

// frag is a received fragment (copied).
type frag struct {
	from int
	tag  btl.Tag
	hdr  []byte
	data []byte
}

// inbox collects what one rank receives.
type inbox struct {
	rank int
	mu   sync.Mutex
	got  []frag        // guarded by mu
	note chan struct{} // cap 1
	bad  []string      // guarded by mu: contract violations seen by the handler
}

func (b *inbox) handler(tag btl.Tag) btl.Handler {
	return func(ep btl.Endpoint, hdr, data []byte) {
		f := frag{from: ep.Peer(), tag: tag, hdr: bytes.Clone(hdr), data: bytes.Clone(data)}
		b.mu.Lock()
		if ep.Peer() == b.rank {
			b.bad = append(b.bad, fmt.Sprintf("fragment with endpoint of own rank %d", b.rank))
		}
		b.got = append(b.got, f)
		b.mu.Unlock()
		select {
		case b.note <- struct{}{}:
		default:
		}
	}
}

// wait waits until cond holds for the fragments received so far and
// returns a snapshot of them.
func (b *inbox) wait(t testing.TB, what string, cond func([]frag) bool) []frag {
	t.Helper()
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for {
		b.mu.Lock()
		got, bad := b.got, b.bad
		ok := cond(got)
		b.mu.Unlock()
		require.Empty(t, bad, "rank %d", b.rank)
		if ok {
			return got
		}
		select {
		case <-b.note:
		case <-timer.C:
			t.Fatalf("rank %d: timed out after %v waiting for %s (received %d fragments)", b.rank, Timeout, what, len(got))
		}
	}
}

// markers counts the marker fragments from peer in fs.
func markers(fs []frag, from int) int {
	n := 0
	for _, f := range fs {
		if f.tag == TagMarker && f.from == from {
			n++
		}
	}
	return n
}

func dataFrom(fs []frag, from int) []frag {
	var out []frag
	for _, f := range fs {
		if f.tag == TagData && f.from == from {
			out = append(out, f)
		}
	}
	return out
}

type failure struct {
	peer int
	err  error
}

// job is the suite's view of the n ranks of one subtest.
type job struct {
	t     *testing.T
	peers []Peer
	in    []*inbox
	fails []chan failure
}

func start(t *testing.T, mk func(*testing.T, int) []Peer, n int) *job {
	t.Helper()
	peers := mk(t, n)
	require.Len(t, peers, n, "mk returned the wrong number of peers")
	j := &job{t: t, peers: peers}
	for i, p := range peers {
		require.NotNil(t, p.Module, "rank %d", i)
		require.NotNil(t, p.Dispatch, "rank %d", i)
		in := &inbox{rank: i, note: make(chan struct{}, 1)}
		p.Dispatch.Register(TagData, in.handler(TagData))
		p.Dispatch.Register(TagMarker, in.handler(TagMarker))
		fc := make(chan failure, 1024)
		p.Dispatch.OnPeerFailed(func(peer int, err error) {
			select {
			case fc <- failure{peer, err}:
			default:
			}
		})
		j.in = append(j.in, in)
		j.fails = append(j.fails, fc)
	}
	return j
}

func (j *job) ep(from, to int) btl.Endpoint {
	j.t.Helper()
	ep, err := j.peers[from].Module.AddProc(to)
	require.NoError(j.t, err, "rank %d AddProc(%d)", from, to)
	require.Equal(j.t, to, ep.Peer())
	again, err := j.peers[from].Module.AddProc(to)
	require.NoError(j.t, err)
	require.True(j.t, ep == again, "AddProc(%d) returned a different endpoint the second time", to)
	return ep
}

// marker sends a marker fragment from → to and waits for it: everything
// sent before it on that endpoint has then arrived.
func (j *job) marker(from, to int) {
	j.t.Helper()
	var c completions
	before := 0
	j.in[to].mu.Lock()
	before = markers(j.in[to].got, from)
	j.in[to].mu.Unlock()
	require.NoError(j.t, c.send(j.ep(from, to), TagMarker, []byte("mark"), nil))
	j.in[to].wait(j.t, fmt.Sprintf("marker from rank %d", from), func(fs []frag) bool { return markers(fs, from) > before })
	c.wait(j.t)
}

func (j *job) limit() int { return j.peers[0].Module.Limits().MaxSendSize }

// completions tracks the callbacks of asynchronous operations.
type completions struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error // guarded by mu
	n    atomic.Int64
}

// cb returns a completion for one operation and finish, to call instead
// when the operation completed or failed during the call.
func (c *completions) cb() (btl.Completion, func()) {
	c.wg.Add(1)
	c.n.Add(1)
	var once atomic.Bool
	done := func(err error) {
		if !once.CompareAndSwap(false, true) {
			c.record(errors.New("completion called twice (or after the operation returned done/error)"))
			return
		}
		if err != nil {
			c.record(err)
		}
		c.n.Add(-1)
		c.wg.Done()
	}
	return done, func() { done(nil) }
}

func (c *completions) record(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err)
	c.mu.Unlock()
}

func (c *completions) send(ep btl.Endpoint, tag btl.Tag, hdr, data []byte) error {
	return c.post(ep, func(cb btl.Completion) (bool, error) { return ep.Send(tag, hdr, data, cb) })
}

// post starts one tracked operation with op, again while it refuses with
// ErrWouldBlock (polling the module in between, which frees its queues),
// for at most Timeout.
func (c *completions) post(ep btl.Endpoint, op func(btl.Completion) (bool, error)) error {
	cb, finish := c.cb()
	done, err := retry(ep, func() (bool, error) { return op(cb) })
	if done || err != nil {
		finish()
	}
	return err
}

// retry calls op until it does not refuse with ErrWouldBlock or Timeout
// passed, polling ep's module (when it is a btl.Poller) between calls.
func retry(ep btl.Endpoint, op func() (bool, error)) (bool, error) {
	var deadline time.Time
	for {
		done, err := op()
		if !errors.Is(err, btl.ErrWouldBlock) {
			return done, err
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(Timeout)
		} else if time.Now().After(deadline) {
			return false, fmt.Errorf("still refused after %v: %w", Timeout, err)
		}
		if p, ok := ep.Module().(btl.Poller); ok {
			p.Progress()
		}
		runtime.Gosched()
	}
}

// settle waits until every tracked operation completed and returns the
// errors they completed with.
func (c *completions) settle(t testing.TB) []error {
	t.Helper()
	ch := make(chan struct{})
	go func() { c.wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(Timeout):
		t.Fatalf("timed out after %v: %d operations never completed", Timeout, c.n.Load())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.errs...)
}

// wait is settle that requires every completion to succeed.
func (c *completions) wait(t testing.TB) {
	t.Helper()
	require.Empty(t, c.settle(t))
}

// dataHdr is the 16-byte header of the suite's data fragments.
func dataHdr(sender, stream, seq, size int) []byte {
	h := make([]byte, 16)
	binary.LittleEndian.PutUint32(h[0:], uint32(sender))
	binary.LittleEndian.PutUint32(h[4:], uint32(stream))
	binary.LittleEndian.PutUint32(h[8:], uint32(seq))
	binary.LittleEndian.PutUint32(h[12:], uint32(size))
	return h
}

// checkStream checks fs (data fragments from sender) carry, per stream,
// sequence numbers 0..count-1 in order with intact payloads.
func checkStream(t testing.TB, fs []frag, sender int, counts map[int]int) {
	t.Helper()
	next := map[int]int{}
	for _, f := range fs {
		require.Len(t, f.hdr, 16, "header length")
		s := int(binary.LittleEndian.Uint32(f.hdr[0:]))
		stream := int(binary.LittleEndian.Uint32(f.hdr[4:]))
		seq := int(binary.LittleEndian.Uint32(f.hdr[8:]))
		size := int(binary.LittleEndian.Uint32(f.hdr[12:]))
		require.Equal(t, sender, s, "fragment's sender")
		require.Equal(t, next[stream], seq, "rank %d stream %d: out of order, lost or duplicated fragment", sender, stream)
		next[stream]++
		require.Equal(t, size, len(f.data), "rank %d stream %d seq %d: data length", sender, stream, seq)
		if !bytes.Equal(f.data, payload(sender, stream<<20|seq, size)) {
			t.Fatalf("rank %d stream %d seq %d: %d data bytes corrupted", sender, stream, seq, size)
		}
	}
	for stream, n := range counts {
		require.Equal(t, n, next[stream], "rank %d stream %d: fragments received", sender, stream)
	}
}

func countData(from int, want int) func([]frag) bool {
	return func(fs []frag) bool { return len(dataFrom(fs, from)) >= want }
}

// randSize returns a fragment payload size up to max, biased to the edges.
func randSize(r *rand.Rand, max int) int {
	switch r.IntN(6) {
	case 0:
		return 0
	case 1:
		return min(r.IntN(64), max)
	case 2:
		return min(r.IntN(4096), max)
	case 3:
		return max
	}
	return r.IntN(max + 1)
}

func testOrdered(t *testing.T, mk func(*testing.T, int) []Peer) {
	const n, count = 3, 150
	j := start(t, mk, n)
	maxData := j.limit() - 16
	var c completions
	var wg sync.WaitGroup
	for from := range n {
		for to := range n {
			if from == to {
				continue
			}
			ep := j.ep(from, to)
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := rand.New(rand.NewPCG(uint64(from), uint64(to)))
				for seq := range count {
					size := randSize(r, maxData)
					if err := c.send(ep, TagData, dataHdr(from, to, seq, size), payload(from, to<<20|seq, size)); err != nil {
						c.record(fmt.Errorf("send %d→%d seq %d: %w", from, to, seq, err))
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	c.wait(t)
	for to := range n {
		for from := range n {
			if from == to {
				continue
			}
			fs := j.in[to].wait(t, "all fragments", countData(from, count))
			checkStream(t, dataFrom(fs, from), from, map[int]int{to: count})
		}
	}
}

func testSplit(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	max := j.limit()
	cases := [][2]int{{0, 0}, {1, 0}, {0, 1}, {16, 100}, {3, 4096}, {1000, max - 1000}, {max, 0}, {0, max}}
	var c completions
	for i, k := range cases {
		hdr := bytes.Clone(payload(7, i, k[0]))
		require.NoError(t, c.send(ep, TagData, hdr, payload(9, i, k[1])), "hdr %d data %d", k[0], k[1])
		clear(hdr) // Send copied it
	}
	c.wait(t)
	fs := j.in[1].wait(t, "all fragments", countData(0, len(cases)))
	for i, f := range dataFrom(fs, 0) {
		k := cases[i]
		require.Equal(t, k[0], len(f.hdr), "case %d: hdr length", i)
		require.Equal(t, k[1], len(f.data), "case %d: data length", i)
		require.True(t, bytes.Equal(f.hdr, payload(7, i, k[0])), "case %d: hdr bytes", i)
		require.True(t, bytes.Equal(f.data, payload(9, i, k[1])), "case %d: data bytes", i)
	}
}

func testSendImmediate(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	j.marker(0, 1) // connect
	max := min(j.peers[0].Module.Limits().EagerLimit, j.limit()) - 16
	r := rand.New(rand.NewPCG(3, 4))
	var sent []int
	hdr := make([]byte, 16)
	buf := make([]byte, max)
	for seq := range 300 {
		size := randSize(r, max)
		copy(hdr, dataHdr(0, 0, len(sent), size))
		data := buf[:size]
		copy(data, payload(0, len(sent), size))
		err := ep.SendImmediate(TagData, hdr, data)
		// The module no longer references hdr or data.
		for i := range hdr {
			hdr[i] = 0xFF
		}
		for i := range data {
			data[i] = 0xFF
		}
		if err != nil {
			require.ErrorIs(t, err, btl.ErrWouldBlock, "SendImmediate %d", seq)
			continue
		}
		sent = append(sent, seq)
	}
	if j.peers[0].Module.Caps()&btl.CapSendImmediate != 0 {
		require.NotEmpty(t, sent, "CapSendImmediate set but every SendImmediate refused")
	}
	j.marker(0, 1)
	fs := j.in[1].wait(t, "marker", func(fs []frag) bool { return markers(fs, 0) >= 2 })
	checkStream(t, dataFrom(fs, 0), 0, map[int]int{0: len(sent)})
	// Nothing refused arrives after the marker either: every fragment so far
	// is accounted for, and the final marker comes after all of them.
	require.Equal(t, TagMarker, fs[len(fs)-1].tag)
}

func testAlloc(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	l := j.peers[0].Module.Limits()
	alloc := func(size int) []byte {
		deadline := time.Now().Add(Timeout)
		for {
			b, err := ep.Alloc(size)
			if err == nil {
				require.Len(t, b, size, "Alloc(%d)", size)
				return b
			}
			require.ErrorIs(t, err, btl.ErrWouldBlock, "Alloc(%d)", size)
			require.True(t, time.Now().Before(deadline), "Alloc(%d) kept refusing", size)
			time.Sleep(time.Millisecond)
		}
	}
	// Unsent buffers go back with Free.
	for _, size := range []int{0, 1, l.EagerLimit, l.MaxSendSize} {
		ep.Free(alloc(size))
	}
	sizes := []int{16, 17, 100, 4096, l.EagerLimit, l.MaxSendSize}
	var c completions
	for i, size := range sizes {
		b := alloc(size)
		copy(b, dataHdr(0, 0, i, size-16))
		copy(b[16:], payload(0, i, size-16))
		cb, finish := c.cb()
		done, err := retry(ep, func() (bool, error) { return ep.SendAlloc(TagData, b, 16, cb) })
		require.NoError(t, err, "SendAlloc(%d)", size)
		if done {
			finish()
		}
	}
	c.wait(t)
	j.marker(0, 1)
	fs := j.in[1].wait(t, "marker", func(fs []frag) bool { return markers(fs, 0) >= 1 })
	checkStream(t, dataFrom(fs, 0), 0, map[int]int{0: len(sizes)})
}

func testConcurrent(t *testing.T, mk func(*testing.T, int) []Peer) {
	const senders, count = 8, 250
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	max := j.limit() - 16
	var c completions
	var wg sync.WaitGroup
	for g := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 99))
			for seq := range count {
				size := r.IntN(2048)
				if seq%50 == 49 {
					size = max
				}
				if err := c.send(ep, TagData, dataHdr(0, g, seq, size), payload(0, g<<20|seq, size)); err != nil {
					c.record(fmt.Errorf("sender %d seq %d: %w", g, seq, err))
					return
				}
			}
		}()
	}
	wg.Wait()
	c.wait(t)
	fs := j.in[1].wait(t, "all fragments", countData(0, senders*count))
	counts := map[int]int{}
	for g := range senders {
		counts[g] = count
	}
	checkStream(t, dataFrom(fs, 0), 0, counts)
	// Exactly once: no extra fragment after a marker.
	j.marker(0, 1)
	require.Len(t, dataFrom(j.in[1].wait(t, "", func([]frag) bool { return true }), 0), senders*count)
}

const guard = 4096

func testPutGet(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	caps := j.peers[0].Module.Caps()
	if caps&btl.CapRDMA == 0 {
		t.Skipf("module has neither put nor get (caps %v)", caps)
	}
	const max = 16 << 20
	const fill = 0x5A
	fillBuf := bytes.Repeat([]byte{fill}, max+2*guard)
	target := bytes.Clone(fillBuf)
	reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	require.NoError(t, err)
	defer reg.Release()
	handle := bytes.Clone(reg.Handle())
	ep := j.ep(0, 1)
	type tc struct{ size, off int }
	cases := []tc{{0, 0}, {1, 0}, {1, guard - 1}, {7, 13}, {4096, guard}, {65537, 1000}, {1 << 20, 12345}, {max, guard}, {1, max + 2*guard - 1}}

	if caps&btl.CapPut != 0 {
		for i, k := range cases {
			local := payload(0, i, k.size)
			var c completions
			cb, finish := c.cb()
			done, err := retry(ep, func() (bool, error) { return ep.Put(local, handle, k.off, cb) })
			require.NoError(t, err, "Put %d bytes at %d", k.size, k.off)
			if done {
				finish()
			}
			c.wait(t)
			j.marker(0, 1) // the Put's data is in place when the marker arrives
			end := k.off + k.size
			require.True(t, bytes.Equal(target[k.off:end], local), "Put %d bytes at %d: data", k.size, k.off)
			require.True(t, bytes.Equal(target[:k.off], fillBuf[:k.off]), "Put %d bytes at %d: bytes before the range changed", k.size, k.off)
			require.True(t, bytes.Equal(target[end:], fillBuf[end:]), "Put %d bytes at %d: bytes after the range changed", k.size, k.off)
			copy(target[k.off:end], fillBuf)
		}
	}
	if caps&btl.CapGet != 0 {
		copy(target, pattern)
		for _, k := range cases {
			buf := make([]byte, k.size+2*guard)
			for i := range buf {
				buf[i] = 0xA5
			}
			local := buf[guard : guard+k.size]
			var c completions
			cb, finish := c.cb()
			done, err := retry(ep, func() (bool, error) { return ep.Get(local, handle, k.off, cb) })
			require.NoError(t, err, "Get %d bytes at %d", k.size, k.off)
			if done {
				finish()
			}
			c.wait(t)
			require.True(t, bytes.Equal(local, target[k.off:k.off+k.size]), "Get %d bytes at %d: data", k.size, k.off)
			for x, b := range append(bytes.Clone(buf[:guard]), buf[guard+k.size:]...) {
				require.Equal(t, byte(0xA5), b, "Get %d bytes at %d: local byte %d outside the range changed", k.size, k.off, x)
			}
		}
	}
}

func testBadHandle(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	caps := j.peers[0].Module.Caps()
	if caps&btl.CapRDMA == 0 {
		t.Skipf("module has neither put nor get (caps %v)", caps)
	}
	const size = 4096
	target := bytes.Repeat([]byte{0x5A}, size)
	reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	require.NoError(t, err)
	defer reg.Release()
	h := bytes.Clone(reg.Handle())
	ep := j.ep(0, 1)
	j.marker(0, 1)
	local := bytes.Repeat([]byte{0xA5}, 16)
	cases := []struct {
		name   string
		handle []byte
		off    int
	}{
		{"nil handle", nil, 0},
		{"truncated handle", h[:len(h)-1], 0},
		{"negative offset", h, -1},
		{"one past the end", h, size - len(local) + 1},
		{"offset beyond", h, size + 1},
		{"huge offset", h, 1 << 60},
	}
	never := func(err error) { t.Errorf("completion called for a rejected operation (%v)", err) }
	for _, k := range cases {
		if caps&btl.CapPut != 0 {
			_, err := ep.Put(local, k.handle, k.off, never)
			require.ErrorIs(t, err, btl.ErrBadHandle, "Put: %s", k.name)
		}
		if caps&btl.CapGet != 0 {
			_, err := ep.Get(local, k.handle, k.off, never)
			require.ErrorIs(t, err, btl.ErrBadHandle, "Get: %s", k.name)
		}
	}
	j.marker(0, 1)
	require.Equal(t, bytes.Repeat([]byte{0x5A}, size), target, "target written by a rejected Put")
	require.Equal(t, bytes.Repeat([]byte{0xA5}, 16), local, "local written by a rejected Get")
	require.Empty(t, j.fails[0], "a rejected operation failed the peer")
	require.Empty(t, j.fails[1], "a rejected operation failed the peer")
}

func testClose(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	m := j.peers[0].Module
	ep := j.ep(0, 1)
	back := j.ep(1, 0)
	j.marker(0, 1)
	j.marker(1, 0)
	var reg btl.Registration
	if m.Caps()&btl.CapRDMA != 0 {
		var err error
		reg, err = j.peers[1].Module.Register(make([]byte, 64), btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		defer reg.Release()
	}
	require.NoError(t, m.Close())

	never := func(err error) { t.Errorf("completion called for an operation on a closed module (%v)", err) }
	_, err := m.AddProc(1)
	require.ErrorIs(t, err, btl.ErrClosed, "AddProc after Close")
	_, err = ep.Send(TagData, []byte("h"), []byte("d"), never)
	require.ErrorIs(t, err, btl.ErrClosed, "Send after Close")
	require.ErrorIs(t, ep.SendImmediate(TagData, []byte("h"), nil), btl.ErrClosed, "SendImmediate after Close")
	_, err = ep.Alloc(8)
	require.ErrorIs(t, err, btl.ErrClosed, "Alloc after Close")
	_, err = m.Register(make([]byte, 8), btl.AccessRemoteWrite)
	require.ErrorIs(t, err, btl.ErrClosed, "Register after Close")
	if m.Caps()&btl.CapPut != 0 {
		_, err = ep.Put(make([]byte, 8), reg.Handle(), 0, never)
		require.ErrorIs(t, err, btl.ErrClosed, "Put after Close")
	}
	if m.Caps()&btl.CapGet != 0 {
		_, err = ep.Get(make([]byte, 8), reg.Handle(), 0, never)
		require.ErrorIs(t, err, btl.ErrClosed, "Get after Close")
	}
	// The survivor's sends to the closed rank resolve (fail or complete);
	// none hangs.
	var c completions
	for range 10 {
		c.send(back, TagData, dataHdr(1, 0, 0, 0), nil)
	}
	c.settle(t)
}

// killedJob starts n ranks, connects rank 0 with every other, and
// registers memory at rank 1 for Puts.
func killedJob(t *testing.T, mk func(*testing.T, int) []Peer, n int) (*job, []byte) {
	j := start(t, mk, n)
	if j.peers[1].Kill == nil {
		t.Skip("Peer.Kill not provided")
	}
	var h []byte
	if j.peers[0].Module.Caps()&btl.CapPut != 0 {
		reg, err := j.peers[1].Module.Register(make([]byte, 1<<20), btl.AccessRemoteWrite)
		require.NoError(t, err)
		h = bytes.Clone(reg.Handle())
	}
	return j, h
}

// expectFailure waits for rank's report that peer failed.
func (j *job) expectFailure(rank, peer int) {
	j.t.Helper()
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for {
		select {
		case f := <-j.fails[rank]:
			if f.peer != peer {
				j.t.Fatalf("rank %d: PeerFailed(%d, %v), expected rank %d only", rank, f.peer, f.err, peer)
			}
			require.ErrorIs(j.t, f.err, mpierr.ErrProcFailed, "rank %d: PeerFailed error", rank)
			return
		case <-timer.C:
			j.t.Fatalf("rank %d: no PeerFailed for rank %d within %v", rank, peer, Timeout)
		}
	}
}

// sendFails checks that a send from rank 0 to a failed peer fails: at once
// or through its completion.
func (j *job) sendFails(ep btl.Endpoint, h []byte) {
	t := j.t
	t.Helper()
	var c completions
	err := c.send(ep, TagData, dataHdr(0, 0, 0, 8), payload(0, 0, 8))
	errs := c.settle(t)
	require.True(t, err != nil || len(errs) > 0, "Send to a failed peer succeeded")
	if h != nil {
		var c completions
		cb, finish := c.cb()
		done, err := retry(ep, func() (bool, error) { return ep.Put(payload(0, 0, 64), h, 0, cb) })
		if done || err != nil {
			finish()
		}
		errs := c.settle(t)
		require.True(t, err != nil || len(errs) > 0, "Put to a failed peer succeeded")
	}
}

func testPeerKilled(t *testing.T, mk func(*testing.T, int) []Peer) {
	j, h := killedJob(t, mk, 3)
	ep := j.ep(0, 1)
	j.marker(0, 1)
	j.marker(1, 0)
	j.marker(0, 2)
	j.marker(2, 0)

	// A flood towards the victim is in flight when it dies: every send
	// resolves.
	var c completions
	stop := make(chan struct{})
	flood := make(chan struct{})
	go func() {
		defer close(flood)
		size := j.limit() - 16
		for seq := 0; ; seq++ {
			select {
			case <-stop:
				return
			default:
			}
			if c.send(ep, TagData, dataHdr(0, 0, seq, size), payload(0, seq, size)) != nil {
				return
			}
		}
	}()
	j.in[1].wait(t, "flood", countData(0, 10))
	j.peers[1].Kill()
	j.expectFailure(0, 1)
	close(stop)
	<-flood
	c.settle(t)
	j.sendFails(ep, h)

	// The other peer is unaffected.
	j.marker(0, 2)
	j.marker(2, 0)
	for len(j.fails[0]) > 0 {
		f := <-j.fails[0]
		require.Failf(t, "extra failure report", "PeerFailed(%d, %v) reported again", f.peer, f.err)
	}
}

func testKilledBeforeConnect(t *testing.T, mk func(*testing.T, int) []Peer) {
	j, h := killedJob(t, mk, 2)
	j.peers[1].Kill()
	ep := j.ep(0, 1)
	var c completions
	c.send(ep, TagData, dataHdr(0, 0, 0, 8), payload(0, 0, 8))
	j.expectFailure(0, 1)
	c.settle(t)
	j.sendFails(ep, h)
}

// testFlushIdle: Flush on an endpoint where nothing was posted completes
// during the call.
func testFlushIdle(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	never := func(err error) { t.Errorf("Flush with nothing posted called its completion (%v)", err) }
	done, err := ep.Flush(never)
	require.NoError(t, err)
	require.True(t, done, "Flush with nothing posted must complete at once")
}

// testFlush posts bursts of Sends (of the largest size: they queue in a
// socket or a ring), Puts and Gets, then a Flush: when the Flush
// completes, every operation before it has completed (the Gets' bytes
// are in local memory), and the Flush completes once.
func testFlush(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	caps := j.peers[0].Module.Caps()
	const chunk, puts = 16 << 10, 4 // per round: Puts into the first half, Gets from the second
	var target []byte
	var handle []byte
	if caps&btl.CapRDMA != 0 {
		target = make([]byte, 2*puts*chunk)
		copy(target[puts*chunk:], pattern)
		reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		defer reg.Release()
		handle = bytes.Clone(reg.Handle())
	}
	j.marker(0, 1)
	max := j.limit() - 16
	const rounds, count = 4, 48
	for round := range rounds {
		var c completions
		var gets [][]byte
		for seq := range count {
			size := max
			if seq%3 == 1 {
				size = seq
			}
			require.NoError(t, c.send(ep, TagData, dataHdr(0, round, seq, size), payload(0, round<<20|seq, size)))
			if k := seq / (count / puts); seq%(count/puts) == 0 {
				if caps&btl.CapPut != 0 {
					local := payload(1, round<<8|k, chunk)
					require.NoError(t, c.post(ep, func(cb btl.Completion) (bool, error) { return ep.Put(local, handle, k*chunk, cb) }))
				}
				if caps&btl.CapGet != 0 {
					local := make([]byte, chunk)
					gets = append(gets, local)
					require.NoError(t, c.post(ep, func(cb btl.Completion) (bool, error) {
						return ep.Get(local, handle, (puts+k)*chunk, cb)
					}))
				}
			}
		}
		var calls atomic.Int32
		left := make(chan int64, 2)
		done, err := ep.Flush(func(err error) {
			calls.Add(1)
			if err != nil {
				c.record(fmt.Errorf("Flush completed with %w", err))
			}
			left <- c.n.Load()
		})
		require.NoError(t, err, "Flush")
		if done {
			left <- c.n.Load()
		}
		select {
		case n := <-left:
			require.Zero(t, n, "round %d: Flush completed while operations before it had not", round)
		case <-time.After(Timeout):
			t.Fatalf("round %d: Flush did not complete within %v (%d operations outstanding)", round, Timeout, c.n.Load())
		}
		for k, local := range gets {
			require.True(t, bytes.Equal(local, target[(puts+k)*chunk:][:chunk]), "round %d: Get %d: bytes not in place when Flush completed", round, k)
		}
		c.wait(t)
		j.marker(0, 1)
		if !done {
			require.Equal(t, int32(1), calls.Load(), "round %d: Flush completions", round)
		}
		if caps&btl.CapPut != 0 {
			for k := range puts {
				require.True(t, bytes.Equal(target[k*chunk:][:chunk], payload(1, round<<8|k, chunk)), "round %d: Put %d: data", round, k)
			}
		}
	}
	fs := j.in[1].wait(t, "all fragments", countData(0, rounds*count))
	counts := map[int]int{}
	for round := range rounds {
		counts[round] = count
	}
	checkStream(t, dataFrom(fs, 0), 0, counts)
}

// testPutVisible: a fragment sent after a Put completed finds the Put's
// bytes in the peer's memory when its handler runs, whether the sender
// learnt of the completion from the Put (done, or its callback, where the
// PML sends its FIN from) or from a Flush after it.
func testPutVisible(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	if j.peers[0].Module.Caps()&btl.CapPut == 0 {
		t.Skip("module has no put")
	}
	sizes := []int{1, 4096, 65539, 1 << 20, 7, 300001, 2 << 20, 64}
	offs := make([]int, len(sizes))
	total := 0
	for i, n := range sizes {
		offs[i] = total
		total += n + 3
	}
	target := make([]byte, total)
	reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite)
	require.NoError(t, err)
	defer reg.Release()
	handle := bytes.Clone(reg.Handle())
	want := func(i int) []byte { return payload(2, i, sizes[i]) }
	seen := make(chan [2]int, len(sizes)) // case, 1 if the bytes were in place
	j.peers[1].Dispatch.Register(TagCheck, func(_ btl.Endpoint, hdr, _ []byte) {
		i := int(binary.LittleEndian.Uint32(hdr))
		ok := 0
		if i < len(sizes) && bytes.Equal(target[offs[i]:][:sizes[i]], want(i)) {
			ok = 1
		}
		seen <- [2]int{i, ok}
	})
	ep := j.ep(0, 1)
	j.marker(0, 1)
	var c completions
	check := func(i int) {
		h := binary.LittleEndian.AppendUint32(nil, uint32(i))
		if err := c.send(ep, TagCheck, h, nil); err != nil {
			c.record(fmt.Errorf("case %d: check fragment: %w", i, err))
		}
	}
	for i := range sizes {
		local := want(i)
		cb, finish := c.cb()
		byFlush := i%2 == 1
		done, err := retry(ep, func() (bool, error) {
			return ep.Put(local, handle, offs[i], func(err error) {
				if err == nil && !byFlush {
					check(i)
				}
				cb(err)
			})
		})
		require.NoError(t, err, "case %d: Put", i)
		if done {
			finish()
			if !byFlush {
				check(i)
			}
		}
		if byFlush {
			fcb, ffinish := c.cb()
			fdone, err := ep.Flush(func(err error) {
				if err == nil {
					check(i)
				}
				fcb(err)
			})
			require.NoError(t, err, "case %d: Flush", i)
			if fdone {
				check(i)
				ffinish()
			}
		}
		select {
		case got := <-seen:
			require.Equal(t, [2]int{i, 1}, got, "case %d (%d bytes, by %s): the Put's bytes were not in place when the fragment sent after it arrived", i, sizes[i], map[bool]string{true: "Flush", false: "completion"}[byFlush])
		case <-time.After(Timeout):
			t.Fatalf("case %d: no check fragment within %v", i, Timeout)
		}
	}
	c.wait(t)
}

// testWouldBlock: an operation refused with ErrWouldBlock (Peer.WouldBlock)
// delivers nothing, writes and reads nothing, calls no completion, and
// leaves a SendAlloc's buffer with the caller; the operations accepted
// around it arrive in order.
func testWouldBlock(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	block := j.peers[0].WouldBlock
	if block == nil {
		t.Skip("Peer.WouldBlock not provided")
	}
	defer block(0)
	ep := j.ep(0, 1)
	j.marker(0, 1)
	never := func(err error) { t.Errorf("completion called for an operation refused with ErrWouldBlock (%v)", err) }
	var c completions
	sent := 0
	max := j.limit() - 16
	for k := range 40 {
		size := (k * 997) % (max + 1)
		h, data := dataHdr(0, 0, sent, size), payload(0, sent, size)
		if k%2 == 0 {
			block(1)
			_, err := ep.Send(TagData, h, data, never)
			require.ErrorIs(t, err, btl.ErrWouldBlock, "Send %d after WouldBlock(1)", k)
			continue
		}
		require.NoError(t, c.send(ep, TagData, h, data), "Send %d", k)
		sent++
	}
	buf, err := ep.Alloc(64)
	if err == nil {
		copy(buf, dataHdr(0, 0, sent, 48))
		copy(buf[16:], payload(0, sent, 48))
		block(1)
		_, err = ep.SendAlloc(TagData, buf, 16, never)
		require.ErrorIs(t, err, btl.ErrWouldBlock, "SendAlloc after WouldBlock(1)")
		ep.Free(buf) // still ours after the refusal
	} else {
		require.ErrorIs(t, err, btl.ErrWouldBlock, "Alloc")
	}
	caps := j.peers[0].Module.Caps()
	const size = 4096
	target := bytes.Repeat([]byte{0x5A}, size)
	if caps&btl.CapRDMA != 0 {
		reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		defer reg.Release()
		h := bytes.Clone(reg.Handle())
		local := bytes.Repeat([]byte{0xA5}, size)
		if caps&btl.CapPut != 0 {
			block(1)
			_, err := ep.Put(local, h, 0, never)
			require.ErrorIs(t, err, btl.ErrWouldBlock, "Put after WouldBlock(1)")
		}
		if caps&btl.CapGet != 0 {
			block(1)
			_, err := ep.Get(local, h, 0, never)
			require.ErrorIs(t, err, btl.ErrWouldBlock, "Get after WouldBlock(1)")
			require.Equal(t, bytes.Repeat([]byte{0xA5}, size), local, "a refused Get wrote local memory")
		}
	}
	block(0)
	c.wait(t)
	j.marker(0, 1)
	fs := j.in[1].wait(t, "marker", func(fs []frag) bool { return markers(fs, 0) >= 2 })
	checkStream(t, dataFrom(fs, 0), 0, map[int]int{0: sent})
	require.Equal(t, bytes.Repeat([]byte{0x5A}, size), target, "a refused Put wrote the peer's memory")
}
