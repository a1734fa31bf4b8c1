//go:build !linux

package tcp

import (
	"net"
	"time"
)

// iovMax bounds the iovecs of one write.
const iovMax = 1024

// canPoll: reads block, so Module.Progress leaves the sockets to the reader
// goroutines.
const canPoll = false

// sock is the portable I/O side of a connection: blocking reads through the
// netpoller (no busy polling) and writes that always block, so SendImmediate
// only succeeds on Linux.
type sock struct {
	nc *net.TCPConn
}

func newSock(nc *net.TCPConn, _ time.Duration, _ bool) (*sock, error) { return &sock{nc: nc}, nil }

func (s *sock) read(p []byte) (int, error) { return s.nc.Read(p) }

// wait returns at once: read blocks.
func (s *sock) wait(func() bool) (bool, error) { return false, nil }

func (s *sock) writev(iov [][]byte, block bool) (int, error) {
	if !block {
		return 0, nil
	}
	bufs := net.Buffers(iov)
	n, err := bufs.WriteTo(s.nc)
	return int(n), err
}

func (s *sock) shutdownWrite() { s.nc.CloseWrite() }
func (s *sock) abort()         { s.nc.Close() }
func (s *sock) kick()          { s.nc.SetReadDeadline(time.Unix(1, 0)) }
func (s *sock) close() error   { return s.nc.Close() }
