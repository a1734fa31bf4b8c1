package tensor_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

type outcome struct {
	t   tensor.Tensor
	err error
}

func await(ctx context.Context, ch chan outcome) (outcome, error) {
	select {
	case o := <-ch:
		return o, nil
	case <-ctx.Done():
		return outcome{}, ctx.Err()
	}
}

// TestCancel: a Recv whose context ends returns the context's error; its
// request is withdrawn at the sender (nothing stays registered, nothing is
// written later) and the tensor stays there for a later Recv. For a small
// tensor (inline in the NOTIFY), a middle one (put into a registered
// destination) and a large one (the receiver reads it).
func TestCancel(t *testing.T) {
	for _, size := range []int{256, 8 << 10, 256 << 10} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) { testCancel(t, size) })
	}
}

func testCancel(t *testing.T, size int) {
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		if w.Rank() == 0 {
			// Warm the cache so the cancelled request carries its destination.
			if err := w.Send(nil, 1, 0); err != nil {
				return err
			}
			if _, err := rv.Recv(ctx, 0, "w", 1); err != nil {
				return err
			}
			cctx, cancel := context.WithCancel(ctx)
			go func() {
				// Cancel once the request is on its way.
				for {
					if reqs, _ := rv.Pending(); reqs > 0 {
						cancel()
						return
					}
				}
			}()
			_, err := rv.Recv(cctx, 1, "w", 1)
			if !errors.Is(err, context.Canceled) {
				return fmt.Errorf("cancelled recv: %v", err)
			}
			// The sender's CANCELLED releases the destination: a Barrier
			// with the sender after its answer would race, so wait for it.
			for {
				reqs, regs := rv.Pending()
				if reqs == 0 && regs == 0 {
					break
				}
				if ctx.Err() != nil {
					return fmt.Errorf("withdrawn request still held: %d requests, %d registrations", reqs, regs)
				}
			}
			if err := w.Send(nil, 1, 1); err != nil { // now send step 1
				return err
			}
			got, err := rv.Recv(ctx, 1, "w", 1)
			if err != nil {
				return err
			}
			if string(got.Data) != string(seq(size, 1)) {
				return fmt.Errorf("after cancel: wrong content")
			}
			if st := rv.Stats(); st.Cancels != 1 {
				return fmt.Errorf("stats %+v", st)
			}
			return nil
		}
		if _, err := w.Recv(nil, 0, 0); err != nil {
			return err
		}
		if err := rv.Send(0, "w", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: seq(size, 0)}); err != nil {
			return err
		}
		if _, err := w.Recv(nil, 0, 1); err != nil {
			return err
		}
		return rv.Send(1, "w", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: seq(size, 1)})
	})
}

// TestAbortReachesEveryRank: one rank's Abort fails its own pending Recv
// with its error, and the other ranks' pending and later calls with
// mpi.ErrAborted.
func TestAbortReachesEveryRank(t *testing.T) {
	boom := errors.New("boom: out of memory on the parameter server")
	run(t, 3, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		ch := make(chan outcome, 1)
		rv.RecvAsync(0, "never", (w.Rank()+1)%3, func(t tensor.Tensor, err error) { ch <- outcome{t, err} })
		if err := w.Barrier(); err != nil {
			return err
		}
		if w.Rank() == 2 {
			rv.Abort(boom)
		}
		o, err := await(ctx, ch)
		if err != nil {
			return err
		}
		if w.Rank() == 2 {
			if !errors.Is(o.err, boom) {
				return fmt.Errorf("aborting rank's recv: %v", o.err)
			}
		} else if !errors.Is(o.err, mpi.ErrAborted) || !contains(o.err, "boom") {
			return fmt.Errorf("rank %d's recv: %v", w.Rank(), o.err)
		}
		serr := rv.Send(1, "later", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{0}})
		if w.Rank() == 2 && !errors.Is(serr, boom) || w.Rank() != 2 && !errors.Is(serr, mpi.ErrAborted) {
			return fmt.Errorf("send after abort: %v", serr)
		}
		if err := w.Barrier(); err != nil {
			return err
		}
		// Every answer has come: nothing stays registered.
		for {
			if reqs, regs := rv.Pending(); reqs == 0 && regs == 0 {
				return nil
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
	})
}

