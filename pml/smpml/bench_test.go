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
						s, err := a.Isend(ba, z.Rank(), 1, pml.Standard, nil)
						must(b, err)
						r, err := z.Irecv(bz, a.Rank(), 1)
						must(b, err)
						must(b, z.Engine().Wait(nil, r))
						must(b, a.Engine().Wait(nil, s))
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
func BenchmarkPMLWindow(b *testing.B) {
	for _, size := range []int{8, 512} {
		b.Run(fmt.Sprintf("size=%s", sizeName(size)), func(b *testing.B) {
			c0, c1 := pmlPair(b, [2]string{"pml_wait_spin", "1s"})
			sb, rb := pml.Buffer{Bytes: make([]byte, size)}, pml.Buffer{Bytes: make([]byte, size)}
			const window = 64
			reqs := make([]*pml.Request, 2*window)
			round := func() {
				var err error
				for i := range window {
					reqs[i], err = c0.Isend(sb, 1, 1, pml.Standard, nil)
					must(b, err)
				}
				for i := range window {
					reqs[window+i], err = c1.Irecv(rb, 0, 1)
					must(b, err)
				}
				for _, r := range reqs { // both sides poll: a full fast box queues sends
					for !r.Done() {
						c0.Engine().Progress()
						c1.Engine().Progress()
					}
					if _, err := r.Result(); err != nil {
						b.Fatal(err)
					}
				}
			}
			rounds(b, 10, round, window*1000, "us/msg")
		})
	}
}

// BenchmarkPMLRecvWindow is the receiver's work in gompi-bench rate, on
// one goroutine: the peer's 64 eager sends sit in the fast box (sent with
// IsendNow, as mpi.Isend does, before the window), then 64 Irecv and a
// Wait on each, as a rank in Waitall (ns/msg: per message, both sides).
func BenchmarkPMLRecvWindow(b *testing.B) {
	c0, c1 := pmlPair(b, [2]string{"pml_wait_spin", "1s"})
	sb, rb := pml.Buffer{Bytes: make([]byte, 8)}, pml.Buffer{Bytes: make([]byte, 8)}
	const window = 64
	reqs := make([]*pml.Request, window)
	round := func() {
		c0.Engine().Progress() // the receiver's CREDITs (pml flow control)
		for range window {
			r, err := c0.IsendNow(sb, 1, 1, pml.Standard)
			must(b, err)
			if r != nil {
				b.Fatal("the send did not go at once")
			}
		}
		var err error
		for i := range window {
			reqs[i], err = c1.Irecv(rb, 0, 1)
			must(b, err)
		}
		for _, r := range reqs {
			must(b, c1.Engine().Wait(nil, r))
			if _, err := r.Result(); err != nil {
				b.Fatal(err)
			}
			pml.Recycle(r)
		}
	}
	rounds(b, 100, round, window, "ns/msg")
}

// BenchmarkPMLRecvSinkWindow splits the processor work of gompi-bench rate
// 8 B on one goroutine into the sender's and the receiver's: 64 eager
// IsendNow into the fast box (send-ns/msg), then the PML's share of what
// mpi.Irecv and mpi.WaitallInto do on the receiving rank (recv-ns/msg,
// without mpi's Handles): IrecvSink with a sink per request, the first request held and waited on (which polls
// all 64 in), the others read from their sinks, the held one given back
// with RecycleAll.
func BenchmarkPMLRecvSinkWindow(b *testing.B) {
	c0, c1 := pmlPair(b, [2]string{"pml_wait_spin", "1s"})
	sb, rb := pml.Buffer{Bytes: make([]byte, 8)}, pml.Buffer{Bytes: make([]byte, 8)}
	const window = 64
	reqs := make([]*pml.Request, window)
	sinks := make([]pml.Sink, window)
	var back []*pml.Request
	var sendT, recvT time.Duration
	round := func() {
		c0.Engine().Progress() // the receiver's CREDITs (pml flow control)
		t0 := time.Now()
		for range window {
			r, err := c0.IsendNow(sb, 1, 1, pml.Standard)
			must(b, err)
			if r != nil {
				b.Fatal("the send did not go at once")
			}
		}
		t1 := time.Now()
		var err error
		for i := range reqs {
			s := &sinks[i]
			*s = pml.Sink{}
			s.State.Init(pml.SinkMode)
			reqs[i], err = c1.IrecvSink(rb, 0, 1, s)
			must(b, err)
		}
		back = back[:0]
		for i, r := range reqs {
			s := &sinks[i]
			if s.State.Load()&pml.SinkGone == 0 {
				s.State.Add(1)
				if s.State.Load()&pml.SinkGone == 0 {
					must(b, c1.Engine().Wait(nil, r))
				}
				if x := s.ReleaseKeep(r); x != nil {
					back = append(back, x)
				}
			}
			if _, err := s.Result(); err != nil {
				b.Fatal(err)
			}
		}
		c1.Engine().RecycleAll(back)
		sendT += t1.Sub(t0)
		recvT += time.Since(t1)
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
	b.ReportMetric(float64(sendT.Nanoseconds())/float64(n*window), "send-ns/msg")
	b.ReportMetric(float64(recvT.Nanoseconds())/float64(n*window), "recv-ns/msg")
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
