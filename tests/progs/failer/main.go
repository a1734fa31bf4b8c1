// Command failer misbehaves on purpose for the fault tests:
//
//	failer exit CODE      rank 1 exits with CODE after Init; rank 0 blocks in Recv from 1
//	failer abort CODE     rank 1 calls Abort(CODE); rank 0 blocks in Recv
//	failer kill           rank 1 kills itself with SIGKILL in the middle of a 64 MiB transfer
//	failer blocked        rank 1 exits 3; rank 0 reports what its blocked Recv returned
package main

import (
	"errors"
	"fmt"
	"os"
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
	if w.Rank() == 1 {
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
		}
		select {}
	}
	if w.Rank() == 0 {
		buf := make([]byte, 64<<20)
		var err error
		if mode == "kill" {
			err = w.Send(buf, 1, 1)
		} else {
			_, err = w.Recv(buf[:8], 1, 1)
		}
		fmt.Printf("rank 0: blocked call returned: %v (ErrProcFailed=%v)\n", err, errors.Is(err, mpi.ErrProcFailed))
		// Stay alive: gorun must name rank 1 as the failure and stop us.
		select {}
	}
	select {}
}
