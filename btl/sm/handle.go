package sm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
	"sync"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
)

// Registration handles are the one place where addresses cross processes.
// A handle is 32 bytes, little-endian:
//
//	 0 u32 magic "gSMh"
//	 4 u32 owner pid
//	 8 u64 address of the registered memory in the owner
//	16 u64 length
//	24 u32 owner world rank
//	28 u32 CRC-32C of bytes 0-27
//
// Put and Get accept a handle only on the endpoint to its owner (pid and
// rank match the peer) and only for a range inside [0, length): anything
// else is btl.ErrBadHandle before any byte moves. The kernel checks the
// rest (the address must be mapped in the owner: EFAULT otherwise).
const (
	handleLen   = 32
	handleMagic = 0x68534d67 // "gSMh"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type handle struct {
	pid, rank int
	addr, n   uint64
}

// encodeInto writes h into b, the registration's own array: a local one
// escapes into the checksum (an indirect call) and cost an allocation per
// Register.
func (h handle) encodeInto(b *[handleLen]byte) {
	le := binary.LittleEndian
	le.PutUint32(b[0:], handleMagic)
	le.PutUint32(b[4:], uint32(h.pid))
	le.PutUint64(b[8:], h.addr)
	le.PutUint64(b[16:], h.n)
	le.PutUint32(b[24:], uint32(h.rank))
	le.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
}

func decodeHandle(b []byte) (handle, error) {
	var h handle
	le := binary.LittleEndian
	if len(b) != handleLen || le.Uint32(b) != handleMagic || le.Uint32(b[28:]) != crc32.Checksum(b[:28], castagnoli) {
		return h, fmt.Errorf("sm: handle of %d bytes does not decode: %w", len(b), btl.ErrBadHandle)
	}
	h = handle{pid: int(le.Uint32(b[4:])), addr: le.Uint64(b[8:]), n: le.Uint64(b[16:]), rank: int(le.Uint32(b[24:]))}
	if h.addr+h.n < h.addr {
		return h, fmt.Errorf("sm: handle range [%#x,+%d) wraps: %w", h.addr, h.n, btl.ErrBadHandle)
	}
	return h, nil
}

// registration pins Go memory (it must neither move nor be freed while a
// peer may write it) until Release.
type registration struct {
	m      *Module
	h      [handleLen]byte
	mem    []byte // fixed at Register: what a shared Get's helper copies from (help.go)
	mu     sync.Mutex
	pinner *runtime.Pinner // guarded by mu; nil for empty memory
	done   bool            // guarded by mu
}

// pinners recycles runtime.Pinners: a new one costs a SetFinalizer, a
// recycled one usually still holds the runtime's pinner behind it
// (Register: 19% -> 7% of the sender's CPU profile in gompi-bench bw
// --sizes 16k).
var pinners = sync.Pool{New: func() any { return new(runtime.Pinner) }}

// Register makes mem reachable by Put/Get of the local peers. mem must stay
// valid until Release; Go memory is pinned meanwhile. It needs put or get
// in Caps (cross-memory attach permitted): otherwise an error wrapping
// mpierr.ErrNotSupported.
func (m *Module) Register(mem []byte, _ btl.Access) (btl.Registration, error) {
	if m.closed.Load() {
		return nil, fmt.Errorf("sm: module closed: %w", btl.ErrClosed)
	}
	if m.Caps()&btl.CapRDMA == 0 {
		return nil, mpierr.Errorf(mpierr.ErrNotSupported, "sm: no single-copy put/get here (%s)", Status())
	}
	r := &registration{m: m, mem: mem}
	if len(mem) > 0 {
		r.pinner = pinners.Get().(*runtime.Pinner)
		r.pinner.Pin(&mem[0])
	}
	// The module keeps live registrations reachable: a pinned Pinner must
	// not be collected. Close releases what is left.
	m.regMu.Lock()
	m.regs[r] = struct{}{}
	m.nregs.Store(int64(len(m.regs)))
	m.regMu.Unlock()
	handle{pid: m.pid, rank: m.rank, addr: uint64(sys.Addr(mem)), n: uint64(len(mem))}.encodeInto(&r.h)
	m.hugeNote(mem)
	return r, nil
}

func (r *registration) Handle() []byte { return r.h[:] }

func (r *registration) Release() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.done {
		r.done = true
		if r.pinner != nil {
			r.pinner.Unpin()
			pinners.Put(r.pinner)
			r.pinner = nil
		}
		r.m.regMu.Lock()
		delete(r.m.regs, r)
		r.m.nregs.Store(int64(len(r.m.regs)))
		r.m.regMu.Unlock()
	}
	return nil
}

