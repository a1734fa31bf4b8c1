package tensor_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

// TestRecvAllocations: in the steady state (meta-data cached, the
// destination recycled), a step of an in-process tensor Recv allocates
// no more than the same step with a plain Recv of the same bytes, plus
// one (the returned tensor's shape, which the caller owns). Each
// allocation on that path measured about 0.13 us after a large copy has
// taken the caches (few, in outbox.go), so the pools that keep it there
// must not quietly stop working.
func TestRecvAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	const size = 64 << 10
	var tensorAllocs, plainAllocs float64
	err := mpi.Run(2, func(w *mpi.Comm) error {
		rv, err := tensor.New(w)
		if err != nil {
			return err
		}
		defer rv.Close()
		data, buf := make([]byte, size), make([]byte, size)
		var flag any = make([]byte, 1)
		var plainBuf, plainData any = buf, data
		ctx := context.Background()
		step := int64(0)
		shape := []int64{size}
		if w.Rank() == 1 { // serves steps until told to stop (flag 0)
			for {
				if _, err := w.Recv(flag, 0, 1); err != nil {
					return err
				}
				switch flag.([]byte)[0] {
				case 0:
					return nil
				case 1:
					step++
					if err := rv.Send(step, "t", tensor.Tensor{DType: tensor.Uint8, Shape: shape, Data: data}); err != nil {
						return err
					}
				case 2:
					if err := w.Send(plainData, 0, 2); err != nil {
						return err
					}
				}
			}
		}
		var failed error
		tensorStep := func() {
			flag.([]byte)[0] = 1
			if err := w.Send(flag, 1, 1); err != nil {
				failed = err
				return
			}
			step++
			t, err := rv.Recv(ctx, step, "t", 1)
			if err != nil {
				failed = err
				return
			}
			rv.Recycle(t)
		}
		plainStep := func() {
			flag.([]byte)[0] = 2
			if err := w.Send(flag, 1, 1); err != nil {
				failed = err
				return
			}
			if _, err := w.Recv(plainBuf, 1, 2); err != nil {
				failed = err
			}
		}
		for range 20 { // warm up: the first step's meta-data round trip, the pools
			tensorStep()
			plainStep()
		}
		tensorAllocs = testing.AllocsPerRun(200, tensorStep)
		plainAllocs = testing.AllocsPerRun(200, plainStep)
		// (No require here: a failed assertion would end this rank's
		// goroutine and leave rank 1 waiting.)
		flag.([]byte)[0] = 0
		if err := w.Send(flag, 1, 1); err != nil {
			return err
		}
		return failed
	})
	require.NoError(t, err)
	t.Logf("allocations per step: tensor Recv %.0f, plain Recv %.0f", tensorAllocs, plainAllocs)
	require.LessOrEqual(t, tensorAllocs, plainAllocs+1, "a tensor Recv's step allocates more than a plain Recv's plus the returned shape")
}
