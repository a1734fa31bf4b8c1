package pml_test

// Property tests of MPI matching: random mixes of posted receives
// (specific, AnySource, AnyTag, both), arrivals from several sources in
// random (but per-link, or with unordered links per-source scrambled)
// order, probes and cancels, compared with a naive reference matcher.

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gompi-org/gompi/btl/fake"
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/stretchr/testify/require"
)

// ---- the reference matcher ----

type refMsg struct {
	id       int
	src, tag int
	size     int
}

type refRecv struct {
	idx       int // index in model.recvs (post order)
	src, tag  int
	matched   *refMsg
	cancelled bool
}

// model is the MPI rule, written as plainly as possible: a message is
// admitted to matching in per-source send order; an admitted message goes
// to the earliest-posted compatible receive, else waits in arrival order;
// a posted receive takes the earliest-arrived compatible waiting message.
// AnyTag never matches a negative tag.
type model struct {
	sent     map[int][]*refMsg // per source, in send order (index = seq)
	expect   map[int]int       // per source: next seq to admit
	early    map[int]map[int]bool
	waiting  []*refMsg // admitted, unmatched, in admission order
	posted   []*refRecv
	recvs    []*refRecv
	admitted int
}

func newModel() *model {
	return &model{sent: map[int][]*refMsg{}, expect: map[int]int{}, early: map[int]map[int]bool{}}
}

func compatible(r *refRecv, m *refMsg) bool {
	srcOK := r.src == pml.AnySource || r.src == m.src
	tagOK := r.tag == m.tag || (r.tag == pml.AnyTag && m.tag >= 0)
	return srcOK && tagOK
}

func (md *model) post(r *refRecv) {
	for i, m := range md.waiting {
		if compatible(r, m) {
			r.matched = m
			md.waiting = append(md.waiting[:i], md.waiting[i+1:]...)
			return
		}
	}
	md.posted = append(md.posted, r)
}

func (md *model) probe(src, tag int) *refMsg {
	r := &refRecv{src: src, tag: tag}
	for _, m := range md.waiting {
		if compatible(r, m) {
			return m
		}
	}
	return nil
}

func (md *model) cancel(r *refRecv) bool {
	for i, p := range md.posted {
		if p == r {
			md.posted = append(md.posted[:i], md.posted[i+1:]...)
			r.cancelled = true
			return true
		}
	}
	return false
}

// arrive records that message seq of src reached the receiver.
func (md *model) arrive(src, seq int) {
	if md.early[src] == nil {
		md.early[src] = map[int]bool{}
	}
	md.early[src][seq] = true
	for md.early[src][md.expect[src]] {
		delete(md.early[src], md.expect[src])
		m := md.sent[src][md.expect[src]]
		md.expect[src]++
		md.admitted++
		md.admit(m)
	}
}

func (md *model) admit(m *refMsg) {
	for i, r := range md.posted {
		if compatible(r, m) {
			r.matched = m
			md.posted = append(md.posted[:i], md.posted[i+1:]...)
			return
		}
	}
	md.waiting = append(md.waiting, m)
}

// ---- the property ----

type propRecv struct {
	ref *refRecv
	req *pml.Handle
	buf []byte
}

