//go:build !race

package soft

// wireSync is a no-op without the race detector (see race_on.go).
func wireSync() {}
