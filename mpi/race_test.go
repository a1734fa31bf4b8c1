//go:build race

package mpi_test

// raceEnabled: the race detector allocates on its own, so the allocation
// counts are not checked under it.
const raceEnabled = true
