package pml

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// A Handle keeps its result in 32 bits of count and no error field; a
// count beyond 32 bits and an error go to a box. Every combination comes
// back whole from the sink, and a Handle done at once returns its status.
func TestHandleResultStorage(t *testing.T) {
	trunc := mpierr.Errorf(mpierr.ErrTruncate, "test")
	for _, c := range []struct {
		st  Status
		err error
	}{
		{Status{Source: 3, Tag: 7, Count: 8}, nil},
		{Status{Source: 0, Tag: 1 << 30, Count: math.MaxUint32}, nil},
		{Status{Source: 1, Tag: 2, Count: math.MaxUint32 + 1}, nil},
		{Status{Source: 2, Tag: 0, Count: 1 << 40}, trunc},
		{Status{Source: -1, Tag: AnyTag, Count: 0}, trunc},
	} {
		var s sink
		s.store(c.st, c.err)
		st, err := s.Result()
		require.Equal(t, c.st, st)
		require.True(t, errors.Is(err, c.err) && (err == nil) == (c.err == nil), "error %v, want %v", err, c.err)
	}
	h := DoneHandle(Status{Source: 1, Tag: 5, Count: 3, Cancelled: true})
	st, err := h.Wait(nil)
	require.NoError(t, err)
	require.Equal(t, Status{Source: 1, Tag: 5, Count: 3, Cancelled: true}, st)
}
