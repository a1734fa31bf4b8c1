//go:build !linux

package pml

import "time"

// nap: outside Linux the wait only yields (yield.go).
func nap() { time.Sleep(0) }
