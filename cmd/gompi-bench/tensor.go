package main

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

// tensorBench is the tensor mode: the tensor rendezvous (pml/tensor)
// against plain messages of the same size, in the same run, between ranks
// 0 and 1 (rank 1 produces, rank 0 consumes):
//
//   - for each size: the median time of one Recv of a tensor of that
//     size (steady state: meta-data cached, buffer recycled), and of a
//     plain Recv of as many bytes; each iteration ends with a 0-byte ack
//     from rank 0, so rank 1 sends the next only then; batches of the two
//     alternate;
//   - the control messages, puts (or gets, where the receiver reads the
//     content) and NOTIFYs per tensor in the steady state (both ranks'
//     counters);
//   - many small tensors: --tensors tensors of 64 bytes per step received
//     with RecvAsync, tensors per second, against as many plain
//     Isend/Irecv messages (Waitall), with request batching (the default)
//     and without.
func tensorBench(w *mpi.Comm, cfg *config) error {
	rank := w.Rank()
	if rank > 1 {
		return w.Barrier()
	}
	ctx := context.Background()
	plain, err := tensor.New(w)
	if err != nil {
		return err
	}
	defer plain.Close()
	unbatched, err := tensor.New(w, tensor.WithBatching(false))
	if err != nil {
		return err
	}
	defer unbatched.Close()
	if err := warmUp(w, cfg.warmupTime); err != nil {
		return err
	}
	out := cfg.out
	if rank == 0 {
		fmt.Fprintf(out, "# gompi-bench tensor: median of %d batches; Recv time in us\n%10s %14s %14s %8s\n", cfg.batches, "size", "tensor_us", "mpi_us", "ratio")
	}
	step := int64(0)
	for _, size := range cfg.sizes {
		n := cfg.iterations
		if n == 0 {
			n = min(200, max(8, (64<<20)/(size+1)))
		}
		data := make([]byte, size)
		buf := make([]byte, size)
		tensorBatch := func() (time.Duration, error) {
			start := time.Now()
			for i := 0; i < n; i++ {
				step++
				if rank == 1 {
					if err := plain.Send(step, "t", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: data}); err != nil {
						return 0, err
					}
					if _, err := w.Recv(nil, 0, tagAck); err != nil {
						return 0, err
					}
					continue
				}
				t, err := plain.Recv(ctx, step, "t", 1)
				if err != nil {
					return 0, err
				}
				plain.Recycle(t)
				if err := w.Send(nil, 1, tagAck); err != nil {
					return 0, err
				}
			}
			return time.Since(start), nil
		}
		mpiBatch := func() (time.Duration, error) {
			start := time.Now()
			for i := 0; i < n; i++ {
				if rank == 1 {
					if err := w.Send(data, 0, tagData); err != nil {
						return 0, err
					}
					if _, err := w.Recv(nil, 0, tagAck); err != nil {
						return 0, err
					}
					continue
				}
				if _, err := w.Recv(buf, 1, tagData); err != nil {
					return 0, err
				}
				if err := w.Send(nil, 1, tagAck); err != nil {
					return 0, err
				}
			}
			return time.Since(start), nil
		}
		for i := 0; i < max(1, cfg.warmup); i++ {
			if _, err := tensorBatch(); err != nil {
				return err
			}
			if _, err := mpiBatch(); err != nil {
				return err
			}
		}
		var ts, ms []float64
		for b := 0; b < cfg.batches; b++ {
			d, err := tensorBatch()
			if err != nil {
				return err
			}
			ts = append(ts, d.Seconds()/float64(n)*1e6)
			if d, err = mpiBatch(); err != nil {
				return err
			}
			ms = append(ms, d.Seconds()/float64(n)*1e6)
		}
		if rank == 0 {
			t, m := medianOf(ts), medianOf(ms)
			fmt.Fprintf(out, "%10d %14.2f %14.2f %8.3f\n", size, t, m, t/m)
		}
	}
	// Steady-state control messages per tensor: both ranks' counters over
	// the measured steps.
	if err := steadyState(w, plain, &step, out); err != nil {
		return err
	}
	if rank == 0 {
		fmt.Fprintf(out, "# many small tensors: %d x 64 B per step, tensors/s (median of %d batches)\n%-22s %14s\n", cfg.tensors, cfg.batches, "mode", "tensors_per_s")
	}
	for _, mode := range []string{"mpi", "tensor", "tensor-nobatching"} {
		rv := plain
		if mode == "tensor-nobatching" {
			rv = unbatched
		}
		v, err := smallRate(w, cfg, rv, mode == "mpi", &step)
		if err != nil {
			return err
		}
		if rank == 0 {
			fmt.Fprintf(out, "%-22s %14.0f\n", mode, v)
		}
	}
	return w.Barrier()
}

