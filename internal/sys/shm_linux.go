package sys

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// MemfdCreate returns an anonymous memory file (memfd_create with
// MFD_CLOEXEC) named name (the name shows in /proc/<pid>/maps and fd links
// only; it is not a path). The file has size 0: size it with Truncate. Its
// memory is freed once the last descriptor and the last mapping are gone,
// so nothing outlives the processes that use it, whatever way they end.
func MemfdCreate(name string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("memfd_create", err)
	}
	return os.NewFile(uintptr(fd), "memfd:"+name), nil
}

// Ftruncate sets the size of the file open as fd (ftruncate(2)).
func Ftruncate(fd int, size int64) error {
	return os.NewSyscallError("ftruncate", unix.Ftruncate(fd, size))
}

// MapShared maps size bytes of f from offset 0 read-write and MAP_SHARED:
// stores are visible to every process that maps the same file. f may be
// closed after the call; the mapping stays until Unmap. The slice is not
// Go memory: the garbage collector ignores it, and it must not be used
// after Unmap.
func MapShared(f *os.File, size int) ([]byte, error) {
	if size <= 0 {
		return nil, fmt.Errorf("mmap: size %d", size)
	}
	fd := int(f.Fd())
	b, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, os.NewSyscallError("mmap", err)
	}
	return b, nil
}

// Unmap removes a mapping made by MapShared. Every slice into it becomes
// invalid (touching it faults).
func Unmap(b []byte) error {
	return os.NewSyscallError("munmap", unix.Munmap(b))
}
