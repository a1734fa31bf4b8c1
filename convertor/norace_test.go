//go:build !race

package convertor

const raceEnabled = false
