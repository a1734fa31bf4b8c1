package sys

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrWatchClosed is returned by PidWatch.Wait after Close.
var ErrWatchClosed = errors.New("sys: pid watch closed")

// PidWatch waits for a process to exit without a thread of its own: on a
// pidfd (pidfd_open(2)) parked in the runtime's network poller, or, on
// kernels without pidfd, by probing with kill(pid, 0) every 100ms.
type PidWatch struct {
	pid  int
	f    *os.File      // the pidfd; nil in probing mode
	stop chan struct{} // closed by Close
	once sync.Once
}

// WatchPid starts watching pid. The pidfd names the process itself, not
// the number, so a later reuse of the number is never mistaken for it.
func WatchPid(pid int) (*PidWatch, error) {
	w := &PidWatch{pid: pid, stop: make(chan struct{})}
	fd, err := unix.PidfdOpen(pid, 0)
	switch {
	case err == nil:
		if err := unix.SetNonblock(fd, true); err != nil {
			unix.Close(fd)
			return nil, os.NewSyscallError("fcntl", err)
		}
		w.f = os.NewFile(uintptr(fd), "pidfd")
	case errors.Is(err, unix.ENOSYS), errors.Is(err, unix.EPERM):
		if !ProcessExists(pid) {
			return nil, os.NewSyscallError("kill", unix.ESRCH)
		}
	default:
		return nil, os.NewSyscallError("pidfd_open", err)
	}
	return w, nil
}

// Wait blocks until the process exits (nil) or Close is called
// (ErrWatchClosed). Call it from one goroutine.
func (w *PidWatch) Wait() error {
	if w.f != nil {
		rc, err := w.f.SyscallConn()
		if err != nil {
			return err
		}
		exited := false
		err = rc.Read(func(fd uintptr) bool {
			fds := [1]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(fds[:], 0)
			exited = n > 0 && fds[0].Revents != 0
			return exited
		})
		if exited {
			return nil
		}
		select {
		case <-w.stop:
			return ErrWatchClosed
		default:
		}
		if err == nil {
			return nil
		}
		// The pidfd could not be parked in the poller: fall back to probing.
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if !ProcessExists(w.pid) {
			return nil
		}
		select {
		case <-w.stop:
			return ErrWatchClosed
		case <-t.C:
		}
	}
}

// Close ends the watch; a Wait in progress returns ErrWatchClosed.
func (w *PidWatch) Close() error {
	var err error
	w.once.Do(func() {
		close(w.stop)
		if w.f != nil {
			err = w.f.Close()
		}
	})
	return err
}

// ProcessExists reports whether process pid exists (kill(pid, 0) succeeds
// or fails with EPERM). A zombie exists until reaped.
func ProcessExists(pid int) bool {
	err := unix.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
