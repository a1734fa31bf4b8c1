// Command rankprog is the rank program of the launcher's tests. It reaches
// the wire-up store through the launch environment (GOMPI_STORE,
// GOMPI_SECRET, GOMPI_RANK) with package store directly, and behaves as its
// first argument says:
//
//	ring                    Set own key, Get the next rank's, Fence, Finalize
//	finalize                connect and Finalize (the launch-cost measurement)
//	exit RANK CODE          RANK exits with CODE after connecting; the others wait for its failure notice
//	sigkill RANK            RANK kills itself with SIGKILL; the others wait for the notice
//	nofinalize RANK         RANK exits 0 without Finalize; the others wait for the notice
//	abort RANK CODE         RANK calls Abort(CODE); every rank then blocks
//	echo                    copy stdin to stdout (rank 0); others report what they read
//	lines N LEN [nopartial] print N lines of LEN bytes, each in several writes, then a partial line
//	hang [ignoreterm] [nochild]
//	                        start a grandchild (unless nochild), print "ready", block
//	                        (ignoring SIGTERM with ignoreterm)
//	env                     print the launch environment and whether the secret is on a command line
//	pgo                     print the profile this program was built with ("-pgo=" and the
//	                        build setting, or "-pgo=none"), then Finalize
//
// When RANKPROG_PIDDIR is set every rank writes its pid there in a file named
// "rank<RANK>.<pid>", and every grandchild's as "child.<pid>".
package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/launcher/store"
)

func main() {
	if len(os.Args) < 2 {
		fatal("usage: rankprog MODE [ARGS]")
	}
	notePID()
	mode, args := os.Args[1], os.Args[2:]
	rank, _ := strconv.Atoi(os.Getenv("GOMPI_RANK"))
	arg := func(i int) int {
		if i >= len(args) {
			fatal("mode %s: missing argument %d", mode, i+1)
		}
		n, err := strconv.Atoi(args[i])
		if err != nil {
			fatal("mode %s: %v", mode, err)
		}
		return n
	}
	ctx := context.Background()
	switch mode {
	case "ring":
		c := connect(ctx, rank)
		size, _ := strconv.Atoi(os.Getenv("GOMPI_SIZE"))
		check(c.Set(fmt.Sprintf("ring/%d", rank), []byte(fmt.Sprintf("hello from %d", rank))))
		v, err := c.Get(ctx, fmt.Sprintf("ring/%d", (rank+1)%size))
		check(err)
		fmt.Printf("rank %d got %q\n", rank, v)
		check(c.Fence(ctx, "done"))
		check(c.Finalize())
	case "finalize":
		check(connect(ctx, rank).Finalize())
	case "pgo":
		prof := "none"
		if bi, ok := debug.ReadBuildInfo(); ok {
			for _, kv := range bi.Settings {
				if kv.Key == "-pgo" {
					prof = kv.Value
				}
			}
		}
		fmt.Printf("-pgo=%s\n", prof)
		check(connect(ctx, rank).Finalize())
	case "exit", "sigkill", "nofinalize", "abort":
		c := connect(ctx, rank)
		if rank != arg(0) && mode != "abort" {
			awaitFailure(c, rank)
		}
		// Wait until every rank is connected, so that all are running
		// when the chosen rank fails, and the others hear of it as a notice.
		check(c.Set(fmt.Sprintf("up/%d", rank), nil))
		size, _ := strconv.Atoi(os.Getenv("GOMPI_SIZE"))
		for r := range size {
			_, err := c.Get(ctx, fmt.Sprintf("up/%d", r))
			check(err)
		}
		if rank != arg(0) {
			select {} // until the failure notice, or gorun stops us
		}
		switch mode {
		case "exit":
			os.Exit(arg(1))
		case "sigkill":
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		case "nofinalize":
			os.Exit(0)
		case "abort":
			check(c.Abort(arg(1), fmt.Sprintf("rank %d gives up", rank)))
			select {}
		}
	case "echo":
		in, err := io.ReadAll(os.Stdin)
		check(err)
		if rank == 0 {
			os.Stdout.Write(in)
		} else {
			fmt.Printf("rank %d read %d bytes of stdin\n", rank, len(in))
		}
	case "lines":
		n, length := arg(0), arg(1)
		for i := range n {
			line := []byte(fmt.Sprintf("rank=%d line=%06d ", rank, i))
			for len(line) < length {
				line = append(line, byte('a'+rank))
			}
			line = append(line, '\n')
			// Several small writes per line: gorun must join them.
			for len(line) > 0 {
				k := min(len(line), 1+len(line)/3)
				os.Stdout.Write(line[:k])
				line = line[k:]
			}
		}
		if len(args) < 3 || args[2] != "nopartial" {
			fmt.Printf("partial-%d", rank)
		}
	case "hang":
		opts := strings.Join(args, " ")
		if strings.Contains(opts, "ignoreterm") {
			signal.Ignore(syscall.SIGTERM)
		}
		if !strings.Contains(opts, "nochild") {
			child := exec.Command(os.Args[0], "grandchild")
			check(child.Start())
			writePID("child", child.Process.Pid)
		}
		fmt.Printf("ready %d\n", rank)
		select {}
	case "grandchild":
		select {}
	case "env":
		var lines []string
		for _, kv := range os.Environ() {
			if strings.HasPrefix(kv, "GOMPI_") || strings.HasPrefix(kv, "RANKPROG_") {
				lines = append(lines, strings.ReplaceAll(kv, "\n", `\n`))
			}
		}
		sort.Strings(lines)
		for _, l := range lines {
			fmt.Println(l)
		}
		secret := os.Getenv("GOMPI_SECRET")
		onCmdline := false
		for _, pid := range []int{os.Getpid(), os.Getppid()} {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			check(err)
			onCmdline = onCmdline || (secret != "" && bytes.Contains(b, []byte(secret)))
		}
		fmt.Printf("secret on a command line: %v\n", onCmdline)
	default:
		fatal("unknown mode %q", mode)
	}
}

func connect(ctx context.Context, rank int) *store.Client {
	secret, err := hex.DecodeString(os.Getenv("GOMPI_SECRET"))
	check(err)
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c, err := store.Dial(ctx, os.Getenv("GOMPI_STORE"), secret, rank)
	check(err)
	return c
}

// awaitFailure waits for a failure notice, prints it and exits 1, as a rank
// whose peer died would.
func awaitFailure(c *store.Client, rank int) {
	go func() {
		f := <-c.Failures()
		fmt.Printf("rank %d notified: rank %d %s\n", rank, f.Rank, f.Cause)
		os.Exit(1)
	}()
}

func notePID() {
	if os.Args[1] != "grandchild" { // its parent notes it
		writePID("rank"+os.Getenv("GOMPI_RANK"), os.Getpid())
	}
}

// writePID records a pid in $RANKPROG_PIDDIR as the file "<what>.<pid>".
func writePID(what string, p int) {
	dir := os.Getenv("RANKPROG_PIDDIR")
	if dir == "" {
		return
	}
	pid := strconv.Itoa(p)
	check(os.WriteFile(filepath.Join(dir, what+"."+pid), []byte(pid), 0o644))
}

func check(err error) {
	if err != nil {
		fatal("%v", err)
	}
}

func fatal(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "rankprog: "+format+"\n", args...)
	os.Exit(99)
}