// TestClose: Close fails the closing rank's pending receives with
// ErrClosed, releases their registrations, and the receives of other
// ranks from it fail with ErrClosed.
func TestClose(t *testing.T) {
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		ch := make(chan outcome, 2)
		if w.Rank() == 0 {
			// Warm the cache: the pending receive holds a registration (8 KiB:
			// not inline, not read by the receiver).
			if err := rv.Send(0, "x", tensor.Tensor{DType: tensor.Int64, Shape: []int64{1024}, Data: make([]byte, 8192)}); err != nil {
				return err
			}
			if _, err := rv.Recv(ctx, 0, "x", 0); err != nil {
				return err
			}
			rv.RecvAsync(1, "x", 0, func(t tensor.Tensor, err error) { ch <- outcome{t, err} })
			rv.RecvAsync(1, "x", 1, func(t tensor.Tensor, err error) { ch <- outcome{t, err} })
			if _, regs := rv.Pending(); regs != 1 {
				return fmt.Errorf("%d registrations before Close", regs)
			}
			if err := rv.Close(); err != nil {
				return err
			}
			for range 2 {
				o, err := await(ctx, ch)
				if err != nil {
					return err
				}
				if !errors.Is(o.err, tensor.ErrClosed) {
					return fmt.Errorf("pending recv at close: %v", o.err)
				}
			}
			if reqs, regs := rv.Pending(); reqs != 0 || regs != 0 {
				return fmt.Errorf("after Close: %d requests, %d registrations", reqs, regs)
			}
			_, err := rv.Recv(ctx, 2, "x", 1)
			if !errors.Is(err, tensor.ErrClosed) {
				return fmt.Errorf("recv after close: %v", err)
			}
			return nil
		}
		_, err := rv.Recv(ctx, 0, "never-sent", 0)
		if !errors.Is(err, tensor.ErrClosed) {
			return fmt.Errorf("recv from a closed rank: %v", err)
		}
		return nil
	})
}

// TestManySmallTensors: hundreds of gradients per step, every order of
// sends and receives, with and without batching.
func TestManySmallTensors(t *testing.T) {
	for _, batching := range []bool{false, true} {
		t.Run(fmt.Sprintf("batching=%v", batching), func(t *testing.T) {
			run(t, 2, []tensor.Option{tensor.WithBatching(batching)}, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
				ctx := deadline(t)
				const n = 300
				peer := 1 - w.Rank()
				for step := range int64(3) {
					ch := make(chan outcome, n)
					for i := range n {
						name := fmt.Sprintf("grad/%d", i)
						rv.RecvAsync(step, name, peer, func(t tensor.Tensor, err error) { ch <- outcome{t, err} })
					}
					// Every request is made before any tensor is sent: they
					// pend together (a RecvAsync with nothing else pending
					// from its source goes at once).
					if err := w.Barrier(); err != nil {
						return err
					}
					for i := range n {
						name := fmt.Sprintf("grad/%d", i)
						if err := rv.Send(step, name, tensor.Tensor{DType: tensor.Float32, Shape: []int64{4}, Data: floats(float32(i), 1, 2, float32(step))}); err != nil {
							return err
						}
					}
					for range n {
						o, err := await(ctx, ch)
						if err != nil {
							return err
						}
						if o.err != nil {
							return o.err
						}
						if len(o.t.Data) != 16 {
							return fmt.Errorf("got %d bytes", len(o.t.Data))
						}
					}
				}
				st := rv.Stats()
				if st.Requests != 3*300 || st.CacheHits != 2*300 {
					return fmt.Errorf("stats %+v", st)
				}
				if batching && st.ControlMessages >= st.Requests+st.ReRequests {
					return fmt.Errorf("batching sent %d control messages for %d requests", st.ControlMessages, st.Requests+st.ReRequests)
				}
				return nil
			})
		})
	}
}

