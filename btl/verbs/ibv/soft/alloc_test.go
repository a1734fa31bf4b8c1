package soft

import (
	"runtime"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// TestNoAllocationPerPacket: in the steady state the device allocates
// nothing per packet. A 256 KiB RDMA WRITE and a 256 KiB RDMA READ (64
// packets each at MTU 4096, with their ACKs and READ responses) cost the
// whole process, the device's goroutines included, fewer allocations than
// a tenth of their packets.
func TestNoAllocationPerPacket(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	const n = 256 << 10
	wrs := []ibv.SendWR{
		writeWR(1, a.mr, n, b.mr, 0),
		{ID: 2, Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, n)},
			RemoteAddr: b.mr.Addr() + n, RKey: b.mr.RKey()},
	}
	wc := make([]ibv.WC, 4)
	dl := deadline(t, 20*time.Second)
	round := func() {
		if _, err := a.qp.PostSend(wrs); err != nil {
			t.Fatal(err)
		}
		for got := 0; got < len(wrs); {
			k, err := a.scq.Poll(wc)
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range wc[:k] {
				if c.Status != ibv.WCSuccess {
					t.Fatalf("completion %+v", c)
				}
			}
			got += k
			if k == 0 {
				if time.Now().After(dl) {
					t.Fatalf("%d of %d completions", got, len(wrs))
				}
				runtime.Gosched()
			}
		}
	}
	for range 20 {
		round()
	}
	allocs := testing.AllocsPerRun(50, round)
	t.Logf("%.1f allocations per round of 128 data packets", allocs)
	require.Less(t, allocs, 128/10.0, "allocations per round of 128 data packets")
}
