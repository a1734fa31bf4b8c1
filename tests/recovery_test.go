package tests

import (
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Programs this file's tests need beyond TestMain's, built on first use.
var (
	extraMu    sync.Mutex
	extraBuilt = map[string]error{}
)

// buildProg builds ./progs/name into bin once and returns its path.
func buildProg(t *testing.T, name string) string {
	t.Helper()
	extraMu.Lock()
	defer extraMu.Unlock()
	err, done := extraBuilt[name]
	if !done {
		out, berr := exec.Command("go", "build", "-o", bin+"/", "./progs/"+name).CombinedOutput()
		if berr != nil {
			err = fmt.Errorf("go build ./progs/%s: %v\n%s", name, berr, out)
		}
		extraBuilt[name] = err
	}
	require.NoError(t, err)
	return prog(name)
}

// killsPerCase is how many jobs TestRecoveryKills kills per transport and
// protocol: GOMPI_TEST_KILLS, default 5 (about 3 s per case; a soak run
// takes GOMPI_TEST_KILLS=200).
func killsPerCase() int {
	if n, err := strconv.Atoi(os.Getenv("GOMPI_TEST_KILLS")); err == nil && n > 0 {
		return n
	}
	return 5
}

var (
	reTransferring = regexp.MustCompile(`rank 2: transferring pid (\d+)`)
	reVictimFailed = regexp.MustCompile(`rank (\d): victim failed at (\d+) after (\d+) messages: (.*)`)
)

// TestRecoveryKills: under gorun --enable-recovery, rank 2 of 3 is
// killed with SIGKILL at a random moment of its transfers with the other
// two (every protocol, and the tensor rendezvous), over every transport,
// many times (GOMPI_TEST_KILLS per case). Each time the survivors'
// operations with it fail with ErrProcFailed within 5 s of the kill, the
// checked traffic between the survivors loses nothing, the ULFM rules
// hold (tests/progs/survivor checks them), both survivors finalize, gorun
// exits 128+9 naming rank 2, and nothing of the job is left on the host.
func TestRecoveryKills(t *testing.T) {
	survivor := buildProg(t, "survivor")
	cases := []struct {
		name string
		args []string
	}{
		{"eager", []string{"--protocol", "eager", survivor, "p2p", "2048"}},
		{"rdma_put", []string{"--protocol", "rdma_put", survivor, "p2p", "262144"}},
		{"rdma_get", []string{"--protocol", "rdma_get", survivor, "p2p", "262144"}},
		{"send_pipeline", []string{"--protocol", "send_pipeline", survivor, "p2p", "262144"}},
		{"rdma_pipeline", []string{"--protocol", "rdma_pipeline", "--param", "btl_sm_rdma_pipeline_frag_size=64k",
			"--param", "btl_tcp_rdma_pipeline_frag_size=64k", survivor, "p2p", "1048576"}},
		{"tensor", []string{survivor, "tensor", "65536"}},
	}
	kills := killsPerCase()
	for _, tr := range transports {
		for _, c := range cases {
			t.Run(tr.name+"/"+c.name, func(t *testing.T) {
				seed := uint64(time.Now().UnixNano())
				t.Logf("seed %d", seed)
				rng := rand.New(rand.NewPCG(seed, 1))
				for i := range kills {
					killOnce(t, i, tr.btl, rng.IntN(20_000), c.args)
				}
			})
		}
	}
}

// killOnce runs one job and kills its rank 2 delayUS microseconds after
// it reports its transfers running.
func killOnce(t *testing.T, i int, btl string, delayUS int, args []string) {
	t.Helper()
	shm := shmEntries()
	tmp, env := jobTmp(t)
	r := start(t, 60*time.Second, env, append([]string{"-np", "3", "--oversubscribe", "--enable-recovery", "--btl", btl,
		"--verbose", "--timeout", "45s"}, args...)...)
	m := r.await(reTransferring, 30*time.Second)
	pid, _ := strconv.Atoi(m[1])
	time.Sleep(time.Duration(delayUS) * time.Microsecond) // a random point of the transfers
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	killed := time.Now()
	out, code := r.wait()
	id, ranks := jobOf(t, out)
	require.Equal(t, ranks[2], pid, out)
	require.Equal(t, 128+9, code, "job %d (kill after %d us):\n%s", i, delayUS, out)
	require.Contains(t, out, "gorun: rank 2 (pid "+m[1]+") killed by signal 9", out)
	require.NotContains(t, out, "survivor: rank", "job %d (kill after %d us): a survivor broke a rule:\n%s", i, delayUS, out)
	for _, s := range []string{"0", "1"} {
		require.Contains(t, out, "rank "+s+": survived", "job %d (kill after %d us):\n%s", i, delayUS, out)
	}
	fails := reVictimFailed.FindAllStringSubmatch(out, -1)
	require.Len(t, fails, 2, out)
	for _, f := range fails {
		at, _ := strconv.ParseInt(f[2], 10, 64)
		require.Less(t, time.Unix(0, at).Sub(killed), 5*time.Second, "rank %s saw the failure late:\n%s", f[1], out)
	}
	requireNoLeftovers(t, id, []int{ranks[0], ranks[1], ranks[2]}, shm, tmp)
}
