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

	"github.com/gompi-org/gompi/btl"
	"github.com/stretchr/testify/require"
)

// The suite's rig: the payloads, the inbox a rank's handlers fill, a job of
// n ranks, and the completions its operations report.

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
