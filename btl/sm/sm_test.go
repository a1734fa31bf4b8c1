package sm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

const tagData btl.Tag = 0x41

// seqHdr is a 12-byte test header: sender stream, sequence number, size.
func seqHdr(stream, seq, size int) []byte {
	h := make([]byte, 12)
	binary.LittleEndian.PutUint32(h, uint32(stream))
	binary.LittleEndian.PutUint32(h[4:], uint32(seq))
	binary.LittleEndian.PutUint32(h[8:], uint32(size))
	return h
}

func fill(stream, seq, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(stream*31 + seq*7 + i)
	}
	return b
}

// checkOrder checks fragments of each stream arrive in sequence with their
// payloads intact and returns how many arrived per stream.
func checkOrder(t *testing.T, frags []rcvd) map[int]int {
	t.Helper()
	next := map[int]int{}
	for _, f := range frags {
		require.Len(t, f.hdr, 12)
		stream := int(binary.LittleEndian.Uint32(f.hdr))
		seq := int(binary.LittleEndian.Uint32(f.hdr[4:]))
		size := int(binary.LittleEndian.Uint32(f.hdr[8:]))
		require.Equal(t, next[stream], seq, "stream %d: out of order", stream)
		next[stream]++
		require.True(t, bytes.Equal(f.data, fill(stream, seq, size)), "stream %d seq %d: %d bytes corrupted", stream, seq, size)
	}
	return next
}

// Fragments of every size class, sent with every send call, stay in order
// across the fast-box set-up and through a small ring that wraps and fills.
func TestFastBoxOrderAcrossThreshold(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramFboxThreshold, "7"}, [2]string{paramFboxSize, "512"},
		[2]string{paramSegmentSize, "2m"})
	in := newInbox(ranks[1].env.Dispatch, tagData)
	ranks[1].startPoller()
	ep, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)
	e := ep.(*endpoint)
	inline := ranks[0].m.lay.inlineLimit
	max := ranks[0].m.cfg.maxSend
	sizes := []int{0, 8, inline - 12, inline - 11, 200, 4096, max - 12, 1}
	const count = 600
	var wg sync.WaitGroup
	var cbErr error
	var cbMu sync.Mutex
	for seq := range count {
		size := sizes[seq%len(sizes)]
		hdr, data := seqHdr(0, seq, size), fill(0, seq, size)
		switch seq % 3 {
		case 0:
			wg.Add(1)
			done, err := ep.Send(tagData, hdr, data, func(err error) {
				cbMu.Lock()
				cbErr = errors.Join(cbErr, err)
				cbMu.Unlock()
				wg.Done()
			})
			require.NoError(t, err)
			if done {
				wg.Done()
			}
		case 1:
			for {
				err := ep.SendImmediate(tagData, hdr, data)
				if err == nil {
					break
				}
				require.ErrorIs(t, err, btl.ErrWouldBlock)
				ranks[0].m.Progress()
			}
		case 2:
			var buf []byte
			for {
				buf, err = ep.Alloc(len(hdr) + size)
				if err == nil {
					break
				}
				require.ErrorIs(t, err, btl.ErrWouldBlock)
				ranks[0].m.Progress()
			}
			copy(buf, hdr)
			copy(buf[len(hdr):], data)
			wg.Add(1)
			done, err := ep.SendAlloc(tagData, buf, len(hdr), func(err error) {
				cbMu.Lock()
				cbErr = errors.Join(cbErr, err)
				cbMu.Unlock()
				wg.Done()
			})
			require.NoError(t, err)
			if done {
				wg.Done()
			}
		}
		if seq%50 == 0 {
			ranks[0].m.Progress() // posts queued sends
		}
	}
	in.waitFor(t, ranks[0].m, true, 30*time.Second, "all fragments", func(n, _ int) bool { return n == count })
	wg.Wait()
	require.NoError(t, cbErr)
	in.mu.Lock()
	got := checkOrder(t, in.frags)
	in.mu.Unlock()
	require.Equal(t, count, got[0])
	e.mu.Lock()
	require.NotNil(t, e.tx, "no fast box was set up")
	require.True(t, e.announced)
	require.Greater(t, e.tx.pos, 2*e.tx.size, "the ring never wrapped")
	e.mu.Unlock()
}

