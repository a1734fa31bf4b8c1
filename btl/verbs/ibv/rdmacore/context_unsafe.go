//go:build rdmacore && linux && cgo

// An open device (devContext): its attributes and limits, the goroutine
// that reads its asynchronous events, port and GID queries, and the
// objects made from it directly (PDs, completion channels, CQs), counted
// so that Close refuses while any is alive.

package rdmacore

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"sync"
	"syscall"
	"unsafe"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"golang.org/x/sys/unix"
)

// devContext is an open device.
type devContext struct {
	ctx  *C.struct_ibv_context
	attr ibv.DeviceAttr
	lim  limits
	wake int // eventfd that stops the async event reader

	asyncDone chan struct{}

	mu       sync.Mutex
	children int // PDs, CQs and channels not yet destroyed; guarded by mu
	closed   bool
	cqs      map[*C.struct_ibv_cq]*cq // live CQs by handle, for events; guarded by mu
}

var _ ibv.Context = (*devContext)(nil)

func (c *devContext) init(name string) error {
	attr, err := queryDevice(c.ctx, name)
	if err != nil {
		return err
	}
	c.attr = attr
	c.lim.ports = attr.PhysPortCnt
	for p := 1; p <= attr.PhysPortCnt; p++ {
		pa, err := c.QueryPort(uint8(p))
		if err != nil {
			return err
		}
		c.lim.pkeyTblLen = max(c.lim.pkeyTblLen, pa.PKeyTblLen)
		c.lim.gidTblLen = max(c.lim.gidTblLen, pa.GIDTblLen)
	}
	c.attr.MaxInline = c.probeInline()
	if r := C.gompi_set_nonblock(c.ctx.async_fd); r != 0 {
		return errnoErr("rdmacore: async fd non-blocking", syscall.Errno(r))
	}
	c.wake, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return fmt.Errorf("rdmacore: eventfd: %w", err)
	}
	go c.asyncLoop(int(c.ctx.async_fd))
	return nil
}

// probeInline finds the largest inline send the device accepts by
// creating a small QP with decreasing max_inline_data (verbs has no
// device attribute for it).
func (c *devContext) probeInline() int {
	pd := C.ibv_alloc_pd(c.ctx)
	if pd == nil {
		return 0
	}
	defer C.ibv_dealloc_pd(pd)
	cq := C.ibv_create_cq(c.ctx, 4, nil, nil, 0)
	if cq == nil {
		return 0
	}
	defer C.ibv_destroy_cq(cq)
	for _, want := range []int{1024, 512, 256, 128, 64, 32, 16} {
		var ia C.struct_ibv_qp_init_attr
		ia.send_cq, ia.recv_cq = cq, cq
		ia.qp_type = C.IBV_QPT_RC
		ia.cap.max_send_wr, ia.cap.max_recv_wr = 1, 1
		ia.cap.max_send_sge, ia.cap.max_recv_sge = 1, 1
		ia.cap.max_inline_data = C.uint32_t(want)
		if qp := C.ibv_create_qp(pd, &ia); qp != nil {
			got := int(ia.cap.max_inline_data)
			C.ibv_destroy_qp(qp)
			return max(got, want)
		}
	}
	return 0
}

// asyncLoop reads the device's asynchronous events until Close signals
// wake: a CQ error (overrun) marks the CQ so that its Poll fails.
func (c *devContext) asyncLoop(fd int) {
	defer close(c.asyncDone)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}, {Fd: int32(c.wake), Events: unix.POLLIN}}
	for {
		if _, err := unix.Poll(fds, -1); err != nil && err != unix.EINTR {
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		for {
			var typ C.int
			var ecq *C.struct_ibv_cq
			var eqp *C.struct_ibv_qp
			if C.gompi_get_async_event(c.ctx, &typ, &ecq, &eqp) != 0 {
				break
			}
			if typ == C.IBV_EVENT_CQ_ERR && ecq != nil {
				c.mu.Lock()
				if q := c.cqs[ecq]; q != nil {
					q.overrun.Store(true)
				}
				c.mu.Unlock()
			}
		}
	}
}

func (c *devContext) Device() ibv.DeviceAttr { return c.attr }

func (c *devContext) QueryPort(port uint8) (ibv.PortAttr, error) {
	if port < 1 || int(port) > c.attr.PhysPortCnt {
		return ibv.PortAttr{}, fmt.Errorf("rdmacore: port %d of %d: %w", port, c.attr.PhysPortCnt, ibv.ErrInvalid)
	}
	var a C.struct_ibv_port_attr
	if r := C.gompi_query_port(c.ctx, C.uint8_t(port), &a); r != 0 {
		return ibv.PortAttr{}, errnoErr(fmt.Sprintf("rdmacore: query port %d", port), syscall.Errno(r))
	}
	link := ibv.LinkInfiniBand
	if a.link_layer == C.IBV_LINK_LAYER_ETHERNET {
		link = ibv.LinkEthernet
	}
	return ibv.PortAttr{
		State:      ibv.PortState(a.state),
		MaxMTU:     ibv.MTU(a.max_mtu),
		ActiveMTU:  ibv.MTU(a.active_mtu),
		LID:        uint16(a.lid),
		GIDTblLen:  int(a.gid_tbl_len),
		LinkLayer:  link,
		PKeyTblLen: int(a.pkey_tbl_len),
	}, nil
}

