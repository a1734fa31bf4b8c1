package tests

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The stated bound of flow control (docs/architecture.md, "Flow
// control"): a receiver that posts nothing holds at most
// pml_unexpected_window messages with data per sender and communicator,
// each its payload plus about 256 bytes of bookkeeping; its resident set
// grows by at most twice that (the garbage collector's headroom) plus
// floodSlack for the runtime's own growth.
const (
	floodWindow = 512 // pml_unexpected_window's default
	floodSlack  = 8 << 20
)

func floodBound(senders, size int) int {
	return 2*senders*floodWindow*(size+256) + floodSlack
}

var reFlood = regexp.MustCompile(`flood: (\d+) messages in order; VmHWM before (\d+) KiB, after (\d+) KiB, growth (-?\d+) KiB`)

// TestFloodBoundedMemory: three senders send GOMPI_TEST_FLOOD_N (default
// 20000) 1 KiB messages each to a receiver that sleeps a second before
// it receives: every message arrives, in order, and the receiver's peak
// resident set grows less than the stated bound, over every transport.
// Without flow control (pml_unexpected_window=0) the same flood exceeds
// it, so the check can fail. docs/PERFORMANCE.md has the manual run with
// N = 1,000,000.
func TestFloodBoundedMemory(t *testing.T) {
	flood := buildProg(t, "flood")
	n := 20000
	if v, err := strconv.Atoi(os.Getenv("GOMPI_TEST_FLOOD_N")); err == nil && v > 0 {
		n = v
	}
	const size = 1024
	bound := floodBound(3, size)
	run := func(t *testing.T, btl, window string) int {
		out, code := gorun(t, 180*time.Second, "-np", "4", "--oversubscribe", "--btl", btl, "--timeout", "150s",
			"-x", "GOMPI_PML_UNEXPECTED_WINDOW="+window, flood, strconv.Itoa(n), strconv.Itoa(size), "1s")
		require.Equal(t, 0, code, out)
		m := reFlood.FindStringSubmatch(out)
		require.NotNil(t, m, out)
		require.Equal(t, strconv.Itoa(3*n), m[1], out)
		growth, _ := strconv.Atoi(m[4])
		t.Logf("%s window %s: %s", btl, window, m[0])
		return growth << 10
	}
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			growth := run(t, tr.btl, strconv.Itoa(floodWindow))
			require.Less(t, growth, bound, "receiver grew %d KiB, bound %d KiB", growth>>10, bound>>10)
		})
	}
	t.Run("sm/no-flow-control", func(t *testing.T) {
		if n*3*size < 2*bound {
			t.Skip(fmt.Sprintf("N=%d is too small to exceed the bound without flow control", n))
		}
		growth := run(t, "self,sm", "0")
		require.Greater(t, growth, bound, "without flow control the flood should exceed the bound")
	})
}
