//go:build rdmacore && linux && cgo

package rdmacore

/*
#cgo LDFLAGS: -libverbs
#include "shim.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/params"
)

func init() {
	ibv.RegisterProvider("rdmacore", func(*params.Set) (ibv.Provider, error) { return New(), nil })
}

// Provider opens the RDMA devices libibverbs finds.
type Provider struct{}

var _ ibv.Provider = (*Provider)(nil)

// New returns the rdmacore provider. It touches no device until Devices
// or Open is called.
func New() *Provider { return &Provider{} }

// Name is "rdmacore".
func (p *Provider) Name() string { return "rdmacore" }

// deviceList returns libibverbs' device list (to be freed with
// ibv_free_device_list) and its length, or an error wrapping
// ibv.ErrNoDevice when there is no device.
func deviceList() (**C.struct_ibv_device, int, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, 0, fmt.Errorf("rdmacore: ibv_get_device_list: %v: %w", errnoOf(err, syscall.ENODEV), ibv.ErrNoDevice)
	}
	if n == 0 {
		C.ibv_free_device_list(list)
		return nil, 0, fmt.Errorf("rdmacore: libibverbs lists no RDMA device: %w", ibv.ErrNoDevice)
	}
	return list, int(n), nil
}

// Devices lists every device with its attributes (as ibv_devinfo prints
// them), opening each briefly.
func (p *Provider) Devices() ([]ibv.DeviceAttr, error) {
	list, n, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(list)
	var out []ibv.DeviceAttr
	for i := range n {
		dev := C.gompi_device_at(list, C.int(i))
		name := C.GoString(C.gompi_device_name(list, C.int(i)))
		c, err := C.ibv_open_device(dev)
		if c == nil {
			return out, fmt.Errorf("rdmacore: open %s: %w", name, errnoErr("ibv_open_device", errnoOf(err, syscall.ENODEV)))
		}
		attr, err := queryDevice(c, name)
		C.ibv_close_device(c)
		if err != nil {
			return out, err
		}
		out = append(out, attr)
	}
	return out, nil
}

func queryDevice(c *C.struct_ibv_context, name string) (ibv.DeviceAttr, error) {
	var a C.struct_ibv_device_attr
	if r := C.ibv_query_device(c, &a); r != 0 {
		return ibv.DeviceAttr{}, errnoErr("ibv_query_device "+name, syscall.Errno(r))
	}
	guid := (*[8]byte)(unsafe.Pointer(&a.node_guid))
	return ibv.DeviceAttr{
		Name:            name,
		Provider:        "rdmacore",
		NodeGUID:        binary.BigEndian.Uint64(guid[:]),
		FWVersion:       C.GoString(&a.fw_ver[0]),
		VendorID:        uint32(a.vendor_id),
		VendorPartID:    uint32(a.vendor_part_id),
		HWVersion:       uint32(a.hw_ver),
		MaxMRSize:       uint64(a.max_mr_size),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		MaxSGE:          int(a.max_sge),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxPD:           int(a.max_pd),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		PhysPortCnt:     int(a.phys_port_cnt),
	}, nil
}

// Open opens the named device ("" = the first one libibverbs lists).
func (p *Provider) Open(name string) (ibv.Context, error) {
	list, n, err := deviceList()
	if err != nil {
		return nil, err
	}
	defer C.ibv_free_device_list(list)
	var dev *C.struct_ibv_device
	var names []string
	for i := range n {
		dn := C.GoString(C.gompi_device_name(list, C.int(i)))
		names = append(names, dn)
		if dev == nil && (name == "" || dn == name) {
			dev, name = C.gompi_device_at(list, C.int(i)), dn
		}
	}
	if dev == nil {
		return nil, fmt.Errorf("rdmacore: no device %q (have %v): %w", name, names, ibv.ErrNoDevice)
	}
	c, cerr := C.ibv_open_device(dev)
	if c == nil {
		return nil, errnoErr("rdmacore: ibv_open_device "+name, errnoOf(cerr, syscall.ENODEV))
	}
	ctx := &devContext{ctx: c, cqs: map[*C.struct_ibv_cq]*cq{}, asyncDone: make(chan struct{})}
	if err := ctx.init(name); err != nil {
		C.ibv_close_device(c)
		return nil, err
	}
	return ctx, nil
}

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

// pd is a protection domain.
type pd struct {
	c  *devContext
	pd *C.struct_ibv_pd

	mu     sync.Mutex
	users  int // MRs and QPs; guarded by mu
	closed bool
}

var _ ibv.PD = (*pd)(nil)

func (p *pd) hold() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("rdmacore: PD: %w", ibv.ErrClosed)
	}
	p.users++
	return nil
}

func (p *pd) release() {
	p.mu.Lock()
	p.users--
	p.mu.Unlock()
}

// RegMR registers buf, pinning it (runtime.Pinner) until Dereg. A
// zero-length buf is backed by one byte of C memory registered for local
// access only, so its keys are valid for 0-byte operations and any
// remote access of a byte or more is refused.
func (p *pd) RegMR(buf []byte, access ibv.Access) (ibv.MR, error) {
	if err := validateAccess(access); err != nil {
		return nil, err
	}
	if err := p.hold(); err != nil {
		return nil, err
	}
	m := &mr{pd: p, buf: buf, access: access}
	var addr unsafe.Pointer
	acc := C.int(access)
	n := len(buf)
	if n == 0 {
		m.cmem = C.malloc(1)
		addr, n, acc = m.cmem, 1, C.IBV_ACCESS_LOCAL_WRITE
	} else {
		m.pin.Pin(&buf[0])
		addr = unsafe.Pointer(&buf[0])
	}
	r, err := C.ibv_reg_mr(p.pd, addr, C.size_t(n), acc)
	if r == nil {
		m.unpin()
		p.release()
		return nil, errnoErr(fmt.Sprintf("rdmacore: ibv_reg_mr of %d bytes", len(buf)), errnoOf(err, syscall.ENOMEM))
	}
	m.mr = r
	return m, nil
}

func (p *pd) Dealloc() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("rdmacore: PD: %w", ibv.ErrClosed)
	}
	if p.users > 0 {
		return fmt.Errorf("rdmacore: dealloc PD with %d MRs and QPs: %w", p.users, ibv.ErrBusy)
	}
	if r := C.ibv_dealloc_pd(p.pd); r != 0 {
		return errnoErr("rdmacore: ibv_dealloc_pd", syscall.Errno(r))
	}
	p.closed = true
	p.c.release()
	return nil
}

// mr is a registered memory region.
type mr struct {
	pd     *pd
	mr     *C.struct_ibv_mr
	buf    []byte
	access ibv.Access
	pin    runtime.Pinner
	cmem   unsafe.Pointer // the byte behind a zero-length MR

	mu     sync.Mutex
	closed bool
}

var _ ibv.MR = (*mr)(nil)

func (m *mr) LKey() uint32       { return uint32(m.mr.lkey) }
func (m *mr) RKey() uint32       { return uint32(m.mr.rkey) }
func (m *mr) Addr() uint64       { return uint64(uintptr(m.mr.addr)) }
func (m *mr) Len() int           { return len(m.buf) }
func (m *mr) Access() ibv.Access { return m.access }
func (m *mr) Buf() []byte        { return m.buf }

func (m *mr) unpin() {
	m.pin.Unpin()
	if m.cmem != nil {
		C.free(m.cmem)
		m.cmem = nil
	}
}

// Dereg ends the registration, then unpins the memory.
func (m *mr) Dereg() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return fmt.Errorf("rdmacore: MR: %w", ibv.ErrClosed)
	}
	if r := C.ibv_dereg_mr(m.mr); r != 0 {
		return errnoErr("rdmacore: ibv_dereg_mr", syscall.Errno(r))
	}
	m.closed = true
	m.unpin()
	m.pd.release()
	return nil
}

// channel is a completion channel.
type channel struct {
	c    *devContext
	ch   *C.struct_ibv_comp_channel
	wake int // eventfd: a waiter's context ended, or Close

	getMu sync.Mutex // held by GetEvent while it waits; Close takes it to wait for it

	mu     sync.Mutex
	users  int // CQs; guarded by mu
	closed atomic.Bool
}

var _ ibv.CompChannel = (*channel)(nil)

func (ch *channel) hold() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed.Load() {
		return fmt.Errorf("rdmacore: channel: %w", ibv.ErrClosed)
	}
	ch.users++
	return nil
}

func (ch *channel) release() {
	ch.mu.Lock()
	ch.users--
	ch.mu.Unlock()
}

func (ch *channel) signal() {
	one := [8]byte{1}
	_, _ = unix.Write(ch.wake, one[:])
}

// GetEvent takes the next CQ event: it tries the non-blocking channel fd
// and, when empty, waits in poll(2) for it or for the eventfd that ctx's
// end (or Close) writes.
func (ch *channel) GetEvent(ctx context.Context) (ibv.CQ, error) {
	ch.getMu.Lock()
	defer ch.getMu.Unlock()
	fds := []unix.PollFd{{Fd: int32(ch.ch.fd), Events: unix.POLLIN}, {Fd: int32(ch.wake), Events: unix.POLLIN}}
	for {
		if ch.closed.Load() {
			return nil, fmt.Errorf("rdmacore: channel: %w", ibv.ErrClosed)
		}
		var q *C.struct_ibv_cq
		switch r := syscall.Errno(C.gompi_get_cq_event(ch.ch, &q)); r {
		case 0:
			ch.c.mu.Lock()
			cq := ch.c.cqs[q]
			ch.c.mu.Unlock()
			if cq == nil {
				panic("rdmacore: completion event for a CQ the device does not know")
			}
			cq.events.Add(1)
			return cq, nil
		case syscall.EAGAIN:
		default:
			return nil, errnoErr("rdmacore: ibv_get_cq_event", r)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		stop := context.AfterFunc(ctx, ch.signal)
		_, err := unix.Poll(fds, -1)
		stop()
		if err != nil && err != unix.EINTR {
			return nil, fmt.Errorf("rdmacore: poll completion channel: %w", err)
		}
		if fds[1].Revents != 0 {
			var b [8]byte
			_, _ = unix.Read(ch.wake, b[:]) // reset; a stale signal only costs a loop
		}
	}
}

// Close destroys the channel; ErrBusy while CQs use it. A GetEvent
// waiting on it returns ErrClosed.
func (ch *channel) Close() error {
	ch.mu.Lock()
	if ch.closed.Load() {
		ch.mu.Unlock()
		return fmt.Errorf("rdmacore: channel: %w", ibv.ErrClosed)
	}
	if ch.users > 0 {
		n := ch.users
		ch.mu.Unlock()
		return fmt.Errorf("rdmacore: close channel with %d CQs: %w", n, ibv.ErrBusy)
	}
	ch.closed.Store(true)
	ch.mu.Unlock()
	ch.signal()
	ch.getMu.Lock() // a GetEvent in progress has returned
	defer ch.getMu.Unlock()
	_ = unix.Close(ch.wake)
	if r := C.ibv_destroy_comp_channel(ch.ch); r != 0 {
		return errnoErr("rdmacore: ibv_destroy_comp_channel", syscall.Errno(r))
	}
	ch.c.release()
	return nil
}

// pollBatch is how many completions one ibv_poll_cq call takes.
const pollBatch = 64

// cq is a completion queue.
type cq struct {
	c  *devContext
	cq *C.struct_ibv_cq
	ch *channel

	pollMu sync.Mutex       // serialises Poll over raw and out
	raw    *C.struct_ibv_wc // pollBatch entries of C memory
	out    *C.gompi_wc      // pollBatch entries of C memory

	overrun       atomic.Bool  // the device reported IBV_EVENT_CQ_ERR
	events, acked atomic.Int64 // completion events taken and acknowledged
	mu            sync.Mutex
	users         int // QPs; guarded by mu
	closed        bool
}

var _ ibv.CQ = (*cq)(nil)

func (q *cq) hold() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("rdmacore: CQ: %w", ibv.ErrClosed)
	}
	q.users++
	return nil
}

func (q *cq) release() {
	q.mu.Lock()
	q.users--
	q.mu.Unlock()
}

// Poll takes up to len(wc) completions, oldest first.
func (q *cq) Poll(wc []ibv.WC) (int, error) {
	if q.overrun.Load() {
		return 0, fmt.Errorf("rdmacore: CQ: %w", ibv.ErrCQOverrun)
	}
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("rdmacore: CQ: %w", ibv.ErrClosed)
	}
	got := 0
	out := unsafe.Slice(q.out, pollBatch)
	for got < len(wc) {
		want := min(len(wc)-got, pollBatch)
		k := int(C.gompi_poll_cq(q.cq, C.int(want), q.raw, q.out))
		if k < 0 {
			// ibv_poll_cq reports a failure without an errno.
			return got, fmt.Errorf("rdmacore: ibv_poll_cq failed (%d) after %d completions", k, got)
		}
		for i := range k {
			o := &out[i]
			wc[got+i] = ibv.WC{
				ID:        uint64(o.id),
				Status:    ibv.WCStatus(o.status),
				Opcode:    ibv.WCOpcode(o.opcode),
				VendorErr: uint32(o.vendor_err),
				ByteLen:   uint32(o.byte_len),
				Imm:       uint32(o.imm),
				QPNum:     uint32(o.qp_num),
				SrcQP:     uint32(o.src_qp),
				Flags:     ibv.WCFlags(o.flags),
			}
		}
		got += k
		if k < want {
			break
		}
	}
	return got, nil
}

func (q *cq) ReqNotify(solicitedOnly bool) error {
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	if r := C.gompi_req_notify_cq(q.cq, s); r != 0 {
		return errnoErr("rdmacore: ibv_req_notify_cq", syscall.Errno(r))
	}
	return nil
}

func (q *cq) AckEvents(n int) {
	if n <= 0 {
		return
	}
	C.ibv_ack_cq_events(q.cq, C.uint(n))
	q.acked.Add(int64(n))
}

// Destroy releases the CQ; ErrBusy while QPs use it or while events taken
// with GetEvent are not acknowledged (ibv_destroy_cq would wait for them
// without end).
func (q *cq) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("rdmacore: CQ: %w", ibv.ErrClosed)
	}
	if q.users > 0 {
		return fmt.Errorf("rdmacore: destroy CQ used by %d QPs: %w", q.users, ibv.ErrBusy)
	}
	if ev, ack := q.events.Load(), q.acked.Load(); ev != ack {
		return fmt.Errorf("rdmacore: destroy CQ with %d of %d events unacknowledged: %w", ev-ack, ev, ibv.ErrBusy)
	}
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	if r := C.ibv_destroy_cq(q.cq); r != 0 {
		return errnoErr("rdmacore: ibv_destroy_cq", syscall.Errno(r))
	}
	q.closed = true
	q.c.mu.Lock()
	delete(q.c.cqs, q.cq)
	q.c.mu.Unlock()
	C.free(unsafe.Pointer(q.raw))
	C.free(unsafe.Pointer(q.out))
	if q.ch != nil {
		q.ch.release()
	}
	q.c.release()
	return nil
}

var errNotOurs = errors.New("rdmacore: object of another provider or device")
