package self

import (
	"encoding/binary"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
)

// world attaches n modules to a new world; procs, when > 0, stands for
// GOMAXPROCS (a world with more ranks does not hand off). Hand-offs are
// enabled, as an engine that polls does.
func world(t testing.TB, n, procs int) ([]*Module, []*btl.Dispatcher) {
	t.Helper()
	w := NewWorld()
	if procs > 0 {
		w.procs = int32(procs)
	}
	mods := make([]*Module, n)
	ds := make([]*btl.Dispatcher, n)
	for i := range n {
		env, _ := btltest.Env(t, nil, "", i, n)
		ds[i] = env.Dispatch
		m, err := w.Attach(env)
		require.NoError(t, err)
		m.Enable()
		mods[i] = m
		t.Cleanup(func() { m.Close() })
	}
	return mods, ds
}

func TestSuite(t *testing.T) {
	btltest.Run(t, func(t *testing.T, n int) []btltest.Peer {
		mods, ds := world(t, n, 0)
		peers := make([]btltest.Peer, n)
		for i := range n {
			peers[i] = btltest.Peer{Module: mods[i], Dispatch: ds[i]}
		}
		return peers
	})
}

const testTag btl.Tag = 0x41

// got is what a handler saw: the header words, the payload, and whether
// it ran while the test said a send was in progress.
type got struct {
	h0, h1  uint64
	data    string
	inSend  bool
	fromEnd int
}

type recorder struct {
	mu      sync.Mutex
	frags   []got
	sending atomic.Bool
}

func (r *recorder) handler(ep btl.Endpoint, hdr, data []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.frags = append(r.frags, got{h0: binary.LittleEndian.Uint64(hdr), h1: binary.LittleEndian.Uint64(hdr[8:]),
		data: string(data), inSend: r.sending.Load(), fromEnd: ep.Peer()})
}

func (r *recorder) all() []got {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]got(nil), r.frags...)
}

func pair(t *testing.T) (btl.HeaderSender, *Module, *recorder) {
	mods, ds := world(t, 2, 2)
	rec := &recorder{}
	ds[1].Register(testTag, rec.handler)
	ep, err := mods[0].AddProc(1)
	require.NoError(t, err)
	return ep.(btl.HeaderSender), mods[1], rec
}

func send(t *testing.T, hs btl.HeaderSender, rec *recorder, i int, data []byte) {
	t.Helper()
	rec.sending.Store(true)
	require.NoError(t, hs.SendImmediateHeader(testTag, uint64(i), ^uint64(i), data))
	rec.sending.Store(false)
}

// A send to a rank that hands off waits in the ring until the rank
// polls, and arrives intact; a world with more ranks than processors and
// a rank whose engine does not poll (never enabled) get it inside the
// send.
func TestHandOffUntilPolled(t *testing.T) {
	hs, rcv, rec := pair(t)
	send(t, hs, rec, 1, []byte("handed over"))
	send(t, hs, rec, 2, nil)
	require.Empty(t, rec.all(), "a hand-off ran on the sender's goroutine")
	require.Equal(t, 2, rcv.Poll())
	require.Equal(t, 0, rcv.Poll())
	require.Equal(t, []got{
		{h0: 1, h1: ^uint64(1), data: "handed over"},
		{h0: 2, h1: ^uint64(2), data: ""},
	}, rec.all())

	mods, ds := world(t, 3, 2) // more ranks than processors
	rec3 := &recorder{}
	ds[1].Register(testTag, rec3.handler)
	ep, err := mods[0].AddProc(1)
	require.NoError(t, err)
	send(t, ep.(btl.HeaderSender), rec3, 3, []byte("direct"))
	require.Equal(t, []got{{h0: 3, h1: ^uint64(3), data: "direct", inSend: true}}, rec3.all())

	w := NewWorld()
	var plain [2]*Module
	var ds2 [2]*btl.Dispatcher
	for i := range plain {
		env, _ := btltest.Env(t, nil, "", i, 2)
		ds2[i] = env.Dispatch
		var err error
		plain[i], err = w.Attach(env)
		require.NoError(t, err)
		t.Cleanup(func() { plain[i].Close() })
	}
	rec4 := &recorder{}
	ds2[1].Register(testTag, rec4.handler)
	ep, err = plain[0].AddProc(1)
	require.NoError(t, err)
	send(t, ep.(btl.HeaderSender), rec4, 4, []byte("direct"))
	require.Equal(t, []got{{h0: 4, h1: ^uint64(4), data: "direct", inSend: true}}, rec4.all())
}

