// Package lockcost measures what a locked instruction costs on this machine:
// an uncontended atomic add or store against a plain increment, and a
// mutex lock/unlock pair, a sync.Pool against a one-slot atomic pointer.
// docs/PERFORMANCE.md ("Fourth session", item 3; "Eighth session")
// uses it to price the locked instructions on the message path.
//
//	go test -bench . ./bench/lockcost
package lockcost

import (
	"sync"
	"sync/atomic"
	"testing"
)

var (
	x  atomic.Int64
	y  int64
	mu sync.Mutex
)

func BenchmarkAtomicAdd(b *testing.B) {
	for b.Loop() {
		x.Add(1)
	}
}

func BenchmarkAtomicStore(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		x.Store(int64(i))
	}
}

func BenchmarkPlainIncrement(b *testing.B) {
	for b.Loop() {
		y++
	}
}

func BenchmarkMutexPair(b *testing.B) {
	for b.Loop() {
		mu.Lock()
		y++
		mu.Unlock()
	}
}

// A request taken and given back through a sync.Pool against a one-slot
// atomic pointer (pml's engine spare: a swap and a compare-and-swap).
type spareReq struct{ _ [416]byte }

var (
	spares = sync.Pool{New: func() any { return new(spareReq) }}
	slot   atomic.Pointer[spareReq]
)

func BenchmarkPoolTakeGive(b *testing.B) {
	for b.Loop() {
		r := spares.Get().(*spareReq)
		spares.Put(r)
	}
}

func BenchmarkSlotTakeGive(b *testing.B) {
	slot.Store(new(spareReq))
	for b.Loop() {
		r := slot.Swap(nil)
		slot.CompareAndSwap(nil, r)
	}
}