// A header given as two words (SendImmediateHeader) arrives as the 16
// bytes they encode, in front of payloads of every length up to past the
// box's inline limit, so at every place an inline entry can cross a cache
// line, through a ring that wraps.
func TestSendImmediateHeaderWords(t *testing.T) {
	for _, box := range []int{512, 4096} {
		t.Run(fmt.Sprintf("box=%d", box), func(t *testing.T) {
			ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramFboxThreshold, "1"}, [2]string{paramFboxSize, strconv.Itoa(box)})
			in := newInbox(ranks[1].env.Dispatch, tagData)
			ranks[1].startPoller()
			ep, err := ranks[0].m.AddProc(1)
			require.NoError(t, err)
			hs, ok := ep.(btl.HeaderSender)
			require.True(t, ok)
			words := func(seq, size int) (uint64, uint64) {
				return uint64(seq) | uint64(size)<<32, ^uint64(seq) * 0x9e3779b97f4a7c15
			}
			span := box/4 + 30 // payloads to past the inline limit (box/4 - 8 - 16)
			count := 3 * span
			for seq := range count {
				size := seq % span
				w0, w1 := words(seq, size)
				for {
					err := hs.SendImmediateHeader(tagData, w0, w1, fill(0, seq, size))
					if err == nil {
						break
					}
					require.ErrorIs(t, err, btl.ErrWouldBlock)
					ranks[0].m.Progress()
				}
			}
			in.waitFor(t, ranks[0].m, true, 30*time.Second, "all fragments", func(n, _ int) bool { return n == count })
			in.mu.Lock()
			defer in.mu.Unlock()
			for seq, f := range in.frags {
				size := seq % span
				w0, w1 := words(seq, size)
				require.Len(t, f.hdr, 16, "seq %d", seq)
				require.Equal(t, w0, binary.LittleEndian.Uint64(f.hdr), "seq %d: first header word", seq)
				require.Equal(t, w1, binary.LittleEndian.Uint64(f.hdr[8:]), "seq %d: second header word", seq)
				require.True(t, bytes.Equal(fill(0, seq, size), f.data), "seq %d: payload", seq)
			}
		})
	}
}

