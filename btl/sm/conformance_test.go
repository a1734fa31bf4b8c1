package sm

import (
	"testing"

	"github.com/gompi-org/gompi/btl/btltest"
)

func TestConformance(t *testing.T) {
	t.Run("default", func(t *testing.T) { btltest.Run(t, suitePeers()) })
	t.Run("no-single-copy", func(t *testing.T) {
		btltest.Run(t, suitePeers([2]string{paramSingleCopy, "none"}))
	})
	t.Run("fifo-only", func(t *testing.T) {
		btltest.Run(t, suitePeers([2]string{paramFboxMax, "0"}))
	})
	t.Run("tiny-fast-boxes", func(t *testing.T) {
		btltest.Run(t, suitePeers([2]string{paramFboxThreshold, "0"}, [2]string{paramFboxSize, "256"},
			[2]string{paramSegmentSize, "1m"}))
	})
}