// steadyState exchanges 64 KiB tensors for 100 steps and prints the
// control messages and puts per tensor of both ranks.
func steadyState(w *mpi.Comm, rv *tensor.Rendezvous, step *int64, out interface{ Write([]byte) (int, error) }) error {
	const n, size = 100, 64 << 10
	data := make([]byte, size)
	run := func() error {
		for i := 0; i < n; i++ {
			*step++
			if w.Rank() == 1 {
				if err := rv.Send(*step, "steady", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{size}, Data: data}); err != nil {
					return err
				}
				continue
			}
			t, err := rv.Recv(context.Background(), *step, "steady", 1)
			if err != nil {
				return err
			}
			rv.Recycle(t)
		}
		return w.Barrier()
	}
	if err := run(); err != nil { // first step: the meta-data round trip
		return err
	}
	before := rv.Stats()
	if err := run(); err != nil {
		return err
	}
	after := rv.Stats()
	mine := []int64{after.ControlMessages - before.ControlMessages, after.Puts - before.Puts, after.Gets - before.Gets,
		after.Notifications - before.Notifications}
	if w.Rank() == 1 {
		return w.Send(mine, 0, tagData)
	}
	theirs := make([]int64, len(mine))
	if _, err := w.Recv(theirs, 1, tagData); err != nil {
		return err
	}
	per := func(i int) float64 { return float64(mine[i]+theirs[i]) / n }
	fmt.Fprintf(out, "# steady state (64 KiB, %d tensors): control messages/tensor %.2f, puts/tensor %.2f, gets/tensor %.2f, notifications/tensor %.2f\n",
		n, per(0), per(1), per(2), per(3))
	return nil
}

// smallRate moves cfg.tensors 64-byte tensors (or plain messages) per step
// from rank 1 to rank 0 and returns the median rate.
func smallRate(w *mpi.Comm, cfg *config, rv *tensor.Rendezvous, plainMPI bool, step *int64) (float64, error) {
	k := cfg.tensors
	names := make([]string, k)
	for i := range names {
		names[i] = fmt.Sprintf("grad/%d", i)
	}
	data := make([]byte, 64)
	bufs := make([][]byte, k)
	for i := range bufs {
		bufs[i] = make([]byte, 64)
	}
	reqs := make([]*mpi.Request, k)
	steps := max(2, min(50, 20000/k))
	batch := func() (time.Duration, error) {
		start := time.Now()
		for s := 0; s < steps; s++ {
			*step++
			if w.Rank() == 1 {
				for i := 0; i < k; i++ {
					var err error
					if plainMPI {
						reqs[i], err = w.Isend(data, 0, i)
					} else {
						err = rv.Send(*step, names[i], tensor.Tensor{DType: tensor.Float32, Shape: []int64{16}, Data: data})
					}
					if err != nil {
						return 0, err
					}
				}
				if plainMPI {
					if _, err := mpi.Waitall(reqs); err != nil {
						return 0, err
					}
				}
				if _, err := w.Recv(nil, 0, tagAck); err != nil {
					return 0, err
				}
				continue
			}
			if plainMPI {
				for i := 0; i < k; i++ {
					var err error
					if reqs[i], err = w.Irecv(bufs[i], 1, i); err != nil {
						return 0, err
					}
				}
				if _, err := mpi.Waitall(reqs); err != nil {
					return 0, err
				}
			} else {
				done := make(chan error, k)
				for i := 0; i < k; i++ {
					rv.RecvAsync(*step, names[i], 1, func(t tensor.Tensor, err error) {
						if err == nil {
							rv.Recycle(t)
						}
						done <- err
					})
				}
				for i := 0; i < k; i++ {
					if err := <-done; err != nil {
						return 0, err
					}
				}
			}
			if err := w.Send(nil, 1, tagAck); err != nil {
				return 0, err
			}
		}
		return time.Since(start), nil
	}
	if _, err := batch(); err != nil {
		return 0, err
	}
	var vals []float64
	for b := 0; b < cfg.batches; b++ {
		d, err := batch()
		if err != nil {
			return 0, err
		}
		vals = append(vals, float64(k*steps)/d.Seconds())
	}
	return medianOf(vals), nil
}

func medianOf(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}
