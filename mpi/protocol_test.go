package mpi_test

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

	"github.com/gompi-org/gompi/mpi"
)

// Sizes around every limit of the self transport (eager limit 1k with a
// 16-byte MATCH header, 32-byte RNDV header, 16k max send size, 128k
// first chunk, 64k/128k pipeline settings) up to 16 MiB.
var protocolSizes = []int{
	0, 1, 7, 8, 255, 256, 257, 991, 992, 993, 1007, 1008, 1009, 1023, 1024, 1025,
	4064, 4096, 16352, 16384, 16385, 65536, 65537, 128 << 10, 128<<10 + 1, 200000,
	1 << 20, 1<<20 + 1, 16 << 20,
}

// seedOf makes the pattern of message i of a phase differ from every
// other message of the test.
func seedOf(phase, i int) uint64 { return uint64(phase*1000 + i) }

const slack = 64 // receive buffers are this much larger; the bytes past the message must stay untouched

// checkMessage checks a receive into buf (len n+slack, filled with 0xA5
// beforehand) of message (phase, i) of n bytes.
func checkMessage(buf []byte, st mpi.Status, n, phase, i int) error {
	if st.Count != n || st.Source != 0 {
		return fmt.Errorf("message of %d bytes (phase %d): status %+v", n, phase, st)
	}
	if d := diff(buf[:n], expected(n, seedOf(phase, i))); d != "" {
		return fmt.Errorf("message of %d bytes (phase %d): %s", n, phase, d)
	}
	for k, b := range buf[n:] {
		if b != 0xA5 {
			return fmt.Errorf("message of %d bytes (phase %d): byte %d past the message was overwritten", n, phase, n+k)
		}
	}
	return nil
}

func recvBuf(n int) []byte { return bytes.Repeat([]byte{0xA5}, n+slack) }

// Every size arrives byte-exact under every forced protocol: blocking
// Send/Recv, receives posted before the sends, sends before the receives
// (unexpected messages), and synchronous sends.
func TestProtocolSizes(t *testing.T) {
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		j := newJob()
		ready := make(chan struct{})
		mustRunJob(t, j, 2, func(w *mpi.Comm) error {
			sender := w.Rank() == 0
			// Phase 1: blocking, in lock step.
			for i, n := range protocolSizes {
				if sender {
					if err := w.Send(pattern(n, seedOf(1, i)), 1, i); err != nil {
						return err
					}
					continue
				}
				buf := recvBuf(n)
				st, err := w.Recv(buf, 0, i)
				if err != nil {
					return err
				}
				if err := checkMessage(buf, st, n, 1, i); err != nil {
					return err
				}
			}
			// Phase 2: every receive posted first.
			// Phase 3: every send started first.
			for _, phase := range []int{2, 3} {
				if sender {
					if phase == 2 {
						if err := j.wait(ready); err != nil {
							return err
						}
					}
					reqs := make([]*mpi.Request, len(protocolSizes))
					for i, n := range protocolSizes {
						var err error
						if reqs[i], err = w.Isend(pattern(n, seedOf(phase, i)), 1, i); err != nil {
							return err
						}
					}
					if phase == 3 {
						if err := j.signal(ready); err != nil {
							return err
						}
					}
					if _, err := mpi.Waitall(reqs); err != nil {
						return err
					}
					continue
				}
				bufs := make([][]byte, len(protocolSizes))
				reqs := make([]*mpi.Request, len(protocolSizes))
				if phase == 3 {
					if err := j.wait(ready); err != nil {
						return err
					}
				}
				for i, n := range protocolSizes {
					bufs[i] = recvBuf(n)
					var err error
					if reqs[i], err = w.Irecv(bufs[i], 0, i); err != nil {
						return err
					}
				}
				if phase == 2 {
					if err := j.signal(ready); err != nil {
						return err
					}
				}
				sts, err := mpi.Waitall(reqs)
				if err != nil {
					return err
				}
				for i, n := range protocolSizes {
					if err := checkMessage(bufs[i], sts[i], n, phase, i); err != nil {
						return err
					}
				}
			}
			// Phase 4: synchronous sends.
			for i, n := range protocolSizes {
				if n > 1<<20 {
					break
				}
				if sender {
					if err := w.Ssend(pattern(n, seedOf(4, i)), 1, i); err != nil {
						return err
					}
					continue
				}
				buf := recvBuf(n)
				st, err := w.Recv(buf, 0, i)
				if err != nil {
					return err
				}
				if err := checkMessage(buf, st, n, 4, i); err != nil {
					return err
				}
			}
			return nil
		}, opts...)
	})
}

