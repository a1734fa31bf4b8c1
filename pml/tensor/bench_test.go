package tensor_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

// BenchmarkRecv: one steady-state tensor Recv between two in-process
// ranks (meta-data cached, buffer recycled), against a plain Recv of as
// many bytes.
func BenchmarkRecv(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20} {
		for _, plain := range []bool{false, true} {
			name := fmt.Sprintf("size=%dKiB/tensor", size>>10)
			if plain {
				name = fmt.Sprintf("size=%dKiB/mpi", size>>10)
			}
			b.Run(name, func(b *testing.B) {
				b.ReportAllocs()
				b.SetBytes(int64(size))
				err := mpi.Run(2, func(w *mpi.Comm) error {
					rv, err := tensor.New(w)
					if err != nil {
						return err
					}
					defer rv.Close()
					data, buf := make([]byte, size), make([]byte, size)
					ctx := context.Background()
					step := int64(0)
					one := func() error {
						step++
						if w.Rank() == 1 {
							if plain {
								if err := w.Send(data, 0, 1); err != nil {
									return err
								}
							} else if err := rv.Send(step, "t", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: data}); err != nil {
								return err
							}
							_, err := w.Recv(nil, 0, 2)
							return err
						}
						if plain {
							if _, err := w.Recv(buf, 1, 1); err != nil {
								return err
							}
						} else {
							t, err := rv.Recv(ctx, step, "t", 1)
							if err != nil {
								return err
							}
							rv.Recycle(t)
						}
						return w.Send(nil, 1, 2)
					}
					if err := one(); err != nil { // first step: the meta-data round trip
						return err
					}
					if w.Rank() == 0 {
						b.ResetTimer()
						for b.Loop() {
							if err := w.Send([]byte{1}, 1, 3); err != nil {
								return err
							}
							if err := one(); err != nil {
								return err
							}
						}
						return w.Send([]byte{0}, 1, 3)
					}
					flag := []byte{0}
					for {
						if _, err := w.Recv(flag, 0, 3); err != nil || flag[0] == 0 {
							return err
						}
						if err := one(); err != nil {
							return err
						}
					}
				})
				if err != nil {
					b.Fatal(err)
				}
			})
		}
	}
}

// BenchmarkSmallTensors: a step of 256 16-byte tensors received with
// RecvAsync, with and without request batching; reported per tensor.
func BenchmarkSmallTensors(b *testing.B) {
	for _, batching := range []bool{false, true} {
		b.Run(fmt.Sprintf("batching=%v", batching), func(b *testing.B) {
			const k = 256
			names := make([]string, k)
			for i := range names {
				names[i] = fmt.Sprintf("grad/%d", i)
			}
			err := mpi.Run(2, func(w *mpi.Comm) error {
				rv, err := tensor.New(w, tensor.WithBatching(batching))
				if err != nil {
					return err
				}
				defer rv.Close()
				data := make([]byte, 16)
				step := int64(0)
				one := func() error {
					step++
					if w.Rank() == 1 {
						for i := range k {
							if err := rv.Send(step, names[i], tensor.Tensor{DType: tensor.Float32, Shape: []int64{4}, Data: data}); err != nil {
								return err
							}
						}
						_, err := w.Recv(nil, 0, 2)
						return err
					}
					done := make(chan error, k)
					for i := range k {
						rv.RecvAsync(step, names[i], 1, func(t tensor.Tensor, err error) { done <- err })
					}
					for range k {
						if err := <-done; err != nil {
							return err
						}
					}
					return w.Send(nil, 1, 2)
				}
				if err := one(); err != nil {
					return err
				}
				if w.Rank() == 0 {
					b.ResetTimer()
					n := 0
					for b.Loop() {
						if err := w.Send([]byte{1}, 1, 3); err != nil {
							return err
						}
						if err := one(); err != nil {
							return err
						}
						n++
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*k), "ns/tensor")
					return w.Send([]byte{0}, 1, 3)
				}
				flag := []byte{0}
				for {
					if _, err := w.Recv(flag, 0, 3); err != nil || flag[0] == 0 {
						return err
					}
					if err := one(); err != nil {
						return err
					}
				}
			})
			if err != nil {
				b.Fatal(err)
			}
		})
	}
}
