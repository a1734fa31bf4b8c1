package tcp

import (
	"io"
	"net"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// iovMax is the most iovecs one writev takes on Linux (IOV_MAX).
const iovMax = 1024

// sock is the I/O side of one established connection. read is used by the
// connection's reader goroutine only; writev by the goroutine that owns the
// write side (conn.busy) only. The closures are made once so that the hot
// paths do not allocate.
type sock struct {
	nc   *net.TCPConn
	rc   syscall.RawConn
	spin time.Duration // busy-poll budget of a read before it parks in the netpoller

	// reader state
	rp      []byte
	rn      int
	rerr    error
	spun    bool
	started time.Time
	readFn  func(fd uintptr) bool

	// writer state
	wiov    [][]byte
	wn      int
	werr    error
	wblock  bool
	writeFn func(fd uintptr) bool
}

func newSock(nc *net.TCPConn, spin time.Duration) (*sock, error) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &sock{nc: nc, rc: rc, spin: spin}
	s.readFn = s.doRead
	s.writeFn = s.doWrite
	return s, nil
}

// doRead retries a non-blocking read for up to s.spin before it lets the
// runtime park the goroutine until the socket is readable. Spinning can
// save the sleep and wake-up of an idle CPU per message. Between retries
// runtime.Gosched lets goroutines that the reader just woke (a receiver
// waiting for this message) run on this P at once, and sched_yield lets
// other threads of this CPU run, such as the peer process when it shares
// the CPU, which must run for the answer to come.
func (s *sock) doRead(fd uintptr) bool {
	for {
		n, err := unix.Read(int(fd), s.rp)
		switch err {
		case nil:
			s.rn = n
			return true
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			s.rerr = err
			return true
		}
		if s.spin <= 0 {
			return false
		}
		now := time.Now()
		if !s.spun {
			s.spun, s.started = true, now
		} else if now.Sub(s.started) >= s.spin {
			return false
		}
		runtime.Gosched()
		unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// read reads at least one byte into p (len(p) > 0), or returns an error
// (io.EOF when the peer closed its side).
func (s *sock) read(p []byte) (int, error) {
	s.rp, s.rn, s.rerr, s.spun = p, 0, nil, false
	err := s.rc.Read(s.readFn)
	s.rp = nil
	if err == nil {
		err = s.rerr
	}
	if err != nil {
		return 0, err
	}
	if s.rn == 0 {
		return 0, io.EOF
	}
	return s.rn, nil
}

func (s *sock) doWrite(fd uintptr) bool {
	for len(s.wiov) > 0 {
		iov := s.wiov
		if len(iov) > iovMax {
			iov = iov[:iovMax]
		}
		n, err := unix.Writev(int(fd), iov)
		if n > 0 {
			s.wn += n
			s.wiov = consume(s.wiov, n)
		}
		switch err {
		case nil:
		case unix.EINTR:
		case unix.EAGAIN:
			return !s.wblock
		default:
			s.werr = err
			return true
		}
	}
	return true
}

// writev writes iov (whose slices it advances past what was written). With
// block it returns when everything is written or the socket failed;
// without, it stops when the socket buffer is full. It returns the bytes
// written.
func (s *sock) writev(iov [][]byte, block bool) (int, error) {
	s.wiov, s.wn, s.werr, s.wblock = iov, 0, nil, block
	err := s.rc.Write(s.writeFn)
	s.wiov = nil
	if err == nil {
		err = s.werr
	}
	return s.wn, err
}

// consume drops the first n bytes of iov.
func consume(iov [][]byte, n int) [][]byte {
	for len(iov) > 0 && n >= len(iov[0]) {
		n -= len(iov[0])
		iov[0] = nil
		iov = iov[1:]
	}
	if n > 0 {
		iov[0] = iov[0][n:]
	}
	return iov
}