// A rank sends to itself under every forced protocol.
func TestSendToSelf(t *testing.T) {
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		mustRun(t, 1, func(w *mpi.Comm) error {
			for i, n := range []int{0, 100, 5000, 300000, 2 << 20} {
				// Send first.
				s, err := w.Isend(pattern(n, seedOf(1, i)), 0, i)
				if err != nil {
					return err
				}
				buf := recvBuf(n)
				st, err := w.Recv(buf, 0, i)
				if err != nil {
					return err
				}
				if _, err := s.Wait(); err != nil {
					return err
				}
				if err := checkMessage(buf, st, n, 1, i); err != nil {
					return err
				}
				// Receive first.
				buf = recvBuf(n)
				r, err := w.Irecv(buf, mpi.AnySource, mpi.AnyTag)
				if err != nil {
					return err
				}
				if err := w.Send(pattern(n, seedOf(2, i)), 0, i); err != nil {
					return err
				}
				if st, err = r.Wait(); err != nil {
					return err
				}
				if err := checkMessage(buf, st, n, 2, i); err != nil {
					return err
				}
			}
			return nil
		}, opts...)
	})
}

// Many goroutines of each rank send and receive messages larger than the
// eager limit at the same time (MPI_THREAD_MULTIPLE): every message
// arrives intact and in order per (source, tag).
func TestThreadMultiple(t *testing.T) {
	const workers, msgs = 8, 6
	size := func(g, i int) int { return 2000 + g*7919 + i*15013 }
	seed := func(rank, g, i int) uint64 { return uint64(rank<<20 | g<<10 | i) }
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		mustRun(t, 2, func(w *mpi.Comm) error {
			me, peer := w.Rank(), 1-w.Rank()
			return goroutines(2*workers, func(k int) error {
				g := k % workers
				if k < workers {
					// Senders: a mix of send modes on tag g.
					for i := range msgs {
						buf := pattern(size(g, i), seed(me, g, i))
						var err error
						switch (g + i) % 4 {
						case 0:
							err = w.Send(buf, peer, g)
						case 1:
							err = w.Ssend(buf, peer, g)
						case 2:
							var r *mpi.Request
							if r, err = w.Isend(buf, peer, g); err == nil {
								_, err = r.Wait()
							}
						default:
							var r *mpi.Request
							if r, err = w.Issend(buf, peer, g); err == nil {
								_, err = r.Wait()
							}
						}
						if err != nil {
							return fmt.Errorf("worker %d message %d: %v", g, i, err)
						}
					}
					return nil
				}
				// Receivers: tag g from the peer, in order.
				for i := range msgs {
					n := size(g, i)
					buf := recvBuf(n)
					var st mpi.Status
					var err error
					if i%2 == 0 {
						st, err = w.Recv(buf, peer, g)
					} else {
						var r *mpi.Request
						if r, err = w.Irecv(buf, peer, g); err == nil {
							st, err = r.Wait()
						}
					}
					if err != nil {
						return fmt.Errorf("worker %d receive %d: %v", g, i, err)
					}
					if st.Count != n || st.Tag != g || st.Source != peer {
						return fmt.Errorf("worker %d receive %d: status %+v, want count %d (order broken?)", g, i, st, n)
					}
					if d := diff(buf[:n], expected(n, seed(peer, g, i))); d != "" {
						return fmt.Errorf("worker %d receive %d: %s", g, i, d)
					}
				}
				return nil
			})
		}, opts...)
	})
}

// Goroutines of the receiving rank take messages with Mprobe(AnySource,
// AnyTag) and Message.Recv concurrently, sized from the probe's status:
// every message is received exactly once, intact.
func TestThreadMultipleMprobe(t *testing.T) {
	const workers, msgs = 6, 8
	size := func(g, i int) int { return 50 + g + i*i*5003 } // distinct per i
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		var mu sync.Mutex
		got := map[[2]int]int{}
		mustRun(t, 2, func(w *mpi.Comm) error {
			return goroutines(workers, func(g int) error {
				if w.Rank() == 0 {
					for i := range msgs {
						if err := w.Send(pattern(size(g, i), uint64(g*1000+i)), 1, g); err != nil {
							return err
						}
					}
					return nil
				}
				for range msgs {
					m, st, err := w.Mprobe(mpi.AnySource, mpi.AnyTag)
					if err != nil {
						return err
					}
					buf := make([]byte, st.Count)
					rst, err := m.Recv(buf)
					if err != nil {
						return err
					}
					if rst.Count != st.Count || rst.Tag != st.Tag || rst.Source != 0 {
						return fmt.Errorf("Message.Recv status %+v differs from Mprobe's %+v", rst, st)
					}
					tag, i := st.Tag, -1
					for k := range msgs {
						if size(tag, k) == st.Count {
							i = k
						}
					}
					if i < 0 {
						return fmt.Errorf("message of %d bytes with tag %d was never sent", st.Count, tag)
					}
					if d := diff(buf, expected(st.Count, uint64(tag*1000+i))); d != "" {
						return fmt.Errorf("message %d of tag %d: %s", i, tag, d)
					}
					mu.Lock()
					got[[2]int{tag, i}]++
					mu.Unlock()
				}
				return nil
			})
		}, opts...)
		for g := range workers {
			for i := range msgs {
				if c := got[[2]int{g, i}]; c != 1 {
					t.Errorf("message %d of tag %d received %d times", i, g, c)
				}
			}
		}
	})
}
