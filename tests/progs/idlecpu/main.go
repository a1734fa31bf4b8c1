// Command idlecpu measures what a blocked Recv costs: rank 1 sleeps (2 s by
// default) before it sends 8 bytes, while rank 0 waits in Recv. Both ranks
// report the CPU time (user+system, from getrusage) they used over that
// wait and its share of the wall time:
//
//	rank 0: blocked Recv: wall 2.001s, cpu 0.004s (user 0.002s, sys 0.002s), 0.2%
//	rank 1: sleeping: wall 2.000s, cpu ...
//
//	gorun -np 2 --btl self,sm ./tests/progs/idlecpu [DURATION]
//
// Ranks other than 0 and 1 only take part in the final barrier.
package main

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

func cpu() (user, sys time.Duration) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}

func report(who string, start time.Time, u0, s0 time.Duration) {
	wall := time.Since(start)
	u1, s1 := cpu()
	u, s := u1-u0, s1-s0
	fmt.Printf("%s: wall %.3fs, cpu %.3fs (user %.3fs, sys %.3fs), %.1f%%\n",
		who, wall.Seconds(), (u + s).Seconds(), u.Seconds(), s.Seconds(), 100*(u+s).Seconds()/wall.Seconds())
}

func main() {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "idlecpu:", err)
		os.Exit(1)
	}
	wait := 2 * time.Second
	if len(os.Args) > 1 {
		if wait, err = time.ParseDuration(os.Args[1]); err != nil {
			fmt.Fprintln(os.Stderr, "idlecpu:", err)
			os.Exit(2)
		}
	}
	if w.Size() < 2 {
		fmt.Fprintln(os.Stderr, "idlecpu: needs 2 ranks")
		os.Exit(2)
	}
	// Connect the pair first, so the wait measures waiting and not wire-up.
	if me := w.Rank(); me < 2 {
		if _, err := w.Sendrecv([]byte{1}, 1-me, 0, make([]byte, 1), 1-me, 0); err != nil {
			fmt.Fprintln(os.Stderr, "idlecpu:", err)
			os.Exit(1)
		}
	}
	switch w.Rank() {
	case 0:
		u0, s0 := cpu()
		start := time.Now()
		if _, err := w.Recv(make([]byte, 8), 1, 1); err != nil {
			fmt.Fprintln(os.Stderr, "idlecpu: rank 0:", err)
			os.Exit(1)
		}
		report("rank 0: blocked Recv", start, u0, s0)
	case 1:
		u0, s0 := cpu()
		start := time.Now()
		time.Sleep(wait)
		report("rank 1: sleeping", start, u0, s0)
		if err := w.Send(make([]byte, 8), 0, 1); err != nil {
			fmt.Fprintln(os.Stderr, "idlecpu: rank 1:", err)
			os.Exit(1)
		}
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "idlecpu:", err)
		os.Exit(1)
	}
}
