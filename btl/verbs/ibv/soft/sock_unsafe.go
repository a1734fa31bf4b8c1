//go:build linux

package soft

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// sock is the device's UDP socket: a raw blocking descriptor, read by the
// device's receive goroutine with recvmmsg and written by whichever
// goroutine pumps a QP, with sendmmsg. Sends use UDP GSO (one system call
// hands the kernel up to 64 KiB of equal-size packets) and receives UDP
// GRO (the kernel hands back such runs whole) where the kernel has them;
// both are probed once at open and switched off on the first failure.
type sock struct {
	fd          int
	file        *os.File // nil for a send socket (openTxSock)
	rc          syscall.RawConn
	local       netip.AddrPort
	gso         atomic.Bool
	gro         bool
	connected   bool           // sends go to the connected peer, with no address
	connectedTo netip.AddrPort // that peer
	closed      atomic.Bool
}

// gsoMax bounds a GSO super-packet: the UDP length field's 64 KiB and
// the kernel's segment limit.
const (
	gsoMaxBytes = 65000
	gsoMaxSegs  = 64
)

// sockaddr is ap as the kernel takes it (an IPv4-mapped IPv6 address as
// IPv4 when v4 is set).
func sockaddr(ap netip.AddrPort, v4 bool) unix.Sockaddr {
	if v4 {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

// udpSocket opens a non-blocking UDP socket bound to local, with DF on
// every packet (no fragmentation; the IPv4 ID is then zero, as the ICRC
// assumes), buffers of bufBytes (the send buffer, and the receive buffer
// when recv: a window of packets in flight must fit the peer's receive
// buffer; the FORCE variants pass rmem_max as root), and UDP GSO unless
// noGSO. It returns the socket with fd, local and gso set.
func udpSocket(local netip.AddrPort, bufBytes int, recv, noGSO bool) (*sock, error) {
	v4 := local.Addr().Is4()
	fam := unix.AF_INET
	if !v4 {
		fam = unix.AF_INET6
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.IPPROTO_UDP)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := unix.Bind(fd, sockaddr(local, v4)); err != nil {
		unix.Close(fd)
		return nil, err
	}
	s := &sock{fd: fd, local: local}
	bufs := [][2]int{{unix.SO_SNDBUFFORCE, unix.SO_SNDBUF}}
	if recv {
		bufs = append(bufs, [2]int{unix.SO_RCVBUFFORCE, unix.SO_RCVBUF})
	}
	for _, o := range bufs {
		if unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[0], bufBytes) != nil {
			_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, o[1], bufBytes)
		}
	}
	if v4 {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	} else {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_MTU_DISCOVER, unix.IP_PMTUDISC_DO)
	}
	if !noGSO && unix.SetsockoptInt(fd, unix.SOL_UDP, unix.UDP_SEGMENT, 0) == nil {
		s.gso.Store(true)
	}
	return s, nil
}

// openSock opens the device's socket on addr and port: sends and
// receives (UDP GRO unless noGSO), read through Go's poller.
func openSock(addr netip.Addr, port int, bufBytes int, noGSO bool) (*sock, error) {
	s, err := udpSocket(netip.AddrPortFrom(addr, uint16(port)), bufBytes, true, noGSO)
	if err != nil {
		return nil, err
	}
	if !noGSO && unix.SetsockoptInt(s.fd, unix.SOL_UDP, unix.UDP_GRO, 1) == nil {
		s.gro = true
	}
	// The descriptor is non-blocking; Go's poller wakes the receive
	// goroutine (os.NewFile registers it).
	s.file = os.NewFile(uintptr(s.fd), "soft-udp")
	if s.rc, err = s.file.SyscallConn(); err != nil {
		s.file.Close()
		return nil, err
	}
	return s, nil
}

// openTxSock opens a send-only UDP socket bound to local and connected
// to peer: the kernel then routes its datagrams by the route cached at
// connect, where a datagram sent with an address (the device's socket)
// looks the route up on every send. Nothing is read from it.
func openTxSock(local, peer netip.AddrPort, bufBytes int, noGSO bool) (*sock, error) {
	s, err := udpSocket(local, bufBytes, false, noGSO)
	if err != nil {
		return nil, err
	}
	s.connected = true
	fail := func(err error) (*sock, error) {
		unix.Close(s.fd)
		return nil, err
	}
	if err := unix.Connect(s.fd, sockaddr(peer, local.Addr().Is4())); err != nil {
		return fail(err)
	}
	got, err := unix.Getsockname(s.fd)
	if err != nil {
		return fail(err)
	}
	switch g := got.(type) {
	case *unix.SockaddrInet4:
		s.local = netip.AddrPortFrom(netip.AddrFrom4(g.Addr), uint16(g.Port))
	case *unix.SockaddrInet6:
		s.local = netip.AddrPortFrom(netip.AddrFrom16(g.Addr).Unmap(), uint16(g.Port))
	default:
		return fail(fmt.Errorf("socket: local address %T", got))
	}
	return s, nil
}

