package tests

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var reChild = regexp.MustCompile(`rank 1: child pid (\d+)`)

// jobTmp returns a fresh TMPDIR for one job and the environment entry that
// gives it to gorun (and so to the ranks).
func jobTmp(t *testing.T) (string, []string) {
	dir := filepath.Join(t.TempDir(), "tmp")
	require.NoError(t, os.Mkdir(dir, 0o700))
	return dir, []string{"TMPDIR=" + dir}
}

// allPIDs returns the rank pids and the pid of rank 1's child, if it printed one.
func allPIDs(out string, ranks map[int]int) []int {
	var pids []int
	for _, p := range ranks {
		pids = append(pids, p)
	}
	if m := reChild.FindStringSubmatch(out); m != nil {
		p, _ := strconv.Atoi(m[1])
		pids = append(pids, p)
	}
	return pids
}

// TestRankFailure: rank 1 fails in various ways (while rank 1 has started a
// child process of its own); gorun exits with the right status and names
// rank 1, its pid and the cause; rank 0, blocked in a Recv or Send with
// rank 1, is released with ErrProcFailed; and nothing of the job is left on
// the host.
func TestRankFailure(t *testing.T) {
	cases := []struct {
		name       string
		args       []string
		code       int
		cause      string
		procFailed bool // rank 0 reports ErrProcFailed from its blocked call
		mayFinish  bool // or its Send may have completed (the data was taken before rank 1 died)
	}{
		{"exit", []string{"exit", "3"}, 3, "exited with status 3", true, false},
		{"blocked-recv-exit", []string{"blocked"}, 3, "exited with status 3", true, false},
		{"abort", []string{"abort", "7"}, 7, "called Abort(7)", false, false},
		// Rank 1 posts the receive and kills itself: the receive may take the
		// data (and complete rank 0's Send) before the kill.
		{"kill-posted-recv", []string{"kill"}, 128 + 9, "killed by signal 9", true, true},
		{"kill-blocked-recv", []string{"recvblocked"}, 128 + 9, "killed by signal 9", true, false},
		{"kill-blocked-send", []string{"sendblocked"}, 128 + 9, "killed by signal 9", true, false},
	}
	for _, tr := range transports {
		for _, c := range cases {
			t.Run(tr.name+"/"+c.name, func(t *testing.T) {
				shm := shmEntries()
				tmp, env := jobTmp(t)
				args := append([]string{"-np", "2", "--btl", tr.btl, "--verbose", "--grace", "500ms", "--timeout", "30s",
					"-x", "FAILER_SPAWN=1", prog("failer")}, c.args...)
				out, code := gorunEnv(t, 60*time.Second, env, args...)
				id, ranks := jobOf(t, out)
				require.Len(t, ranks, 2, out)
				require.Equal(t, c.code, code, out)
				require.Contains(t, out, "gorun: rank 1 (pid "+strconv.Itoa(ranks[1])+") "+c.cause, out)
				if c.procFailed {
					ret := regexp.MustCompile(`rank 0: blocked call returned: (.*) \(ErrProcFailed=(\w+)\)`).FindStringSubmatch(out)
					require.NotNil(t, ret, "rank 0 was not released from its blocked call:\n%s", out)
					if !(c.mayFinish && ret[1] == "<nil>") {
						require.Equal(t, "true", ret[2], "rank 0's blocked call returned %q:\n%s", ret[1], out)
					}
				}
				require.Regexp(t, reChild, out)
				requireNoLeftovers(t, id, allPIDs(out, ranks), shm, tmp)
			})
		}
	}
}

// TestKilledFromOutsideMidTransfer: while rank 0 streams 4 MiB messages to
// rank 1, the test kills rank 1 with SIGKILL. Before that, the leftover
// check must see the running job (so it is able to fail); afterwards it must
// find nothing.
func TestKilledFromOutsideMidTransfer(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			shm := shmEntries()
			tmp, env := jobTmp(t)
			r := start(t, 60*time.Second, env, "-np", "2", "--btl", tr.btl, "--verbose", "--grace", "500ms", "--timeout", "30s",
				"-x", "FAILER_SPAWN=1", prog("failer"), "stream")
			m := r.await(regexp.MustCompile(`rank 1: streaming pid (\d+)`), 30*time.Second)
			pid, _ := strconv.Atoi(m[1])
			id, ranks := jobOf(t, r.output())
			require.Equal(t, ranks[1], pid)

			live := strings.Join(holders(id), "\n")
			for _, p := range allPIDs(r.output(), ranks) {
				require.Contains(t, live, "pid "+strconv.Itoa(p)+" ", "the leftover check does not see a live process of the job")
			}
			if tr.name == "sm" {
				require.Contains(t, live, "maps a segment", "the leftover check does not see the mapped segments")
				require.Contains(t, live, "holds /memfd:gompi-sm."+id, "the leftover check does not see the segments' descriptors")
			}

			require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
			out, code := r.wait()
			require.Equal(t, 128+9, code, out)
			require.Contains(t, out, "gorun: rank 1 (pid "+m[1]+") killed by signal 9", out)
			require.Contains(t, out, "(ErrProcFailed=true)", out)
			requireNoLeftovers(t, id, allPIDs(out, ranks), shm, tmp)
		})
	}
}

// TestNormalEndLeavesNothing: a job that ends cleanly (after sm or tcp
// traffic, with a child process left running by rank 1) exits 0 and leaves
// nothing behind.
func TestNormalEndLeavesNothing(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			shm := shmEntries()
			tmp, env := jobTmp(t)
			out, code := gorunEnv(t, 60*time.Second, env, "-np", "3", "--oversubscribe", "--btl", tr.btl, "--verbose",
				"--timeout", "30s", "-x", "FAILER_SPAWN=1", prog("failer"), "finalize")
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "rank 0: finalized")
			id, ranks := jobOf(t, out)
			require.Len(t, ranks, 3, out)
			requireNoLeftovers(t, id, allPIDs(out, ranks), shm, tmp)
		})
	}
}

// TestBuiltProgramLeavesNothing: gorun builds a Go package, the job aborts;
// the build's temporary directory is gone afterwards.
func TestBuiltProgramLeavesNothing(t *testing.T) {
	shm := shmEntries()
	tmp, env := jobTmp(t)
	out, code := gorunEnv(t, 120*time.Second, env, "-np", "2", "--btl", "self,sm", "--verbose", "--grace", "500ms",
		"--timeout", "60s", "./progs/failer", "abort", "5")
	require.Equal(t, 5, code, out)
	require.Contains(t, out, "called Abort(5)")
	id, ranks := jobOf(t, out)
	requireNoLeftovers(t, id, allPIDs(out, ranks), shm, tmp)
}