// TestPartedMessages: with fragments of 1 KiB, control messages larger
// than one (a request with a long name, batches of requests and NOTIFYs
// with inline contents) go in parts and arrive whole.
func TestPartedMessages(t *testing.T) {
	small := []mpi.Option{mpi.WithParam("btl_self_max_send_size", "1k"), mpi.WithParam("btl_self_eager_limit", "1k")}
	run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
		ctx := deadline(t)
		long := strings.Repeat("n", 3000)
		const n = 40
		peer := 1 - w.Rank()
		for step := range int64(3) {
			ch := make(chan outcome, n)
			for i := range n {
				rv.RecvAsync(step, fmt.Sprintf("g/%d", i), peer, func(t tensor.Tensor, err error) { ch <- outcome{t, err} })
			}
			for i := range n {
				if err := rv.Send(step, fmt.Sprintf("g/%d", i), tensor.Tensor{DType: tensor.Uint8, Shape: []int64{100}, Data: seq(100, byte(i))}); err != nil {
					return err
				}
			}
			if err := rv.Send(step, long, tensor.Tensor{DType: tensor.Uint8, Shape: []int64{3}, Data: seq(3, byte(step))}); err != nil {
				return err
			}
			got, err := rv.Recv(ctx, step, long, peer)
			if err != nil {
				return err
			}
			if string(got.Data) != string(seq(3, byte(step))) {
				return fmt.Errorf("step %d: long-named tensor %v", step, got.Data)
			}
			seen := map[string]bool{}
			for range n {
				o, err := await(ctx, ch)
				if err != nil {
					return err
				}
				if o.err != nil {
					return o.err
				}
				seen[string(o.t.Data)] = true
			}
			for i := range n {
				if !seen[string(seq(100, byte(i)))] {
					return fmt.Errorf("step %d: tensor %d missing or wrong", step, i)
				}
			}
		}
		return nil
	}, small...)
}

// TestBadControlMessage: a malformed control message (or part), or one
// that breaks the protocol, from a peer cuts it off: the receives from it fail with tensor.ErrBadMessage,
// and it is told, so that its receives from this rank fail too.
func TestBadControlMessage(t *testing.T) {
	for _, tc := range []struct {
		name string
		part bool
		hdr  []byte
		msg  []byte
	}{
		{"unknown kind", false, nil, []byte{1, 99}},
		{"truncated request", false, nil, []byte{1, 1, 5}},
		// Well-formed, but CANCELLED for the pending receive (index 1),
		// which rank 0 never withdrew.
		{"cancelled, not withdrawn", false, nil, []byte{2, 7, 1, 1}},
		{"part flag", true, []byte{0, 0, 0, 0, 1, 0, 0, 0, 7}, []byte{1}},
		{"part too long", true, []byte{0, 0, 0, 0, 1, 0, 0, 0, 0}, make([]byte, 65<<10)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run(t, 2, nil, func(w *mpi.Comm, rv *tensor.Rendezvous) error {
				ctx := deadline(t)
				if w.Rank() == 0 {
					ch := make(chan outcome, 1)
					rv.RecvAsync(0, "never", 1, func(t tensor.Tensor, err error) { ch <- outcome{t, err} })
					rv.Inject(1, tc.part, tc.hdr, tc.msg)
					o, err := await(ctx, ch)
					if err != nil {
						return err
					}
					if !errors.Is(o.err, tensor.ErrBadMessage) {
						return fmt.Errorf("recv from the bad peer: %v", o.err)
					}
				} else if _, err := rv.Recv(ctx, 0, "never", 0); !errors.Is(err, tensor.ErrClosed) || !contains(err, "rejected") {
					return fmt.Errorf("recv from the rank that rejected us: %v", err)
				}
				return nil
			})
		})
	}
}
