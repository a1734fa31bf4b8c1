// Command launch calls mpi.Init and mpi.Finalize and nothing else: what
// bench/launch.sh times under gorun, against bench/launch-initfin.c under mpirun.
package main

import (
	"fmt"
	"os"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	if _, err := mpi.Init(); err != nil {
		fmt.Fprintln(os.Stderr, "launch:", err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "launch:", err)
		os.Exit(1)
	}
}
