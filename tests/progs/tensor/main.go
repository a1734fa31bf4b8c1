// Command tensor runs the tensor rendezvous between the processes of a
// gorun job, for the multi-process tests:
//
//	tensor exchange   every rank sends every other rank named tensors for 6
//	                  steps (one changes shape at step 3), a string tensor, a
//	                  dead tensor and an invalid one; each rank checks the
//	                  bytes, the ERROR_STATUS and its counters, and prints
//	                  "rank N: ok ..." with them
//	tensor dead       rank 1 exits with status 3 while rank 0 waits in a Recv
//	                  from it; rank 0 prints "rank 0: tensor recv returned:
//	                  ERR (ErrProcFailed=BOOL)" and waits to be stopped
//	tensor abort      the last rank aborts the rendezvous while the others
//	                  wait in Recvs; they print "rank N: aborted: ERR
//	                  (ErrAborted=BOOL)"
//	tensor steady     rank 1 sends rank 0 a 64 KiB tensor per step; after
//	                  the first steps rank 0 prints both ranks' control
//	                  messages, puts (or gets, where the receiver reads)
//	                  and NOTIFYs per tensor in the steady state:
//	                  "steady: control=C puts=P notifies=N"
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

func main() {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "tensor:", err)
		os.Exit(1)
	}
	rv, err := tensor.New(w, tensor.WithChecksum(os.Getenv("TENSOR_CHECKSUM") == "1"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "tensor:", err)
		os.Exit(1)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	switch os.Args[1] {
	case "exchange":
		err = exchange(ctx, w, rv)
	case "dead":
		dead(ctx, w, rv)
	case "abort":
		err = abort(ctx, w, rv)
	case "steady":
		err = steady(ctx, w, rv)
	default:
		err = fmt.Errorf("unknown mode %q", os.Args[1])
	}
	if err == nil {
		err = w.Barrier()
	}
	if err == nil {
		err = rv.Close()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "tensor: rank %d: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "tensor:", err)
		os.Exit(1)
	}
}

func content(n int, step int64, src, dst int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*13) + byte(step)*7 + byte(src)*3 + byte(dst)
	}
	return b
}

func exchange(ctx context.Context, w *mpi.Comm, rv *tensor.Rendezvous) error {
	rank, size := w.Rank(), w.Size()
	const steps = 6
	for step := int64(0); step < steps; step++ {
		n := 1 << 20
		if step >= 3 {
			n = 3 << 19 // changed shape
		}
		for p := 0; p < size; p++ {
			if p == rank {
				continue
			}
			name := fmt.Sprintf("w:%d->%d", rank, p)
			if err := rv.Send(step, name, tensor.Tensor{DType: tensor.Int32, Shape: []int64{int64(n / 4)}, Data: content(n, step, rank, p)}); err != nil {
				return err
			}
		}
		before := rv.Stats()
		for p := 0; p < size; p++ {
			if p == rank {
				continue
			}
			t, err := rv.Recv(ctx, step, fmt.Sprintf("w:%d->%d", p, rank), p)
			if err != nil {
				return fmt.Errorf("step %d from %d: %w", step, p, err)
			}
			if !bytes.Equal(t.Data, content(n, step, p, rank)) || t.Shape[0] != int64(n/4) {
				return fmt.Errorf("step %d from %d: wrong content (shape %v)", step, p, t.Shape)
			}
			rv.Recycle(t)
		}
		after := rv.Stats()
		want := int64(size - 1) // steady state: one TENSOR_REQUEST per tensor
		if step == 0 || step == 3 {
			want *= 2 // and a TENSOR_RE_REQUEST (the META_DATA_RESPONSE is the sender's)
		}
		if got := after.Requests + after.ReRequests - before.Requests - before.ReRequests; got != want {
			return fmt.Errorf("step %d: %d requests and re-requests, want %d", step, got, want)
		}
	}
	// Strings, dead tensors and a sender-side error.
	next, prev := (rank+1)%size, (rank-1+size)%size
	words := []string{"rank", fmt.Sprint(rank), "", "épsilon"}
	if err := rv.Send(100, "words", tensor.Tensor{DType: tensor.String, Shape: []int64{4}, Strings: words}); err != nil {
		return err
	}
	if err := rv.Send(100, "dead", tensor.Tensor{DType: tensor.Float64, Shape: []int64{9}, IsDead: true}); err != nil {
		return err
	}
	if err := rv.Send(100, "bad", tensor.Tensor{DType: tensor.Float64, Shape: []int64{3}, Data: make([]byte, 5)}); err == nil {
		return errors.New("an invalid tensor was accepted")
	}
	t, err := rv.Recv(ctx, 100, "words", prev)
	if err != nil {
		return err
	}
	if fmt.Sprint(t.Strings) != fmt.Sprint([]string{"rank", fmt.Sprint(prev), "", "épsilon"}) {
		return fmt.Errorf("strings %q", t.Strings)
	}
	if t, err = rv.Recv(ctx, 100, "dead", prev); err != nil || !t.IsDead {
		return fmt.Errorf("dead tensor: %+v, %v", t, err)
	}
	if _, err = rv.Recv(ctx, 100, "bad", prev); !errors.Is(err, tensor.ErrRemote) {
		return fmt.Errorf("invalid tensor's request: %v", err)
	}
	_ = next
	if err := w.Barrier(); err != nil {
		return err
	}
	st := rv.Stats()
	fmt.Printf("rank %d: ok requests=%d rerequests=%d metas=%d control=%d puts=%d gets=%d messages=%d hits=%d misses=%d errors=%d\n",
		rank, st.Requests, st.ReRequests, st.MetaResponses, st.ControlMessages, st.Puts, st.Gets, st.MessageContents, st.CacheHits, st.CacheMisses, st.Errors)
	return nil
}

