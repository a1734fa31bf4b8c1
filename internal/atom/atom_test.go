package atom

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

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
// sees every store made before it; the reader answers through StoreRel32.
// Fails if the stores were moved after the flag's (by the compiler or the
// processor).
func TestStoreRelPublishes(t *testing.T) {
	const rounds = 100000
	var flag atomic.Uint64
	var ack atomic.Uint32
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
			StoreRel32(&ack, uint32(i))
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
			return ack.Load() == uint32(i)
		})
		if failed {
			return
		}
	}
	require.NoError(t, <-errc)
}

// Goroutines contending for a Mutex (more of them than processors, so
// that waiters park) never overlap in it, and every Lock returns.
func TestMutexExcludes(t *testing.T) {
	var mu Mutex
	var inside atomic.Int32
	count := 0
	const workers, each = 16, 20000
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				mu.Lock()
				if inside.Add(1) != 1 {
					panic("two goroutines inside the lock")
				}
				count++
				if (w+i)%997 == 0 {
					time.Sleep(20 * time.Microsecond) // a long hold now and then: waiters park
				}
				inside.Add(-1)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, workers*each, count)
}

// A goroutine parked behind a long hold takes the lock after the Unlock,
// not before, and TryLock fails while it is held.
func TestMutexLongHold(t *testing.T) {
	var mu Mutex
	mu.Lock()
	require.False(t, mu.TryLock())
	var released atomic.Bool
	got := make(chan bool)
	go func() {
		mu.Lock()
		got <- released.Load()
		mu.Unlock()
	}()
	// Let the waiter get past its spinning and park (it parks without
	// the lock whatever the timing; this only makes the park likely).
	time.Sleep(30 * time.Millisecond)
	released.Store(true)
	mu.Unlock()
	select {
	case after := <-got:
		require.True(t, after, "Lock returned while the lock was held")
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not get the lock after Unlock")
	}
	require.True(t, mu.TryLock())
	mu.Unlock()
}

func TestMutexUnlockUnlockedPanics(t *testing.T) {
	var mu Mutex
	require.PanicsWithValue(t, "atom: unlock of unlocked Mutex", func() { mu.Unlock() })
}

// BenchmarkMutex: an uncontended Lock and Unlock, against sync.Mutex's.
func BenchmarkMutex(b *testing.B) {
	b.Run("atom", func(b *testing.B) {
		var mu Mutex
		for b.Loop() {
			mu.Lock()
			mu.Unlock()
		}
	})
	b.Run("sync", func(b *testing.B) {
		var mu sync.Mutex
		for b.Loop() {
			mu.Lock()
			mu.Unlock()
		}
	})
}
