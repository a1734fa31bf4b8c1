package mpi_test

import (
	"flag"
	"os"
	"testing"

	"github.com/gompi-org/gompi/pml"
)

// TestMain checks every short reset of a receive request in the PML
// (pml.SetResetCheck) unless benchmarks run, whose figures the check would
// distort.
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		pml.SetResetCheck(true)
	}
	os.Exit(m.Run())
}
