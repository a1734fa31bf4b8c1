package tensor_test

import (
	"encoding/binary"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

// FuzzBadTensorPeer: control messages, whole or in parts, that rank 1 did
// not send (any bytes,
// seeded with a valid message of every kind, so that well-formed messages
// with wrong indices, sizes, handles and kinds come first) reach rank 0
// while its receive of a tensor from rank 1 is under way; then each rank
// sends the other a tensor. Rank 0
// must not panic; its receive from rank 1 may end in any way (a peer may
// fail to send), but Close must return within its deadline on both ranks
// and, once it has, every receive's callback must have run exactly once.
func FuzzBadTensorPeer(f *testing.F) {
	for _, m := range tensor.SampleMessages() {
		f.Add(append([]byte{byte(len(m))}, m...))
	}
	// A message in two parts.
	m := tensor.SampleMessages()[0]
	k := len(m) / 2
	seed := append([]byte{0xFF, 1, 0, byte(k)}, m[:k]...)
	f.Add(append(append(seed, 0xFF, 1, 1, byte(len(m)-k)), m[k:]...))
	f.Fuzz(func(t *testing.T, in []byte) {
		// Records: a length byte and a whole message; or 0xFF, a part's
		// id and last flag, a length byte and the part's bytes.
		type forgery struct {
			part     bool
			hdr, msg []byte
		}
		var forged []forgery
		for len(in) > 0 && len(forged) < 8 {
			var f forgery
			if in[0] == 0xFF && len(in) >= 4 {
				f.part = true
				f.hdr = binary.LittleEndian.AppendUint32(make([]byte, 4, tensor.PartHdrLen), uint32(in[1]%4))
				f.hdr = append(f.hdr, in[2]&1)
				in = in[3:]
			}
			n := min(int(in[0]), len(in)-1)
			f.msg, in = in[1:1+n], in[1+n:]
			forged = append(forged, f)
		}
		content := make([]byte, 4096)
		for i := range content {
			content[i] = byte(i * 7)
		}
		done := make(chan error, 1)
		go func() {
			done <- mpi.Run(2, func(w *mpi.Comm) error {
				rv, err := tensor.New(w)
				if err != nil {
					return err
				}
				var calls atomic.Int32
				got := make(chan struct{}, 1)
				cb := func(tensor.Tensor, error) {
					calls.Add(1)
					got <- struct{}{}
				}
				peer := 1 - w.Rank()
				// Rank 0's receive is pending (its request sent, its answer
				// not) while the forged messages arrive; rank 1 sends after.
				// A Send may fail: a forged message can close or abort.
				if w.Rank() == 1 {
					rv.RecvAsync(1, "b", peer, cb)
					if err := w.Barrier(); err != nil {
						return err
					}
					_ = rv.Send(1, "a", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(len(content))}, Data: content})
				} else {
					rv.RecvAsync(1, "a", peer, cb)
					for _, f := range forged {
						rv.Inject(peer, f.part, f.hdr, f.msg)
					}
					if err := w.Barrier(); err != nil {
						return err
					}
					_ = rv.Send(1, "b", tensor.Tensor{DType: tensor.Float32, Shape: []int64{2}, Data: make([]byte, 8)})
				}
				// The receive may never end on its own (the forged messages
				// may stand for rank 1's answer); Close must end it.
				ended := false
				select {
				case <-got:
					ended = true
				case <-time.After(2 * time.Second):
				}
				closed := make(chan error, 1)
				go func() { closed <- rv.Close() }()
				select {
				case <-closed:
				case <-time.After(10 * time.Second):
					return fmt.Errorf("rank %d: Close did not return", w.Rank())
				}
				if !ended {
					select {
					case <-got:
					case <-time.After(5 * time.Second):
						return fmt.Errorf("rank %d: Close returned, the receive did not end", w.Rank())
					}
				}
				if err := w.Barrier(); err != nil { // both ranks closed: no late callback
					return err
				}
				if n := calls.Load(); n != 1 {
					return fmt.Errorf("rank %d: the receive's callback ran %d times", w.Rank(), n)
				}
				return nil
			})
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("ranks did not finish within 30s")
		}
	})
}
