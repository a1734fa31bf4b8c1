//go:build race

package ibvtest

// raceEnabled: the race detector slows memory-heavy cases tenfold.
const raceEnabled = true
