package tests

import (
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestExamplesOversubscribed runs the examples with 4 ranks on this host
// (more ranks than CPUs on the 2-core CI machine) over every transport: each
// must finish with its own check passed, without livelock, within the
// deadline.
func TestExamplesOversubscribed(t *testing.T) {
	examples := []struct {
		name string
		want *regexp.Regexp
	}{
		{"ring", regexp.MustCompile(`ring of 4 ranks: token came back with 6 \(want 6\)`)},
		{"halo", regexp.MustCompile(`halo: 4 ranks, 20 steps on a 64x64 grid: matches the serial result`)},
		// pingpong prints one line per size up to 4 MiB; it checks every byte that comes back.
		{"pingpong", regexp.MustCompile(`(?m)^\s*4194304 B\s+[0-9.]+ us$`)},
	}
	for _, tr := range transports {
		for _, ex := range examples {
			t.Run(tr.name+"/"+ex.name, func(t *testing.T) {
				out, code := gorun(t, 90*time.Second, "-np", "4", "--oversubscribe", "--timeout", "60s",
					"--btl", tr.btl, prog(ex.name))
				require.Equal(t, 0, code, out)
				require.Regexp(t, ex.want, out)
				require.NotContains(t, out, "oversubscribed") // --oversubscribe hides the notice
			})
		}
	}
}

// TestExampleFromSource: the README's command, with gorun building the
// example from its package directory.
func TestExampleFromSource(t *testing.T) {
	out, code := gorun(t, 120*time.Second, "-np", "4", "--timeout", "60s", "../examples/ring")
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "token came back with 6 (want 6)")
	if n := runtimeCPUs(); n < 4 {
		require.Contains(t, out, "4 ranks on "+strconv.Itoa(n)+" CPUs: oversubscribed")
	}
}
