package tensor_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
	"github.com/stretchr/testify/require"
)

// deadline bounds every test's waits.
func deadline(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func floats(vals ...float32) []byte {
	b := make([]byte, 4*len(vals))
	for i, v := range vals {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
	}
	return b
}

func seq(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// run runs body on n in-process ranks, each with a rendezvous over the
// world, closed after a barrier.
func run(t *testing.T, n int, opts []tensor.Option, body func(w *mpi.Comm, rv *tensor.Rendezvous) error, mopts ...mpi.Option) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		done <- mpi.Run(n, func(w *mpi.Comm) error {
			rv, err := tensor.New(w, opts...)
			if err != nil {
				return err
			}
			berr := body(w, rv)
			if berr != nil {
				rv.Abort(berr)
				rv.Close()
				return berr
			}
			if err := w.Barrier(); err != nil {
				return err
			}
			return rv.Close()
		}, mopts...)
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("ranks did not finish within 60s")
	}
}

func TestSteadyStateAndFirstStep(t *testing.T) {
	noPull := tensor.WithPullMin(0)
	type path int
	const (
		viaPut path = iota
		viaGet
		viaMessage
	)
	for _, tc := range []struct {
		name  string
		opts  []tensor.Option
		mopts []mpi.Option
		path  path
	}{
		{"put", []tensor.Option{noPull}, nil, viaPut},
		{"get", nil, nil, viaGet},
		{"checksum", []tensor.Option{noPull, tensor.WithChecksum(true)}, nil, viaPut},
		{"checksum-get", []tensor.Option{tensor.WithChecksum(true)}, nil, viaGet},
		{"nobatching", []tensor.Option{noPull, tensor.WithBatching(false)}, nil, viaPut},
		{"proxy", []tensor.Option{tensor.WithForcedProxy()}, nil, viaPut},
		{"noput", nil, []mpi.Option{mpi.WithParam("btl_self_flags", "send,sendi,inplace")}, viaMessage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, 2, tc.opts, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
				ctx := deadline(t)
				const steps = 5
				for step := int64(0); step < steps; step++ {
					size := 64 << 10
					if step >= 3 {
						size = 96 << 10 // the shape changes midway
					}
					if w.Rank() == 1 {
						if err := rv.Send(step, "grad/w", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: seq(size, byte(step))}); err != nil {
							return err
						}
						continue
					}
					before := rv.Stats()
					got, err := rv.Recv(ctx, step, "grad/w", 1)
					if err != nil {
						return err
					}
					if got.DType != tensor.Uint8 || len(got.Shape) != 1 || got.Shape[0] != int64(size) {
						return fmt.Errorf("step %d: got %v %v", step, got.DType, got.Shape)
					}
					if string(got.Data) != string(seq(size, byte(step))) {
						return fmt.Errorf("step %d: content differs", step)
					}
					after := rv.Stats()
					d := after.ControlMessages - before.ControlMessages
					switch step {
					case 0, 3: // first step, changed shape: REQUEST + RE_REQUEST here (META on the sender)
						if d != 2 || after.ReRequests-before.ReRequests != 1 || after.CacheHits-before.CacheHits != boolInt(step == 3) {
							return fmt.Errorf("step %d: %d control messages sent, stats %+v -> %+v", step, d, before, after)
						}
					default: // steady state: one TENSOR_REQUEST, nothing else
						if d != 1 || after.ReRequests != before.ReRequests || after.CacheHits-before.CacheHits != 1 {
							return fmt.Errorf("step %d: %d control messages sent, stats %+v -> %+v", step, d, before, after)
						}
					}
					rv.Recycle(got)
				}
				if err := w.Barrier(); err != nil {
					return err
				}
				st := rv.Stats()
				if w.Rank() == 1 {
					// Two META_DATA_RESPONSEs (step 0, step 3), five writes.
					if st.MetaResponses != 2 || st.ControlMessages != 2 {
						return fmt.Errorf("sender stats %+v", st)
					}
					if tc.path == viaPut && st.Puts != steps || tc.path == viaMessage && st.MessageContents != steps ||
						tc.path == viaGet && (st.Puts != 0 || st.MessageContents != 0) {
						return fmt.Errorf("sender stats %+v", st)
					}
					// The receiver releases a content it read with its next
					// request: only the last one can still be exposed.
					if n := rv.Exposed(); tc.path == viaGet && n > 1 || tc.path != viaGet && n != 0 {
						return fmt.Errorf("%d contents exposed", n)
					}
				} else {
					if st.Requests != steps || st.ReRequests != 2 || st.CacheMisses != 1 || st.CacheHits != steps-1 {
						return fmt.Errorf("receiver stats %+v", st)
					}
					if tc.path == viaGet && st.Gets != steps || tc.path != viaGet && st.Gets != 0 {
						return fmt.Errorf("receiver stats %+v", st)
					}
					if reqs, regs := rv.Pending(); reqs != 0 || regs != 0 {
						return fmt.Errorf("%d receives and %d registrations left", reqs, regs)
					}
				}
				return nil
			}, tc.mopts...)
		})
	}
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func TestRecvBeforeSendAndStepsNeverMix(t *testing.T) {
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		if w.Rank() == 0 {
			// Post step 1's receive first, then step 0's: each gets its own.
			type res struct {
				t   tensor.Tensor
				err error
			}
			ch1, ch0 := make(chan res, 1), make(chan res, 1)
			rv.RecvAsync(1, "x", 1, func(t tensor.Tensor, err error) { ch1 <- res{t, err} })
			rv.RecvAsync(0, "x", 1, func(t tensor.Tensor, err error) { ch0 <- res{t, err} })
			if err := w.Send([]byte{1}, 1, 0); err != nil { // "requests are out"
				return err
			}
			for i, ch := range []chan res{ch0, ch1} {
				select {
				case r := <-ch:
					if r.err != nil {
						return r.err
					}
					if string(r.t.Data) != string(floats(float32(i), float32(i)+0.5)) {
						return fmt.Errorf("step %d got %v", i, r.t.Data)
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		if _, err := w.Recv(make([]byte, 1), 0, 0); err != nil {
			return err
		}
		// Step 1 first: it must not satisfy step 0's request.
		for _, step := range []int64{1, 0} {
			if err := rv.Send(step, "x", tensor.Tensor{DType: tensor.Float32, Shape: []int64{2}, Data: floats(float32(step), float32(step)+0.5)}); err != nil {
				return err
			}
		}
		return nil
	})
}

func TestDuplicateSend(t *testing.T) {
	run(t, 1, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		tt := tensor.Tensor{DType: tensor.Int32, Shape: []int64{1}, Data: make([]byte, 4)}
		if err := rv.Send(3, "a", tt); err != nil {
			return err
		}
		err := rv.Send(3, "a", tt)
		if !errors.Is(err, tensor.ErrDuplicate) {
			return fmt.Errorf("duplicate send: %v", err)
		}
		if err := rv.Send(4, "a", tt); err != nil { // another step is another tensor
			return err
		}
		// A rank receives from itself.
		got, err := rv.Recv(deadline(t), 3, "a", 0)
		if err != nil || len(got.Data) != 4 {
			return fmt.Errorf("self recv: %v %v", got, err)
		}
		return nil
	})
}

func TestErrorStatus(t *testing.T) {
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		if w.Rank() == 1 {
			err1 := rv.Send(0, "bad-dtype", tensor.Tensor{DType: 99, Shape: []int64{1}, Data: []byte{1}})
			err2 := rv.Send(0, "bad-len", tensor.Tensor{DType: tensor.Float64, Shape: []int64{2, 3}, Data: make([]byte, 40)})
			if err1 == nil || err2 == nil {
				return fmt.Errorf("invalid tensors accepted: %v, %v", err1, err2)
			}
			return nil
		}
		_, err := rv.Recv(ctx, 0, "bad-dtype", 1)
		if !errors.Is(err, tensor.ErrRemote) || !contains(err, "invalid dtype 99") {
			return fmt.Errorf("bad dtype: %v", err)
		}
		_, err = rv.Recv(ctx, 0, "bad-len", 1)
		if !errors.Is(err, tensor.ErrRemote) || !contains(err, "40 data bytes, want 48") {
			return fmt.Errorf("bad length: %v", err)
		}
		if st := rv.Stats(); st.Errors != 2 {
			return fmt.Errorf("errors counted: %+v", st)
		}
		return nil
	})
}

