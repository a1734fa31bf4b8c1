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

// sock is the I/O side of one established connection. read is used by
// whoever holds the connection's read side (conn.rmu): the reader goroutine
// or a goroutine polling through Module.Progress. wait is used by the
// reader goroutine only, writev by the goroutine that owns the write side
// (conn.busy) only. Reads go through RawConn.Control, not RawConn.Read, so
// that a poller never queues behind the reader goroutine parked in the
// netpoller. The closures are made once so that the hot paths do not
// allocate.
type sock struct {
	nc   *net.TCPConn
	rc   syscall.RawConn
	spin time.Duration // busy-poll budget of wait before it parks in the netpoller

	// read state (conn.rmu)
	rp     []byte
	rn     int
	rerr   error
	readFn func(fd uintptr)

	// wait state (reader goroutine)
	spun    bool
	started time.Time
	peek    [1]byte
	waitFn  func(fd uintptr) bool

	// writer state
	wiov    [][]byte
	wn      int
	werr    error
	wblock  bool
	writeFn func(fd uintptr) bool
}

// canPoll: reads never block, so Module.Progress may read the socket.
const canPoll = true

func newSock(nc *net.TCPConn, spin time.Duration) (*sock, error) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	s := &sock{nc: nc, rc: rc, spin: spin}
	s.readFn = s.doRead
	s.waitFn = s.doWait
	s.writeFn = s.doWrite
	return s, nil
}

func (s *sock) doRead(fd uintptr) {
	for {
		n, err := unix.Read(int(fd), s.rp)
		switch err {
		case nil:
			s.rn = n
			if n == 0 {
				s.rerr = io.EOF
			}
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			s.rerr = errWouldBlock
		default:
			s.rerr = err
		}
		return
	}
}

// read reads what the socket has, at most len(p) > 0 bytes, without
// blocking: errWouldBlock when it has nothing, io.EOF when the peer closed
// its side.
func (s *sock) read(p []byte) (int, error) {
	s.rp, s.rn, s.rerr = p, 0, nil
	err := s.rc.Control(s.readFn)
	s.rp = nil
	if err == nil {
		err = s.rerr
	}
	if err != nil {
		return 0, err
	}
	return s.rn, nil
}

// doWait reports whether the socket has something to read (or an error or
// EOF to report), retrying for up to s.spin before it lets the runtime
// park the goroutine until the socket is readable. Spinning can save the
// sleep and wake-up of an idle CPU per message. Between retries
// runtime.Gosched lets goroutines that the reader just woke run on this P
// at once, and sched_yield lets other threads of this CPU run, such as the
// peer process when it shares the CPU, which must run for the answer to
// come.
func (s *sock) doWait(fd uintptr) bool {
	for {
		_, _, err := unix.Recvfrom(int(fd), s.peek[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch err {
		case nil:
			return true // data, or EOF
		case unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			return true // the read reports the error
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

// wait returns when the socket is readable (or at EOF, or failed), parking
// in the netpoller; it returns an error when the connection was closed or
// its read deadline passed (how a poller that found the end of the stream
// wakes the reader goroutine).
func (s *sock) wait() error {
	s.spun = false
	return s.rc.Read(s.waitFn)
}

// kick makes a wait in progress, or the next one, return an error.
func (s *sock) kick() { s.nc.SetReadDeadline(time.Unix(1, 0)) }

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
