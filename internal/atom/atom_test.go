package atom

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// spinUntil spins until cond holds, yielding now and then (with one
// processor the other goroutine needs it).
func spinUntil(cond func() bool) {
	for i := 1; !cond(); i++ {
		if i%64 == 0 {
			runtime.Gosched()
		}
	}
}

// Message passing: a goroutine that sees the flag stored by StoreRel64
// sees every store made before it; the reader answers through StoreRel64.
// Fails if the stores were moved after the flag's (by the compiler or the
// processor).
func TestStoreRelPublishes(t *testing.T) {
	const rounds = 100000
	var flag atomic.Uint64
	var ack atomic.Uint64
	data := make([]uint64, 16)
	errc := make(chan error, 1)
	go func() {
		for i := uint64(1); i <= rounds; i++ {
			spinUntil(func() bool { return flag.Load() == i })
			for k, v := range data {
				if v != i {
					errc <- fmt.Errorf("round %d: data[%d] = %d once the flag was seen", i, k, v)
					return
				}
			}
			StoreRel64(&ack, i)
		}
		errc <- nil
	}()
	for i := uint64(1); i <= rounds; i++ {
		for k := range data {
			data[k] = i
		}
		StoreRel64(&flag, i)
		failed := false
		spinUntil(func() bool {
			select {
			case err := <-errc:
				require.NoError(t, err)
				failed = true
				return true
			default:
			}
			return ack.Load() == i
		})
		if failed {
			return
		}
	}
	require.NoError(t, <-errc)
}