func contains(err error, s string) bool {
	return err != nil && len(s) > 0 && (fmt.Sprint(err) != "" && stringsContains(err.Error(), s))
}

func stringsContains(a, b string) bool {
	for i := 0; i+len(b) <= len(a); i++ {
		if a[i:i+len(b)] == b {
			return true
		}
	}
	return false
}

func TestStringsAndDeadTensors(t *testing.T) {
	run(t, 2, []tensor.Option{tensor.WithChecksum(true)}, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		words := [][]string{{"alpha", "", "γάμμα", "delta"}, {"a", "b", "c", "d"}, {"a", "b", "c", "a much longer string"}}
		for step := range int64(3) {
			if w.Rank() == 1 {
				if err := rv.Send(step, "vocab", tensor.Tensor{DType: tensor.String, Shape: []int64{2, 2}, Strings: words[step]}); err != nil {
					return err
				}
				if err := rv.Send(step, "branch", tensor.Tensor{DType: tensor.Float32, Shape: []int64{1 << 10}, IsDead: true}); err != nil {
					return err
				}
				continue
			}
			got, err := rv.Recv(ctx, step, "vocab", 1)
			if err != nil {
				return err
			}
			if got.DType != tensor.String || fmt.Sprint(got.Strings) != fmt.Sprint(words[step]) || got.Data != nil {
				return fmt.Errorf("step %d: strings %q", step, got.Strings)
			}
			dead, err := rv.Recv(ctx, step, "branch", 1)
			if err != nil {
				return err
			}
			if !dead.IsDead || dead.Data != nil || dead.DType != tensor.Float32 {
				return fmt.Errorf("step %d: dead tensor %+v", step, dead)
			}
		}
		return nil
	})
}