// matchingRun runs one random history against the engine on rank 0 and
// the model, and compares every outcome.
func matchingRun(t *testing.T, seed uint64, unordered bool, steps int) {
	rng := rand.New(rand.NewPCG(seed, 42))
	const nsrc = 3 // ranks 1..3 send to rank 0
	g := newRig(t, nsrc+1, capsConfig(fake.AllCaps))
	g.net.SetTraceStarts(false)
	g.net.SetUnordered(unordered)
	md := newModel()
	var recvs []*propRecv
	nextID := 0
	tags := []int{0, 1, 2, -2} // -2: an internal (negative) tag
	sizes := []int{0, 8, 40, 100, 500, 1500}

	// deliverOne delivers pending op 0 and feeds matching arrivals to the model.
	deliverOne := func() {
		op := g.net.Pending()[0]
		if op.To == 0 && op.Kind.IsSend() {
			switch hdr.Type(op.Tag) {
			case hdr.TypeMatch, hdr.TypeRndv, hdr.TypeRget:
				m, _, err := hdr.DecodeMatch(op.Hdr)
				require.NoError(t, err)
				md.arrive(int(m.Src), int(m.Seq))
			}
		}
		require.True(t, g.net.Step())
	}

	for step := 0; step < steps; step++ {
		switch k := rng.IntN(100); {
		case k < 35: // post a receive
			src := pml.AnySource
			if rng.IntN(3) > 0 {
				src = 1 + rng.IntN(nsrc)
			}
			tag := pml.AnyTag
			if rng.IntN(3) > 0 {
				tag = tags[rng.IntN(len(tags))]
			}
			ref := &refRecv{idx: len(md.recvs), src: src, tag: tag}
			md.recvs = append(md.recvs, ref)
			buf := make([]byte, 1500)
			req, err := g.comm[0].IrecvHandle(pml.Buffer{Bytes: buf}, src, tag)
			require.NoError(t, err)
			recvs = append(recvs, &propRecv{ref: ref, req: req, buf: buf})
			md.post(ref)
		case k < 70: // send
			src := 1 + rng.IntN(nsrc)
			tag := tags[rng.IntN(len(tags))]
			size := sizes[rng.IntN(len(sizes))]
			m := &refMsg{id: nextID, src: src, tag: tag, size: size}
			nextID++
			md.sent[src] = append(md.sent[src], m)
			mode := pml.Standard
			if rng.IntN(8) == 0 {
				mode = pml.Synchronous
			}
			_, err := g.comm[src].IsendHandle(pml.Buffer{Bytes: payload(m)}, 0, tag, mode, nil)
			require.NoError(t, err)
		case k < 94: // deliver a few operations, maybe reordered first
			if g.net.Len() == 0 {
				continue
			}
			if rng.IntN(2) == 0 {
				g.net.Reorder(rng.Uint64())
			}
			for n := 1 + rng.IntN(4); n > 0 && g.net.Len() > 0; n-- {
				deliverOne()
			}
		case k < 98: // probe
			src, tag := pml.AnySource, pml.AnyTag
			if rng.IntN(2) == 0 {
				src = 1 + rng.IntN(nsrc)
			}
			if rng.IntN(2) == 0 {
				tag = tags[rng.IntN(len(tags))]
			}
			st, ok, err := g.comm[0].Iprobe(src, tag)
			require.NoError(t, err)
			want := md.probe(src, tag)
			require.Equal(t, want != nil, ok, "seed %d step %d: iprobe(%d,%d)", seed, step, src, tag)
			if want != nil {
				require.Equal(t, pml.Status{Source: want.src, Tag: want.tag, Count: want.size}, st, "seed %d step %d: iprobe(%d,%d)", seed, step, src, tag)
			}
		default: // cancel a random receive
			if len(recvs) == 0 {
				continue
			}
			r := recvs[rng.IntN(len(recvs))]
			got := cancel(g.comm[0], r.req)
			want := md.cancel(r.ref)
			require.Equal(t, want, got, "seed %d step %d: cancel of receive %d", seed, step, r.ref.idx)
		}
	}
	for g.net.Len() > 0 {
		deliverOne()
	}
	require.Equal(t, nextID, md.admitted, "seed %d: every message admitted", seed)

	for _, r := range recvs {
		ref := r.ref
		what := fmt.Sprintf("seed %d unordered=%v: receive %d (src=%d tag=%d)", seed, unordered, ref.idx, ref.src, ref.tag)
		switch {
		case ref.cancelled:
			require.True(t, r.req.Done(), what)
			st, err := r.req.Result()
			require.NoError(t, err, what)
			require.True(t, st.Cancelled, what)
		case ref.matched == nil:
			require.False(t, r.req.Done(), "%s: the model has no message for it", what)
		default:
			m := ref.matched
			require.True(t, r.req.Done(), "%s: should have message %d", what, m.id)
			st, err := r.req.Result()
			require.NoError(t, err, what)
			require.Equal(t, pml.Status{Source: m.src, Tag: m.tag, Count: m.size}, st, "%s: should have message %d", what, m.id)
			require.Equal(t, payload(m), r.buf[:m.size], "%s: bytes of message %d", what, m.id)
		}
	}
	// What the model still holds unexpected, the engine reports too.
	for _, m := range md.waiting {
		st, ok, err := g.comm[0].Iprobe(m.src, m.tag)
		require.NoError(t, err)
		require.True(t, ok, "seed %d: message %d should be unexpected", seed, m.id)
		require.Equal(t, m.src, st.Source)
	}
	require.Empty(t, g.net.Violations())
}

