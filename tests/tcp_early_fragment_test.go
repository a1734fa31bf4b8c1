package tests

// Fragments that arrive over tcp before mpi.Init has chosen the endpoint
// of their sender (tcp starts receiving as soon as its address is
// published) must be kept, not dropped: a dropped one used to fail the
// sender's peer, be forgotten by the next SetPeer, and leave a receive
// waiting forever (about 1 run in 20-30 of this test's job hung). The
// engine now sets the sender up from the endpoint the fragment came on.

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBurstAfterInitTCP(t *testing.T) {
	for i := range 30 {
		out, code := gorun(t, 60*time.Second, "-np", "8", "--oversubscribe", "--timeout", "20s", "--btl", "self,tcp", prog("burst"))
		require.Equal(t, 0, code, "run %d:\n%s", i, out)
		require.Contains(t, out, "burst ok")
	}
}