// Several modules, each with several goroutines, send to one receiver
// through its FIFO only (no fast boxes): every fragment arrives once, in
// order per sender goroutine.
func TestFifoManyProducers(t *testing.T) {
	const n, goroutines, count = 4, 3, 300
	ranks := openJob(t, btltest.NewStore(), n, [2]string{paramFboxMax, "0"}, [2]string{paramSegmentSize, "1m"})
	in := newInbox(ranks[0].env.Dispatch, tagData)
	ranks[0].startPoller()
	var wg sync.WaitGroup
	errs := make(chan error, n*goroutines)
	for r := 1; r < n; r++ {
		ranks[r].startPoller() // posts queued sends
		ep, err := ranks[r].m.AddProc(0)
		require.NoError(t, err)
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stream := r*goroutines + g
				rng := rand.New(rand.NewPCG(uint64(stream), 1))
				for seq := range count {
					size := rng.IntN(3000)
					if seq%40 == 0 {
						size = ranks[r].m.cfg.maxSend - 12
					}
					if _, err := ep.Send(tagData, seqHdr(stream, seq, size), fill(stream, seq, size), nil); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	total := (n - 1) * goroutines * count
	in.waitFor(t, ranks[0].m, false, 30*time.Second, "all fragments", func(f, _ int) bool { return f >= total })
	in.mu.Lock()
	got := checkOrder(t, in.frags)
	require.Len(t, in.frags, total)
	in.mu.Unlock()
	for stream := goroutines; stream < n*goroutines; stream++ {
		require.Equal(t, count, got[stream], "stream %d", stream)
	}
	for r := range ranks {
		require.Empty(t, ranks[r].m.rx, "rank %d polls a fast box", r)
	}
}

// The FIFO algorithm itself, on Go memory so the race detector sees every
// access: concurrent producers, one consumer, a queue much shorter than
// the traffic so it fills and wraps.
func TestFifoAlgorithm(t *testing.T) {
	const producers, count, slots = 6, 3000, 16
	mem := make([]byte, headerSize+8*slots)
	f := newFifo(mem, &layout{fifoOff: headerSize, fifoSlots: slots})
	f.init()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range count {
				for f.push(p, i%maxFrags) != nil {
					runtime.Gosched()
				}
			}
		}()
	}
	next := make([]int, producers)
	var h uint64
	for got := 0; got < producers*count; {
		l, idx, ok := f.pop(h)
		if !ok {
			runtime.Gosched()
			continue
		}
		h++
		got++
		require.Less(t, l, producers)
		require.Equal(t, next[l]%maxFrags, idx, "producer %d", l)
		next[l]++
	}
	wg.Wait()
	_, _, ok := f.pop(h)
	require.False(t, ok, "entry beyond the last one")
}

// sendAndPoll sends one fragment from a to b and polls b until it arrives.
func sendAndPoll(t *testing.T, ep btl.Endpoint, b *Module, in *inbox, size int) {
	t.Helper()
	before, _ := in.count()
	_, err := ep.Send(tagData, []byte("h"), make([]byte, size), nil)
	require.NoError(t, err)
	in.waitFor(t, b, true, 5*time.Second, "fragment", func(n, _ int) bool { return n > before })
}

func requireProtocolFailure(t *testing.T, in *inbox, b *Module, peer int) {
	t.Helper()
	in.waitFor(t, b, true, 5*time.Second, "PeerFailed", func(_, f int) bool { return f > 0 })
	in.mu.Lock()
	defer in.mu.Unlock()
	require.Len(t, in.fails, 1)
	require.Equal(t, peer, in.fails[0].peer)
	require.ErrorIs(t, in.fails[0].err, mpierr.ErrProtocol)
	require.ErrorIs(t, in.fails[0].err, mpierr.ErrProcFailed)
}

