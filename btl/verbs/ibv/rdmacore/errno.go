//go:build rdmacore && linux && cgo

package rdmacore

import (
	"fmt"
	"syscall"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// errnoErr turns a verbs call's errno into the model's error classes:
// EINVAL -> ErrInvalid, ENOMEM -> ErrNoMem, EBUSY -> ErrBusy; others are
// returned as the syscall.Errno, wrapped with op.
func errnoErr(op string, e syscall.Errno) error {
	switch e {
	case 0:
		return nil
	case syscall.EINVAL:
		return fmt.Errorf("%s: %w (%v)", op, ibv.ErrInvalid, e)
	case syscall.ENOMEM:
		return fmt.Errorf("%s: %w (%v)", op, ibv.ErrNoMem, e)
	case syscall.EBUSY:
		return fmt.Errorf("%s: %w (%v)", op, ibv.ErrBusy, e)
	case syscall.ENODEV, syscall.ENXIO:
		return fmt.Errorf("%s: %w (%v)", op, ibv.ErrNoDevice, e)
	}
	return fmt.Errorf("%s: %w", op, e)
}

// errnoOf returns the errno a failed call left, or fallback when it left
// none.
func errnoOf(err error, fallback syscall.Errno) syscall.Errno {
	if e, ok := err.(syscall.Errno); ok && e != 0 {
		return e
	}
	return fallback
}
