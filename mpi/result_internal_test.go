package mpi

import (
	"errors"
	"math"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
)

// A Request keeps its result in 32 bits of count and no error field; a
// count beyond 32 bits and an error go to a box. Every combination comes
// back whole from the sink (pml.Sink.Result).
func TestRequestResultStorage(t *testing.T) {
	trunc := mpierr.Errorf(mpierr.ErrTruncate, "test")
	for _, c := range []struct {
		st  Status
		err error
	}{
		{Status{Source: 3, Tag: 7, Count: 8}, nil},
		{Status{Source: 0, Tag: TagUB, Count: math.MaxUint32}, nil},
		{Status{Source: 1, Tag: 2, Count: math.MaxUint32 + 1}, nil},
		{Status{Source: 2, Tag: 0, Count: 1 << 40}, trunc},
		{Status{Source: ProcNull, Tag: AnyTag, Count: 0}, trunc},
	} {
		r := &pml.Sink{}
		r.Store(pml.Status(c.st), c.err)
		pst, err := r.Result()
		st := Status(pst)
		require.Equal(t, c.st, st)
		require.True(t, errors.Is(err, c.err) && (err == nil) == (c.err == nil), "error %v, want %v", err, c.err)
	}
	// 32 bytes: the one allocation of a nonblocking call (a size class up
	// would pace the collector half as fast again).
	require.Equal(t, uintptr(32), unsafe.Sizeof(Request{}))
	r := doneRequest(Status{Source: 1, Tag: 5, Count: 3, Cancelled: true})
	st, err := r.Wait()
	require.NoError(t, err)
	require.Equal(t, Status{Source: 1, Tag: 5, Count: 3, Cancelled: true}, st)
}