// payload identifies the message in its first bytes (when it has room).
func payload(m *refMsg) []byte {
	b := pattern(m.size, byte(m.id))
	if m.size >= 8 {
		binary.LittleEndian.PutUint64(b, uint64(m.id))
	}
	return b
}

func TestMatchingProperty(t *testing.T) {
	seeds := 150
	if testing.Short() {
		seeds = 20
	}
	for seed := range uint64(seeds) {
		matchingRun(t, seed, seed%2 == 1, 250)
	}
}

// TestInterleavedProtocolsKeepOrder: one sender interleaves eager and
// rendezvous messages (every protocol, standard and synchronous) to one
// AnyTag receiver over a transport that scrambles the link; receive k
// gets message k, whether it was posted before or after the arrival.
func TestInterleavedProtocolsKeepOrder(t *testing.T) {
	sizes := []int{0, 16, 100, 300, 1000, 3000} // immediate, prepared, rget, rndv pipeline
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		g := newRig(t, 2, capsConfig(fake.AllCaps))
		g.net.SetTraceStarts(false)
		g.net.SetUnordered(true)
		const n = 40
		var data [][]byte
		var recvs []*pml.Handle
		var bufs [][]byte
		post := func() {
			b := make([]byte, 3000)
			r, err := g.comm[1].IrecvHandle(pml.Buffer{Bytes: b}, 0, pml.AnyTag)
			require.NoError(t, err)
			recvs, bufs = append(recvs, r), append(bufs, b)
		}
		for k := range n {
			if k < n/2 {
				post() // half the receives are posted before anything is sent
			}
			d := pattern(sizes[rng.IntN(len(sizes))], byte(k))
			data = append(data, d)
			mode := pml.Standard
			if rng.IntN(5) == 0 {
				mode = pml.Synchronous
			}
			_, err := g.comm[0].IsendHandle(pml.Buffer{Bytes: d}, 1, k, mode, nil)
			require.NoError(t, err)
			if rng.IntN(3) == 0 {
				g.net.Reorder(rng.Uint64())
				for m := rng.IntN(5); m > 0 && g.step(); m-- {
				}
			}
		}
		for g.net.Len() > 0 {
			g.net.Reorder(rng.Uint64())
			g.step()
			if len(recvs) < n && rng.IntN(4) == 0 {
				post()
			}
		}
		for len(recvs) < n {
			post()
		}
		g.run()
		for k, r := range recvs {
			require.True(t, r.Done(), "seed %d: receive %d", seed, k)
			st, err := r.Result()
			require.NoError(t, err)
			require.Equal(t, k, st.Tag, "seed %d: receive %d got message %d", seed, k, st.Tag)
			require.Equal(t, data[k], bufs[k][:st.Count], "seed %d: receive %d bytes", seed, k)
		}
		require.Empty(t, g.net.Violations())
	}
}
