//go:build !linux

package sys

import "runtime"

// OSYield gives the processor to another goroutine (this package has no
// sched_yield outside Linux).
func OSYield() { runtime.Gosched() }
