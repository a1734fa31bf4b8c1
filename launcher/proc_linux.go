package launcher

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// rankProcAttr puts a rank in a process group of its own (so that gorun can
// signal the rank and everything it started, and so that a terminal's ^C
// reaches gorun alone) and has the kernel SIGKILL it if gorun dies.
func rankProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// waitExited blocks until process pid has exited, without reaping it: the
// zombie keeps its pid, and therefore its process group id, reserved until
// the caller reaps it, so signalling the group in between cannot hit an
// unrelated process that reused the number.
func waitExited(pid int) error {
	var info unix.Siginfo
	for {
		switch err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil); err {
		case nil:
			return nil
		case unix.EINTR:
			continue
		default:
			return err
		}
	}
}

// signalGroup sends sig to the process group led by pid. A group that no
// longer exists is not an error.
func signalGroup(pid int, sig syscall.Signal) error {
	err := syscall.Kill(-pid, sig)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}
