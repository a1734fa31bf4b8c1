package launcher

import (
	"syscall"
	"unsafe"
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
	const pPID = 1     // idtype P_PID
	var info [128]byte // siginfo_t
	for {
		_, _, errno := syscall.Syscall6(syscall.SYS_WAITID, pPID, uintptr(pid),
			uintptr(unsafe.Pointer(&info[0])), syscall.WEXITED|syscall.WNOWAIT, 0, 0)
		switch errno {
		case 0:
			return nil
		case syscall.EINTR:
			continue
		default:
			return errno
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
