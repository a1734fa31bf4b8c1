// Command ring passes a token around all ranks: rank 0 starts it with
// value 0, every rank adds its rank number and passes it on, and rank 0
// checks the total when it comes back.
//
//	go run ./cmd/gorun -np 4 ./examples/ring
package main

import (
	"fmt"
	"os"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "ring:", err)
		os.Exit(1)
	}
	if err := ring(world); err != nil {
		fmt.Fprintf(os.Stderr, "ring: rank %d: %v\n", world.Rank(), err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "ring:", err)
		os.Exit(1)
	}
}

func ring(world *mpi.Comm) error {
	rank, size := world.Rank(), world.Size()
	next, prev := (rank+1)%size, (rank-1+size)%size
	token := []int64{0}
	if rank == 0 {
		if err := world.Send(token, next, 0); err != nil {
			return err
		}
		if _, err := world.Recv(token, prev, 0); err != nil {
			return err
		}
		want := int64(size * (size - 1) / 2)
		fmt.Printf("ring of %d ranks: token came back with %d (want %d)\n", size, token[0], want)
		if token[0] != want {
			return fmt.Errorf("token %d, want %d", token[0], want)
		}
		return nil
	}
	if _, err := world.Recv(token, prev, 0); err != nil {
		return err
	}
	token[0] += int64(rank)
	return world.Send(token, next, 0)
}