// Garbage where the receiver reads: each case fails the sender with a
// protocol error, nothing panics, nothing outside the segment is touched.
func TestCorruptSharedMemory(t *testing.T) {
	type corrupt func(t *testing.T, a, b *Module, e *endpoint)
	atNextEntry := func(w func(seq uint16) uint64) corrupt {
		return func(t *testing.T, a, b *Module, e *endpoint) {
			e.mu.Lock()
			defer e.mu.Unlock()
			word64(e.tx.ring, int(e.tx.pos%e.tx.size)).Store(w(e.tx.seq))
		}
	}
	cases := []struct {
		name   string
		fbox   bool
		before func(t *testing.T, a, b *Module, e *endpoint) // after one good fragment, before polling
	}{
		{"fbox wrong sequence", true, atNextEntry(func(s uint16) uint64 { return packEntry(s+5, entryInline, 0x41, 0, 8) })},
		{"fbox unknown kind", true, atNextEntry(func(s uint16) uint64 { return packEntry(s, 9, 0x41, 0, 8) })},
		{"fbox length past ring", true, atNextEntry(func(s uint16) uint64 { return packEntry(s, entryInline, 0x41, 0, 0xFFFF) })},
		{"fbox header longer than entry", true, atNextEntry(func(s uint16) uint64 { return packEntry(s, entryInline, 0x41, 40, 8) })},
		{"fbox fragment index", true, atNextEntry(func(s uint16) uint64 { return packEntry(s, entryFrag, 0, 0, 60000) })},
		{"fbox all ones", true, atNextEntry(func(uint16) uint64 { return ^uint64(0) })},
		{"fragment length", false, func(t *testing.T, a, b *Module, e *endpoint) {
			_, idx, ok := fifoPeek(b)
			require.True(t, ok)
			off, _ := a.lay.frag(idx)
			word64(a.seg, off+fragMeta).Store(packFragMeta(0x41, 0, 0, 1<<30))
		}},
		{"fragment destination", false, func(t *testing.T, a, b *Module, e *endpoint) {
			_, idx, ok := fifoPeek(b)
			require.True(t, ok)
			off, _ := a.lay.frag(idx)
			word64(a.seg, off+fragDest).Store(7)
		}},
		{"fast box set-up index", false, func(t *testing.T, a, b *Module, e *endpoint) {
			_, idx, ok := fifoPeek(b)
			require.True(t, ok)
			off, _ := a.lay.frag(idx)
			w := word64(a.seg, off+fragMeta)
			w.Store(w.Load() | flagSetupFbox<<8)
			word64(a.seg, off+fragDest).Store(uint64(b.local) | 999<<32)
		}},
		{"FIFO fragment index", false, func(t *testing.T, a, b *Module, e *endpoint) {
			word64(b.fifo.slots, int(b.head&b.fifo.mask)*8).Store(slotFull(b.head, a.local, 0xFFFF))
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			threshold := "1000"
			if c.fbox {
				threshold = "0"
			}
			ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramFboxThreshold, threshold})
			a, b := ranks[0].m, ranks[1].m
			in := newInbox(ranks[1].env.Dispatch, tagData)
			ep, err := a.AddProc(1)
			require.NoError(t, err)
			e := ep.(*endpoint)
			sendAndPoll(t, ep, b, in, 8)
			if c.fbox {
				require.True(t, e.announced)
				c.before(t, a, b, e)
			} else {
				_, err := ep.Send(tagData, []byte("h"), make([]byte, 100), nil)
				require.NoError(t, err)
				c.before(t, a, b, e)
			}
			requireProtocolFailure(t, in, b, 0)
			// The peer stays failed; polling goes on without it.
			for range 10 {
				b.Progress()
			}
			_, fails := in.count()
			require.Equal(t, 1, fails, "PeerFailed reported more than once")
		})
	}
}

func fifoPeek(m *Module) (int, int, bool) {
	w := m.fifo.slot(m.head).Load()
	if w&fifoFull == 0 {
		return 0, 0, false
	}
	return int(w>>16) & (maxLocal - 1), int(uint16(w)), true
}

// A receiver that reports an impossible consumed position in a sender's
// fast box fails that receiver (as the sender sees it).
func TestCorruptConsumedPosition(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramFboxThreshold, "0"}, [2]string{paramFboxSize, "256"})
	a, b := ranks[0].m, ranks[1].m
	in := newInbox(ranks[1].env.Dispatch, tagData)
	fa := newInbox(ranks[0].env.Dispatch)
	ep, err := a.AddProc(1)
	require.NoError(t, err)
	sendAndPoll(t, ep, b, in, 8)
	e := ep.(*endpoint)
	e.tx.ctrl.Store(1 << 40)
	var sendErr error
	for range 100 {
		if _, sendErr = ep.Send(tagData, []byte("h"), make([]byte, 40), nil); sendErr != nil {
			break
		}
	}
	require.ErrorIs(t, sendErr, mpierr.ErrProtocol)
	requireProtocolFailure(t, fa, a, 1)
}

