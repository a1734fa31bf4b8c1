package pml

import (
	"runtime"
	"testing"
)

// BenchmarkYieldAlone: a yield with nothing else to run on the processor,
// what yieldedTo must stay well above.
func BenchmarkYieldAlone(b *testing.B) {
	for b.Loop() {
		runtime.Gosched()
	}
}

// BenchmarkNap: what one nap (yieldSeparating) costs the waiter: the
// kernel's timer slack, not the nanosecond asked for.
func BenchmarkNap(b *testing.B) {
	for b.Loop() {
		nap()
	}
}
