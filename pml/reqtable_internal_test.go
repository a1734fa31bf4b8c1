package pml

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// An id finds its request until the request leaves the table; after that
// it finds nothing, also once its slot holds another request; ids a peer
// could forge (0, an unused slot, any generation) find nothing and delete
// nothing.
func TestReqTableIDs(t *testing.T) {
	var tb reqTable
	a, b := &Request{}, &Request{}
	ida := tb.add(a)
	idb := tb.add(b)
	require.NotZero(t, ida)
	require.NotEqual(t, ida, idb)
	require.Same(t, a, tb.get(ida))
	require.Same(t, b, tb.get(idb))
	require.Equal(t, 2, tb.len())

	tb.del(ida)
	require.Nil(t, tb.get(ida))
	c := &Request{}
	idc := tb.add(c) // a's slot again, with a new generation
	require.NotEqual(t, ida, idc)
	require.Nil(t, tb.get(ida), "a stale id finds the slot's new request")
	require.Same(t, c, tb.get(idc))
	tb.del(ida) // a stale id deletes nothing
	require.Same(t, c, tb.get(idc))
	require.Equal(t, 2, tb.len())

	for _, id := range []uint64{0, idb + 100, idb ^ 1<<40, math.MaxUint64, 1 << 32} {
		require.Nil(t, tb.get(id), "id %#x", id)
		tb.del(id)
	}
	require.Equal(t, 2, tb.len())

	var seen []*Request
	tb.each(func(id uint64, r *Request) {
		require.Same(t, r, tb.get(id))
		seen = append(seen, r)
		tb.del(id)
	})
	require.ElementsMatch(t, []*Request{b, c}, seen)
	require.Zero(t, tb.len())
	require.Nil(t, tb.get(idb))
}