// Put and Get move the bytes; handles are checked before anything moves.
func TestSingleCopy(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 3)
	if ranks[0].m.Caps()&btl.CapRDMA == 0 {
		t.Skipf("cross-memory attach not permitted here: %s", Status())
	}
	target := make([]byte, 1<<20)
	reg, err := ranks[1].m.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	require.NoError(t, err)
	defer reg.Release()
	other, err := ranks[2].m.Register(make([]byte, 64), btl.AccessRemoteWrite)
	require.NoError(t, err)
	defer other.Release()
	ep, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)

	src := fill(1, 2, 100000)
	done, err := ep.Put(src, reg.Handle(), 4321, nil)
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, src, target[4321:4321+len(src)])
	dst := make([]byte, len(src))
	done, err = ep.Get(dst, reg.Handle(), 4321, nil)
	require.NoError(t, err)
	require.True(t, done)
	require.Equal(t, src, dst)

	bad := bytes.Clone(reg.Handle())
	bad[9] ^= 1 // address changed: checksum fails
	for name, h := range map[string][]byte{"corrupted": bad, "other rank's": other.Handle(), "empty": nil} {
		_, err := ep.Put(src[:8], h, 0, nil)
		require.ErrorIs(t, err, btl.ErrBadHandle, name)
		_, err = ep.Get(dst[:8], h, 0, nil)
		require.ErrorIs(t, err, btl.ErrBadHandle, name)
	}
	_, err = ep.Put(src[:8], reg.Handle(), len(target)-7, nil)
	require.ErrorIs(t, err, btl.ErrBadHandle)
	c := ranks[0].m.Counters()
	require.EqualValues(t, 1, c.Puts)
	require.EqualValues(t, 1, c.Gets)
	require.EqualValues(t, len(src), c.PutBytes)
}

func TestSingleCopyNone(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramSingleCopy, "none"})
	require.Zero(t, ranks[0].m.Caps()&btl.CapRDMA)
	require.Contains(t, Status(), "none")
	_, err := ranks[0].m.Register(make([]byte, 8), btl.AccessRemoteRead)
	require.ErrorIs(t, err, mpierr.ErrNotSupported)
}

func TestOpenWithoutStore(t *testing.T) {
	set, err := params.NewSet(nil)
	require.NoError(t, err)
	_, err = component{}.Open(&btl.Env{LocalSize: 2, Params: set, Dispatch: &btl.Dispatcher{}, Logf: func(string, ...any) {}})
	require.ErrorIs(t, err, mpierr.ErrNotSupported)
	require.Contains(t, err.Error(), "store")
}

func TestParams(t *testing.T) {
	for _, o := range [][2]string{{paramFboxSize, "1000"}, {paramSingleCopy, "xpmem"}, {paramSegmentSize, "4k"}, {paramFboxMax, "-1"}, {paramGetSplit, "16k"}, {paramGetChunk, "8k"}, {paramHugeAfter, "-1"}} {
		set, err := params.NewSet([][2]string{o})
		require.NoError(t, err)
		_, err = component{}.Open(&btl.Env{LocalSize: 2, Params: set, Store: btltest.NewStore(), Dispatch: &btl.Dispatcher{}, Logf: func(string, ...any) {}})
		require.ErrorIs(t, err, mpierr.ErrArg, "%v", o)
	}
	set, err := params.NewSet(nil)
	require.NoError(t, err)
	l, caps, excl, err := btl.Settings(set, Name, have)
	require.NoError(t, err)
	require.Equal(t, 16<<10+64, l.EagerLimit)
	require.Equal(t, 32768, l.MaxSendSize)
	require.Equal(t, btl.ExclusivityHigh-1, excl)
	require.Equal(t, have, caps)
	env := &btl.Env{Params: set, Oversubscribed: true}
	cfg, err := readConfig(env)
	require.NoError(t, err)
	require.Zero(t, cfg.spin, "spin when oversubscribed")
	require.Zero(t, cfg.getSplit, "shared Gets when oversubscribed")
	cfg, err = readConfig(&btl.Env{Params: set})
	require.NoError(t, err)
	require.Equal(t, 32<<10, cfg.getSplit)
}

