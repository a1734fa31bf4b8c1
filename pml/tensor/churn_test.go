package tensor_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

// TestRecyclingChurn: steps of three names whose sizes (inline, read by
// the receiver, in between) and shapes (so meta-data changes, answered
// with META_DATA_RESPONSE and TENSOR_RE_REQUEST) keep changing, sent from
// two goroutines and received with Recv, RecvAsync and Recvs whose
// deadline may end them before or after the request left (then received
// again: the tensor stays at the sender), and Recvs of steps never sent,
// withdrawn at their deadline. Every tensor arrives with its
// own shape and bytes while the rendezvous's messages, waiters, receives,
// responses and sent tensors go through their pools.
func TestRecyclingChurn(t *testing.T) {
	const steps = 120
	names := []string{"a", "b", "c"}
	sizes := []int{256, 64 << 10, 4 << 10, 300 << 10}
	shapeOf := func(step int64, i int) []int64 {
		n := int64(sizes[(int(step)/17+i)%len(sizes)])
		if (step/5+int64(i))%2 == 0 {
			return []int64{n}
		}
		return []int64{n / 4, 4}
	}
	contentOf := func(step int64, i int, shape []int64) []byte {
		n := 1
		for _, d := range shape {
			n *= int(d)
		}
		return seq(n, byte(step*31)+byte(i*7))
	}
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		if w.Rank() == 1 {
			var wg sync.WaitGroup
			errs := make([]error, 2)
			for g := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for step := int64(1); step <= steps; step++ {
						for i := range names {
							if i%2 != g {
								continue
							}
							shape := shapeOf(step, i)
							err := rv.Send(step, names[i], tensor.Tensor{DType: tensor.Uint8, Shape: shape, Data: contentOf(step, i, shape)})
							if err != nil {
								errs[g] = err
								return
							}
						}
					}
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				return err
			}
			_, err := w.Recv(nil, 0, 9) // until rank 0 has everything
			return err
		}
		check := func(step int64, i int, got tensor.Tensor) error {
			want := shapeOf(step, i)
			if fmt.Sprint(got.Shape) != fmt.Sprint(want) || !bytes.Equal(got.Data, contentOf(step, i, want)) {
				return fmt.Errorf("step %d %q: shape %v (want %v), %d bytes, content wrong", step, names[i], got.Shape, want, len(got.Data))
			}
			return nil
		}
		type async struct {
			step int64
			t    tensor.Tensor
			err  error
		}
		done := make(chan async, steps)
		for step := int64(1); step <= steps; step++ {
			if step%7 == 0 {
				// A step that never comes: the receive is withdrawn when
				// its deadline ends, its request on the way or answered.
				rctx, cancel := context.WithTimeout(ctx, 200*time.Microsecond)
				_, err := rv.Recv(rctx, 1_000_000+step, names[0], 1)
				cancel()
				if !errors.Is(err, context.DeadlineExceeded) {
					return fmt.Errorf("step %d never sent: %v", 1_000_000+step, err)
				}
			}
			for i := range 2 {
				rctx := ctx
				var cancel context.CancelFunc = func() {}
				if (step+int64(i))%7 == 0 {
					rctx, cancel = context.WithTimeout(ctx, time.Duration(step%3)*time.Microsecond)
				}
				got, err := rv.Recv(rctx, step, names[i], 1)
				cancel()
				if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
					got, err = rv.Recv(ctx, step, names[i], 1) // withdrawn: receive it again
				}
				if err != nil {
					return fmt.Errorf("step %d %q: %w", step, names[i], err)
				}
				if err := check(step, i, got); err != nil {
					return err
				}
				if step%2 == 0 {
					rv.Recycle(got)
				}
			}
			rv.RecvAsync(step, names[2], 1, func(t tensor.Tensor, err error) { done <- async{step, t, err} })
		}
		for range steps {
			select {
			case a := <-done:
				if a.err != nil {
					return fmt.Errorf("step %d %q: %w", a.step, names[2], a.err)
				}
				if err := check(a.step, 2, a.t); err != nil {
					return err
				}
			case <-ctx.Done():
				return fmt.Errorf("RecvAsync outcomes: %w", ctx.Err())
			}
		}
		st := rv.Stats()
		t.Logf("rank 0: %d requests, %d re-requests, %d cancels", st.Requests, st.ReRequests, st.Cancels)
		return w.Send(nil, 1, 9)
	})
}
