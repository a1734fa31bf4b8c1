package tests

// gorun --eager-limit and --max-send-size set the limits of every
// transport (self, sm, tcp, verbs), and a job runs with them over each.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSizeFlags(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out, code := gorun(t, 60*time.Second, "-np", "2", "--timeout", "50s", "--btl", tr.btl,
				"--eager-limit", "8k", "--max-send-size", "64k", prog("conform"))
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "conform ok")
		})
	}
}
