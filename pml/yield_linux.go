package pml

import "syscall"

// nap sleeps this thread in the kernel for a moment (yield.go).
func nap() {
	ts := syscall.Timespec{Nsec: 1000}
	syscall.Nanosleep(&ts, nil)
}