// Park dispatches what is in the rings; while a goroutine is parked,
// senders dispatch themselves; after Unpark the rings are used again.
func TestHandOffPark(t *testing.T) {
	hs, rcv, rec := pair(t)
	for i := range 3 {
		send(t, hs, rec, i, []byte{byte(i)})
	}
	require.Empty(t, rec.all())
	rcv.Park()
	fs := rec.all()
	require.Len(t, fs, 3)
	for i, f := range fs {
		require.Equal(t, uint64(i), f.h0)
		require.Equal(t, string([]byte{byte(i)}), f.data)
		require.False(t, f.inSend)
	}
	send(t, hs, rec, 3, []byte("while parked"))
	require.Len(t, rec.all(), 4)
	require.True(t, rec.all()[3].inSend)
	rcv.Unpark()
	send(t, hs, rec, 4, nil)
	require.Len(t, rec.all(), 4)
	require.Equal(t, 1, rcv.Poll())
}

// A goroutine parking while a sender hands over: every fragment is
// dispatched by one of the two, with no Poll (nothing waits in a ring for
// a blocked rank).
func TestHandOffParkRace(t *testing.T) {
	hs, rcv, rec := pair(t)
	for i := range 2000 {
		var wg sync.WaitGroup
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := hs.SendImmediateHeader(testTag, uint64(i), 0, nil); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			rcv.Park()
		}()
		wg.Wait()
		require.Len(t, rec.all(), i+1, "fragment %d waits in the ring of a parked rank", i)
		rcv.Unpark()
	}
}

// A sender that finds the ring full dispatches it itself, in order, and
// goes on through the ring; a payload too big for a slot goes directly,
// after what the sender left in the ring (flush). Nothing is lost,
// duplicated or reordered.
func TestHandOffFullRingAndBigPayload(t *testing.T) {
	hs, rcv, rec := pair(t)
	for i := range ringSlots + 3 {
		send(t, hs, rec, i, []byte("x"))
	}
	fs := rec.all()
	require.Len(t, fs, ringSlots, "the sender dispatched the full ring")
	for i, f := range fs {
		require.Equal(t, uint64(i), f.h0)
		require.True(t, f.inSend)
	}
	big := make([]byte, slotData+1)
	for i := range big {
		big[i] = byte(i)
	}
	send(t, hs, rec, ringSlots+3, big)
	fs = rec.all()
	require.Len(t, fs, ringSlots+4)
	for i, f := range fs {
		require.Equal(t, uint64(i), f.h0)
		require.True(t, f.inSend)
	}
	require.Equal(t, string(big), fs[ringSlots+3].data)
	require.Equal(t, 0, rcv.Poll())
}

// A direct delivery (here a SendImmediate) dispatches the sender's
// hand-offs first: a rendezvous header never waits behind them.
func TestDirectFlushesRing(t *testing.T) {
	hs, _, rec := pair(t)
	send(t, hs, rec, 1, []byte("eager"))
	require.Empty(t, rec.all())
	rec.sending.Store(true)
	require.NoError(t, hs.(btl.Endpoint).SendImmediate(testTag, binary.LittleEndian.AppendUint64(make([]byte, 8), 2), []byte("rndv")))
	rec.sending.Store(false)
	fs := rec.all()
	require.Len(t, fs, 2)
	require.Equal(t, "eager", fs[0].data)
	require.Equal(t, "rndv", fs[1].data)
}

// Waits for messages larger than a slot and smaller than spinLarge, in
// worlds with more ranks than processors, and on closed modules do not
// spin.
func TestSpinFor(t *testing.T) {
	mods, _ := world(t, 2, 2)
	require.NotZero(t, mods[0].SpinFor(slotData))
	require.Zero(t, mods[0].SpinFor(slotData+1))
	require.Zero(t, mods[0].SpinFor(spinLarge-1))
	require.NotZero(t, mods[0].SpinFor(spinLarge))
	require.NoError(t, mods[1].Close())
	require.Zero(t, mods[1].SpinFor(0), "closed")
	over, _ := world(t, 3, 2)
	require.Zero(t, over[0].SpinFor(0))
}

