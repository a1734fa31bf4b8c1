// Command flood measures the receiver's memory under a flood of eager
// messages (flow control, docs/architecture.md), under gorun -np 4:
//
//	flood N SIZE SLEEP
//
// Ranks 1-3 each send N messages of SIZE bytes (blocking Send, tag 1) to
// rank 0, which sleeps SLEEP (a Go duration) before it receives anything,
// then receives all 3N from AnySource and checks that each sender's
// arrive in order with their content. Rank 0 then prints
//
//	flood: 3N messages in order; VmHWM before B KiB, after A KiB, growth G KiB; window W
//
// (VmHWM: the peak resident set, /proc/self/status). Any error is printed
// as "flood: rank R: ..." with exit status 1.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

func fail(rank int, format string, a ...any) {
	fmt.Fprintf(os.Stderr, "flood: rank %d: %s\n", rank, fmt.Sprintf(format, a...))
	os.Exit(1)
}

// content is message seq of sender src: seq, then a pattern of both.
func content(b []byte, src, seq int) {
	for i := range b {
		b[i] = byte(i*7 + src*31 + seq*13)
	}
	if len(b) >= 8 {
		binary.LittleEndian.PutUint64(b, uint64(seq))
	}
}

// vmHWM returns the process's peak resident set in KiB.
func vmHWM() int {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			return n
		}
	}
	return -1
}

func main() {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
	rank := w.Rank()
	if len(os.Args) < 4 || w.Size() != 4 {
		fail(rank, "run me as gorun -np 4 flood N SIZE SLEEP")
	}
	n, err1 := strconv.Atoi(os.Args[1])
	size, err2 := strconv.Atoi(os.Args[2])
	pause, err3 := time.ParseDuration(os.Args[3])
	if err1 != nil || err2 != nil || err3 != nil || n < 1 || size < 8 {
		fail(rank, "bad arguments %q", os.Args[1:])
	}
	if rank != 0 {
		b := make([]byte, size)
		for i := range n {
			content(b, rank, i)
			if err := w.Send(b, 0, 1); err != nil {
				fail(rank, "send %d: %v", i, err)
			}
		}
	} else {
		before := vmHWM()
		time.Sleep(pause)
		got, want := make([]byte, size), make([]byte, size)
		next := [4]int{}
		for k := range 3 * n {
			st, err := w.Recv(got, mpi.AnySource, 1)
			if err != nil {
				fail(rank, "receive %d: %v", k, err)
			}
			s := st.Source
			content(want, s, next[s])
			if st.Count != size || !bytes.Equal(got, want) {
				fail(rank, "receive %d: message %d of rank %d expected, got seq %d (%d bytes)", k, next[s], s, binary.LittleEndian.Uint64(got), st.Count)
			}
			next[s]++
		}
		after := vmHWM()
		win := os.Getenv("GOMPI_PML_UNEXPECTED_WINDOW")
		if win == "" {
			win = "default"
		}
		debug.FreeOSMemory()
		fmt.Printf("flood: %d messages in order; VmHWM before %d KiB, after %d KiB, growth %d KiB; window %s\n", 3*n, before, after, after-before, win)
	}
	if err := mpi.Finalize(); err != nil {
		fail(rank, "Finalize: %v", err)
	}
}
