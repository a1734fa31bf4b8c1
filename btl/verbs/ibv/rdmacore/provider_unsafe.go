//go:build rdmacore && linux && cgo

package rdmacore

/*
#cgo LDFLAGS: -libverbs
#include "shim.h"
*/
import "C"

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"
	"unsafe"

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

var errNotOurs = errors.New("rdmacore: object of another provider or device")