// readLoop calls fn each time the socket may have datagrams, until the
// socket is closed; fn reports whether it found any (false: wait).
func (s *sock) readLoop(fn func() bool) {
	for !s.closed.Load() {
		if err := s.rc.Read(func(uintptr) bool { return fn() || s.closed.Load() }); err != nil {
			return
		}
	}
}

// close stops readLoop and releases the descriptor. The caller makes sure
// no one sends or receives on it any more.
func (s *sock) close() {
	s.closed.Store(true)
	if s.file == nil {
		unix.Close(s.fd)
		return
	}
	s.file.Close()
}

// waitWritable waits up to a millisecond for send buffer space.
func (s *sock) waitWritable() {
	fds := []unix.PollFd{{Fd: int32(s.fd), Events: unix.POLLOUT}}
	_, _ = unix.Poll(fds, 1)
}

// txState is a sender's reusable system-call scratch space.
type txState struct {
	msgs []unix.Mmsghdr
	iovs []unix.Iovec
	ctrl []byte
	sa   unix.RawSockaddrInet6
	sa4  unix.RawSockaddrInet4
}

const ctrlSpace = 32 // one cmsg with a 2- or 4-byte payload, rounded

func newTxState(maxPkts int) *txState {
	return &txState{
		msgs: make([]unix.Mmsghdr, 0, maxPkts),
		iovs: make([]unix.Iovec, 0, maxPkts*6),
		ctrl: make([]byte, maxPkts*ctrlSpace),
	}
}

// send writes every packet of b to b.dst and returns the number of
// packets the kernel took. Errors other than interruption end the call:
// the transport's retransmission covers a lost packet.
func (s *sock) send(ts *txState, b *txBatch) (int, error) {
	if len(b.pkts) == 0 {
		return 0, nil
	}
	var name *byte
	var namelen uint32
	switch {
	case s.connected:
	case b.dst.Addr().Is4():
		ts.sa4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: b.dst.Addr().As4()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&ts.sa4.Port))[:], b.dst.Port())
		name, namelen = (*byte)(unsafe.Pointer(&ts.sa4)), unix.SizeofSockaddrInet4
	default:
		ts.sa = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: b.dst.Addr().As16()}
		binary.BigEndian.PutUint16((*[2]byte)(unsafe.Pointer(&ts.sa.Port))[:], b.dst.Port())
		name, namelen = (*byte)(unsafe.Pointer(&ts.sa)), unix.SizeofSockaddrInet6
	}
	gso := s.gso.Load()
	sent := 0
	for sent < len(b.pkts) {
		ts.msgs = ts.msgs[:0]
		ts.iovs = ts.iovs[:0]
		// Group packets into messages: with GSO, a run of packets of one
		// size (the last may be shorter) up to the limits.
		type span struct{ first, n, seg int }
		var spans [64]span
		ns := 0
		i := sent
		iovCap := cap(ts.iovs)
		for i < len(b.pkts) && ns < len(spans) {
			k := b.pkts[i]
			sp := span{first: i, n: 1, seg: k.size}
			iovs := k.n
			if gso {
				total := k.size
				for j := i + 1; j < len(b.pkts) && sp.n < gsoMaxSegs; j++ {
					kj := b.pkts[j]
					if kj.size > sp.seg || total+kj.size > gsoMaxBytes || iovs+kj.n > iovCap-len(ts.iovs) {
						break
					}
					total += kj.size
					iovs += kj.n
					sp.n++
					if kj.size < sp.seg {
						break
					}
				}
			}
			if len(ts.iovs)+iovs > iovCap {
				break
			}
			for j := sp.first; j < sp.first+sp.n; j++ {
				for _, p := range b.packetParts(j) {
					ts.iovs = append(ts.iovs, unix.Iovec{Base: &p[0]})
					ts.iovs[len(ts.iovs)-1].SetLen(len(p))
				}
			}
			spans[ns] = sp
			ns++
			i += sp.n
		}
		// Fill the message headers now that the iovec array is final.
		iv := 0
		for m := 0; m < ns; m++ {
			sp := spans[m]
			niov := 0
			for j := sp.first; j < sp.first+sp.n; j++ {
				niov += b.pkts[j].n
			}
			var h unix.Mmsghdr
			h.Hdr.Name, h.Hdr.Namelen = name, namelen
			h.Hdr.Iov = &ts.iovs[iv]
			h.Hdr.SetIovlen(niov)
			iv += niov
			if sp.n > 1 {
				c := ts.ctrl[m*ctrlSpace : (m+1)*ctrlSpace]
				clear(c)
				hdr := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
				hdr.Level, hdr.Type = unix.SOL_UDP, unix.UDP_SEGMENT
				hdr.SetLen(unix.CmsgLen(2))
				*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])) = uint16(sp.seg)
				h.Hdr.Control = &c[0]
				h.Hdr.SetControllen(unix.CmsgSpace(2))
			}
			ts.msgs = append(ts.msgs, h)
		}
		// Send the messages; sendmmsg may take fewer than offered.
		done := 0
		waited := false
		for done < len(ts.msgs) {
			r, _, e := unix.RawSyscall6(unix.SYS_SENDMMSG, uintptr(s.fd),
				uintptr(unsafe.Pointer(&ts.msgs[done])), uintptr(len(ts.msgs)-done), 0, 0, 0)
			if e == unix.EINTR {
				continue
			}
			if e != 0 {
				if (e == unix.EIO || e == unix.EINVAL) && gso && spans[done].n > 1 {
					// The path cannot segment: send single packets from
					// now on, starting with this message's.
					s.gso.Store(false)
					gso = false
					break
				}
				if e == unix.EAGAIN && !waited {
					waited = true
					s.waitWritable()
					continue
				}
				// Skip the message that failed; the transport retransmits.
				waited = false
				sent += spans[done].n
				done++
				if e == unix.EAGAIN || e == unix.ENOBUFS {
					continue
				}
				runtime.KeepAlive(b)
				return sent, e
			}
			for m := done; m < done+int(r); m++ {
				sent += spans[m].n
			}
			done += int(r)
			waited = false
		}
	}
	runtime.KeepAlive(b)
	return sent, nil
}