func TestChecksumMismatch(t *testing.T) {
	tensor.SetContentHook(func(b []byte) {
		if len(b) == 1000 {
			b[500] ^= 0x40
		}
	})
	t.Cleanup(func() { tensor.SetContentHook(nil) })
	run(t, 2, []tensor.Option{tensor.WithChecksum(true)}, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		if w.Rank() == 1 {
			if err := rv.Send(0, "ok", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{999}, Data: seq(999, 1)}); err != nil {
				return err
			}
			return rv.Send(0, "corrupted", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{1000}, Data: seq(1000, 1)})
		}
		if _, err := rv.Recv(ctx, 0, "ok", 1); err != nil {
			return err
		}
		_, err := rv.Recv(ctx, 0, "corrupted", 1)
		if !errors.Is(err, tensor.ErrChecksum) {
			return fmt.Errorf("corrupted content: %v", err)
		}
		return nil
	})
}

// TestRegisteredAhead: a tensor sent before its request, whose name's
// last request read the content, is registered by Send; the request then
// reads it with that registration. The registration goes when the
// content is copied (a changed shape), when a request that does not read
// takes the tensor (which also stops registering ahead for the name), and
// at Close. Rank 1 sends; rank 0 reads (the default), rank 2 takes puts.
func TestRegisteredAhead(t *testing.T) {
	const size = 64 << 10
	done := make(chan error, 1)
	go func() {
		done <- mpi.Run(3, func(w *mpi.Comm) error {
			var opts []tensor.Option
			if w.Rank() == 2 {
				opts = append(opts, tensor.WithPullMin(0))
			}
			rv, err := tensor.New(w, opts...)
			if err != nil {
				return err
			}
			defer rv.Close()
			ctx := deadline(t)
			// step: the tensor's step, receiver and size, and whether the
			// sender registers it ahead.
			for _, st := range []struct {
				step  int64
				recv  int
				size  int
				ahead bool
			}{
				{0, 0, size, false},    // first step: nothing known
				{1, 0, size, true},     // rank 0 read step 0
				{2, 0, size, true},     // and step 1
				{3, 0, 2 * size, true}, // a changed shape: the content is copied for the META_DATA_RESPONSE
				{4, 2, size, true},     // taken by rank 2, which does not read
				{5, 0, size, false},    // nothing ahead after that
				{6, 0, size, true},     // rank 0 read step 5
				{7, 0, size, true},     // never received: Close releases it
			} {
				data := seq(st.size, byte(st.step))
				if w.Rank() == 1 {
					if err := rv.Send(st.step, "w", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(st.size)}, Data: data}); err != nil {
						return err
					}
					if n := rv.Ahead(); int64(n) != boolInt(st.ahead) {
						return fmt.Errorf("step %d: %d tensors registered ahead, want %v", st.step, n, st.ahead)
					}
				}
				if err := w.Barrier(); err != nil { // the tensor is in the table before its request
					return err
				}
				if w.Rank() == st.recv && st.step != 7 {
					got, err := rv.Recv(ctx, st.step, "w", 1)
					if err != nil {
						return err
					}
					if string(got.Data) != string(data) {
						return fmt.Errorf("step %d: content differs", st.step)
					}
				}
				if err := w.Barrier(); err != nil {
					return err
				}
				if w.Rank() == 1 && st.step != 7 && rv.Ahead() != 0 {
					return fmt.Errorf("step %d: %d tensors still registered ahead after the receive", st.step, rv.Ahead())
				}
			}
			return w.Barrier()
		})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("ranks did not finish within 60s")
	}
}