func dead(ctx context.Context, w *mpi.Comm, rv *tensor.Rendezvous) {
	if w.Rank() == 1 {
		// Wait until rank 0's request has been taken, then die.
		if _, err := w.Recv(nil, 0, 5); err != nil {
			os.Exit(1)
		}
		os.Exit(3)
	}
	if w.Rank() == 0 {
		rv.RecvAsync(0, "never", 1, func(t tensor.Tensor, err error) {
			fmt.Printf("rank 0: tensor recv returned: %v (ErrProcFailed=%v)\n", err, errors.Is(err, mpi.ErrProcFailed))
		})
		if err := w.Send(nil, 1, 5); err != nil {
			fmt.Printf("rank 0: send: %v\n", err)
		}
	}
	select {} // gorun stops this rank once rank 1's death is known
}

func abort(ctx context.Context, w *mpi.Comm, rv *tensor.Rendezvous) error {
	rank, size := w.Rank(), w.Size()
	ch := make(chan error, 1)
	rv.RecvAsync(0, "never", (rank+1)%size, func(t tensor.Tensor, err error) { ch <- err })
	if err := w.Barrier(); err != nil {
		return err
	}
	if rank == size-1 {
		rv.Abort(errors.New("loss is NaN"))
	}
	select {
	case err := <-ch:
		fmt.Printf("rank %d: aborted: %v (ErrAborted=%v)\n", rank, err, errors.Is(err, mpi.ErrAborted))
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

func steady(ctx context.Context, w *mpi.Comm, rv *tensor.Rendezvous) error {
	const size, warm, steps = 64 << 10, 3, 50
	data := content(size, 0, 1, 0)
	var before tensor.Stats
	for step := int64(0); step < warm+steps; step++ {
		if step == warm {
			if err := w.Barrier(); err != nil {
				return err
			}
			before = rv.Stats()
		}
		switch w.Rank() {
		case 1:
			if err := rv.Send(step, "steady", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{size}, Data: data}); err != nil {
				return err
			}
		case 0:
			t, err := rv.Recv(ctx, step, "steady", 1)
			if err != nil {
				return err
			}
			if !bytes.Equal(t.Data, data) {
				return fmt.Errorf("step %d: wrong content", step)
			}
			rv.Recycle(t)
		}
	}
	if err := w.Barrier(); err != nil {
		return err
	}
	after := rv.Stats()
	mine := []int64{after.ControlMessages - before.ControlMessages, after.Puts + after.Gets - before.Puts - before.Gets, after.Notifications - before.Notifications}
	switch w.Rank() {
	case 1:
		return w.Send(mine, 0, 7)
	case 0:
		theirs := make([]int64, 3)
		if _, err := w.Recv(theirs, 1, 7); err != nil {
			return err
		}
		fmt.Printf("steady: control=%.2f puts=%.2f notifies=%.2f\n", float64(mine[0]+theirs[0])/steps,
			float64(mine[1]+theirs[1])/steps, float64(mine[2]+theirs[2])/steps)
	}
	return nil
}
