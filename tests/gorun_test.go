// Package tests holds multi-process conformance and fault tests. Every
// test launches real processes through gorun.
package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var bin string // folder with gorun, conform and failer

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gompi-tests")
	if err != nil {
		panic(err)
	}
	bin = dir
	for _, p := range []string{"../cmd/gorun", "./progs/conform", "./progs/failer"} {
		out, err := exec.Command("go", "build", "-o", dir+"/", p).CombinedOutput()
		if err != nil {
			os.Stderr.Write(out)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// gorun runs gorun with args and a deadline; it returns stdout+stderr and the exit code.
func gorun(t *testing.T, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "gorun"), args...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("gorun %v did not end within %v:\n%s", args, timeout, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("gorun %v: %v", args, err)
	}
	return string(out), code
}

func TestConformTCP(t *testing.T) {
	for _, np := range []string{"2", "3"} {
		out, code := gorun(t, 120*time.Second, "-np", np, "--oversubscribe", "--btl", "self,tcp", filepath.Join(bin, "conform"))
		require.Equal(t, 0, code, out)
		require.Contains(t, out, "conform ok")
	}
}

func TestConformForcedProtocols(t *testing.T) {
	for _, p := range []string{"eager", "rdma_put", "rdma_get", "send_pipeline", "rdma_pipeline"} {
		t.Run(p, func(t *testing.T) {
			out, code := gorun(t, 120*time.Second, "-np", "2", "--btl", "self,tcp", "--protocol", p,
				"--param", "btl_tcp_rdma_pipeline_frag_size=256k", filepath.Join(bin, "conform"))
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "conform ok")
		})
	}
}

func TestSingleton(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, filepath.Join(bin, "conform")).CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "conform ok")
}

func TestRankExitFailsJob(t *testing.T) {
	out, code := gorun(t, 60*time.Second, "-np", "2", filepath.Join(bin, "failer"), "exit", "3")
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "rank 1")
	require.Contains(t, out, "status 3")
}

func TestBlockedPeerGetsProcFailed(t *testing.T) {
	out, code := gorun(t, 60*time.Second, "-np", "2", "--btl", "self,tcp", filepath.Join(bin, "failer"), "blocked")
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "rank 1")
	// Rank 0 was blocked in Recv from the dead rank 1: it must have been released with ErrProcFailed
	// (unless gorun's TERM came first, which the launcher's grace period makes unlikely).
	require.Contains(t, out, "ErrProcFailed=true", out)
}

func TestAbortExitCode(t *testing.T) {
	out, code := gorun(t, 60*time.Second, "-np", "2", filepath.Join(bin, "failer"), "abort", "7")
	require.Equal(t, 7, code, out)
}

func TestKilledMidTransfer(t *testing.T) {
	out, code := gorun(t, 60*time.Second, "-np", "2", "--btl", "self,tcp", filepath.Join(bin, "failer"), "kill")
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "rank 1")
	require.True(t, strings.Contains(out, "signal") || strings.Contains(out, "killed"), out)
}

func TestNoTransportReachesPeer(t *testing.T) {
	out, code := gorun(t, 60*time.Second, "-np", "2", "--btl", "self", filepath.Join(bin, "conform"))
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "no transport reaches rank")
}

func TestBadFlagsAndMissingProgram(t *testing.T) {
	out, code := gorun(t, 30*time.Second, "-np", "2", "--no-such-flag", filepath.Join(bin, "conform"))
	require.NotEqual(t, 0, code)
	require.NotContains(t, out, "goroutine ")
	out, code = gorun(t, 30*time.Second, "-np", "2", "/no/such/program")
	require.NotEqual(t, 0, code)
	require.NotContains(t, out, "goroutine ")
	out, code = gorun(t, 30*time.Second, "-np", "2", "--param", "no_such_param=1", filepath.Join(bin, "conform"))
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "unknown parameter")
}
