// Command burst sends right after Init: every rank sends its rank number to
// every other rank at once (nonblocking), then receives from each. Ranks
// that are still starting receive fragments from ranks that already
// finished Init. Rank 0 prints "burst ok" when every value arrived.
package main

import (
	"fmt"
	"os"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "burst: init:", err)
		os.Exit(1)
	}
	me, n := w.Rank(), w.Size()
	var reqs []*mpi.Request
	for p := range n {
		if p == me {
			continue
		}
		r, err := w.Isend([]int64{int64(me)}, p, 1)
		if err != nil {
			fmt.Fprintf(os.Stderr, "burst: rank %d: isend to %d: %v\n", me, p, err)
			os.Exit(1)
		}
		reqs = append(reqs, r)
	}
	for p := range n {
		if p == me {
			continue
		}
		v := []int64{-1}
		if _, err := w.Recv(v, p, 1); err != nil || v[0] != int64(p) {
			fmt.Fprintf(os.Stderr, "burst: rank %d: recv from %d: %v (value %d)\n", me, p, err, v[0])
			os.Exit(1)
		}
	}
	if _, err := mpi.Waitall(reqs); err != nil {
		fmt.Fprintf(os.Stderr, "burst: rank %d: %v\n", me, err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "burst: finalize:", err)
		os.Exit(1)
	}
	if me == 0 {
		fmt.Println("burst ok")
	}
}
