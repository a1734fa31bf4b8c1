package tests

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Jobs on several hosts run here on hosts made of network namespaces: a
// head namespace (where gorun runs) holds a bridge, and every host
// namespace a veth whose other end is on that bridge, with addresses the
// test assigns in 10.231.0.0/24 inside its own namespaces (nothing is
// added to the machine's own network). The launch agent enters a host's
// namespace, and a UTS namespace of its own so that the host has its own
// name, instead of going through ssh.

// netHosts is a set of namespace hosts; Close removes them.
type netHosts struct {
	t      *testing.T
	prefix string
	agent  string // the launch agent script
	names  []string
}

func ipCmd(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// newNetHosts makes the head namespace and hosts h1..hn, or skips the test
// saying why they cannot be made here.
func newNetHosts(t *testing.T, n int) *netHosts {
	t.Helper()
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skipf("ip (iproute2) not found: %v", err)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skipf("unshare (util-linux) not found: %v", err)
	}
	h := &netHosts{t: t, prefix: fmt.Sprintf("gompi%d", os.Getpid()%100000)}
	if err := ipCmd("netns", "add", h.ns("head")); err != nil {
		t.Skipf("cannot make network namespaces here (needs root): %v", err)
	}
	h.names = append(h.names, "head")
	t.Cleanup(h.close)
	head := h.ns("head")
	must := func(args ...string) {
		t.Helper()
		require.NoError(t, ipCmd(args...))
	}
	must("-n", head, "link", "set", "lo", "up")
	must("-n", head, "link", "add", "br0", "type", "bridge")
	must("-n", head, "addr", "add", "10.231.0.1/24", "dev", "br0")
	must("-n", head, "link", "set", "br0", "up")
	for i := 1; i <= n; i++ {
		name := "h" + strconv.Itoa(i)
		ns := h.ns(name)
		must("netns", "add", ns)
		h.names = append(h.names, name)
		must("-n", head, "link", "add", "v"+name, "type", "veth", "peer", "name", "eth0", "netns", ns)
		must("-n", head, "link", "set", "v"+name, "master", "br0", "up")
		must("-n", ns, "link", "set", "lo", "up")
		must("-n", ns, "addr", "add", fmt.Sprintf("10.231.0.%d/24", 10+i), "dev", "eth0")
		must("-n", ns, "link", "set", "eth0", "up")
	}
	h.agent = filepath.Join(t.TempDir(), "netns-agent")
	script := "#!/bin/sh\n# launch agent: AGENT HOST CMD... runs CMD in HOST's namespaces\nhost=$1; shift\n" +
		"exec ip netns exec \"" + h.prefix + "-$host\" unshare --uts sh -c 'hostname \"$0\" && exec \"$@\"' \"$host\" \"$@\"\n"
	require.NoError(t, os.WriteFile(h.agent, []byte(script), 0o755))
	return h
}

func (h *netHosts) ns(name string) string { return h.prefix + "-" + name }

// pids lists the processes in host name's namespace.
func (h *netHosts) pids(name string) []int {
	out, _ := exec.Command("ip", "netns", "pids", h.ns(name)).Output()
	var pids []int
	for _, f := range strings.Fields(string(out)) {
		if p, err := strconv.Atoi(f); err == nil {
			pids = append(pids, p)
		}
	}
	return pids
}

// kill ends every process in host name's namespace: the host dies.
func (h *netHosts) kill(name string) {
	for _, p := range h.pids(name) {
		syscall.Kill(p, syscall.SIGKILL)
	}
}

func (h *netHosts) close() {
	for _, n := range h.names {
		h.kill(n)
	}
	for _, n := range h.names {
		if err := ipCmd("netns", "del", h.ns(n)); err != nil {
			h.t.Errorf("removing namespace: %v", err)
		}
	}
}

