// Command halo runs a 1-D decomposed 2-D stencil: each rank owns a block
// of columns of a grid and exchanges its boundary columns with its left
// and right neighbours every step, sending the columns in place with a
// Vector datatype (no hand packing). It checks the result against the
// same computation done serially.
//
//	go run ./cmd/gorun -np 4 ./examples/halo
package main

import (
	"fmt"
	"math"
	"os"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

const (
	rows  = 64 // grid rows
	cols  = 16 // columns per rank (without the two halo columns)
	steps = 20
)

func main() {
	world, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "halo:", err)
		os.Exit(1)
	}
	if err := run(world); err != nil {
		fmt.Fprintf(os.Stderr, "halo: rank %d: %v\n", world.Rank(), err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "halo:", err)
		os.Exit(1)
	}
}

// initial is the starting value of global cell (r, c).
func initial(r, c int) float64 { return math.Sin(float64(r)*0.3) + math.Cos(float64(c)*0.2) }

// step computes one Jacobi step of the 5-point average on the interior of
// a (rows x w) row-major grid with halo columns 0 and w-1.
func step(g []float64, w int) []float64 {
	out := append([]float64(nil), g...)
	for r := 1; r < rows-1; r++ {
		for c := 1; c < w-1; c++ {
			out[r*w+c] = (g[r*w+c] + g[(r-1)*w+c] + g[(r+1)*w+c] + g[r*w+c-1] + g[r*w+c+1]) / 5
		}
	}
	return out
}

func run(world *mpi.Comm) error {
	rank, size := world.Rank(), world.Size()
	w := cols + 2
	grid := make([]float64, rows*w)
	for r := 0; r < rows; r++ {
		for c := 0; c < w; c++ {
			grid[r*w+c] = initial(r, rank*cols+c-1)
		}
	}
	// One column of the local grid: rows elements, w apart.
	col, err := convertor.Vector(rows, 1, w, convertor.Float64)
	if err != nil {
		return err
	}
	if col, err = col.Commit(); err != nil {
		return err
	}
	left, right := rank-1, rank+1
	if left < 0 {
		left = mpi.ProcNull
	}
	if right >= size {
		right = mpi.ProcNull
	}
	for s := 0; s < steps; s++ {
		// Send my first real column left, receive my right halo from the right; and the reverse.
		if _, err := world.Sendrecv(mpi.Typed(grid[1:], 1, col), left, 0, mpi.Typed(grid[w-1:], 1, col), right, 0); err != nil {
			return err
		}
		if _, err := world.Sendrecv(mpi.Typed(grid[w-2:], 1, col), right, 1, mpi.Typed(grid[0:], 1, col), left, 1); err != nil {
			return err
		}
		next := step(grid, w)
		// The global boundary columns stay fixed.
		if rank == 0 {
			for r := 0; r < rows; r++ {
				next[r*w+1] = grid[r*w+1]
			}
		}
		if rank == size-1 {
			for r := 0; r < rows; r++ {
				next[r*w+w-2] = grid[r*w+w-2]
			}
		}
		grid = next
	}
	// Check against the serial computation on the whole grid.
	W := size*cols + 2
	full := make([]float64, rows*W)
	for r := 0; r < rows; r++ {
		for c := 0; c < W; c++ {
			full[r*W+c] = initial(r, c-1)
		}
	}
	for s := 0; s < steps; s++ {
		next := step(full, W)
		for r := 0; r < rows; r++ {
			next[r*W+1], next[r*W+W-2] = full[r*W+1], full[r*W+W-2]
		}
		full = next
	}
	var maxErr float64
	for r := 0; r < rows; r++ {
		for c := 1; c <= cols; c++ {
			maxErr = math.Max(maxErr, math.Abs(grid[r*w+c]-full[r*W+rank*cols+c]))
		}
	}
	if maxErr > 1e-12 {
		return fmt.Errorf("differs from the serial result by %g", maxErr)
	}
	if rank == 0 {
		fmt.Printf("halo: %d ranks, %d steps on a %dx%d grid: matches the serial result\n", size, steps, rows, size*cols)
	}
	return nil
}
