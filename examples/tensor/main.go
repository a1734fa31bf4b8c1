// Command tensor is data-parallel training in miniature: every worker
// computes gradients for the layers of a small model, exchanges them with
// every other worker through the tensor rendezvous (each gradient a named
// tensor, Send on the producer, Recv on the consumer, TensorFlow style),
// averages them and applies the update. At step 4 the embedding's
// vocabulary grows, so its gradient changes shape: the receivers' cached
// meta-data is stale once, and the rendezvous re-requests that tensor.
//
//	go run ./cmd/gorun -np 2 ./examples/tensor
//	go run ./cmd/gorun -np 4 ./examples/tensor -steps 20
//
// Every worker ends with the same weights (checked through a checksum
// compared across ranks); rank 0 prints the rendezvous counters, where
// the steady state shows one request per gradient. Gradients of up to
// 4 KiB (all but the embedding's) ride inline in the answer; the
// embedding's (64 KB) goes by a transport put (tcp, verbs) or is read by
// the receiver (a get: sm, in-process ranks).
package main

import (
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"math"
	"os"
	"time"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

// layer is one trainable variable of the model.
type layer struct {
	name  string
	shape []int64
	w     []float32
}

func main() {
	steps := flag.Int("steps", 8, "training steps")
	checksum := flag.Bool("checksum", false, "verify every transfer with a CRC-32C")
	flag.Parse()
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tensor:", err)
		os.Exit(1)
	}
	if err := train(world, *steps, *checksum); err != nil {
		fmt.Fprintf(os.Stderr, "tensor: rank %d: %v\n", world.Rank(), err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "tensor:", err)
		os.Exit(1)
	}
}

func train(world *mpi.Comm, steps int, checksum bool) error {
	rank, size := world.Rank(), world.Size()
	rv, err := tensor.New(world, tensor.WithChecksum(checksum))
	if err != nil {
		return err
	}
	defer rv.Close()
	model := []*layer{
		{name: "embedding", shape: []int64{1000, 16}},
		{name: "dense1/kernel", shape: []int64{16, 64}},
		{name: "dense1/bias", shape: []int64{64}},
		{name: "dense2/kernel", shape: []int64{64, 10}},
		{name: "dense2/bias", shape: []int64{10}},
	}
	for _, l := range model {
		l.w = make([]float32, elems(l.shape))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const lr = 0.01
	for step := int64(0); step < int64(steps); step++ {
		if step == 4 {
			// The vocabulary grows: the embedding (and its gradient) gains rows.
			e := model[0]
			e.shape = []int64{1200, 16}
			e.w = append(e.w, make([]float32, elems(e.shape)-len(e.w))...)
		}
		// Compute this worker's gradients (a deterministic stand-in for
		// backpropagation over its shard of the batch) and hand them to
		// every other worker. Send never blocks: the consumers pull.
		grads := make([][]float32, len(model))
		for i, l := range model {
			grads[i] = gradient(l, rank, step)
			for peer := 0; peer < size; peer++ {
				if peer == rank {
					continue
				}
				t := tensor.Tensor{DType: tensor.Float32, Shape: l.shape, Data: bytesOf(grads[i])}
				if err := rv.Send(step, gradName(l.name, rank, peer), t); err != nil {
					return err
				}
			}
		}
		// Receive every other worker's gradients, average, apply.
		for i, l := range model {
			// Sum in rank order on every worker, so that all get the same
			// floating-point result.
			sum := make([]float32, len(grads[i]))
			for peer := 0; peer < size; peer++ {
				if peer == rank {
					for j, g := range grads[i] {
						sum[j] += g
					}
					continue
				}
				t, err := rv.Recv(ctx, step, gradName(l.name, peer, rank), peer)
				if err != nil {
					return fmt.Errorf("step %d: %w", step, err)
				}
				if len(t.Data) != 4*len(sum) {
					return fmt.Errorf("step %d: %s from rank %d has shape %v, want %v", step, l.name, peer, t.Shape, l.shape)
				}
				for j := range sum {
					sum[j] += math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*j:]))
				}
				rv.Recycle(t)
			}
			for j := range l.w {
				l.w[j] -= lr * sum[j] / float32(size)
			}
		}
		if rank == 0 {
			fmt.Printf("step %d: weights checksum %08x\n", step, weightsSum(model))
		}
	}
	// Every worker must hold the same model: rank 0 compares checksums.
	mine := []uint32{weightsSum(model)}
	if rank != 0 {
		if err := world.Send(mine, 0, 1); err != nil {
			return err
		}
	} else {
		other := make([]uint32, 1)
		for r := 1; r < size; r++ {
			if _, err := world.Recv(other, r, 1); err != nil {
				return err
			}
			if other[0] != mine[0] {
				return fmt.Errorf("rank %d's weights differ (%08x, rank 0 %08x)", r, other[0], mine[0])
			}
		}
	}
	if err := world.Barrier(); err != nil {
		return err
	}
	if rank == 0 {
		st := rv.Stats()
		fmt.Printf("%d workers agree after %d steps\n", size, steps)
		fmt.Printf("rank 0: requests %d (re-requests %d), cache hits %d / misses %d, control messages %d, puts %d, gets %d, bytes written %d\n",
			st.Requests, st.ReRequests, st.CacheHits, st.CacheMisses, st.ControlMessages, st.Puts, st.Gets, st.BytesWritten)
	}
	return nil
}

// gradName names the gradient of a variable from worker src for worker
// dst: every tensor has one consumer.
func gradName(variable string, src, dst int) string {
	return fmt.Sprintf("%s/grad:%d->%d", variable, src, dst)
}

func gradient(l *layer, rank int, step int64) []float32 {
	g := make([]float32, len(l.w))
	for i := range g {
		g[i] = float32(math.Sin(float64(i+1)*0.001*float64(step+1))) + float32(rank)*0.1 + 0.01*l.w[i]
	}
	return g
}

func elems(shape []int64) int {
	n := 1
	for _, d := range shape {
		n *= int(d)
	}
	return n
}

func bytesOf(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func weightsSum(model []*layer) uint32 {
	h := crc32.NewIEEE()
	for _, l := range model {
		h.Write(bytesOf(l.w))
	}
	return h.Sum32()
}
