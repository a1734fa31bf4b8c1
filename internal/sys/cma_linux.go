package sys

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// RemoteIOV is a range of another process's address space: the remote half
// of a cross-memory-attach transfer. Addr is an address in that process,
// never dereferenced here.
type RemoteIOV struct {
	Addr uintptr
	Len  int
}

// iovMax is the kernel's UIO_MAXIOV: the most iovecs one call takes.
const iovMax = 1024

// ProcessVMReadv copies from the remote ranges of process pid into the
// local buffers, in order, until either list is exhausted
// (process_vm_readv(2)). The kernel may stop early (a fault in the middle
// of a range, or more than 1024 ranges); the rest is retried, so on a nil
// error n is min(total local, total remote) bytes. A transfer that makes no
// progress returns the bytes done so far and the error (EFAULT: a remote
// range is not mapped; ESRCH: no such process; EPERM: ptrace access
// denied).
func ProcessVMReadv(pid int, local [][]byte, remote []RemoteIOV) (int, error) {
	return cmaVec(pid, local, remote, false)
}

// ProcessVMWritev copies the local buffers into the remote ranges of
// process pid (process_vm_writev(2)); otherwise as ProcessVMReadv.
func ProcessVMWritev(pid int, local [][]byte, remote []RemoteIOV) (int, error) {
	return cmaVec(pid, local, remote, true)
}

// CMARead copies len(local) bytes from address addr of process pid into
// local. It allocates nothing; a short transfer is retried.
func CMARead(pid int, local []byte, addr uintptr) error {
	return cma1(pid, local, addr, false)
}

// CMAWrite copies local to address addr of process pid. It allocates
// nothing; a short transfer is retried.
func CMAWrite(pid int, local []byte, addr uintptr) error {
	return cma1(pid, local, addr, true)
}

func cma1(pid int, local []byte, addr uintptr, write bool) error {
	var liov [1]unix.Iovec
	var riov [1]unix.RemoteIovec
	done := 0
	for done < len(local) {
		// At most cmaChunk per call: the calls are raw (cmaCall), so a
		// long one would hold this goroutine's P, and delay a garbage
		// collection's stop-the-world, for its whole duration.
		b := local[done:min(len(local), done+cmaChunk)]
		liov[0].Base = &b[0]
		liov[0].SetLen(len(b))
		riov[0] = unix.RemoteIovec{Base: addr + uintptr(done), Len: len(b)}
		n, err := cmaCall(pid, liov[:], riov[:], write)
		runtime.KeepAlive(b)
		if err != nil {
			return err
		}
		if n <= 0 {
			return cmaErr(write, unix.EFAULT)
		}
		done += n
	}
	return nil
}

// cmaChunk bounds one CMARead/CMAWrite system call (about 0.4 ms of copying).
const cmaChunk = 4 << 20

func cmaCall(pid int, l []unix.Iovec, r []unix.RemoteIovec, write bool) (int, error) {
	for {
		// A raw system call: the copy is the rank's work, and it keeps its
		// processor meanwhile. Through the scheduler, a copy longer than
		// 20 us had its P handed to another thread (the background
		// poller), which then competed for a core with the peer's copy.
		trap := uintptr(unix.SYS_PROCESS_VM_READV)
		if write {
			trap = unix.SYS_PROCESS_VM_WRITEV
		}
		// (The pointer conversions stay inside the call: unsafe.Pointer rule 4.)
		n, _, e := unix.RawSyscall6(trap, uintptr(pid),
			uintptr(unsafe.Pointer(unsafe.SliceData(l))), uintptr(len(l)),
			uintptr(unsafe.Pointer(unsafe.SliceData(r))), uintptr(len(r)), 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			return 0, cmaErr(write, e)
		}
		return int(n), nil
	}
}

func cmaErr(write bool, err error) error {
	if write {
		return os.NewSyscallError("process_vm_writev", err)
	}
	return os.NewSyscallError("process_vm_readv", err)
}