// Sends to a closed module fail, hand-off or not.
func TestHandOffClosed(t *testing.T) {
	hs, rcv, _ := pair(t)
	require.NoError(t, rcv.Close())
	require.ErrorIs(t, hs.SendImmediateHeader(testTag, 0, 0, nil), btl.ErrClosed)
}

// Senders on several goroutines and ranks against receivers that poll
// and park in turn: every fragment arrives exactly once, intact, once
// each receiver has polled after the senders finished (as its next call
// would).
func TestHandOffConcurrent(t *testing.T) {
	const n, perSender, senders = 3, 3000, 2
	mods, ds := world(t, n, n)
	recs := make([]*recorder, n)
	for i := range n {
		recs[i] = &recorder{}
		ds[i].Register(testTag, recs[i].handler)
	}
	stop := make(chan struct{})
	var spinners sync.WaitGroup
	for i := range n {
		spinners.Add(1)
		go func(m *Module) {
			defer spinners.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for range 50 {
					m.Poll()
				}
				m.Park()
				runtime.Gosched()
				m.Unpark()
			}
		}(mods[i])
	}
	var wg sync.WaitGroup
	for from := range n {
		for s := range senders {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range perSender {
					to := (from + 1 + k%(n-1)) % n
					ep, err := mods[from].AddProc(to)
					if err != nil {
						t.Error(err)
						return
					}
					id := uint64(from)<<32 | uint64(s)<<24 | uint64(k)
					var data [8]byte
					binary.LittleEndian.PutUint64(data[:], id*3)
					if err := ep.(btl.HeaderSender).SendImmediateHeader(testTag, id, uint64(from), data[:k%9]); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	close(stop)
	spinners.Wait()
	for _, m := range mods {
		m.Poll()
	}
	seen := map[uint64]bool{}
	for to, rec := range recs {
		for _, f := range rec.all() {
			require.False(t, seen[f.h0], "fragment %#x delivered twice", f.h0)
			seen[f.h0] = true
			require.Equal(t, int(f.h1), f.fromEnd, "origin endpoint")
			require.NotEqual(t, to, f.fromEnd)
			k := int(f.h0 & (1<<24 - 1))
			var data [8]byte
			binary.LittleEndian.PutUint64(data[:], f.h0*3)
			require.Equal(t, string(data[:k%9]), f.data)
		}
	}
	require.Len(t, seen, n*senders*perSender)
}

// A goroutine polling in a loop sees a hand-off: the waits of the PML
// (pml.Engine.SetSpinner) rely on it. (The poller's count says who
// dispatched it: the recorder's inSend only says when, and the poller may
// dispatch before the send returns.)
func TestHandOffPolledByAnotherGoroutine(t *testing.T) {
	hs, rcv, rec := pair(t)
	polled := make(chan int)
	go func() {
		n := 0
		deadline := time.Now().Add(10 * time.Second)
		for len(rec.all()) == 0 && time.Now().Before(deadline) {
			n += rcv.Poll()
		}
		polled <- n
	}()
	send(t, hs, rec, 7, []byte("polled"))
	require.Equal(t, 1, <-polled, "the poller did not dispatch the hand-off")
	fs := rec.all()
	require.Len(t, fs, 1)
	require.Equal(t, got{h0: 7, h1: ^uint64(7), data: "polled"}, got{h0: fs[0].h0, h1: fs[0].h1, data: fs[0].data})
}

// btl_self_spin=0 turns spinning off; its value is the spin SpinFor grants
// once the module is enabled.
func TestSelfSpinParam(t *testing.T) {
	for _, c := range []struct {
		val  string
		want time.Duration
	}{{"0", 0}, {"2ms", 2 * time.Millisecond}} {
		env, _ := btltest.Env(t, nil, "", 0, 1, [2]string{"btl_self_spin", c.val})
		m, err := NewWorld().Attach(env)
		require.NoError(t, err)
		require.Zero(t, m.SpinFor(0), "before Enable")
		m.Enable()
		require.Equal(t, c.want, m.SpinFor(0))
		require.NoError(t, m.Close())
	}
}
