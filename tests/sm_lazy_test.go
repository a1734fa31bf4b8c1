package tests

import (
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSMMapsOnlyPeersItTalksTo: in a ring of 6 ranks on one host, each
// rank maps the shared-memory segments of its two neighbours only, the
// ranks it sends to and receives from (--verbose says which).
func TestSMMapsOnlyPeersItTalksTo(t *testing.T) {
	const n = 6
	out, code := gorun(t, 90*time.Second, "-np", fmt.Sprint(n), "--oversubscribe", "--btl", "self,sm", "--verbose",
		"-x", "GOMPI_VERBOSE=1", "--timeout", "60s", prog("ring"))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "ring of 6 ranks: token came back with 15 (want 15)")
	re := regexp.MustCompile(`sm: rank (\d+): mapped the segment of rank (\d+) `)
	mapped := map[[2]int]bool{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		var a, b int
		fmt.Sscan(m[1], &a)
		fmt.Sscan(m[2], &b)
		mapped[[2]int{a, b}] = true
	}
	want := map[[2]int]bool{}
	for r := range n {
		want[[2]int{r, (r + 1) % n}] = true
		want[[2]int{r, (r + n - 1) % n}] = true
	}
	require.Equal(t, want, mapped, "segments mapped (rank, owner):\n%s", out)
}