// cmaVec walks both lists, handing the kernel at most iovMax entries of
// each per call and resuming after partial transfers.
func cmaVec(pid int, local [][]byte, remote []RemoteIOV, write bool) (int, error) {
	li, loff := 0, 0 // next local buffer and offset in it
	ri, roff := 0, 0
	total := 0
	liov := make([]unix.Iovec, 0, min(len(local), iovMax))
	riov := make([]unix.RemoteIovec, 0, min(len(remote), iovMax))
	for {
		for li < len(local) && loff == len(local[li]) {
			li, loff = li+1, 0
		}
		for ri < len(remote) && roff == remote[ri].Len {
			ri, roff = ri+1, 0
		}
		if li == len(local) || ri == len(remote) {
			return total, nil
		}
		liov, riov = liov[:0], riov[:0]
		for i, off := li, loff; i < len(local) && len(liov) < iovMax; i, off = i+1, 0 {
			b := local[i][off:]
			if len(b) == 0 {
				continue
			}
			v := unix.Iovec{Base: &b[0]}
			v.SetLen(len(b))
			liov = append(liov, v)
		}
		for i, off := ri, roff; i < len(remote) && len(riov) < iovMax; i, off = i+1, 0 {
			r := remote[i]
			if r.Len < 0 {
				return total, fmt.Errorf("cma: remote range %d has negative length %d", i, r.Len)
			}
			if r.Len-off == 0 {
				continue
			}
			riov = append(riov, unix.RemoteIovec{Base: r.Addr + uintptr(off), Len: r.Len - off})
		}
		n, err := cmaCall(pid, liov, riov, write)
		runtime.KeepAlive(local)
		if err != nil {
			return total, err
		}
		if n <= 0 {
			return total, cmaErr(write, unix.EFAULT)
		}
		total += n
		// Advance both cursors by n bytes.
		for k := n; k > 0; {
			step := min(k, len(local[li])-loff)
			loff += step
			k -= step
			for li < len(local) && loff == len(local[li]) {
				li, loff = li+1, 0
			}
		}
		for k := n; k > 0; {
			step := min(k, remote[ri].Len-roff)
			roff += step
			k -= step
			for ri < len(remote) && roff == remote[ri].Len {
				ri, roff = ri+1, 0
			}
		}
	}
}

// CMAPermitted reports whether this process may read and write the memory
// of process pid with process_vm_readv/writev. It tries a 1-byte read: of a
// local variable when pid is this process, else of address 0 of pid,
// which the kernel checks for ptrace access before it looks at the address
// (EFAULT then means access is allowed). It returns nil, or an error
// wrapping mpierr.ErrNotSupported that states the reason (ptrace
// restrictions such as Yama's ptrace_scope or a container's seccomp
// profile; a kernel without the calls), or one wrapping mpierr.ErrProcFailed
// when pid does not exist.
func CMAPermitted(pid int) error {
	var probe, dst [1]byte
	probe[0] = 1
	addr := uintptr(0)
	if pid == os.Getpid() {
		addr = uintptr(unsafe.Pointer(&probe[0]))
	}
	err := CMARead(pid, dst[:], addr)
	runtime.KeepAlive(&probe)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, unix.EFAULT) && addr == 0:
		return nil
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return mpierr.Errorf(mpierr.ErrNotSupported,
			"cross-memory attach to pid %d denied (%v): ptrace access is restricted (kernel.yama.ptrace_scope, a container's seccomp profile or missing CAP_SYS_PTRACE)", pid, err)
	case errors.Is(err, unix.ENOSYS):
		return mpierr.Errorf(mpierr.ErrNotSupported, "cross-memory attach unavailable (%v): kernel without process_vm_readv, or blocked by seccomp", err)
	case errors.Is(err, unix.ESRCH):
		return mpierr.Errorf(mpierr.ErrProcFailed, "cross-memory attach probe: pid %d: %v", pid, err)
	}
	return mpierr.Errorf(mpierr.ErrNotSupported, "cross-memory attach probe of pid %d: %v", pid, err)
}

// Errors of the cross-memory-attach calls that callers tell apart with
// errors.Is.
var (
	ErrNoProcess error = unix.ESRCH  // the process is gone
	ErrFault     error = unix.EFAULT // a remote range is not mapped in the process
	ErrPerm      error = unix.EPERM  // ptrace access denied
	ErrAccess    error = unix.EACCES // ptrace access denied
)