// gorunIn starts gorun in the head namespace with args and returns the
// running job.
func (h *netHosts) gorunIn(t *testing.T, timeout time.Duration, args ...string) *running {
	t.Helper()
	full := append([]string{"netns", "exec", h.ns("head"), prog("gorun"), "--launch-agent", h.agent}, args...)
	return startCmd(t, timeout, nil, "ip", full...)
}

// requireHostsEmpty checks, with up to 5 s for killed processes to go,
// that no process is left in the host namespaces.
func (h *netHosts) requireHostsEmpty(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		var left []string
		for _, n := range h.names {
			for _, p := range h.pids(n) {
				cmd, _ := os.ReadFile("/proc/" + strconv.Itoa(p) + "/cmdline")
				left = append(left, fmt.Sprintf("%s: pid %d %s", n, p, strings.ReplaceAll(string(cmd), "\x00", " ")))
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes left on the hosts:\n%s", strings.Join(left, "\n"))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestHostsRing: 4 ranks on two namespace hosts, two per host: sm
// between the ranks of one host, tcp between hosts, output relayed and
// tagged, and nothing left on any host.
func TestHostsRing(t *testing.T) {
	h := newNetHosts(t, 2)
	for _, hostArgs := range [][]string{{"--host", "h1:2,h2:2"}, {"--hostfile", writeHostfile(t, "# test hosts\nh1 slots=2\nh2 slots=2 max_slots=4\n")}} {
		t.Run(hostArgs[0], func(t *testing.T) {
			r := h.gorunIn(t, 90*time.Second, append(hostArgs, "-np", "4", "--verbose", "--tag-output", "-x", "GOMPI_VERBOSE=1",
				"--timeout", "60s", prog("ring"))...)
			out, code := r.wait()
			t.Logf("output:\n%s", out)
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "[0] ring of 4 ranks: token came back with 6 (want 6)")
			require.Contains(t, out, "gorun: ranks on hosts: h1: 0-1, h2: 2-3")
			for _, via := range []string{"[0] gompi[0]: rank 1 via sm", "[0] gompi[0]: rank 2 via tcp", "[3] gompi[3]: rank 2 via sm", "[3] gompi[3]: rank 1 via tcp"} {
				require.Contains(t, out, via, out)
			}
			require.Regexp(t, `\[2\] gompi\[2\]: tcp: rank 2 listening on \[10\.231\.0\.12:\d+\]`, out, "tcp binds the interface that reaches the other host")
			h.requireHostsEmpty(t)
		})
	}
}

func writeHostfile(t *testing.T, text string) string {
	p := filepath.Join(t.TempDir(), "hostfile")
	require.NoError(t, os.WriteFile(p, []byte(text), 0o644))
	return p
}

// TestHostsConform runs the conformance program with ranks on two hosts.
func TestHostsConform(t *testing.T) {
	h := newNetHosts(t, 2)
	r := h.gorunIn(t, 120*time.Second, "--host", "h1,h2:2", "-np", "3", "--oversubscribe", "--timeout", "100s", prog("conform"))
	out, code := r.wait()
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "conform ok")
	h.requireHostsEmpty(t)
}

// TestHostDies: while rank 0 (host h1) streams to rank 1 (host h2),
// everything on h2 is killed. gorun ends the job naming the host, rank 0
// is stopped, and nothing is left on h1.
func TestHostDies(t *testing.T) {
	h := newNetHosts(t, 2)
	r := h.gorunIn(t, 60*time.Second, "--host", "h1,h2", "-np", "2", "--grace", "500ms", "--timeout", "40s", prog("failer"), "stream")
	r.await(regexp.MustCompile(`rank 1: streaming pid \d+`), 30*time.Second)
	h.kill("h2")
	out, code := r.wait()
	t.Logf("output:\n%s", out)
	require.NotEqual(t, 0, code, out)
	require.Regexp(t, `gorun: rank 1 \(pid \d+\) .*gorun daemon on host h2`, out)
	h.requireHostsEmpty(t)
}

// TestHostOfRankZeroDies: as TestHostDies, but the host that dies is rank
// 0's, which holds the connection that relays gorun's standard input (left
// open here): the job still ends naming that host.
func TestHostOfRankZeroDies(t *testing.T) {
	h := newNetHosts(t, 2)
	r := h.gorunIn(t, 60*time.Second, "--host", "h1,h2", "-np", "2", "--grace", "500ms", "--timeout", "40s", prog("failer"), "stream")
	r.await(regexp.MustCompile(`rank 1: streaming pid \d+`), 30*time.Second)
	h.kill("h1")
	out, code := r.wait()
	t.Logf("output:\n%s", out)
	require.NotEqual(t, 0, code, out)
	require.Regexp(t, `gorun: rank 0 \(pid \d+\) .*gorun daemon on host h1`, out)
	h.requireHostsEmpty(t)
}

// TestHostsStdin: gorun's standard input reaches rank 0 (host h1) as it
// comes, a line at a time, and rank 0 only: rank 1 (host h2) reads
// nothing. The ranks are shell scripts: rank 0 copies its input.
func TestHostsStdin(t *testing.T) {
	h := newNetHosts(t, 2)
	script := `if [ "$GOMPI_RANK" = 0 ]; then cat; else echo "rank $GOMPI_RANK read $(wc -c | tr -d ' ') bytes of stdin"; fi`
	r := h.gorunIn(t, 60*time.Second, "--host", "h1,h2", "-np", "2", "--tag-output", "--timeout", "40s", "sh", "-c", script)
	_, err := io.WriteString(r.stdin, "first line\n")
	require.NoError(t, err)
	r.await(regexp.MustCompile(`\[0\] first line`), 30*time.Second)
	_, err = io.WriteString(r.stdin, "second line\n")
	require.NoError(t, err)
	require.NoError(t, r.stdin.Close())
	out, code := r.wait()
	t.Logf("output:\n%s", out)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "[0] second line\n")
	require.Contains(t, out, "[1] rank 1 read 0 bytes of stdin\n")
	h.requireHostsEmpty(t)
}

