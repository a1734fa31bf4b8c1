package tests

import (
	"testing"
	"time"
)

// A short soak over every transport: four processes exchange a checked
// random mix of messages (every size class up to 4 MiB, so every protocol,
// every send mode, wildcards, probes, cancels); gompi-soak exits 0 only
// when nothing was lost, duplicated, corrupted or reordered.
func TestSoak(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out, code := gorun(t, 240*time.Second, "-np", "4", "--oversubscribe", "--timeout", "200s", "--btl", tr.btl,
				prog("gompi-soak"), "--count", "10000", "--max-size", "4m", "--round-deadline", "60s")
			if code != 0 {
				t.Fatalf("gompi-soak over %s exited %d:\n%s", tr.btl, code, out)
			}
			t.Logf("%s", out)
		})
	}
}