// Ranks not on this host are unreachable; a rank's own number too.
func TestReachability(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2)
	_, err := ranks[0].m.AddProc(0)
	require.ErrorIs(t, err, btl.ErrUnreachable)
	_, err = ranks[0].m.AddProc(5)
	require.ErrorIs(t, err, btl.ErrUnreachable)
	ep, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)
	again, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)
	require.True(t, ep == again)
}

// Close leaves nothing: no descriptor, no mapping, nothing in /dev/shm;
// also after a module was killed.
func TestNoLeftovers(t *testing.T) {
	shm := devShm(t)
	require.Empty(t, memfdState(t), "leftovers of an earlier test")
	func() {
		store := btltest.NewStore()
		job := btltest.JobID()
		var ranks []*testRank
		for i := range 3 {
			r := &testRank{stop: make(chan struct{})}
			r.env, _ = btltest.Env(t, store, job, i, 3)
			mods, err := component{}.Open(r.env)
			require.NoError(t, err)
			r.m = mods[0].(*Module)
			newInbox(r.env.Dispatch, tagData)
			r.startPoller()
			ranks = append(ranks, r)
		}
		for i := range ranks {
			for j := range ranks {
				if i != j {
					ep, err := ranks[i].m.AddProc(j)
					require.NoError(t, err)
					for range 20 {
						_, err := ep.Send(tagData, nil, make([]byte, 64), nil)
						require.NoError(t, err)
					}
				}
			}
		}
		require.NotEmpty(t, memfdState(t))
		ranks[2].m.kill()
		ranks[2].stopPoller()
		for _, r := range ranks[:2] {
			r.stopPoller()
			require.NoError(t, r.m.Close())
			require.NoError(t, r.m.Close(), "second Close")
		}
	}()
	require.Empty(t, memfdState(t))
	require.Equal(t, shm, devShm(t))
}

// cpuTime is this process's user+system CPU time (from /proc/self/stat).
func cpuTime(t *testing.T) time.Duration {
	b, err := os.ReadFile("/proc/self/stat")
	require.NoError(t, err)
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	u, _ := strconv.Atoi(f[11])
	k, _ := strconv.Atoi(f[12])
	return time.Duration(u+k) * 10 * time.Millisecond // USER_HZ 100
}

// A rank blocked with nothing to do uses (almost) no CPU, and a fragment
// wakes it promptly.
func TestBlockIdle(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2)
	a, b := ranks[0].m, ranks[1].m
	in := newInbox(ranks[1].env.Dispatch, tagData)
	ep, err := a.AddProc(1)
	require.NoError(t, err)
	sendAndPoll(t, ep, b, in, 8)

	stop := make(chan struct{})
	var blocks int
	start, c0 := time.Now(), cpuTime(t)
	go func() {
		time.Sleep(time.Second)
		close(stop)
	}()
	for !signalled(stop) {
		b.Block(stop)
		b.Progress()
		blocks++
	}
	wall, cpu := time.Since(start), cpuTime(t)-c0
	t.Logf("blocked %v: %v CPU, %d Block calls", wall, cpu, blocks)
	require.Less(t, cpu, wall/20, "a blocked rank must use under 5%% of a core")

	// Wake-up by a fragment.
	for range 5 {
		before, _ := in.count()
		go func() {
			time.Sleep(20 * time.Millisecond)
			ep.Send(tagData, nil, make([]byte, 8), nil)
		}()
		t0 := time.Now()
		for {
			b.Block(nil)
			b.Progress()
			if n, _ := in.count(); n > before {
				break
			}
		}
		require.Less(t, time.Since(t0), 80*time.Millisecond, "Block slept through a fragment")
	}

	// Wake-up by the channel.
	wake := make(chan struct{}, 1)
	go func() {
		time.Sleep(20 * time.Millisecond)
		wake <- struct{}{}
	}()
	t0 := time.Now()
	b.Block(wake)
	require.Less(t, time.Since(t0), 80*time.Millisecond, "Block ignored wake")
}