// TestHostUnreachable: a host whose daemon cannot be started (no such
// namespace) ends the job with the host's name; the ranks already started
// on the other host are stopped.
func TestHostUnreachable(t *testing.T) {
	h := newNetHosts(t, 1)
	r := h.gorunIn(t, 60*time.Second, "--host", "h1,h9", "-np", "2", "--grace", "500ms", "--timeout", "40s", prog("ring"))
	out, code := r.wait()
	t.Logf("output:\n%s", out)
	require.NotEqual(t, 0, code, out)
	require.Contains(t, out, "gorun daemon on host h9 exited with status", out)
	h.requireHostsEmpty(t)
}

// TestHostsOfOneName: two hosts of a job that are one machine under one
// hostname (a launch agent that runs every daemon here, as containers or
// namespaces without their own name would): each host's ranks take only
// each other for local (sm) and reach the other host's by tcp, and the
// ring completes.
func TestHostsOfOneName(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "agent")
	require.NoError(t, os.WriteFile(agent, []byte("#!/bin/sh\n# AGENT HOST CMD...: runs CMD on this machine\nshift\nexec \"$@\"\n"), 0o755))
	r := start(t, 90*time.Second, nil, "--host", "a:2,b:2", "--launch-agent", agent, "-np", "4", "--oversubscribe",
		"--tag-output", "-x", "GOMPI_VERBOSE=1", "--timeout", "60s", prog("ring"))
	out, code := r.wait()
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "[0] ring of 4 ranks: token came back with 6 (want 6)")
	for _, via := range []string{"[0] gompi[0]: rank 1 via sm", "[0] gompi[0]: rank 2 via tcp", "[3] gompi[3]: rank 2 via sm", "[3] gompi[3]: rank 1 via tcp"} {
		require.Contains(t, out, via, out)
	}
}
