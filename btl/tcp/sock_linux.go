package tcp

import (
	"io"
	"net"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// iovMax is the most iovecs one writev takes here (IOV_MAX is 1024; a
// longer list is written in several calls).
const iovMax = 64

// canPoll: reads never block, so Module.Progress may read the socket.
const canPoll = true

// sock is the I/O side of one established connection, on a raw
// non-blocking descriptor that is not registered with Go's netpoller.
//
// Why not the netpoller: every socket it knows is in the runtime's epoll
// set, so each arriving message wakes the thread parked in epoll_wait
// (there always is one while any goroutine waits for a socket, and a
// process with an idle P parks one), even when the application goroutine,
// spinning in a PML wait, reads the message itself through Module.Progress.
// On a machine with as many busy ranks as cores that wake-up preempts a
// rank on every message. Here the reader goroutine waits in poll(2) only
// when it decides to (conn.readLoop), and while the application polls it
// does not wait on the socket at all.
//
// When ranks outnumber cores (netpoll) that reasoning turns around: a
// waiting rank soon parks (pml_wait_yield), and then its messages are
// read by a reader goroutine; one blocked in poll(2) holds a thread (and,
// until sysmon takes it back, the P) that must be woken and handed the P
// before the rank it serves can run. There the socket stays in the netpoller and
// wait parks the reader goroutine on it: the rank's one thread sleeps in
// epoll_wait when it has nothing to do and runs the reader and then the
// woken application goroutine in turn.
//
// read is used by whoever holds the connection's read side (conn.rmu), wait
// by the reader goroutine only, writev by the goroutine that owns the write
// side (conn.busy) only. Every use of the descriptor holds mu for reading;
// close takes it for writing, so the number is never used after close.
type sock struct {
	mu    sync.RWMutex // fd is valid while read-locked and fd >= 0
	fd    int
	spin  time.Duration      // busy-poll budget of wait before it sleeps in poll(2)
	nc    *net.TCPConn       // netpoll mode: the original, kept in the netpoller for wait
	rc    syscall.RawConn    // netpoll mode: nc's, to park wait on
	ready func(uintptr) bool // netpoll mode: wait's readiness test (allocated once)
	peek  [1]byte            // wait's MSG_PEEK buffer (reader goroutine)
	rpfd  [1]unix.PollFd     // wait's poll set (reader goroutine)
	wpfd  [1]unix.PollFd     // writev's poll set (write-side owner)
	wiov  [iovMax]unix.Iovec // writev's vector (write-side owner)
}

// newSock takes the socket of nc: it keeps a duplicate of the descriptor
// (non-blocking, close-on-exec) and closes nc, which takes the original out
// of the netpoller; with netpoll it keeps nc open for wait to park on.
func newSock(nc *net.TCPConn, spin time.Duration, netpoll bool) (*sock, error) {
	rc, err := nc.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd, derr := -1, error(nil)
	if err := rc.Control(func(f uintptr) { fd, derr = unix.FcntlInt(f, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, derr
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		nc.Close()
		return nil, err
	}
	s := &sock{fd: fd, spin: spin}
	if !netpoll {
		nc.Close()
		return s, nil
	}
	s.nc, s.rc = nc, rc
	s.ready = func(uintptr) bool { return s.readable() }
	return s, nil
}

// read reads what the socket has, at most len(p) > 0 bytes, without
// blocking: errWouldBlock when it has nothing, io.EOF when the peer closed
// its side, net.ErrClosed after close.
func (s *sock) read(p []byte) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fd < 0 {
		return 0, net.ErrClosed
	}
	for {
		n, err := sysRead(s.fd, p)
		switch err {
		case nil:
			if n == 0 {
				return 0, io.EOF
			}
			return n, nil
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return 0, errWouldBlock
		}
		return 0, err
	}
}

// readable reports whether a read would not block (data, EOF or an error
// to report), without consuming anything.
func (s *sock) readable() bool {
	for {
		switch s.sysPeek() {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			return false
		}
		return true
	}
}

// wait returns when the socket is readable (or at EOF, or failed, or shut
// down by abort). It first retries for up to s.spin (runtime.Gosched lets
// goroutines this reader woke run on its P, sched_yield lets the peer run
// when it shares the CPU), giving up early, without sleeping, and
// reporting true, as soon as yield returns true; then it sleeps in
// poll(2), or, in netpoll mode, parks the goroutine on the netpoller. An
// error means the descriptor is closed.
func (s *sock) wait(yield func() bool) (bool, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fd < 0 {
		return false, net.ErrClosed
	}
	if s.readable() {
		return false, nil
	}
	if s.spin > 0 {
		start := time.Now()
		for time.Since(start) < s.spin {
			runtime.Gosched()
			unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
			if s.readable() {
				return false, nil
			}
			if yield != nil && yield() {
				return true, nil
			}
		}
	}
	if s.rc != nil {
		// Both descriptors name one socket, so the netpoller's
		// readiness is the duplicate's. RawConn.Read calls ready again
		// after each wake-up until it reports true.
		return false, s.rc.Read(s.ready)
	}
	// A goroutine this reader readied (the application's, woken by a
	// completion) runs now: once poll(2) has begun, the P waits in the
	// system call until sysmon takes it back, 20 us to 10 ms later.
	runtime.Gosched()
	if s.readable() {
		return false, nil
	}
	s.rpfd[0] = unix.PollFd{Fd: int32(s.fd), Events: unix.POLLIN}
	for {
		_, err := unix.Poll(s.rpfd[:], -1)
		if err != unix.EINTR {
			return false, err
		}
	}
}

// writev writes iov (whose slices it advances past what was written). With
// block it returns when everything is written or the socket failed,
// sleeping in poll(2) while the socket buffer is full; without, it stops
// when the buffer is full. It returns the bytes written.
func (s *sock) writev(iov [][]byte, block bool) (int, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fd < 0 {
		return 0, net.ErrClosed
	}
	total := 0
	for len(iov) > 0 {
		part := iov
		if len(part) > iovMax {
			part = part[:iovMax]
		}
		n, err := s.sysWritev(part)
		if n > 0 {
			total += n
			iov = consume(iov, n)
		}
		switch err {
		case nil, unix.EINTR:
			continue
		case unix.EAGAIN:
		default:
			return total, err
		}
		if !block {
			return total, nil
		}
		s.wpfd[0] = unix.PollFd{Fd: int32(s.fd), Events: unix.POLLOUT}
		if _, err := unix.Poll(s.wpfd[:], -1); err != nil && err != unix.EINTR {
			return total, err
		}
	}
	return total, nil
}

// shutdownWrite sends FIN after the last frame (orderly close).
func (s *sock) shutdownWrite() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fd >= 0 {
		unix.Shutdown(s.fd, unix.SHUT_WR)
	}
}

// abort shuts the connection down in both directions: the peer sees it end,
// and a wait or blocked writev of ours returns.
func (s *sock) abort() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fd >= 0 {
		unix.Shutdown(s.fd, unix.SHUT_RDWR)
	}
}

// kick makes a wait in progress, or the next one, return: the read side is
// over (a poller found its end).
func (s *sock) kick() {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.fd >= 0 {
		unix.Shutdown(s.fd, unix.SHUT_RD)
	}
}

// close releases the descriptor once no call is using it; abort first so
// that none is blocked. Later calls fail with net.ErrClosed.
func (s *sock) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fd < 0 {
		return nil
	}
	err := unix.Close(s.fd)
	s.fd = -1
	if s.nc != nil {
		s.nc.Close()
	}
	return err
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
