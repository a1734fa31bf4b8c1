//go:build race

package tensor_test

// raceEnabled skips the allocation counts: the race detector allocates.
const raceEnabled = true
