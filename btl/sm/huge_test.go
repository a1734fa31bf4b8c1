package sm

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/sys"
)

// A send buffer registered btl_sm_huge_after times has its 2 MiB regions
// collapsed into huge pages in the background (where the kernel can), and
// its bytes, read by the peer through every registration, never change.
func TestHugeAfterRegistrations(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramHugeAfter, "2"})
	if ranks[0].m.Caps()&btl.CapRDMA == 0 {
		t.Skipf("cross-memory attach not permitted here: %s", Status())
	}
	ep, err := ranks[0].m.AddProc(1)
	require.NoError(t, err)
	src := fill(5, 2, 6<<20+12345)
	m := ranks[1].m
	read := func() {
		reg, err := m.Register(src, btl.AccessRemoteRead)
		require.NoError(t, err)
		defer reg.Release()
		dst := make([]byte, len(src)-100)
		done, err := ep.Get(dst, reg.Handle(), 100, nil)
		require.NoError(t, err)
		require.True(t, done)
		require.Equal(t, src[100:], dst)
	}
	read()
	m.hugeMu.Lock()
	require.Zero(t, m.hugeRegions, "collapsed after one registration")
	m.hugeMu.Unlock()
	read() // the second registration starts the collapses
	deadline := time.Now().Add(20 * time.Second)
	for {
		m.hugeMu.Lock()
		n, off := m.hugeRegions, m.hugeOff
		m.hugeMu.Unlock()
		if n > 0 {
			break
		}
		if off || time.Now().After(deadline) {
			if !hugePagesPossible() {
				t.Skip("transparent huge pages unavailable here (MADV_COLLAPSE refused or THP disabled)")
			}
			t.Fatalf("no region collapsed (module gave up: %v)", off)
		}
		read()
		time.Sleep(10 * time.Millisecond)
	}
	read() // the bytes are the same after the collapse
	require.Equal(t, fill(5, 2, len(src)), src, "the registered buffer changed")
}

// hugePagesPossible reports whether this kernel can collapse a region of
// this process into a huge page (THP not disabled, MADV_COLLAPSE known).
func hugePagesPossible() bool {
	if b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled"); err != nil || strings.Contains(string(b), "[never]") {
		return false
	}
	buf := make([]byte, 2*sys.HugePage)
	for i := range buf {
		buf[i] = 1
	}
	regions := sys.HugeRegions(nil, buf)
	return len(regions) > 0 && sys.Collapse(regions[0]) == nil
}

// Off (0), nothing is collapsed however often memory is registered.
func TestHugeAfterOff(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramHugeAfter, "0"})
	m := ranks[0].m
	if m.Caps()&btl.CapRDMA == 0 {
		t.Skipf("cross-memory attach not permitted here: %s", Status())
	}
	src := fill(1, 1, 4<<20)
	for range 10 {
		reg, err := m.Register(src, btl.AccessRemoteRead)
		require.NoError(t, err)
		require.NoError(t, reg.Release())
	}
	m.hugeMu.Lock()
	defer m.hugeMu.Unlock()
	require.Empty(t, m.hugeSeen)
}

// HugeRegions: the aligned regions a buffer overlaps; HugeCover: how much
// of one it covers.
func TestHugeRegions(t *testing.T) {
	const h = sys.HugePage
	buf := make([]byte, 5*h)
	base := sys.Addr(buf)
	first := (base + h - 1) &^ (h - 1) // an aligned address inside buf
	off := int(first - base)
	for _, c := range []struct {
		lo, n int
		want  []uintptr
		cover []int
	}{
		{off, h, []uintptr{first}, []int{h}},
		{off + 10, 100, []uintptr{first}, []int{100}},
		{off + h/2, h, []uintptr{first, first + h}, []int{h / 2, h / 2}},
		{off + h - 1, 2, []uintptr{first, first + h}, []int{1, 1}},
		{off + 100, 2*h + 200, []uintptr{first, first + h, first + 2*h}, []int{h - 100, h, 300}},
		{off, 0, nil, nil},
	} {
		b := buf[c.lo : c.lo+c.n]
		got := sys.HugeRegions(nil, b)
		require.Equal(t, c.want, got, "[%d,+%d)", c.lo-off, c.n)
		for i, r := range got {
			require.Equal(t, c.cover[i], sys.HugeCover(r, b), "[%d,+%d) region %d", c.lo-off, c.n, i)
		}
	}
}

// Regions that registered memory covers less than half of are collapsed
// at most hugeSmallMax times per module; regions covered more are not
// limited. (Counting only: no collapse is started.)
func TestHugeSmallBudget(t *testing.T) {
	ranks := openJob(t, btltest.NewStore(), 2, [2]string{paramHugeAfter, "1"})
	m := ranks[0].m
	m.hugeMu.Lock()
	m.hugeClosed = true // start no goroutine: the counting is under test
	m.hugeMu.Unlock()
	const h = sys.HugePage
	big := make([]byte, (hugeSmallMax+11)*h) // never touched: no memory used
	base := sys.Addr(big)
	first := int(((base + h - 1) &^ (h - 1)) - base)
	region := func(i int) uintptr { return base + uintptr(first+i*h) }
	for i := range hugeSmallMax + 10 {
		m.hugeNote(big[first+i*h : first+i*h+hugeMinBuf])
	}
	m.hugeMu.Lock()
	require.Equal(t, hugeSmallMax, m.hugeSmall)
	require.Equal(t, 1|hugeCharged, m.hugeSeen[region(0)])
	require.Zero(t, m.hugeSeen[region(hugeSmallMax)], "a small buffer past the budget was counted")
	m.hugeMu.Unlock()
	m.hugeNote(big[first+hugeSmallMax*h : first+(hugeSmallMax+1)*h]) // covered wholly
	m.hugeMu.Lock()
	defer m.hugeMu.Unlock()
	require.Equal(t, 1, m.hugeSeen[region(hugeSmallMax)])
	require.Equal(t, hugeSmallMax, m.hugeSmall)
	// A region whose collapse stayed busy is counted again (collapse
	// resets its count) without being charged to the budget again.
	m.hugeSeen[region(0)] &= hugeCharged
	m.hugeMu.Unlock()
	m.hugeNote(big[first : first+hugeMinBuf])
	m.hugeMu.Lock()
	require.Equal(t, 1|hugeCharged, m.hugeSeen[region(0)])
	require.Equal(t, hugeSmallMax, m.hugeSmall)
}
