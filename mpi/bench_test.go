package mpi_test

import (
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/mpi"
)

// BenchmarkChannelPingPong is the yardstick for in-process latency: one
// op is a round trip of an 8-byte array between two goroutines.
func BenchmarkChannelPingPong(b *testing.B) {
	ping, pong := make(chan [8]byte), make(chan [8]byte)
	go func() {
		for v := range ping {
			pong <- v
		}
	}()
	var v [8]byte
	b.ReportAllocs()
	for b.Loop() {
		ping <- v
		v = <-pong
	}
	close(ping)
}

// BenchmarkSelfPingPong: one op is a round trip of blocking Send/Recv of
// 8 bytes between two mpi.Run ranks (latency = ns/op / 2).
func BenchmarkSelfPingPong(b *testing.B) {
	for _, n := range []int{8} {
		b.Run(fmt.Sprintf("size=%dB", n), func(b *testing.B) {
			b.ReportAllocs()
			err := mpi.Run(2, func(w *mpi.Comm) error {
				// Converting a slice to the interface parameter allocates
				// once per call unless hoisted, as in any Go API taking any.
				var buf any = make([]byte, n)
				if w.Rank() == 1 {
					for {
						st, err := w.Recv(buf, 0, mpi.AnyTag)
						if err != nil {
							return err
						}
						if st.Tag == 2 {
							return nil
						}
						if err := w.Send(buf, 0, 1); err != nil {
							return err
						}
					}
				}
				for b.Loop() {
					if err := w.Send(buf, 1, 1); err != nil {
						return err
					}
					if _, err := w.Recv(buf, 1, 1); err != nil {
						return err
					}
				}
				return w.Send(buf, 1, 2)
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkSelfBandwidth: one op moves a 4 MiB message from rank 0 to rank
// 1 with the given protocol (rank 1's receive is posted first).
func BenchmarkSelfBandwidth(b *testing.B) {
	const size = 4 << 20
	for _, proto := range []string{"rdma_get", "rdma_put"} {
		b.Run("proto="+proto+"/size=4MiB", func(b *testing.B) {
			b.SetBytes(size)
			b.ReportAllocs()
			err := mpi.Run(2, func(w *mpi.Comm) error {
				buf := make([]byte, size)
				ack := make([]byte, 1)
				if w.Rank() == 1 {
					for {
						r, err := w.Irecv(buf, 0, mpi.AnyTag)
						if err != nil {
							return err
						}
						if err := w.Send(ack, 0, 1); err != nil {
							return err
						}
						st, err := r.Wait()
						if err != nil || st.Tag == 2 {
							return err
						}
					}
				}
				for b.Loop() {
					if _, err := w.Recv(ack, 1, 1); err != nil {
						return err
					}
					if err := w.Send(buf, 1, 1); err != nil {
						return err
					}
				}
				if _, err := w.Recv(ack, 1, 1); err != nil {
					return err
				}
				return w.Send(buf, 1, 2)
			}, mpi.WithParam("pml_force_protocol", proto))
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}

// BenchmarkCopy is the yardstick for in-process bandwidth: copy() of 4 MiB.
func BenchmarkCopy(b *testing.B) {
	src, dst := make([]byte, 4<<20), make([]byte, 4<<20)
	b.SetBytes(4 << 20)
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkSelfExchange: one op is a step of a 2-rank neighbour exchange
// between in-process ranks, two Sendrecv with two tags (bench/ring's sr
// shape); rank 1 does the same number of steps.
func BenchmarkSelfExchange(b *testing.B) {
	b.ReportAllocs()
	steps := make(chan int, 1)
	err := mpi.Run(2, func(w *mpi.Comm) error {
		peer := 1 - w.Rank()
		a, c, d, e := make([]byte, 8), make([]byte, 8), make([]byte, 8), make([]byte, 8)
		step := func() error {
			if _, err := w.Sendrecv(a, peer, 1, c, peer, 1); err != nil {
				return err
			}
			_, err := w.Sendrecv(d, peer, 2, e, peer, 2)
			return err
		}
		if w.Rank() == 1 {
			for range <-steps {
				if err := step(); err != nil {
					return err
				}
			}
			return nil
		}
		steps <- b.N
		b.ResetTimer()
		for range b.N {
			if err := step(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
}
