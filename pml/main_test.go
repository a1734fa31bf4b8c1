package pml

import (
	"flag"
	"os"
	"testing"
)

// TestMain checks every short reset of a receive request (SetResetCheck)
// unless benchmarks run, whose figures the check would distort.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		SetResetCheck(true)
	}
	os.Exit(m.Run())
}
