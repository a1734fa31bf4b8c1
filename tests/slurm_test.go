package tests

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestSlurm runs gompi programs under a single-node Slurm cluster that
// tests/slurm/run.sh configures and starts for the test (munge and Slurm
// daemons with their files in a temporary directory) and stops after it:
// srun --mpi=pmi2 starts them directly (PMI-2), and gorun inside an
// allocation starts its ranks with srun. Skipped, saying why, where
// slurm-wlm or munge is not installed or the cluster does not come up.
func TestSlurm(t *testing.T) {
	for _, b := range []string{"slurmctld", "slurmd", "munged", "srun", "salloc"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Skipf("%s not found: install slurm-wlm and munge (Debian) to run the Slurm tests", b)
		}
	}
	dir, err := os.MkdirTemp("", "gompi-slurm")
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "./slurm/run.sh", "start", dir).CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		t.Skipf("a single-node Slurm could not be started here (%v):\n%s", err, out)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "./slurm/run.sh", "stop", dir).CombinedOutput(); err != nil {
			t.Errorf("stopping Slurm: %v\n%s", err, out)
		}
	})
	conf := "SLURM_CONF=" + dir + "/slurm.conf"
	slurm := func(t *testing.T, env []string, args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, args[0], args[1:]...)
		cmd.Env = append(append(cleanEnv(), conf), env...)
		cmd.WaitDelay = 5 * time.Second
		out, err := cmd.CombinedOutput()
		if ctx.Err() != nil {
			t.Fatalf("%v did not end in time:\n%s", args, out)
		}
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		return string(out), code
	}

	for _, tr := range transports {
		t.Run("srun-pmi2/ring/"+tr.name, func(t *testing.T) {
			out, code := slurm(t, []string{"GOMPI_BTL=" + tr.btl, "GOMPI_VERBOSE=1"}, "srun", "--mpi=pmi2", "-n", "2", prog("ring"))
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "ring of 2 ranks: token came back with 1 (want 1)")
			require.Contains(t, out, "gompi[0]: PMI-2 job ")
			require.Contains(t, out, "gompi[0]: rank 1 via "+tr.name, out)
		})
	}
	t.Run("srun-pmi2/conform", func(t *testing.T) {
		out, code := slurm(t, nil, "srun", "--mpi=pmi2", "-n", "2", prog("conform"))
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "conform ok")
	})
	t.Run("srun-pmi2/failing-rank", func(t *testing.T) {
		out, code := slurm(t, nil, "srun", "--mpi=pmi2", "--kill-on-bad-exit=1", "-n", "2", prog("failer"), "exit", "3")
		require.NotEqual(t, 0, code, out)
		require.Contains(t, out, "task 1: Exited with exit code 3", out)
		require.Empty(t, progProcs("failer"))
	})
	t.Run("gorun-in-allocation/ring", func(t *testing.T) {
		out, code := slurm(t, nil, "salloc", "-n", "2", prog("gorun"), "-np", "2", "--verbose", "--tag-output", prog("ring"))
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "gorun: starting the ranks with srun --ntasks=2")
		require.Contains(t, out, "[0] ring of 2 ranks: token came back with 1 (want 1)")
		require.True(t, strings.Contains(out, "[1] gompi[1]: rank 0 via sm"), out)
	})
	t.Run("gorun-in-allocation/failing-rank", func(t *testing.T) {
		out, code := slurm(t, nil, "salloc", "-n", "2", prog("gorun"), "-np", "2", "--grace", "500ms", prog("failer"), "exit", "3")
		require.NotEqual(t, 0, code, out)
		// Rank 1's store connection ends before srun's status comes:
		// gorun names the rank and leaves the details to srun.
		require.Regexp(t, `gorun: rank 1 \(pid \d+\) (ended before calling Finalize|srun exited with status)`, out)
		require.Contains(t, out, "task 1: Exited with exit code 3")
		require.Empty(t, progProcs("failer"))
	})
}
