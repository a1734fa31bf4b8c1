package launcher_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Binaries built once by TestMain.
var (
	gorunBin    string // cmd/gorun
	rankprogBin string // launcher/testdata/rankprog
	raceEnabled bool   // set by race_test.go
)

func TestMain(m *testing.M) {
	os.Exit(buildAndRun(m))
}

func buildAndRun(m *testing.M) int {
	// Race-enabled programs sleep 1s at exit by default; the ranks and
	// gorun inherit this.
	os.Setenv("GORACE", strings.TrimSpace(os.Getenv("GORACE")+" atexit_sleep_ms=0"))
	dir, err := os.MkdirTemp("", "gorun-test-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	gorunBin = filepath.Join(dir, "gorun")
	rankprogBin = filepath.Join(dir, "rankprog")
	args := []string{"build", "-o", dir + "/"}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/gompi-org/gompi/cmd/gorun", "github.com/gompi-org/gompi/launcher/testdata/rankprog")
	if out, err := exec.Command("go", args...).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "building test binaries: %v\n%s", err, out)
		return 1
	}
	return m.Run()
}

// result is what a gorun run showed its user.
type result struct {
	stdout, stderr string
	code           int
	pidDir         string // where the ranks recorded their pids
}

// gorun runs the gorun binary with args, rankprog's pids recorded in a new
// directory, and returns once it has exited or the test's deadline passed.
func gorun(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	r := result{pidDir: t.TempDir()}
	cmd := exec.CommandContext(ctx, gorunBin, args...)
	cmd.Env = append(os.Environ(), "RANKPROG_PIDDIR="+r.pidDir)
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r.stdout, r.stderr = stdout.String(), stderr.String()
	if ctx.Err() != nil {
		t.Fatalf("gorun %q did not finish in time\nstdout:\n%s\nstderr:\n%s", args, r.stdout, r.stderr)
	}
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatalf("gorun %q: %v", args, err)
	}
	r.code = cmd.ProcessState.ExitCode()
	return r
}

// pids returns the pids recorded in dir by kind ("rank0", "child", ...).
func pids(t *testing.T, dir string) map[string][]int {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string][]int{}
	for _, e := range entries {
		kind, pid, ok := strings.Cut(e.Name(), ".")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil {
			t.Fatalf("bad pid file %q", e.Name())
		}
		m[kind] = append(m[kind], n)
	}
	return m
}

// alive tells whether pid is a live process (a zombie whose parent has not
// reaped it yet counts as dead: it runs no code).
func alive(pid int) bool {
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z' && stat[i+2] != 'X'
	}
	return true
}

