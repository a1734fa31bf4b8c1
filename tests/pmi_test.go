package tests

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The PMI tests start gompi programs with MPICH's process manager (hydra:
// mpiexec.hydra, Debian package mpich) instead of gorun. Open MPI may own
// the plain "mpiexec" name, so hydra is called by its own.

// hydra returns the path of mpiexec.hydra, or skips the test saying why.
func hydra(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("mpiexec.hydra")
	if err != nil {
		t.Skipf("mpiexec.hydra not found (%v): install MPICH (apt-get install mpich) to run the PMI tests", err)
	}
	return p
}

// pmiModes are the ways hydra can hand a process its PMI connection. Both
// use PMI-1: hydra 4.0's PMI-2 kvs-fence answers before every rank arrived
// (see docs/launch.md), so gompi speaks PMI-2 only when PMI_JOBID says
// Slurm started it; the PMI-2 client is tested against launcher/pmi's
// fake server and Slurm.
var pmiModes = []struct {
	name string
	args []string // mpiexec.hydra flags
	env  []string
}{
	{"pmi1", nil, []string{"GOMPI_PMI=1"}},
	{"pmi1-port", []string{"-pmi-port"}, []string{"GOMPI_PMI=1"}},
}

// mpiexec runs mpiexec.hydra with args and extra environment entries (for
// every rank: hydra passes its own environment on) and a deadline; it
// returns stdout+stderr and the exit code.
func mpiexec(t *testing.T, timeout time.Duration, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, hydra(t), args...)
	cmd.Env = append(cleanEnv(), env...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("mpiexec.hydra %v did not end within %v:\n%s", args, timeout, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("mpiexec.hydra %v: %v", args, err)
	}
	return string(out), code
}

// cleanEnv is the test's environment without the variables of an
// enclosing gorun or PMI job.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "GOMPI_") || strings.HasPrefix(kv, "PMI_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

var rePMIJob = regexp.MustCompile(`gompi\[\d+\]: PMI-\d job ([0-9a-f]+): rank`)

// progProcs lists the processes of this host running one of the test
// programs in bin (and so, of a job the test started).
func progProcs(names ...string) []string {
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmdline, err := os.ReadFile(d + "/cmdline")
		if err != nil {
			continue
		}
		argv0, _, _ := strings.Cut(string(cmdline), "\x00")
		for _, n := range names {
			if argv0 == prog(n) {
				st, _ := os.ReadFile(d + "/stat")
				if !strings.Contains(string(st), ") Z ") {
					found = append(found, filepath.Base(d)+": "+strings.ReplaceAll(string(cmdline), "\x00", " "))
				}
			}
		}
	}
	return found
}

// requireNoPMILeftovers checks, with up to 5 s for killed processes to
// leave, that no process of the test programs runs, no child a rank
// started (pids) lives, and no shared-memory segment of job id is held.
func requireNoPMILeftovers(t *testing.T, id string, pids []int, shm map[string]bool, names ...string) {
	t.Helper()
	if id != "" {
		requireNoLeftovers(t, id, pids, shm, "")
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(progProcs(names...)) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	require.Empty(t, progProcs(names...), "processes of the job left behind")
}

// TestHydraRing: mpiexec.hydra -n 4 ring works as gorun -np 4 ring does,
// over every transport and every PMI mode, and the ranks reach each
// other over the transport asked for.
func TestHydraRing(t *testing.T) {
	hydra(t)
	for _, m := range pmiModes {
		for _, tr := range transports {
			t.Run(m.name+"/"+tr.name, func(t *testing.T) {
				env := append([]string{"GOMPI_BTL=" + tr.btl, "GOMPI_VERBOSE=1"}, m.env...)
				args := append(append([]string{}, m.args...), "-n", "4", prog("ring"))
				out, code := mpiexec(t, 60*time.Second, env, args...)
				require.Equal(t, 0, code, out)
				require.Contains(t, out, "ring of 4 ranks: token came back with 6 (want 6)")
				for r := range 4 {
					for p := range 4 {
						via := tr.name
						if p == r {
							via = "self"
						}
						require.Contains(t, out, "gompi["+strconv.Itoa(r)+"]: rank "+strconv.Itoa(p)+" via "+via, out)
					}
				}
				ids := rePMIJob.FindAllStringSubmatch(out, -1)
				require.Len(t, ids, 4, out)
				for _, id := range ids {
					require.Equal(t, ids[0][1], id[1], "ranks disagree on the job id")
				}
				require.Contains(t, out, "local 3 of 4", "hydra's mapping puts all 4 ranks on this host")
			})
		}
	}
}

// TestHydraConform runs the conformance program under hydra over every
// transport, with the PMI connection on a descriptor and on a port.
func TestHydraConform(t *testing.T) {
	hydra(t)
	cases := []struct {
		name, btl string
		args      []string
	}{
		{"sm", "self,sm", nil}, {"tcp", "self,tcp", nil}, {"verbs", "self,verbs", nil}, {"sm/port", "self,sm", []string{"-pmi-port"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := mpiexec(t, 120*time.Second, []string{"GOMPI_BTL=" + c.btl, "GOMPI_OVERSUBSCRIBED=1"},
				append(c.args, "-n", "3", prog("conform"))...)
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "conform ok")
		})
	}
}

// TestHydraFailingRank: a rank that exits non-zero, aborts, or is killed
// ends the whole job the way hydra ends any MPI job: mpiexec.hydra exits
// non-zero (with the rank's own status for an exit or Abort), rank 0,
// blocked in a receive, is stopped, and no rank or shared-memory segment
// of the job is left.
func TestHydraFailingRank(t *testing.T) {
	hydra(t)
	cases := []struct {
		name string
		args []string
		code int    // the failed rank's status, which hydra usually exits with; 0: any non-zero
		say  string // in the output
	}{
		{"exit", []string{"exit", "3"}, 3, ""},
		{"abort", []string{"abort", "5"}, 5, ""},
		{"kill", []string{"kill"}, 0, "BAD TERMINATION"},
	}
	for _, tr := range transports {
		for _, c := range cases {
			t.Run(tr.name+"/"+c.name, func(t *testing.T) {
				shm := shmEntries()
				args := append([]string{"-n", "2", prog("failer")}, c.args...)
				out, code := mpiexec(t, 60*time.Second, []string{"GOMPI_BTL=" + tr.btl, "GOMPI_VERBOSE=1"}, args...)
				require.NotEqual(t, 0, code, out)
				if c.code != 0 && code != c.code {
					// hydra reports the status of whichever process it
					// saw end first: the failed rank's, or that of rank
					// 0, which it killed.
					require.Contains(t, out, "BAD TERMINATION", out)
				}
				require.Contains(t, out, c.say)
				// No FAILER_SPAWN child here: hydra takes a rank as
				// ended only once its output closes, and a child holding
				// it keeps hydra waiting; cleaning up a rank's children
				// is hydra's business.
				var pids []int
				id := ""
				if m := rePMIJob.FindStringSubmatch(out); m != nil {
					id = m[1]
				}
				requireNoPMILeftovers(t, id, pids, shm, "failer")
			})
		}
	}
}
