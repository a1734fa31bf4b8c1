package sm

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
)

// The test binary doubles as the child rank of TestChildKilled: with
// GOMPI_SM_TEST_CHILD set to a store directory it runs childRank instead
// of the tests.
const (
	childEnv    = "GOMPI_SM_TEST_CHILD"
	childJobEnv = "GOMPI_SM_TEST_JOB"
	childSends  = 40
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(childEnv); dir != "" {
		os.Exit(childRank(dir, os.Getenv(childJobEnv)))
	}
	os.Exit(m.Run())
}

// childRank is rank 1 of a two-rank job: it maps rank 0's segment, sends
// it childSends fragments (past the fast-box threshold), says "ready" and
// polls until it is killed.
func childRank(dir, job string) int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 2
	}
	set, err := params.NewSet(nil)
	if err != nil {
		return fail(err)
	}
	env := &btl.Env{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, JobID: job, Params: set, Store: fileStore{dir},
		Dispatch: &btl.Dispatcher{}, Logf: func(string, ...any) {}}
	env.Dispatch.Register(tagData, func(btl.Endpoint, []byte, []byte) {})
	mods, err := component{}.Open(env)
	if err != nil {
		return fail(err)
	}
	m := mods[0].(*Module)
	ep, err := m.AddProc(0)
	if err != nil {
		return fail(err)
	}
	for i := range childSends {
		if _, err := ep.Send(tagData, seqHdr(1, i, 100), fill(1, i, 100), nil); err != nil {
			return fail(err)
		}
	}
	for m.pendingN.Load() > 0 {
		m.Progress()
	}
	fmt.Println("ready")
	for {
		if m.Progress() == 0 {
			m.Block(nil)
		}
	}
}

// A child process maps our segment, talks to us, and is SIGKILLed: we get
// PeerFailed (ErrProcFailed) at once, sends to it fail, and after Close
// nothing of either process is left.
func TestChildKilled(t *testing.T) {
	shm := devShm(t)
	require.Empty(t, memfdState(t), "leftovers of an earlier test")
	dir := t.TempDir()
	job := btltest.JobID()
	r := openRank(t, fileStore{dir}, job, 0, 2)
	in := newInbox(r.env.Dispatch, tagData)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"="+dir, childJobEnv+"="+job)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	exited := make(chan error, 1)
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-exited
	})
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && line != "ready\n" {
			err = fmt.Errorf("child said %q", line)
		}
		ready <- err
		cmd.Wait()
		exited <- nil
	}()
	select {
	case err := <-ready:
		require.NoError(t, err)
	case <-time.After(20 * time.Second):
		t.Fatal("child not ready")
	}

	in.waitFor(t, r.m, true, 10*time.Second, "the child's fragments", func(n, _ int) bool { return n >= childSends })
	in.mu.Lock()
	checkOrder(t, in.frags)
	in.mu.Unlock()
	ep, err := r.m.AddProc(1)
	require.NoError(t, err)
	for i := range childSends {
		_, err := ep.Send(tagData, seqHdr(0, i, 8), fill(0, i, 8), nil)
		require.NoError(t, err)
	}
	require.NotNil(t, ep.(*endpoint).p.seg, "child's segment not mapped")
	require.Len(t, r.m.rx, 1, "the child's fast box is not polled")

	require.NoError(t, cmd.Process.Kill())
	t0 := time.Now()
	r.startPoller()
	in.waitFor(t, r.m, false, 5*time.Second, "PeerFailed", func(_, f int) bool { return f > 0 })
	t.Logf("PeerFailed %v after SIGKILL", time.Since(t0))
	in.mu.Lock()
	require.Equal(t, 1, in.fails[0].peer)
	require.ErrorIs(t, in.fails[0].err, mpierr.ErrProcFailed)
	in.mu.Unlock()
	_, err = ep.Send(tagData, nil, []byte("x"), nil)
	require.ErrorIs(t, err, mpierr.ErrProcFailed)

	r.stopPoller()
	require.NoError(t, r.m.Close())
	require.Empty(t, memfdState(t))
	require.Equal(t, shm, devShm(t))
}