// assertAllGone checks that every process recorded in dir has ended. The
// ranks were reaped by gorun before it exited; a grandchild killed with its
// rank's group may take a moment to die, so the check waits up to a deadline.
func assertAllGone(t *testing.T, dir string, wantRanks int) {
	t.Helper()
	m := pids(t, dir)
	n := 0
	for kind, ps := range m {
		if strings.HasPrefix(kind, "rank") {
			n += len(ps)
		}
	}
	if n != wantRanks {
		t.Errorf("%d ranks recorded their pid, want %d: %v", n, wantRanks, m)
	}
	deadline := time.Now().Add(5 * time.Second)
	for kind, ps := range m {
		for _, pid := range ps {
			for alive(pid) {
				if time.Now().After(deadline) {
					syscall.Kill(pid, syscall.SIGKILL)
					t.Errorf("%s pid %d survived gorun", kind, pid)
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
		}
	}
}

func TestRingSucceeds(t *testing.T) {
	r := gorun(t, "", "-np", "4", "--oversubscribe", "--tag-output", rankprogBin, "ring")
	if r.code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for rank := range 4 {
		want := fmt.Sprintf("[%d] rank %d got \"hello from %d\"\n", rank, rank, (rank+1)%4)
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
	if r.stderr != "" {
		t.Errorf("stderr of a clean run: %q", r.stderr)
	}
	assertAllGone(t, r.pidDir, 4)
}

func TestFailuresStopTheJob(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		rank   int
		reason string
		notice bool // whether the other ranks report a failure notice
	}{
		{"exit status", []string{"exit", "1", "3"}, 3, 1, "exited with status 3", true},
		{"killed", []string{"sigkill", "0"}, 128 + 9, 0, "killed by signal 9 (killed)", true},
		{"no finalize", []string{"nofinalize", "2"}, 1, 2, "exited without calling Finalize", true},
		{"abort", []string{"abort", "1", "7"}, 7, 1, "called Abort(7): rank 1 gives up", false},
		{"abort code beyond an exit status", []string{"abort", "0", "300"}, 1, 0, "called Abort(300): rank 0 gives up", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-np", "3", "--oversubscribe", "--tag-output", rankprogBin}, tc.args...)
			r := gorun(t, "", args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			re := regexp.MustCompile(fmt.Sprintf(`(?m)^gorun: rank %d \(pid (\d+)\) %s$`, tc.rank, regexp.QuoteMeta(tc.reason)))
			m := re.FindAllStringSubmatch(r.stderr, -1)
			if len(m) != 1 {
				t.Fatalf("want one line matching %s on stderr:\n%s", re, r.stderr)
			}
			if pid, _ := strconv.Atoi(m[0][1]); !containsInt(pids(t, r.pidDir)[fmt.Sprintf("rank%d", tc.rank)], pid) {
				t.Errorf("message names pid %d, but rank %d had pid %v", pid, tc.rank, pids(t, r.pidDir))
			}
			if n := strings.Count(r.stderr, "gorun: rank"); n != 1 {
				t.Errorf("%d failure lines, want only the first failure:\n%s", n, r.stderr)
			}
			if tc.notice {
				for other := range 3 {
					if other == tc.rank {
						continue
					}
					want := fmt.Sprintf("[%d] rank %d notified: rank %d %s\n", other, other, tc.rank, tc.reason)
					if !strings.Contains(r.stdout, want) {
						t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
					}
				}
			}
			assertAllGone(t, r.pidDir, 3)
		})
	}
}

func containsInt(s []int, v int) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestTimeoutStopsEveryRank(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"ranks end at SIGTERM", []string{"hang"}},
		{"ranks ignore SIGTERM", []string{"hang", "ignoreterm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"-np", "2", "--timeout", "500ms", "--grace", "200ms", rankprogBin}, tc.args...)
			start := time.Now()
			r := gorun(t, "", args...)
			if r.code != 124 {
				t.Errorf("exit %d, want 124\nstderr:\n%s", r.code, r.stderr)
			}
			if !strings.Contains(r.stderr, "gorun: timed out after 500ms: stopping 2 rank(s)\n") {
				t.Errorf("stderr lacks the timeout line:\n%s", r.stderr)
			}
			if elapsed := time.Since(start); elapsed < 500*time.Millisecond {
				t.Errorf("gorun returned after %v, before the timeout", elapsed)
			}
			if strings.Count(r.stdout, "ready") != 2 {
				t.Errorf("ranks did not all start:\n%s", r.stdout)
			}
			assertAllGone(t, r.pidDir, 2)
		})
	}
}