// With more ranks than cores Block never spins: it sleeps at once.
func TestBlockOversubscribed(t *testing.T) {
	store := btltest.NewStore()
	job := btltest.JobID()
	var ms []*Module
	for i := range 2 {
		env, _ := btltest.Env(t, store, job, i, 2)
		env.Oversubscribed = true
		mods, err := component{}.Open(env)
		require.NoError(t, err)
		m := mods[0].(*Module)
		t.Cleanup(func() { m.Close() })
		ms = append(ms, m)
	}
	require.Zero(t, ms[1].cfg.spin)
	ep, err := ms[0].AddProc(1)
	require.NoError(t, err)
	got := make(chan struct{}, 100)
	var n atomic.Int32
	ms[1].env.Dispatch.Register(tagData, func(btl.Endpoint, []byte, []byte) {
		n.Add(1)
		got <- struct{}{}
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for n.Load() < 50 {
			if ms[1].Progress() == 0 {
				ms[1].Block(nil)
			}
		}
	}()
	for range 50 {
		_, err := ep.Send(tagData, nil, []byte("x"), nil)
		require.NoError(t, err)
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("fragment not delivered to an oversubscribed rank")
		}
	}
	<-done
}

// Close while senders, pollers and blockers are busy: no deadlock, no
// fault, every send resolves.
func TestCloseUnderLoad(t *testing.T) {
	for round := range 5 {
		ranks := openJob(t, btltest.NewStore(), 3, [2]string{paramFboxThreshold, "4"})
		for _, r := range ranks {
			newInbox(r.env.Dispatch, tagData)
			r.startPoller()
		}
		var wg sync.WaitGroup
		stop := make(chan struct{})
		for from := range ranks {
			for to := range ranks {
				if from == to {
					continue
				}
				ep, err := ranks[from].m.AddProc(to)
				require.NoError(t, err)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; !signalled(stop); i++ {
						size := (i * 997) % ranks[from].m.cfg.maxSend
						if _, err := ep.Send(tagData, nil, make([]byte, size), func(error) {}); err != nil {
							return
						}
					}
				}()
			}
		}
		wg.Add(1)
		go func() { // an extra blocker
			defer wg.Done()
			for !signalled(stop) {
				ranks[1].m.Block(stop)
			}
		}()
		time.Sleep(time.Duration(round+1) * 5 * time.Millisecond)
		done := make(chan struct{})
		go func() {
			ranks[round%3].m.Close()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatal("Close hung")
		}
		close(stop)
		wg.Wait()
	}
}

// The eager limit drops to cheapEagerLimit when a 16 KiB single copy is
// cheap, and stays when it is dear, when the caller set it, or when the
// probe failed.
func TestFitEagerLimit(t *testing.T) {
	for _, tc := range []struct {
		name      string
		overrides [][2]string
		cost      time.Duration
		want      int
	}{
		{"cheap", nil, cheapCMA, cheapEagerLimit},
		{"dear", nil, cheapCMA + 1, defaults.Limits.EagerLimit},
		{"failed probe", nil, 0, defaults.Limits.EagerLimit},
		{"set by the user", [][2]string{{"btl_sm_eager_limit", "16448"}}, time.Nanosecond, 16448},
	} {
		t.Run(tc.name, func(t *testing.T) {
			set, err := params.NewSet(tc.overrides)
			require.NoError(t, err)
			cfg, err := readConfig(&btl.Env{Params: set, LocalSize: 2})
			require.NoError(t, err)
			cfg = fitEagerLimit(&btl.Env{Params: set}, cfg, tc.cost)
			require.Equal(t, tc.want, cfg.limits.EagerLimit)
			require.Equal(t, max(tc.want, cfg.limits.MaxSendSize), cfg.maxSend)
		})
	}
}
