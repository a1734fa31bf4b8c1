//go:build race

package convertor

// raceEnabled scales the property tests down under the race detector.
const raceEnabled = true
