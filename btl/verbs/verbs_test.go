package verbs

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

func testConfig(t *testing.T, overrides ...[2]string) (config, error) {
	t.Helper()
	set, err := params.NewSet(overrides)
	require.NoError(t, err)
	return readConfig(set)
}

// The default credits shrink to fit a queue depth set smaller than they
// need; credits asked for do not.
func TestDefaultCreditsFitTheQueues(t *testing.T) {
	c, err := testConfig(t, [2]string{paramQueueDepth, "64"})
	require.NoError(t, err)
	require.Equal(t, 60, c.credits)
	_, err = testConfig(t, [2]string{paramQueueDepth, "64"}, [2]string{paramCredits, "256"})
	require.ErrorIs(t, err, mpierr.ErrArg)
}

func TestDefaults(t *testing.T) {
	c, err := testConfig(t)
	require.NoError(t, err)
	require.Equal(t, 12<<10, c.limits.EagerLimit)
	require.Equal(t, 64<<10, c.limits.MaxSendSize)
	require.Equal(t, btl.CapSend|btl.CapSendImmediate|btl.CapSendInPlace|btl.CapPut|btl.CapGet, c.caps)
	require.Equal(t, 1024, c.depth)
	require.Equal(t, uint8(14), c.timeout)
	require.Equal(t, uint8(7), c.retry)
	require.Equal(t, uint8(7), c.rnrRetry)
	require.Equal(t, defaultCredits, c.credits)
	require.GreaterOrEqual(t, c.ringSize, 4*alignUp(c.maxFrag+frameHdrLen))
	// self > sm > verbs > tcp.
	p, err := params.NewSet(nil)
	require.NoError(t, err)
	for _, other := range []string{"sm", "tcp"} {
		if !p.Has("btl_" + other + "_exclusivity") {
			continue // not linked into this test binary
		}
		if other == "sm" {
			require.Greater(t, p.Int("btl_sm_exclusivity"), c.exclusivity)
		} else {
			require.Less(t, p.Int("btl_tcp_exclusivity"), c.exclusivity)
		}
	}
	require.Less(t, c.exclusivity, btl.ExclusivityHigh-1)
	require.Greater(t, c.exclusivity, btl.ExclusivityLow+100)
}

func TestTensorFlowAliases(t *testing.T) {
	t.Setenv("RDMA_QP_TIMEOUT", "20")
	t.Setenv("RDMA_QP_QUEUE_DEPTH", "512")
	t.Setenv("RDMA_QP_MTU", "1024")
	t.Setenv("RDMA_DEVICE", "mlx5_1")
	t.Setenv("RDMA_QP_SL", "3")
	c, err := testConfig(t)
	require.NoError(t, err)
	require.Equal(t, uint8(20), c.timeout)
	require.Equal(t, 512, c.depth)
	require.Equal(t, ibv.MTU1024, c.mtu)
	require.Equal(t, "mlx5_1", c.device)
	require.Equal(t, uint8(3), c.sl)
	// A parameter set explicitly wins over the alias.
	c, err = testConfig(t, [2]string{paramTimeout, "16"}, [2]string{paramDevice, "soft0"})
	require.NoError(t, err)
	require.Equal(t, uint8(16), c.timeout)
	require.Equal(t, "soft0", c.device)
	// The enumeration value is accepted for the MTU too.
	t.Setenv("RDMA_QP_MTU", "3")
	c, err = testConfig(t)
	require.NoError(t, err)
	require.Equal(t, ibv.MTU1024, c.mtu)
	t.Setenv("RDMA_QP_TIMEOUT", "soon")
	_, err = testConfig(t)
	require.ErrorIs(t, err, mpierr.ErrArg)
}

func TestBadParams(t *testing.T) {
	for _, o := range [][2]string{{paramPort, "0"}, {paramRetryCount, "8"}, {paramTimeout, "32"}, {paramMTU, "1000"},
		{paramCredits, "0"}, {paramCredits, "2000"}, {paramConnectTimeout, "0s"}, {paramRingSize, "2g"}} {
		_, err := testConfig(t, o)
		require.ErrorIs(t, err, mpierr.ErrArg, "%s=%s", o[0], o[1])
	}
}

func TestProviderChoice(t *testing.T) {
	set, err := params.NewSet(nil)
	require.NoError(t, err)
	c, err := readConfig(set)
	require.NoError(t, err)
	// auto without a NIC: soft only when the btl list names verbs.
	if p, err := ibv.NewProvider("rdmacore", set); err == nil {
		if d, err := p.Devices(); err == nil && len(d) > 0 {
			t.Skip("an RDMA device is present: auto picks it")
		}
	}
	for _, list := range []string{"", "^tcp", "self,sm,tcp"} {
		_, err = pickProvider(c, set, list)
		require.ErrorIs(t, err, mpierr.ErrNotSupported, "btl=%q", list)
	}
	p, err := pickProvider(c, set, "self,sm,verbs")
	require.NoError(t, err)
	require.Equal(t, "soft", p.Name())
	c.provider = "soft"
	p, err = pickProvider(c, set, "")
	require.NoError(t, err)
	require.Equal(t, "soft", p.Name())
	c.provider = "nosuch"
	_, err = pickProvider(c, set, "")
	require.ErrorIs(t, err, mpierr.ErrNotSupported)
}