// TestOneBufferRegisteredOnce: a producer that sends from one buffer step
// after step (refilling it once the step's tensor was received) has it
// registered once: the registration of the content a request releases,
// the same memory, goes over to the next content. Every step's bytes
// arrive as sent.
func TestOneBufferRegisteredOnce(t *testing.T) {
	const size, steps = 64 << 10, 6
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		buf := make([]byte, size)
		for step := int64(0); step < steps; step++ {
			if w.Rank() == 1 {
				copy(buf, seq(size, byte(step)))
				if err := rv.Send(step, "w", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{size}, Data: buf}); err != nil {
					return err
				}
			} else {
				got, err := rv.Recv(ctx, step, "w", 1)
				if err != nil {
					return err
				}
				if string(got.Data) != string(seq(size, byte(step))) {
					return fmt.Errorf("step %d: content differs", step)
				}
				rv.Recycle(got)
			}
			if err := w.Barrier(); err != nil { // received: rank 1 may refill the buffer
				return err
			}
		}
		// Twice: step 0's content is a copy (sent with the meta-data the
		// receiver did not have yet), then the buffer once.
		if n := rv.Registered(); w.Rank() == 1 && n != 2 {
			return fmt.Errorf("%d registrations in %d steps, want 2", n, steps)
		}
		return nil
	})
}

// TestIndexWrap: after the request index counter wraps, a receive skips
// the index of one still pending; every receive gets its own tensor.
func TestIndexWrap(t *testing.T) {
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		val := func(step int64) tensor.Tensor {
			return tensor.Tensor{DType: tensor.Float32, Shape: []int64{2}, Data: floats(float32(step), float32(step)+0.5)}
		}
		if w.Rank() == 1 {
			if _, err := w.Recv(make([]byte, 1), 0, 0); err != nil { // the receives are posted
				return err
			}
			for step := int64(0); step < 5; step++ {
				if err := rv.Send(step, "x", val(step)); err != nil {
					return err
				}
			}
			return nil
		}
		// Step 0 takes index 1 and stays pending across the wrap.
		ch := make(chan error, 1)
		rv.RecvAsync(0, "x", 1, func(got tensor.Tensor, err error) {
			if err == nil && string(got.Data) != string(val(0).Data) {
				err = fmt.Errorf("step 0 got %v", got.Data)
			}
			ch <- err
		})
		rv.SetNextIndex(tensor.IndexCounterMax - 1)
		type res struct {
			step int64
			t    tensor.Tensor
			err  error
		}
		out := make(chan res, 4)
		for step := int64(1); step < 5; step++ { // counter max-1, max, then 2 and 3 (1 is live)
			rv.RecvAsync(step, "x", 1, func(got tensor.Tensor, err error) { out <- res{step, got, err} })
		}
		if err := w.Send([]byte{1}, 1, 0); err != nil {
			return err
		}
		for i := 0; i < 4; i++ {
			select {
			case r := <-out:
				if r.err != nil {
					return r.err
				}
				if string(r.t.Data) != string(val(r.step).Data) {
					return fmt.Errorf("step %d got %v", r.step, r.t.Data)
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		select {
		case err := <-ch:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// TestSendFromCallback: a RecvAsync callback that sends a large tensor
// (whose Send polls the transports, here from within the handler that
// runs the callback) relays it; the bytes come back whole, and nothing
// waits forever.
func TestSendFromCallback(t *testing.T) {
	const size, steps = 64 << 10, 4
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		if w.Rank() == 1 {
			errs := make(chan error, steps)
			for step := int64(0); step < steps; step++ {
				rv.RecvAsync(step, "out", 0, func(got tensor.Tensor, err error) {
					if err == nil {
						err = rv.Send(step, "back", got)
					}
					errs <- err
				})
			}
			for i := 0; i < steps; i++ {
				select {
				case err := <-errs:
					if err != nil {
						return err
					}
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		}
		for step := int64(0); step < steps; step++ {
			if err := rv.Send(step, "out", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{size}, Data: seq(size, byte(step))}); err != nil {
				return err
			}
			got, err := rv.Recv(ctx, step, "back", 1)
			if err != nil {
				return err
			}
			if string(got.Data) != string(seq(size, byte(step))) {
				return fmt.Errorf("step %d: content differs", step)
			}
		}
		return nil
	})
}
