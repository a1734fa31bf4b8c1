package smpml

import (
	"fmt"
	"testing"
	"time"

	"github.com/gompi-org/gompi/pml"
)

// BenchmarkPMLRoundTrip runs the code of a ping-pong round trip through
// the PML and sm on one goroutine: Send, then the peer's Recv (which polls
// the fragment in), its Send back and the Recv. No waiting is involved, so
// this is the processor work of two messages, without the cache-line
// transfers between cores (us/one-way is half of it).
func BenchmarkPMLRoundTrip(b *testing.B) {
	for _, size := range []int{0, 8, 512, 4096, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%s", sizeName(size)), func(b *testing.B) {
			c0, c1 := pmlPair(b, [2]string{"pml_wait_spin", "1s"})
			buf0, buf1 := pml.Buffer{Bytes: make([]byte, size)}, pml.Buffer{Bytes: make([]byte, size)}
			round := func() {
				if size > 4000 { // rendezvous: sender and receiver each wait in turn
					one := func(a, z *pml.Comm, ba, bz pml.Buffer) {
						s, err := a.IsendHandle(ba, z.Rank(), 1, pml.Standard, nil)
						must(b, err)
						r, err := z.IrecvHandle(bz, a.Rank(), 1)
						must(b, err)
						_, err = r.Wait(nil)
						must(b, err)
						_, err = s.Wait(nil)
						must(b, err)
					}
					one(c0, c1, buf0, buf1)
					one(c1, c0, buf1, buf0)
					return
				}
				must(b, c0.Send(buf0, 1, 1, pml.Standard))
				_, err := c1.Recv(buf1, 0, 1)
				must(b, err)
				must(b, c1.Send(buf1, 0, 1, pml.Standard))
				_, err = c0.Recv(buf0, 1, 1)
				must(b, err)
			}
			for range 100 {
				round()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				round()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "us/one-way")
		})
	}
}

// must is require.NoError without its cost (testing's Helper walks the stack).
func must(b *testing.B, err error) {
	if err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPMLWindow is the processor work of gompi-bench bw/rate on one
// goroutine: 64 Isend, 64 Irecv, wait for all of them (us/msg per message).
// Both sides poll while a request is not done: a full fast box queues
// sends.
func BenchmarkPMLWindow(b *testing.B) {
	for _, size := range []int{8, 512} {
		b.Run(fmt.Sprintf("size=%s", sizeName(size)), func(b *testing.B) {
			c0, c1 := pmlPair(b, [2]string{"pml_wait_spin", "1s"})
			sb, rb := pml.Buffer{Bytes: make([]byte, size)}, pml.Buffer{Bytes: make([]byte, size)}
			const window = 64
			hs := make([]*pml.Handle, 2*window)
			round := func() {
				var err error
				for i := range window {
					hs[i], err = c0.IsendHandle(sb, 1, 1, pml.Standard, nil)
					must(b, err)
				}
				for i := range window {
					hs[window+i], err = c1.IrecvHandle(rb, 0, 1)
					must(b, err)
				}
				for _, h := range hs {
					for !h.Done() {
						c0.Engine().Progress()
						c1.Engine().Progress()
					}
					_, err := h.Result()
					must(b, err)
				}
			}
			rounds(b, 10, round, window*1000, "us/msg")
		})
	}
}

// BenchmarkPMLRecvWindow is the receiver's work in gompi-bench rate, on
// one goroutine, with a Wait on each request (mpi.Request.Wait) instead of
// a Waitall: the peer's 64 eager sends sit in the fast box (sent before
// the window), then 64 Irecv and their Waits (ns/msg: per message, both
// sides).
func BenchmarkPMLRecvWindow(b *testing.B) {
	c0, c1 := pmlPair(b, [2]string{"pml_wait_spin", "1s"})
	sb, rb := pml.Buffer{Bytes: make([]byte, 8)}, pml.Buffer{Bytes: make([]byte, 8)}
	const window = 64
	hs := make([]*pml.Handle, window)
	round := func() {
		c0.Engine().Progress() // the receiver's CREDITs (pml flow control)
		for range window {
			h, err := c0.IsendHandle(sb, 1, 1, pml.Standard, nil)
			must(b, err)
			if _, ok := h.Ready(); !ok {
				b.Fatal("the send did not go at once")
			}
		}
		var err error
		for i := range window {
			hs[i], err = c1.IrecvHandle(rb, 0, 1)
			must(b, err)
		}
		for _, h := range hs {
			_, err := h.Wait(nil)
			must(b, err)
		}
	}
	rounds(b, 100, round, window, "ns/msg")
}

// BenchmarkPMLRateWindow times what bench/instr.sh counts (cg_test.go):
// gompi-bench rate 8 B on one goroutine, split into the sender's window
// (64 eager Isends into the fast box and their WaitallRelease,
// send-ns/msg) and the receiver's (64 Irecvs and their WaitallRelease,
// recv-ns/msg), each making the PML calls mpi makes.
func BenchmarkPMLRateWindow(b *testing.B) {
	c0, c1 := pmlPair(b, [2]string{"pml_wait_spin", "1s"})
	w := &cgWin{sb: pml.Buffer{Bytes: make([]byte, 8)}, rb: pml.Buffer{Bytes: make([]byte, 8)}}
	checkSendsAtOnce(b, c0, c1, w)
	var sendT, recvT time.Duration
	round := func() {
		t0 := time.Now()
		cgSend(b, c0, w)
		t1 := time.Now()
		cgRecv(b, c1, w)
		sendT += t1.Sub(t0)
		recvT += time.Since(t1)
		c0.Engine().Progress() // the receiver's CREDITs (pml flow control)
	}
	for range 100 {
		round()
	}
	sendT, recvT = 0, 0
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		round()
		n++
	}
	b.ReportMetric(float64(sendT.Nanoseconds())/float64(n*len(w.sends)), "send-ns/msg")
	b.ReportMetric(float64(recvT.Nanoseconds())/float64(n*len(w.recvs)), "recv-ns/msg")
}

// rounds runs round warm times, then as the benchmark's loop, and reports
// the nanoseconds per round divided by per as unit.
func rounds(b *testing.B, warm int, round func(), per float64, unit string) {
	for range warm {
		round()
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		round()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/per, unit)
}
