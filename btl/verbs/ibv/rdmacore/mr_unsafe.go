//go:build rdmacore && linux && cgo

// Protection domains and memory registrations. RegMR pins the Go slice
// with a runtime.Pinner for as long as the registration lives, since the
// NIC reads and writes it by address; Dereg unpins it.

package rdmacore

/*
#include "shim.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"syscall"
	"unsafe"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

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
