package btltest

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/params"
)

// Secret is the job secret of the Envs that Env makes (a transport that
// authenticates its peers, tcp, checks it).
var Secret = []byte("0123456789abcdef-test-secret")

var jobSeq atomic.Int64

// JobID returns a job id not returned before in this process: a transport
// may name shared objects after it (sm's segments), so two jobs of one
// test binary must not share one.
func JobID() string { return fmt.Sprintf("btltest%d", jobSeq.Add(1)) }

// Env returns the btl.Env of world rank i of an n-rank job whose ranks
// all run on this host and share store and job: a Dispatcher of its own,
// Params from overrides (an unknown name or a bad value fails t), Secret,
// and a Logf that writes into the Log returned.
func Env(t testing.TB, store btl.Store, job string, i, n int, overrides ...[2]string) (*btl.Env, *Log) {
	t.Helper()
	set, err := params.NewSet(overrides)
	require.NoError(t, err)
	log := NewLog(t)
	return &btl.Env{Rank: i, Size: n, LocalRank: i, LocalSize: n, JobID: job, Secret: Secret,
		Params: set, Store: store, Dispatch: &btl.Dispatcher{}, Logf: log.Logf}, log
}

// Open opens comp for world rank i of an n-rank job (Env) and fails t
// unless it opens without an error and gives at least one module. The
// modules close when the test ends.
func Open(t testing.TB, comp btl.Component, store btl.Store, job string, i, n int, overrides ...[2]string) (*btl.Env, *Log, []btl.Module) {
	t.Helper()
	env, log := Env(t, store, job, i, n, overrides...)
	mods, err := comp.Open(env)
	require.NoError(t, err)
	require.NotEmpty(t, mods, "%s opened no module", comp.Name())
	t.Cleanup(func() {
		for _, m := range mods {
			m.Close()
		}
	})
	return env, log, mods
}
