//go:build race

package launcher_test

func init() { raceEnabled = true }