func (c *devContext) QueryGID(port uint8, index int) (ibv.GID, error) {
	var g ibv.GID
	if port < 1 || int(port) > c.attr.PhysPortCnt || index < 0 || (c.lim.gidTblLen > 0 && index >= c.lim.gidTblLen) {
		return g, fmt.Errorf("rdmacore: GID %d of port %d: %w", index, port, ibv.ErrInvalid)
	}
	var raw [16]C.uint8_t
	if r := C.gompi_query_gid(c.ctx, C.uint8_t(port), C.int(index), &raw[0]); r != 0 {
		return g, errnoErr(fmt.Sprintf("rdmacore: query GID %d of port %d", index, port), syscall.Errno(r))
	}
	for i := range raw {
		g[i] = byte(raw[i])
	}
	return g, nil
}

// hold counts a new child of the context, or fails once it is closed.
func (c *devContext) hold() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("rdmacore: device %s: %w", c.attr.Name, ibv.ErrClosed)
	}
	c.children++
	return nil
}

func (c *devContext) release() {
	c.mu.Lock()
	c.children--
	c.mu.Unlock()
}

func (c *devContext) AllocPD() (ibv.PD, error) {
	if err := c.hold(); err != nil {
		return nil, err
	}
	p, err := C.ibv_alloc_pd(c.ctx)
	if p == nil {
		c.release()
		return nil, errnoErr("rdmacore: ibv_alloc_pd", errnoOf(err, syscall.ENOMEM))
	}
	return &pd{c: c, pd: p}, nil
}

func (c *devContext) CreateCompChannel() (ibv.CompChannel, error) {
	if err := c.hold(); err != nil {
		return nil, err
	}
	ch, err := C.ibv_create_comp_channel(c.ctx)
	if ch == nil {
		c.release()
		return nil, errnoErr("rdmacore: ibv_create_comp_channel", errnoOf(err, syscall.ENOMEM))
	}
	if r := C.gompi_set_nonblock(ch.fd); r != 0 {
		C.ibv_destroy_comp_channel(ch)
		c.release()
		return nil, errnoErr("rdmacore: completion channel non-blocking", syscall.Errno(r))
	}
	wake, werr := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if werr != nil {
		C.ibv_destroy_comp_channel(ch)
		c.release()
		return nil, fmt.Errorf("rdmacore: eventfd: %w", werr)
	}
	return &channel{c: c, ch: ch, wake: wake}, nil
}

func (c *devContext) CreateCQ(cqe int, ch ibv.CompChannel) (ibv.CQ, error) {
	if cqe < 1 || cqe > c.attr.MaxCQE {
		return nil, fmt.Errorf("rdmacore: CQ of %d entries (device max %d): %w", cqe, c.attr.MaxCQE, ibv.ErrInvalid)
	}
	var chn *channel
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		var ok bool
		if chn, ok = ch.(*channel); !ok || chn.c != c {
			return nil, fmt.Errorf("rdmacore: CQ with a channel of another device or provider: %w", ibv.ErrInvalid)
		}
		if err := chn.hold(); err != nil {
			return nil, err
		}
		cch = chn.ch
	}
	if err := c.hold(); err != nil {
		if chn != nil {
			chn.release()
		}
		return nil, err
	}
	q, err := C.ibv_create_cq(c.ctx, C.int(cqe), nil, cch, 0)
	if q == nil {
		c.release()
		if chn != nil {
			chn.release()
		}
		return nil, errnoErr("rdmacore: ibv_create_cq", errnoOf(err, syscall.ENOMEM))
	}
	r := &cq{c: c, cq: q, ch: chn,
		raw: (*C.struct_ibv_wc)(C.calloc(pollBatch, C.size_t(unsafe.Sizeof(C.struct_ibv_wc{})))),
		out: (*C.gompi_wc)(C.calloc(pollBatch, C.size_t(unsafe.Sizeof(C.gompi_wc{}))))}
	c.mu.Lock()
	c.cqs[q] = r
	c.mu.Unlock()
	return r, nil
}

// Close stops the async event reader and closes the device; ErrBusy while
// PDs, CQs or channels remain.
func (c *devContext) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("rdmacore: device %s: %w", c.attr.Name, ibv.ErrClosed)
	}
	if c.children > 0 {
		n := c.children
		c.mu.Unlock()
		return fmt.Errorf("rdmacore: close device %s with %d objects left: %w", c.attr.Name, n, ibv.ErrBusy)
	}
	c.closed = true
	c.mu.Unlock()
	one := [8]byte{1}
	_, _ = unix.Write(c.wake, one[:])
	<-c.asyncDone
	_ = unix.Close(c.wake)
	if r := C.ibv_close_device(c.ctx); r != 0 {
		return errnoErr("rdmacore: ibv_close_device", syscall.Errno(r))
	}
	return nil
}
