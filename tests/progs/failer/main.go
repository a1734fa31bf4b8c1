// Command failer misbehaves on purpose for the fault tests:
//
//	failer exit CODE      rank 1 exits with CODE after Init; rank 0 blocks in Recv from 1
//	failer abort CODE     rank 1 calls Abort(CODE); rank 0 blocks in Recv
//	failer kill           rank 1 kills itself with SIGKILL in the middle of a 64 MiB transfer
//	failer blocked        rank 1 exits 3; rank 0 reports what its blocked Recv returned
//	failer recvblocked    rank 0 tells rank 1 it is about to block in Recv from 1; rank 1
//	                      then kills itself with SIGKILL
//	failer sendblocked    rank 0 blocks in an 8 MiB (rendezvous) Send to 1; rank 1 waits
//	                      until the message is announced (Probe), then kills itself with SIGKILL
//	failer finalize       ranks 0 and 1 exchange 1 MiB, every rank calls Finalize and
//	                      exits 0
//	failer stream         rank 0 sends 4 MiB messages to rank 1 forever; rank 1 prints
//	                      "rank 1: streaming pid N" after the first and keeps receiving (the
//	                      test kills it from outside)
//
// Rank 0 prints "rank 0: blocked call returned: ERR (ErrProcFailed=BOOL)" and then
// waits to be stopped by gorun. With FAILER_SPAWN=1 in its environment, rank 1 first
// starts a child process ("sleep 600") in its process group and prints
// "rank 1: child pid N".
package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"

	"github.com/gompi-org/gompi/mpi"
)

func main() {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "failer:", err)
		os.Exit(1)
	}
	mode := os.Args[1]
	code := 0
	if len(os.Args) > 2 {
		code, _ = strconv.Atoi(os.Args[2])
	}
	if mode == "finalize" && w.Rank() != 1 {
		finalize(w)
		return
	}
	if w.Rank() == 1 {
		if os.Getenv("FAILER_SPAWN") == "1" {
			child := exec.Command("sleep", "600")
			if err := child.Start(); err != nil {
				fmt.Fprintln(os.Stderr, "failer: spawn:", err)
				os.Exit(1)
			}
			fmt.Printf("rank 1: child pid %d\n", child.Process.Pid)
		}
		if mode == "finalize" {
			finalize(w)
			return
		}
		switch mode {
		case "exit", "blocked":
			os.Exit(max(code, 3))
		case "abort":
			w.Abort(code)
		case "kill":
			buf := make([]byte, 64<<20)
			r, _ := w.Irecv(buf, 0, 1)
			_ = r
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case "recvblocked":
			if _, err := w.Recv(make([]byte, 8), 0, 2); err != nil {
				fmt.Fprintln(os.Stderr, "failer: rank 1:", err)
				os.Exit(1)
			}
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case "sendblocked":
			if _, err := w.Probe(0, 1); err != nil {
				fmt.Fprintln(os.Stderr, "failer: rank 1:", err)
				os.Exit(1)
			}
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
		case "stream":
			buf := make([]byte, 4<<20)
			for i := 0; ; i++ {
				if _, err := w.Recv(buf, 0, 1); err != nil {
					fmt.Fprintln(os.Stderr, "failer: rank 1:", err)
					os.Exit(1)
				}
				if i == 0 {
					fmt.Printf("rank 1: streaming pid %d\n", os.Getpid())
				}
			}
		}
		select {}
	}
	if w.Rank() == 0 {
		buf := make([]byte, 64<<20)
		var err error
		switch mode {
		case "kill":
			err = w.Send(buf, 1, 1)
		case "sendblocked":
			err = w.Send(buf[:8<<20], 1, 1)
		case "recvblocked":
			if err = w.Send(buf[:8], 1, 2); err == nil {
				_, err = w.Recv(buf[:8], 1, 1)
			}
		case "stream":
			for err == nil {
				err = w.Send(buf[:4<<20], 1, 1)
			}
		default:
			_, err = w.Recv(buf[:8], 1, 1)
		}
		fmt.Printf("rank 0: blocked call returned: %v (ErrProcFailed=%v)\n", err, errors.Is(err, mpi.ErrProcFailed))
		// Stay alive: gorun must name rank 1 as the failure and stop us.
		select {}
	}
	select {}
}

// finalize exchanges 1 MiB between ranks 0 and 1 and ends cleanly.
func finalize(w *mpi.Comm) {
	if me := w.Rank(); me < 2 {
		out, in := make([]byte, 1<<20), make([]byte, 1<<20)
		for i := range out {
			out[i] = byte(i + me)
		}
		if _, err := w.Sendrecv(out, 1-me, 3, in, 1-me, 3); err != nil {
			fmt.Fprintf(os.Stderr, "failer: rank %d: %v\n", me, err)
			os.Exit(1)
		}
		for i := range in {
			if in[i] != byte(i+1-me) {
				fmt.Fprintf(os.Stderr, "failer: rank %d: byte %d wrong\n", me, i)
				os.Exit(1)
			}
		}
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "failer:", err)
		os.Exit(1)
	}
	if w.Rank() == 0 {
		fmt.Println("rank 0: finalized")
	}
}
