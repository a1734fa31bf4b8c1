// Command pingpong bounces messages of growing size between ranks 0 and 1
// and prints the half round-trip time of each size.
//
//	go run ./cmd/gorun -np 2 ./examples/pingpong
package main

import (
	"bytes"
	"fmt"
	"os"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "pingpong:", err)
		os.Exit(1)
	}
	if world.Size() < 2 {
		fmt.Fprintln(os.Stderr, "pingpong: needs at least 2 ranks (gorun -np 2)")
		os.Exit(1)
	}
	if err := run(world); err != nil {
		fmt.Fprintf(os.Stderr, "pingpong: rank %d: %v\n", world.Rank(), err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "pingpong:", err)
		os.Exit(1)
	}
}

func run(world *mpi.Comm) error {
	const iters = 100
	if world.Rank() > 1 {
		return nil
	}
	for size := 1; size <= 4<<20; size *= 4 {
		buf := make([]byte, size)
		want := bytes.Repeat([]byte{byte(size)}, size)
		start := time.Now()
		for i := 0; i < iters; i++ {
			if world.Rank() == 0 {
				copy(buf, want)
				if err := world.Send(buf, 1, 1); err != nil {
					return err
				}
				if _, err := world.Recv(buf, 1, 1); err != nil {
					return err
				}
				if !bytes.Equal(buf, want) {
					return fmt.Errorf("size %d: data came back changed", size)
				}
			} else {
				if _, err := world.Recv(buf, 0, 1); err != nil {
					return err
				}
				if err := world.Send(buf, 0, 1); err != nil {
					return err
				}
			}
		}
		if world.Rank() == 0 {
			fmt.Printf("%9d B  %10.2f us\n", size, float64(time.Since(start).Microseconds())/iters/2)
		}
	}
	return nil
}
