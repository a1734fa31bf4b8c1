package verbs

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// fakeMR is an ibv.MR that records its deregistration.
type fakeMR struct {
	buf    []byte
	iova   uint64
	deregs *int
}

func (m *fakeMR) LKey() uint32       { return 1 }
func (m *fakeMR) RKey() uint32       { return 1 }
func (m *fakeMR) Addr() uint64       { return m.iova }
func (m *fakeMR) Len() int           { return len(m.buf) }
func (m *fakeMR) Access() ibv.Access { return ibv.AccessLocalWrite }
func (m *fakeMR) Buf() []byte        { return m.buf }
func (m *fakeMR) Dereg() error       { *m.deregs++; return nil }

type fakeReg struct {
	regs, deregs int
	fail         error
}

func (f *fakeReg) reg(b []byte) (ibv.MR, error) {
	if f.fail != nil {
		return nil, f.fail
	}
	f.regs++
	return &fakeMR{buf: b, iova: uint64(f.regs) << 32, deregs: &f.deregs}, nil
}

func TestRegCacheHitsCoveringRange(t *testing.T) {
	var f fakeReg
	c := newRegCache(f.reg, 1<<30, 100)
	t.Cleanup(c.clear) // unpin what stays cached: a Pinner collected with pins panics
	buf := make([]byte, 1<<20)
	e, err := c.get(buf)
	require.NoError(t, err)
	c.put(e)
	// A part of a cached registration is a hit, with its I/O address.
	e2, err := c.get(buf[4096 : 8192+1])
	require.NoError(t, err)
	require.Same(t, e, e2)
	require.Equal(t, e.mr.Addr()+4096, e2.iova(sliceAddr(buf[4096:])))
	c.put(e2)
	// One byte past it is not.
	bigger := buf[:cap(buf)]
	_ = bigger
	other := make([]byte, 100)
	e3, err := c.get(other)
	require.NoError(t, err)
	require.NotSame(t, e, e3)
	c.put(e3)
	require.Equal(t, 2, f.regs)
	n, b, hits, misses, _ := c.stats()
	require.Equal(t, 2, n)
	require.Equal(t, 1<<20+100, b)
	require.Equal(t, int64(1), hits)
	require.Equal(t, int64(2), misses)
	c.clear()
	require.Equal(t, 2, f.deregs)
}

func TestRegCacheEvictsLRUButNotInUse(t *testing.T) {
	var f fakeReg
	c := newRegCache(f.reg, 3000, 100)
	t.Cleanup(c.clear) // unpin what stays cached: a Pinner collected with pins panics
	get := func(b []byte) *regEntry {
		e, err := c.get(b)
		require.NoError(t, err)
		return e
	}
	bufs := [][]byte{make([]byte, 1000), make([]byte, 1000), make([]byte, 1000), make([]byte, 1000), make([]byte, 1000)}
	ents := []*regEntry{get(bufs[0]), get(bufs[1]), get(bufs[2])}
	for _, e := range ents {
		c.put(e)
	}
	require.True(t, get(bufs[0]) == ents[0], "hit")
	c.put(ents[0]) // LRU order now: 0, 2, 1
	e3 := get(bufs[3])
	require.Equal(t, 1, f.deregs, "one free entry goes for the new one")
	require.True(t, get(bufs[0]) == ents[0], "the recently used entry stays")
	c.put(ents[0])
	require.True(t, get(bufs[2]) == ents[2], "the next one stays")
	c.put(ents[2])
	e1 := get(bufs[1])
	require.False(t, e1 == ents[1], "the least recently used went")
	// Entries in use are kept over the budget.
	e4 := get(bufs[4])
	n, b, _, _, ev := c.stats()
	require.Equal(t, 3, n)
	require.Equal(t, 3000, b)
	require.Equal(t, int64(3), ev)
	c.put(e3)
	c.put(e1)
	c.put(e4)
}

func TestRegCacheEntryBound(t *testing.T) {
	var f fakeReg
	c := newRegCache(f.reg, 1<<30, 4)
	t.Cleanup(c.clear) // unpin what stays cached: a Pinner collected with pins panics
	for range 10 {
		e, err := c.get(make([]byte, 10))
		require.NoError(t, err)
		c.put(e)
	}
	n, _, _, _, _ := c.stats()
	require.Equal(t, 4, n)
	require.Equal(t, 6, f.deregs)
}

func TestRegCacheRetriesAfterEviction(t *testing.T) {
	var f fakeReg
	c := newRegCache(f.reg, 1<<30, 100)
	t.Cleanup(c.clear) // unpin what stays cached: a Pinner collected with pins panics
	e, err := c.get(make([]byte, 10))
	require.NoError(t, err)
	c.put(e)
	// The device refuses: the cache frees what it can and tries again.
	calls := 0
	c.reg = func(b []byte) (ibv.MR, error) {
		calls++
		if calls == 1 {
			return nil, ibv.ErrNoMem
		}
		return f.reg(b)
	}
	e, err = c.get(make([]byte, 10))
	require.NoError(t, err)
	require.Equal(t, 1, f.deregs)
	c.put(e)
	c.reg = func([]byte) (ibv.MR, error) { return nil, ibv.ErrNoMem }
	e, _ = c.get(make([]byte, 10)) // evicts the last free entry, still refused
	require.Nil(t, e)
	_, err = c.get(make([]byte, 10))
	require.True(t, errors.Is(err, ibv.ErrNoMem))
}

func TestRegCachePutTwicePanics(t *testing.T) {
	var f fakeReg
	c := newRegCache(f.reg, 1<<30, 100)
	t.Cleanup(c.clear) // unpin what stays cached: a Pinner collected with pins panics
	e, err := c.get(make([]byte, 10))
	require.NoError(t, err)
	c.put(e)
	require.Panics(t, func() { c.put(e) })
}
