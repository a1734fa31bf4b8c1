package pml

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Yielding in an in-process rank's spinning wait.
//
// Two in-process ranks that spin each need a core. Linux sometimes
// leaves both runtime threads on one core with the other idle
// (/proc/self/task/*/stat during such a phase: both runnable on CPU 1,
// the others asleep); our reading is that a thread woken from its futex
// by the other is placed on its waker's core, and load balancing moves
// it only milliseconds later. The ranks then take turns at every
// yield of spinInbox, and an 8-byte ping-pong moves at 1.9-2.5 us a
// message instead of 0.13-0.19 for as long as that lasts (gompi-bench
// latency --inprocess --batch-log: the first batches of most runs, the
// whole of about one run in six). A yield that took longer than
// yieldedTo is the sign: another thread or goroutine ran on this core
// meanwhile. The waiter then sleeps in the kernel for a moment (nap):
// the timer that ends the sleep wakes this thread on an idle core rather
// than beside the peer's, and each rank keeps a core of its own from then
// on. Not always at the first nap, so a co-located pair naps again
// napEvery later: with 500 us, no batch of 10 runs was slower than 1 us,
// against 5 of 9 runs with phases of 1-8 such batches without naps, and 4
// of 10 runs with phases of up to 14 with 2 ms between naps. A nap takes
// 65-85 us (the kernel's timer slack, not the microsecond asked for:
// go test -run XXX -bench Nap ./pml), so a program whose other goroutines
// keep the cores busy pays at most about a sixth of a waiting rank's
// time.

// yieldedTo is how long a yield takes when another thread or goroutine
// runs in it; alone on its core, a goroutine is back in 60-70 ns
// (go test -run XXX -bench YieldAlone ./pml).
const yieldedTo = time.Microsecond

// napEvery bounds how often a process naps (yieldSeparating).
const napEvery = 500 * time.Microsecond

var (
	clockBase = time.Now()
	lastNap   atomic.Int64 // when this process last napped, in ns since clockBase
)

// yieldSeparating yields the processor, and naps when another thread or
// goroutine ran on this core meanwhile and the process has not napped
// within napEvery.
func yieldSeparating() {
	t := time.Since(clockBase)
	runtime.Gosched()
	if now := time.Since(clockBase); now-t > yieldedTo {
		if last := lastNap.Load(); now-time.Duration(last) >= napEvery && lastNap.CompareAndSwap(last, int64(now)) {
			nap()
		}
	}
}
