package mpi

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/require"
)

// A Request is 32 bytes: the one allocation of a nonblocking call (a size
// class up would pace the collector half as fast again). A request done
// at once returns its status.
func TestRequestSize(t *testing.T) {
	require.Equal(t, uintptr(32), reflect.TypeFor[Request]().Size())
	r := doneRequest(Status{Source: 1, Tag: 5, Count: 3, Cancelled: true})
	st, err := r.Wait()
	require.NoError(t, err)
	require.Equal(t, Status{Source: 1, Tag: 5, Count: 3, Cancelled: true}, st)
}
