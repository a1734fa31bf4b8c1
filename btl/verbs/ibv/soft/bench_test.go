package soft

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// waiter takes completions from a CQ the way a transport does: it polls
// for a while, then arms the CQ and sleeps on its completion channel.
type waiter struct {
	cq   ibv.CQ
	ch   ibv.CompChannel
	spin int
	wc   [16]ibv.WC
}

// next returns the next completion (or an error).
func (w *waiter) next(ctx context.Context) (ibv.WC, error) {
	for i := 0; ; i++ {
		n, err := w.cq.Poll(w.wc[:1])
		if err != nil || n == 1 {
			return w.wc[0], err
		}
		if i < w.spin || w.ch == nil {
			continue
		}
		if err := w.cq.ReqNotify(false); err != nil {
			return ibv.WC{}, err
		}
		if n, err := w.cq.Poll(w.wc[:1]); err != nil || n == 1 {
			return w.wc[0], err
		}
		c, err := w.ch.GetEvent(ctx)
		if err != nil {
			return ibv.WC{}, err
		}
		c.AckEvents(1)
		i = 0
	}
}

// latencyEnd is one side of the ping-pong, with a channel on its
// receive CQ.
func latencyEnd(b *testing.B, cfg Config, o pairOpts) *end {
	p := New(cfg)
	c, err := p.Open("")
	require.NoError(b, err)
	e := &end{t: b, ctx: c}
	ch, err := c.CreateCompChannel()
	require.NoError(b, err)
	e.pd, _ = c.AllocPD()
	e.scq, _ = c.CreateCQ(o.cqe, nil)
	e.rcq, err = c.CreateCQ(o.cqe, ch)
	require.NoError(b, err)
	e.buf = make([]byte, 4096)
	e.mr, _ = e.pd.RegMR(e.buf, o.mrAccess)
	e.qp, err = e.pd.CreateQP(ibv.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, Cap: ibv.QPCap{
		MaxSendWR: o.sendWR, MaxRecvWR: o.recvWR, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
	require.NoError(b, err)
	b.Cleanup(e.close)
	e.ch = ch
	return e
}

// BenchmarkWriteLatency is a ping-pong of 8-byte inline RDMA
// WRITE_WITH_IMM between two devices; ns/op is one round trip and
// us/one-way half of it. spin=0 sleeps on the completion channel at once
// (as a blocking reader of a socket does); spin=N polls N times first.
func BenchmarkWriteLatency(b *testing.B) {
	for _, drop := range []float64{0, 0.02} {
		for _, spin := range []int{0, 1000} {
			b.Run(dropName(drop)+"/spin="+itoa(spin), func(b *testing.B) {
				o := defaultOpts()
				o.timeout = 10 // 4 ms: a busy host may not run a spinning peer for a few ms
				x := latencyEnd(b, Config{Drop: drop, Seed: 1}, o)
				y := latencyEnd(b, Config{Drop: drop, Seed: 2}, o)
				connect(b, x, y, o)
				const size = 8
				for range 64 {
					_, err := x.qp.PostRecv([]ibv.RecvWR{{}})
					require.NoError(b, err)
					_, err = y.qp.PostRecv([]ibv.RecvWR{{}})
					require.NoError(b, err)
				}
				ctx := waitCtx(b, time.Minute)
				hop := func(e, peer *end, w *waiter, recv, send []ibv.RecvWR, wr []ibv.SendWR) error {
					c, err := w.next(ctx)
					if err != nil {
						return err
					}
					if c.Status != ibv.WCSuccess {
						var s [4]ibv.WC
						k, _ := e.scq.Poll(s[:])
						return fmt.Errorf("receive %v; send CQ %v; %+v", c.Status, s[:k], e.ctx.(*devContext).Counters())
					}
					if _, err := e.qp.PostRecv(recv); err != nil {
						return err
					}
					drainSend(e)
					return nil
				}
				mk := func(e, peer *end) []ibv.SendWR {
					return []ibv.SendWR{{Opcode: ibv.WRRDMAWriteWithImm, Flags: ibv.FlagInline,
						SGList: []ibv.SGEntry{ibv.SGE(e.mr, 0, size)}, RemoteAddr: peer.mr.Addr(), RKey: peer.mr.RKey()}}
				}
				xs, ys := mk(x, y), mk(y, x)
				recv := []ibv.RecvWR{{}}
				n := b.N
				errc := make(chan error, 1)
				var wg sync.WaitGroup
				wg.Add(1)
				go func() {
					defer wg.Done()
					w := &waiter{cq: y.rcq, ch: y.ch, spin: spin}
					for range n {
						if err := hop(y, x, w, recv, nil, nil); err != nil {
							errc <- err
							return
						}
						if _, err := y.qp.PostSend(ys); err != nil {
							errc <- err
							return
						}
					}
					errc <- nil
				}()
				w := &waiter{cq: x.rcq, ch: x.ch, spin: spin}
				xrecv := []ibv.RecvWR{{}}
				b.ReportAllocs()
				b.ResetTimer()
				for range n {
					if _, err := x.qp.PostSend(xs); err != nil {
						b.Fatal(err)
					}
					if err := hop(x, y, w, xrecv, nil, nil); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				wg.Wait()
				require.NoError(b, <-errc)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n)/2000, "us/one-way")
			})
		}
	}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	s := ""
	for ; n > 0; n /= 10 {
		s = string(rune('0'+n%10)) + s
	}
	return s
}

// drainSend polls e's send CQ (unsignalled requests complete silently;
// errors show).
func drainSend(e *end) {
	wc := e.sendWC()
	for {
		k, err := e.scq.Poll(wc)
		if err != nil {
			panic(err)
		}
		for _, c := range wc[:k] {
			if c.Status != ibv.WCSuccess {
				panic(c.Status.String())
			}
		}
		if k < len(wc) {
			return
		}
	}
}

func dropName(d float64) string {
	if d == 0 {
		return "drop=0"
	}
	return "drop=2%"
}

// BenchmarkWriteBandwidth streams 4 MiB RDMA WRITEs, four in flight.
func BenchmarkWriteBandwidth(b *testing.B) {
	for _, drop := range []float64{0, 0.02} {
		b.Run("size=4MiB/"+dropName(drop), func(b *testing.B) {
			const size = 4 << 20
			o := defaultOpts()
			o.bufSize = size
			o.timeout = 8
			x, y := newPair(b, Config{Drop: drop, Seed: 1}, Config{Drop: drop, Seed: 2}, o)
			b.SetBytes(size)
			b.ReportAllocs()
			wc := make([]ibv.WC, 16)
			inflight := 0
			wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWrite, Flags: ibv.FlagSignaled,
				SGList: []ibv.SGEntry{ibv.SGE(x.mr, 0, size)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				for inflight >= 4 {
					k, err := x.scq.Poll(wc)
					require.NoError(b, err)
					for _, c := range wc[:k] {
						if c.Status != ibv.WCSuccess {
							b.Fatalf("%v\nsender %+v\nreceiver %+v", c.Status, x.ctx.(*devContext).Counters(), y.ctx.(*devContext).Counters())
						}
					}
					inflight -= k
				}
				_, err := x.qp.PostSend(wr)
				require.NoError(b, err)
				inflight++
			}
			for inflight > 0 {
				k, err := x.scq.Poll(wc)
				require.NoError(b, err)
				inflight -= k
			}
			b.StopTimer()
			c := x.ctx.(*devContext).Counters()
			b.ReportMetric(float64(c.Retransmits)/float64(b.N), "retransmits/op")
		})
	}
}

// BenchmarkTCPLatency is the baseline: an 8-byte ping-pong over Go TCP
// on loopback; ns/op is one round trip.
func BenchmarkTCPLatency(b *testing.B) {
	c1, c2 := tcpPair(b)
	go func() {
		buf := make([]byte, 8)
		for {
			if _, err := io.ReadFull(c2, buf); err != nil {
				return
			}
			if _, err := c2.Write(buf); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 8)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c1.Write(buf); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(c1, buf); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2000, "us/one-way")
}

// BenchmarkTCPBandwidth is the baseline: 4 MiB writes over Go TCP on
// loopback.
func BenchmarkTCPBandwidth(b *testing.B) {
	b.Run("size=4MiB", func(b *testing.B) {
		const size = 4 << 20
		c1, c2 := tcpPair(b)
		done := make(chan struct{})
		n := b.N
		go func() {
			buf := make([]byte, size)
			for i := 0; i < n; i++ {
				if _, err := io.ReadFull(c2, buf); err != nil {
					break
				}
			}
			close(done)
		}()
		buf := make([]byte, size)
		b.SetBytes(size)
		b.ResetTimer()
		for i := 0; i < n; i++ {
			if _, err := c1.Write(buf); err != nil {
				b.Fatal(err)
			}
		}
		<-done
	})
}

func tcpPair(b *testing.B) (net.Conn, net.Conn) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(b, err)
	defer l.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			ch <- c
		}
	}()
	c1, err := net.Dial("tcp", l.Addr().String())
	require.NoError(b, err)
	var c2 net.Conn
	select {
	case c2 = <-ch:
	case <-time.After(10 * time.Second):
		b.Fatal("accept timed out")
	}
	b.Cleanup(func() { c1.Close(); c2.Close() })
	return c1, c2
}
