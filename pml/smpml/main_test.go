package smpml

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	_ "github.com/gompi-org/gompi/btl/sm" // registers the sm component
	"github.com/gompi-org/gompi/pml"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		pml.SetResetCheck(true) // as pml's and mpi's tests do
	}
	os.Exit(m.Run())
}

// pmlPair joins two sm modules of this process with two PML engines (no
// background pollers): whoever waits polls the transport itself. The
// modules are opened and the endpoints chosen as mpi does (btl.Open,
// btl.Reach); everything closes when the test ends.
func pmlPair(tb testing.TB, overrides ...[2]string) (c0, c1 *pml.Comm) {
	tb.Helper()
	store, job := btltest.NewStore(), btltest.JobID()
	var mods [2][]btl.Module
	var envs [2]*btl.Env
	for i := range mods {
		envs[i], _ = btltest.Env(tb, store, job, i, 2, overrides...)
		ms, _, err := btl.Open(envs[i], "sm")
		require.NoError(tb, err)
		require.Len(tb, ms, 1, "sm did not open")
		mods[i] = ms
		tb.Cleanup(func() { ms[0].Close() })
	}
	var comms [2]*pml.Comm
	for i, ms := range mods {
		e, err := pml.New(pml.Config{Rank: i, Size: 2, Params: envs[i].Params, Dispatch: envs[i].Dispatch})
		require.NoError(tb, err)
		ep, why := btl.Reach(ms, 1-i)
		require.NotNil(tb, ep, "sm does not reach rank %d: %v", 1-i, why)
		require.NoError(tb, e.SetPeer(1-i, ep))
		e.AddPoller(ms[0].(btl.Poller))
		comms[i], err = e.NewComm(0, i, []int{0, 1})
		require.NoError(tb, err)
		tb.Cleanup(func() { e.Close(nil) })
	}
	return comms[0], comms[1]
}

// sizeName names a message size in a sub-benchmark: 8B, 4KiB, 1MiB.
func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
