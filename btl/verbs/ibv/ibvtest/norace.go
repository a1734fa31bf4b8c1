//go:build !race

package ibvtest

const raceEnabled = false