// startGorun starts gorun with the ranks in "hang" mode and returns once
// every rank has printed that it is ready.
func startGorun(t *testing.T, ctx context.Context, np int, mode ...string) (*exec.Cmd, *bytes.Buffer, string) {
	t.Helper()
	pidDir := t.TempDir()
	args := append([]string{"-np", strconv.Itoa(np), "--oversubscribe", rankprogBin}, mode...)
	cmd := exec.CommandContext(ctx, gorunBin, args...)
	cmd.Env = append(os.Environ(), "RANKPROG_PIDDIR="+pidDir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(stdout)
	for ready := 0; ready < np; {
		if !sc.Scan() {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("gorun ended before the ranks were ready: %v\n%s", sc.Err(), stderr.String())
		}
		if strings.HasPrefix(sc.Text(), "ready ") {
			ready++
		}
	}
	go io.Copy(io.Discard, stdout)
	return cmd, &stderr, pidDir
}

func TestSignalsAreForwarded(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			cmd, stderr, pidDir := startGorun(t, ctx, 2, "hang")
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			cmd.Wait()
			if ctx.Err() != nil {
				t.Fatalf("gorun did not end after %v", sig)
			}
			if code := cmd.ProcessState.ExitCode(); code != 128+int(sig) {
				t.Errorf("exit %d, want %d (128+%d)", code, 128+int(sig), int(sig))
			}
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^gorun: rank \d \(pid \d+\) killed by signal %d \(%s\)$`, int(sig), sig)).MatchString(stderr.String()) {
				t.Errorf("stderr lacks the failure line:\n%s", stderr.String())
			}
			assertAllGone(t, pidDir, 2)
		})
	}
}

func TestRanksDieWithGorun(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cmd, _, pidDir := startGorun(t, ctx, 2, "hang", "nochild")
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	assertAllGone(t, pidDir, 2)
}

func TestOutputLinesStayWhole(t *testing.T) {
	const n, length = 3000, 300
	for _, tagged := range []bool{true, false} {
		t.Run(fmt.Sprintf("tagged=%v", tagged), func(t *testing.T) {
			args := []string{"-np", "2", rankprogBin, "lines", strconv.Itoa(n), strconv.Itoa(length)}
			if tagged {
				args = append([]string{"--tag-output"}, args...)
			} else {
				// Untagged, a partial line is forwarded as it is and would
				// run into the other rank's next line.
				args = append(args, "nopartial")
			}
			r := gorun(t, "", args...)
			if r.code != 0 {
				t.Fatalf("exit %d: %s", r.code, r.stderr)
			}
			re := regexp.MustCompile(`^(\[(\d)\] )?rank=(\d) line=(\d{6}) ([a-z]+)$`)
			next := [2]int{}
			partial := 0
			for _, line := range strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n") {
				m := re.FindStringSubmatch(line)
				if m == nil {
					// The final partial lines, ended by gorun when tagged.
					if tagged && (line == "[0] partial-0" || line == "[1] partial-1") {
						partial++
						continue
					}
					t.Fatalf("mixed or damaged line: %.120q", line)
				}
				rank, _ := strconv.Atoi(m[3])
				if tagged && m[2] != m[3] {
					t.Fatalf("line of rank %s tagged [%s]", m[3], m[2])
				}
				if i, _ := strconv.Atoi(m[4]); i != next[rank] {
					t.Fatalf("rank %d: line %d after line %d", rank, i, next[rank]-1)
				}
				next[rank]++
				if body := len("rank=0 line=000000 ") + len(m[5]); body != length || strings.Trim(m[5], string(rune('a'+rank))) != "" {
					t.Fatalf("rank %d line %d damaged", rank, next[rank]-1)
				}
			}
			if next != [2]int{n, n} {
				t.Errorf("lines per rank %v, want %d each", next, n)
			}
			if want := map[bool]int{true: 2, false: 0}[tagged]; partial != want {
				t.Errorf("final partial lines: %d, want %d\n%q", partial, want, r.stdout[max(0, len(r.stdout)-200):])
			}
		})
	}
}

func TestStdinGoesToRankZero(t *testing.T) {
	in := strings.Repeat("some input\n", 1000)
	r := gorun(t, in, "-np", "2", rankprogBin, "echo")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	// Rank 1's line may fall anywhere between rank 0's.
	other := "rank 1 read 0 bytes of stdin\n"
	if !strings.Contains(r.stdout, other) || strings.Replace(r.stdout, other, "", 1) != in {
		t.Errorf("stdout:\n%.300q", r.stdout)
	}
}

// TestStdinAcrossHosts: on several hosts (here two, whose daemons a launch
// agent runs on this machine) stdin goes to rank 0 as on one host, whole
// and in order; the other ranks, on rank 0's host and on the other one,
// read nothing.
func TestStdinAcrossHosts(t *testing.T) {
	agent := filepath.Join(t.TempDir(), "agent")
	script := "#!/bin/sh\n# launch agent: AGENT HOST CMD... runs CMD on this machine\nshift\nexec \"$@\"\n"
	if err := os.WriteFile(agent, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for i := range 50000 { // 900 KB: more than the socket buffers hold
		fmt.Fprintf(&b, "input line %06d\n", i)
	}
	in := b.String()
	r := gorun(t, in, "--host", "a:2,b", "--launch-agent", agent, "-np", "3", rankprogBin, "echo")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	out := r.stdout
	for _, other := range []string{"rank 1 read 0 bytes of stdin\n", "rank 2 read 0 bytes of stdin\n"} {
		if !strings.Contains(out, other) {
			t.Fatalf("no %q in stdout; stderr:\n%s", other, r.stderr)
		}
		out = strings.Replace(out, other, "", 1)
	}
	if out != in {
		t.Errorf("rank 0 echoed %d bytes, want the %d of stdin; stdout starts:\n%.300q", len(out), len(in), out)
	}
}

func TestEnvironmentContract(t *testing.T) {
	t.Setenv("GOMPI_RANK", "99") // from an enclosing job: must not leak
	t.Setenv("GORUN_TEST_COPIED", "copied value")
	r := gorun(t, "", "-np", "2", "--tag-output", "--stats", "--verbose",
		"-x", "FOO=bar", "-x", "GORUN_TEST_COPIED",
		"--param", "a=1", "--eager-limit", "4k", "--protocol", "eager", "--param", "z=last",
		rankprogBin, "env")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	env := map[int]map[string]string{0: {}, 1: {}}
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		var rank int
		var kv string
		if _, err := fmt.Sscanf(line, "[%d]", &rank); err != nil {
			t.Fatalf("untagged line %q", line)
		}
		_, kv, _ = strings.Cut(line, "] ")
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[rank][k] = v
		} else {
			env[rank][kv] = ""
		}
	}
	params := `a=1\nbtl_self_eager_limit=4k\nbtl_sm_eager_limit=4k\nbtl_tcp_eager_limit=4k\nbtl_verbs_eager_limit=4k\npml_force_protocol=eager\nz=last`
	for rank := range 2 {
		e := env[rank]
		for k, want := range map[string]string{
			"GOMPI_RANK": strconv.Itoa(rank), "GOMPI_SIZE": "2",
			"GOMPI_LOCAL_RANK": strconv.Itoa(rank), "GOMPI_LOCAL_SIZE": "2",
			"GOMPI_STATS": "1", "GOMPI_VERBOSE": "1", "GOMPI_FLAG_PARAMS": params,
		} {
			if e[k] != want {
				t.Errorf("rank %d: %s=%q, want %q", rank, k, e[k], want)
			}
		}
		if !regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(e["GOMPI_JOB_ID"]) || e["GOMPI_JOB_ID"] != env[0]["GOMPI_JOB_ID"] {
			t.Errorf("rank %d: GOMPI_JOB_ID=%q", rank, e["GOMPI_JOB_ID"])
		}
		if !regexp.MustCompile(`^[0-9a-f]{64}$`).MatchString(e["GOMPI_SECRET"]) {
			t.Errorf("rank %d: GOMPI_SECRET=%q, want 64 hex digits", rank, e["GOMPI_SECRET"])
		}
		if !regexp.MustCompile(`^127\.0\.0\.1:\d+$`).MatchString(e["GOMPI_STORE"]) {
			t.Errorf("rank %d: GOMPI_STORE=%q", rank, e["GOMPI_STORE"])
		}
		if _, ok := e["GOMPI_OVERSUBSCRIBED"]; ok && runtime.NumCPU() >= 2 {
			t.Errorf("rank %d: GOMPI_OVERSUBSCRIBED set with 2 ranks on %d CPUs", rank, runtime.NumCPU())
		}
		if _, ok := e["secret on a command line: false"]; !ok {
			t.Errorf("rank %d: the secret is on a command line, or the check did not run", rank)
		}
	}
	// rankprog prints GOMPI_* and RANKPROG_* only; check -x through a
	// shell instead.
	sh := gorun(t, "", "-np", "1", "-x", "FOO=bar", "-x", "GORUN_TEST_COPIED", "sh", "-c", `echo "$FOO|$GORUN_TEST_COPIED"`)
	if sh.stdout != "bar|copied value\n" {
		t.Errorf("-x: stdout %q", sh.stdout)
	}
	if !strings.Contains(r.stderr, "gorun: rank 0: pid ") {
		t.Errorf("--verbose printed no launch progress:\n%s", r.stderr)
	}
}

// TestRankGOMAXPROCS: ranks share gorun's processors unless the user set
// GOMAXPROCS.
func TestRankGOMAXPROCS(t *testing.T) {
	want := strconv.Itoa(max(1, runtime.GOMAXPROCS(0)/2))
	if v := os.Getenv("GOMAXPROCS"); v != "" {
		want = v // inherited: gorun leaves it alone
	}
	r := gorun(t, "", "-np", "2", "sh", "-c", `echo "$GOMAXPROCS"`)
	if r.code != 0 || r.stdout != want+"\n"+want+"\n" {
		t.Errorf("exit %d, stdout %q, want GOMAXPROCS=%s twice", r.code, r.stdout, want)
	}
	r = gorun(t, "", "-np", "2", "-x", "GOMAXPROCS=3", "sh", "-c", `echo "$GOMAXPROCS"`)
	if r.code != 0 || r.stdout != "3\n3\n" {
		t.Errorf("-x GOMAXPROCS=3: exit %d, stdout %q", r.code, r.stdout)
	}
}

func TestOversubscription(t *testing.T) {
	np := strconv.Itoa(runtime.NumCPU() + 1)
	notice := "oversubscribed, waiting ranks will yield the CPU to each other"
	r := gorun(t, "", "-np", np, rankprogBin, "env")
	if r.code != 0 || !strings.Contains(r.stderr, notice) || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("exit %d, want 0 and a one-line notice; stderr:\n%s", r.code, r.stderr)
	}
	if got := strings.Count(r.stdout, "GOMPI_OVERSUBSCRIBED=1\n"); got != runtime.NumCPU()+1 {
		t.Errorf("%d ranks saw GOMPI_OVERSUBSCRIBED=1, want all", got)
	}
	r = gorun(t, "", "-np", np, "--oversubscribe", rankprogBin, "env")
	if r.code != 0 || r.stderr != "" {
		t.Errorf("with --oversubscribe: exit %d, stderr %q", r.code, r.stderr)
	}
}

func TestBadCommandLines(t *testing.T) {
	for _, args := range [][]string{
		{},
		{rankprogBin, "ring"},
		{"-np", "2"},
		{"-np", "0", rankprogBin},
		{"-np", "two", rankprogBin},
		{"--bogus", "-np", "2", rankprogBin},
		{"-np", "2", "--timeout", "soon", rankprogBin},
		{"-np", "2", "--param", "novalue", rankprogBin},
		{"-np", "2", "-x", "GORUN_TEST_SURELY_UNSET", rankprogBin},
		{"-np"},
	} {
		r := gorun(t, "", args...)
		if r.code != 2 {
			t.Errorf("gorun %q: exit %d, want 2", args, r.code)
		}
		first, rest, _ := strings.Cut(r.stderr, "\n")
		if !strings.HasPrefix(first, "gorun: ") || !strings.HasPrefix(rest, "usage: gorun -np N") {
			t.Errorf("gorun %q: stderr is not one error line and the usage:\n%s", args, r.stderr)
		}
		if strings.Contains(r.stderr, "goroutine ") || strings.Contains(r.stderr, "panic") {
			t.Errorf("gorun %q: a panic:\n%s", args, r.stderr)
		}
	}
	r := gorun(t, "", "--help")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "usage: gorun") {
		t.Errorf("--help: exit %d, stdout %q", r.code, r.stdout)
	}
	// Flags after PROGRAM belong to the program.
	r = gorun(t, "", "-np", "1", "sh", "-c", `echo "$0 $1"`, "-np", "--bogus")
	if r.code != 0 || r.stdout != "-np --bogus\n" {
		t.Errorf("program flags: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
}

func TestMissingProgram(t *testing.T) {
	for _, tc := range []struct{ prog, want string }{
		{"/no/such/program", `gorun: program "/no/such/program" not found`},
		{"./no-such-dir", `gorun: program "./no-such-dir" not found`},
		{"gorun-no-such-command", `gorun: program "gorun-no-such-command" not found`},
		{"./store", "is not a main package"},
	} {
		r := gorun(t, "", "-np", "2", tc.prog)
		if r.code == 0 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "goroutine ") {
			t.Errorf("gorun -np 2 %s: exit %d, stderr:\n%s", tc.prog, r.code, r.stderr)
		}
		if n := strings.Count(r.stderr, "\n"); n != 1 {
			t.Errorf("gorun -np 2 %s: %d lines on stderr, want 1:\n%s", tc.prog, n, r.stderr)
		}
	}
}

func TestBuildsGoPackageDirectory(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	r := gorun(t, "", "-np", "2", "--tag-output", "./testdata/rankprog", "ring")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	if !strings.Contains(r.stdout, `[1] rank 1 got "hello from 0"`) {
		t.Errorf("stdout:\n%s", r.stdout)
	}
	entries, _ := os.ReadDir(tmp)
	for _, e := range entries {
		t.Errorf("left behind in TMPDIR: %s", e.Name())
	}
	// A package path works too, and a build error is reported.
	r = gorun(t, "", "-np", "1", "github.com/gompi-org/gompi/launcher/testdata/rankprog", "ring")
	if r.code != 0 {
		t.Errorf("package path: exit %d: %s", r.code, r.stderr)
	}
	bad := filepath.Join(t.TempDir(), "bad")
	os.MkdirAll(bad, 0o755)
	os.WriteFile(filepath.Join(bad, "main.go"), []byte("package main\nfunc main() { undefined() }\n"), 0o644)
	os.WriteFile(filepath.Join(bad, "go.mod"), []byte("module bad\n"), 0o644)
	r = gorun(t, "", "-np", "1", bad)
	if r.code == 0 || !strings.Contains(r.stderr, "go build") || !strings.Contains(r.stderr, "undefined") {
		t.Errorf("build error: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}

// TestBuildsWithProfile: a program gorun builds gets gompi's profile
// (go build -pgo) unless its folder has a default.pgo or --pgo says
// otherwise; a missing profile file is a command-line error.
func TestBuildsWithProfile(t *testing.T) {
	run := func(args ...string) string {
		t.Helper()
		r := gorun(t, "", append([]string{"-np", "1"}, args...)...)
		if r.code != 0 {
			t.Fatalf("gorun %v: exit %d: %s", args, r.code, r.stderr)
		}
		return strings.TrimSpace(r.stdout)
	}
	if got := run("./testdata/rankprog", "pgo"); !strings.HasPrefix(got, "-pgo=/") || !strings.HasSuffix(got, "/gompi.pgo") {
		t.Errorf("default: program reports %q, want gompi.pgo", got)
	}
	if got := run("--pgo", "off", "./testdata/rankprog", "pgo"); got != "-pgo=none" {
		t.Errorf("--pgo off: program reports %q", got)
	}
	// A program folder with its own default.pgo keeps it (the folder is
	// inside this module, so that the copy still imports its packages).
	prof, err := os.ReadFile("../pgo/gompi.pgo")
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.MkdirTemp("testdata", "pgo-own-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(own) })
	src, err := os.ReadFile("testdata/rankprog/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(own, "main.go"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(own, "default.pgo"), prof, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := run("./"+own, "pgo"); !strings.HasSuffix(got, "/"+filepath.Base(own)+"/default.pgo") {
		t.Errorf("own default.pgo: program reports %q", got)
	}
	explicit := filepath.Join(t.TempDir(), "mine.pgo")
	if err := os.WriteFile(explicit, prof, 0o644); err != nil {
		t.Fatal(err)
	}
	if got := run("--pgo", explicit, "./testdata/rankprog", "pgo"); got != "-pgo="+explicit {
		t.Errorf("--pgo FILE: program reports %q, want -pgo=%s", got, explicit)
	}
	r := gorun(t, "", "-np", "1", "--pgo", filepath.Join(t.TempDir(), "missing.pgo"), "./testdata/rankprog", "pgo")
	if r.code == 0 || !strings.Contains(r.stderr, "not a profile file") {
		t.Errorf("missing profile: exit %d, stderr:\n%s", r.code, r.stderr)
	}
}
