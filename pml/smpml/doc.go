// Package smpml tests and measures the PML over the shared-memory
// transport: two engines of this process joined by two btl/sm modules,
// with no background pollers, so that one goroutine runs both ranks'
// work. It holds tests only (this file is its one non-test file).
//
// It sits above pml and btl/sm and imports both, as mpi does, so that sm's
// own tests need not know the PML and the PML's tests need no transport.
// cg_test.go is the callgrind harness of bench/instr.sh: the instructions
// per message of the path mpi takes for a rate window and a ping-pong.
package smpml