// releaseAll ends every registration still live (Close).
func (m *Module) releaseAll() {
	m.regMu.Lock()
	regs := make([]*registration, 0, len(m.regs))
	for r := range m.regs {
		regs = append(regs, r)
	}
	m.regMu.Unlock()
	for _, r := range regs {
		r.Release()
	}
}

// remote validates handle and [off, off+n) for a Put/Get on e and returns
// the remote address.
func (e *endpoint) remote(h []byte, off, n int, c btl.Caps) (uintptr, error) {
	if e.m.closed.Load() {
		return 0, fmt.Errorf("sm: module closed: %w", btl.ErrClosed)
	}
	if !e.p.mapped.Load() { // first use: map the peer's segment (a shared Get posts into it)
		e.mu.Lock()
		err := e.usable()
		e.mu.Unlock()
		if err != nil {
			return 0, err
		}
	}
	if e.m.Caps()&c == 0 || e.p.cmaErr != nil {
		return 0, mpierr.Errorf(mpierr.ErrNotSupported, "sm: no single-copy %v to rank %d (%s)", c, e.p.rank, Status())
	}
	hd, err := decodeHandle(h)
	if err != nil {
		return 0, err
	}
	if hd.pid != e.p.pid || hd.rank != e.p.rank {
		return 0, fmt.Errorf("sm: handle of rank %d (pid %d) used towards rank %d (pid %d): %w", hd.rank, hd.pid, e.p.rank, e.p.pid, btl.ErrBadHandle)
	}
	if off < 0 || uint64(off) > hd.n || uint64(n) > hd.n-uint64(off) {
		return 0, fmt.Errorf("sm: range [%d,+%d) outside a %d-byte registration: %w", off, n, hd.n, btl.ErrBadHandle)
	}
	if err := e.p.failure(); err != nil {
		return 0, err
	}
	return uintptr(hd.addr + uint64(off)), nil
}

// Put writes local into the peer's registered memory at off with one
// process_vm_writev; it completes during the call (done true, cb unused):
// the data is in the peer's memory when Put returns.
func (e *endpoint) Put(local []byte, h []byte, off int, _ btl.Completion) (bool, error) {
	addr, err := e.remote(h, off, len(local), btl.CapPut)
	if err != nil {
		return false, err
	}
	if len(local) > 0 {
		if err := sys.CMAWrite(e.p.pid, local, addr); err != nil {
			return false, e.cmaFailed("put", err)
		}
	}
	e.m.puts.Add(1)
	e.m.putBytes.Add(int64(len(local)))
	return true, nil
}

// Get reads from the peer's registered memory at off into local with one
// process_vm_readv; it completes during the call.
func (e *endpoint) Get(local []byte, h []byte, off int, _ btl.Completion) (bool, error) {
	if err := e.GetNow(local, h, off); err != nil {
		return false, err
	}
	return true, nil
}

// GetNow is Get, which over sm always finishes before it returns
// (btl.SyncGetter).
func (e *endpoint) GetNow(local []byte, h []byte, off int) error {
	addr, err := e.remote(h, off, len(local), btl.CapGet)
	if err != nil {
		return err
	}
	if len(local) > 0 {
		var err error
		if e.canShare(len(local)) {
			err = e.sharedGet(local, addr)
		} else {
			err = sys.CMARead(e.p.pid, local, addr)
		}
		if err != nil {
			return e.cmaFailed("get", err)
		}
	}
	e.m.gets.Add(1)
	e.m.getBytes.Add(int64(len(local)))
	return nil
}

func (e *endpoint) cmaFailed(op string, err error) error {
	switch {
	case errors.Is(err, sys.ErrNoProcess):
		err = fmt.Errorf("sm: %s to rank %d: process gone: %w", op, e.p.rank, mpierr.ErrProcFailed)
		e.m.fail(e.p, err)
		return err
	case errors.Is(err, sys.ErrFault):
		return fmt.Errorf("sm: %s to rank %d: registered memory not mapped there (released?): %v: %w", op, e.p.rank, err, btl.ErrBadHandle)
	case errors.Is(err, sys.ErrPerm), errors.Is(err, sys.ErrAccess):
		return mpierr.Errorf(mpierr.ErrNotSupported, "sm: %s to rank %d: %v", op, e.p.rank, err)
	}
	return fmt.Errorf("sm: %s to rank %d: %w", op, e.p.rank, err)
}