// rxState is the receive goroutine's batch of buffers. One recvmmsg
// offers limit of them (set by the caller between calls); the message
// headers point at the buffers once and for all, and only the fields the
// kernel wrote in the last call are reset before the next.
type rxState struct {
	bufs  [][]byte
	msgs  []unix.Mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6
	ctrl  []byte
	limit int
	used  int // headers the last call filled
}

func newRxState(n, bufSize int) *rxState {
	r := &rxState{
		bufs:  make([][]byte, n),
		msgs:  make([]unix.Mmsghdr, n),
		iovs:  make([]unix.Iovec, n),
		names: make([]unix.RawSockaddrInet6, n),
		ctrl:  make([]byte, n*ctrlSpace),
		limit: n,
		used:  n,
	}
	mem := make([]byte, n*bufSize)
	for i := range r.bufs {
		r.bufs[i] = mem[i*bufSize : (i+1)*bufSize : (i+1)*bufSize]
		r.iovs[i] = unix.Iovec{Base: &r.bufs[i][0]}
		r.iovs[i].SetLen(bufSize)
		h := &r.msgs[i].Hdr
		h.Name = (*byte)(unsafe.Pointer(&r.names[i]))
		h.Iov = &r.iovs[i]
		h.SetIovlen(1)
		h.Control = &r.ctrl[i*ctrlSpace]
	}
	return r
}

// recv takes up to limit datagrams without waiting (wait: at least one,
// MSG_WAITFORONE) and returns how many arrived.
func (s *sock) recv(r *rxState, wait bool) (int, error) {
	for i := range r.used {
		h := &r.msgs[i].Hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(ctrlSpace)
		h.Flags = 0
		r.msgs[i].Len = 0
	}
	r.used = 0
	flags := unix.MSG_WAITFORONE
	if !wait {
		flags = unix.MSG_DONTWAIT
	}
	for {
		n, _, e := unix.RawSyscall6(unix.SYS_RECVMMSG, uintptr(s.fd),
			uintptr(unsafe.Pointer(&r.msgs[0])), uintptr(r.limit), uintptr(flags), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		r.used = int(n)
		return int(n), nil
	}
}

// datagram returns datagram i of the last recv: its bytes, the size of
// the packets GRO coalesced into it (its length when none) and the
// sender. ok is false for a truncated datagram or an unknown sender
// family.
func (r *rxState) datagram(i int) (data []byte, seg int, from netip.AddrPort, ok bool) {
	m := &r.msgs[i]
	n := int(m.Len)
	if m.Hdr.Flags&unix.MSG_TRUNC != 0 || n > len(r.bufs[i]) {
		return nil, 0, from, false
	}
	data = r.bufs[i][:n]
	seg = n
	cl := int(m.Hdr.Controllen)
	c := r.ctrl[i*ctrlSpace : i*ctrlSpace+min(cl, ctrlSpace)]
	for len(c) >= unix.CmsgLen(0) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&c[0]))
		l := int(h.Len)
		if l < unix.CmsgLen(0) || l > len(c) {
			break
		}
		if h.Level == unix.SOL_UDP && h.Type == unix.UDP_GRO && l >= unix.CmsgLen(2) {
			v := int(*(*uint16)(unsafe.Pointer(&c[unix.CmsgLen(0)])))
			if l >= unix.CmsgLen(4) {
				v = int(*(*int32)(unsafe.Pointer(&c[unix.CmsgLen(0)])))
			}
			if v > 0 {
				seg = v
			}
		}
		sp := unix.CmsgSpace(l - unix.CmsgLen(0))
		if sp > len(c) {
			break
		}
		c = c[sp:]
	}
	sa := &r.names[i]
	switch sa.Family {
	case unix.AF_INET:
		s4 := (*unix.RawSockaddrInet4)(unsafe.Pointer(sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&s4.Port))[:])
		from = netip.AddrPortFrom(netip.AddrFrom4(s4.Addr), port)
	case unix.AF_INET6:
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		from = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr).Unmap(), port)
	default:
		return nil, 0, from, false
	}
	return data, seg, from, true
}
