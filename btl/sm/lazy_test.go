package sm

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// segmentMaps counts, per rank of job, the mappings of its segment in this
// process (in-process ranks: the owner's and those of the peers that
// mapped it).
func segmentMaps(t *testing.T, job string, n int) []int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	counts := make([]int, n)
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		for r := range n {
			if f[5] == "/memfd:gompi-sm."+job+"."+strconv.Itoa(r) {
				counts[r]++
			}
		}
	}
	return counts
}

// Endpoints to every local rank map nothing: a segment is mapped by a peer
// when it first sends to its owner, and by the owner of a fragment's
// receiver when that receiver reads its first fragment.
func TestSegmentsMappedOnFirstUse(t *testing.T) {
	const n = 4
	ranks := openJob(t, btltest.NewStore(), n)
	job := ranks[0].env.JobID
	ins := make([]*inbox, n)
	for i, r := range ranks {
		ins[i] = newInbox(r.env.Dispatch, tagData)
	}
	eps := make([][]btl.Endpoint, n)
	for i, r := range ranks {
		eps[i] = make([]btl.Endpoint, n)
		for j := range n {
			if i != j {
				ep, err := r.m.AddProc(j)
				require.NoError(t, err)
				eps[i][j] = ep
			}
		}
	}
	require.Equal(t, []int{1, 1, 1, 1}, segmentMaps(t, job, n), "after AddProc: only the owners map their segments")

	for i := range 40 { // past the fast-box threshold
		_, err := eps[0][1].Send(tagData, seqHdr(0, i, 8), fill(0, i, 8), nil)
		require.NoError(t, err)
	}
	ins[1].waitFor(t, ranks[1].m, true, 10*time.Second, "rank 0's fragments", func(f, _ int) bool { return f == 40 })
	require.Equal(t, []int{2, 2, 1, 1}, segmentMaps(t, job, n), "rank 0 sent to rank 1: each maps the other's segment, nobody else's")

	_, err := eps[1][0].Send(tagData, seqHdr(1, 0, 8), fill(1, 0, 8), nil)
	require.NoError(t, err)
	ins[0].waitFor(t, ranks[0].m, true, 10*time.Second, "rank 1's reply", func(f, _ int) bool { return f == 1 })
	require.Equal(t, []int{2, 2, 1, 1}, segmentMaps(t, job, n), "the reply maps nothing more")
	ins[1].mu.Lock()
	checkOrder(t, ins[1].frags)
	ins[1].mu.Unlock()
}

// A local rank whose store entry names a segment that is not there: its
// endpoint exists, the first send fails with ErrProcFailed at once, and
// Progress reports the peer failed.
func TestSegmentMissing(t *testing.T) {
	store := btltest.NewStore()
	r := openRank(t, store, "missing", 0, 2)
	in := newInbox(r.env.Dispatch, tagData)
	e := wireEntry{rank: 1, local: 1, localSize: 2, pid: os.Getpid(), fd: 1 << 20, size: 4 << 20, nonce: 3, id: localHostID()}
	require.NoError(t, store.Set(localKey(e.id, 1), e.encode()))

	ep, err := r.m.AddProc(1)
	require.NoError(t, err)
	_, err = ep.Send(tagData, nil, []byte("x"), nil)
	require.ErrorIs(t, err, mpierr.ErrProcFailed)
	in.waitFor(t, r.m, true, 10*time.Second, "PeerFailed", func(_, f int) bool { return f > 0 })
	in.mu.Lock()
	defer in.mu.Unlock()
	require.Len(t, in.fails, 1)
	require.Equal(t, 1, in.fails[0].peer)
	require.ErrorIs(t, in.fails[0].err, mpierr.ErrProcFailed)
}

// A local rank that died before anyone mapped its segment (its pid no
// longer exists) is reported failed without any operation on it, and
// operations on it fail with ErrProcFailed.
func TestPeerDeadBeforeMapped(t *testing.T) {
	child := exec.Command("true")
	require.NoError(t, child.Run())
	store := btltest.NewStore()
	r := openRank(t, store, "deadpeer", 0, 2)
	if r.m.Caps()&btl.CapRDMA == 0 {
		t.Log("no single copy here: the death is found by the first send")
	}
	in := newInbox(r.env.Dispatch, tagData)
	e := wireEntry{rank: 1, local: 1, localSize: 2, pid: child.Process.Pid, fd: 3, size: 4 << 20, nonce: 3, id: localHostID()}
	require.NoError(t, store.Set(localKey(e.id, 1), e.encode()))

	ep, err := r.m.AddProc(1)
	require.NoError(t, err)
	_, err = ep.Send(tagData, nil, []byte("x"), nil)
	require.ErrorIs(t, err, mpierr.ErrProcFailed)
	in.waitFor(t, r.m, true, 10*time.Second, "PeerFailed", func(_, f int) bool { return f > 0 })
	in.mu.Lock()
	defer in.mu.Unlock()
	require.Len(t, in.fails, 1)
	require.Equal(t, 1, in.fails[0].peer)
	require.ErrorIs(t, in.fails[0].err, mpierr.ErrProcFailed)
}
