//go:build !race

package soft

const raceEnabled = false
