package btltest

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/stretchr/testify/require"
)

// Subtests of the send path: order and bytes, the hdr/data split,
// SendImmediate, Alloc/SendAlloc, concurrent senders.

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
