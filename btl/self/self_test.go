package self

import (
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/params"
)

// world attaches n modules to a new world; procs, when > 0, stands for
// GOMAXPROCS (BeginSpin refuses when the world has more ranks).
func world(t testing.TB, n, procs int) ([]*Module, []*btl.Dispatcher) {
	t.Helper()
	w := NewWorld()
	if procs > 0 {
		w.procs = int32(procs)
	}
	mods := make([]*Module, n)
	ds := make([]*btl.Dispatcher, n)
	for i := range n {
		set, err := params.NewSet(nil)
		require.NoError(t, err)
		ds[i] = &btl.Dispatcher{}
		m, err := w.Attach(&btl.Env{Rank: i, Size: n, Params: set, Dispatch: ds[i], Logf: t.Logf})
		require.NoError(t, err)
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

// Without a spinner the handler runs inside the send; with one, the
// fragment waits in the ring until the spinner polls, and arrives intact.
func TestHandOffToSpinner(t *testing.T) {
	hs, rcv, rec := pair(t)
	send(t, hs, rec, 1, []byte("direct"))
	require.Equal(t, []got{{h0: 1, h1: ^uint64(1), data: "direct", inSend: true}}, rec.all())

	require.NotZero(t, rcv.BeginSpin(0))
	send(t, hs, rec, 2, []byte("handed over"))
	send(t, hs, rec, 3, nil)
	require.Len(t, rec.all(), 1, "a hand-off ran on the sender's goroutine")
	require.Equal(t, 2, rcv.Poll())
	require.Equal(t, 0, rcv.Poll())
	rcv.EndSpin()
	require.Equal(t, []got{
		{h0: 1, h1: ^uint64(1), data: "direct", inSend: true},
		{h0: 2, h1: ^uint64(2), data: "handed over"},
		{h0: 3, h1: ^uint64(3), data: ""},
	}, rec.all())
}

// EndSpin dispatches what arrived since the last Poll, in order.
func TestHandOffEndSpinDrains(t *testing.T) {
	hs, rcv, rec := pair(t)
	require.NotZero(t, rcv.BeginSpin(0))
	for i := range 3 {
		send(t, hs, rec, i, []byte{byte(i)})
	}
	require.Empty(t, rec.all())
	rcv.EndSpin()
	fs := rec.all()
	require.Len(t, fs, 3)
	for i, f := range fs {
		require.Equal(t, uint64(i), f.h0)
		require.Equal(t, string([]byte{byte(i)}), f.data)
	}
}

// A sender that finds the ring full dispatches it itself, in order, and
// goes on through the ring; a payload too big for a slot goes directly.
// Nothing is lost or delivered twice.
func TestHandOffFullRingAndBigPayload(t *testing.T) {
	hs, rcv, rec := pair(t)
	require.NotZero(t, rcv.BeginSpin(0))
	for i := range ringSlots + 3 {
		send(t, hs, rec, i, []byte("x"))
	}
	big := make([]byte, slotData+1)
	for i := range big {
		big[i] = byte(i)
	}
	send(t, hs, rec, 100, big)
	fs := rec.all()
	require.Len(t, fs, ringSlots+1, "the full ring and the big payload are dispatched by the sender")
	for i, f := range fs[:ringSlots] {
		require.Equal(t, uint64(i), f.h0)
		require.True(t, f.inSend)
	}
	require.Equal(t, string(big), fs[ringSlots].data)
	require.Equal(t, 3, rcv.Poll())
	rcv.EndSpin()
	fs = rec.all()
	require.Len(t, fs, ringSlots+4)
	for i, f := range fs[ringSlots+1:] {
		require.Equal(t, uint64(ringSlots+i), f.h0)
		require.False(t, f.inSend)
	}
}

// Waits for messages larger than a slot do not spin.
func TestBeginSpinSize(t *testing.T) {
	mods, _ := world(t, 2, 2)
	require.NotZero(t, mods[0].BeginSpin(slotData))
	mods[0].EndSpin()
	require.Zero(t, mods[0].BeginSpin(slotData+1))
}

// A world with more ranks than processors does not spin.
func TestBeginSpinRefusedWhenOversubscribed(t *testing.T) {
	mods, _ := world(t, 3, 2)
	require.Zero(t, mods[0].BeginSpin(0))
	mods2, _ := world(t, 2, 2)
	require.NotZero(t, mods2[0].BeginSpin(0))
	mods2[0].EndSpin()
	require.NoError(t, mods2[1].Close())
	require.Zero(t, mods2[1].BeginSpin(0), "closed")
}

// Sends to a closed module fail, hand-off or not.
func TestHandOffClosed(t *testing.T) {
	hs, rcv, _ := pair(t)
	require.NotZero(t, rcv.BeginSpin(0))
	require.NoError(t, rcv.Close())
	require.ErrorIs(t, hs.SendImmediateHeader(testTag, 0, 0, nil), btl.ErrClosed)
	rcv.EndSpin()
}

// Senders on several goroutines and ranks against receivers that start
// and stop spinning: every fragment arrives exactly once, intact, with no
// Poll after the last EndSpin (nothing is stranded in a ring).
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
				if m.BeginSpin(0) > 0 {
					for range 50 {
						m.Poll()
					}
					m.EndSpin()
				}
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

// A spinner polling in a loop sees a hand-off without EndSpin: the waits
// of the PML (pml.Engine.SetSpinner) rely on it.
func TestHandOffPolledByAnotherGoroutine(t *testing.T) {
	hs, rcv, rec := pair(t)
	require.NotZero(t, rcv.BeginSpin(0))
	done := make(chan struct{})
	go func() {
		defer close(done)
		deadline := time.Now().Add(10 * time.Second)
		for len(rec.all()) == 0 && time.Now().Before(deadline) {
			rcv.Poll()
		}
	}()
	send(t, hs, rec, 7, []byte("polled"))
	<-done
	rcv.EndSpin()
	require.Equal(t, []got{{h0: 7, h1: ^uint64(7), data: "polled"}}, rec.all())
}

// btl_self_spin=0 turns spinning off; its value is the spin BeginSpin grants.
func TestSelfSpinParam(t *testing.T) {
	for _, c := range []struct {
		val  string
		want time.Duration
	}{{"0", 0}, {"2ms", 2 * time.Millisecond}} {
		set, err := params.NewSet([][2]string{{"btl_self_spin", c.val}})
		require.NoError(t, err)
		m, err := NewWorld().Attach(&btl.Env{Rank: 0, Size: 1, Params: set, Dispatch: &btl.Dispatcher{}, Logf: t.Logf})
		require.NoError(t, err)
		got := m.BeginSpin(0)
		require.Equal(t, c.want, got)
		if got > 0 {
			m.EndSpin()
		}
		require.NoError(t, m.Close())
	}
}
