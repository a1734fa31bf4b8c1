// Package mpierr holds the MPI error classes shared by every layer.
//
// The public package mpi re-exports these values (mpi.ErrTruncate is
// mpierr.ErrTruncate), so lower layers such as convertor and pml can return
// errors that callers test with errors.Is(err, mpi.ErrX) without importing mpi.
package mpierr

import (
	"errors"
	"fmt"
)

// The error classes. Every error gompi returns wraps exactly one of them.
var (
	ErrTruncate   = errors.New("mpi: message truncated")
	ErrRank       = errors.New("mpi: invalid rank")
	ErrTag        = errors.New("mpi: invalid tag")
	ErrComm       = errors.New("mpi: invalid communicator")
	ErrBuffer     = errors.New("mpi: invalid buffer")
	ErrCount      = errors.New("mpi: invalid count")
	ErrType       = errors.New("mpi: invalid datatype")
	ErrProcFailed = errors.New("mpi: process failed")
	ErrNotInit    = errors.New("mpi: not initialized")
	// ErrProtocol is wrapped (together with ErrProcFailed) by errors caused by
	// a peer that broke the wire protocol: the peer is treated as failed.
	ErrProtocol = errors.New("mpi: protocol violation")
	// ErrArg is for invalid arguments that fit no other class (bad parameter
	// values, bad options).
	ErrArg = errors.New("mpi: invalid argument")
	// ErrNotSupported marks a feature this machine or transport lacks.
	ErrNotSupported = errors.New("mpi: not supported")
	// ErrAborted is returned by operations of a job that Comm.Abort ended.
	ErrAborted = errors.New("mpi: job aborted")
)

// Errorf formats an error that wraps class: Errorf(ErrRank, "dest %d of %d", d, n).
func Errorf(class error, format string, args ...any) error {
	return &classErr{class: class, msg: fmt.Sprintf(format, args...)}
}

type classErr struct {
	class error
	msg   string
}

func (e *classErr) Error() string { return e.class.Error() + ": " + e.msg }
func (e *classErr) Unwrap() error { return e.class }
