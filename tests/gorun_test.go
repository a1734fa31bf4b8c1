// Package tests holds multi-process conformance and fault tests. Every
// test launches real processes through gorun.
package tests

import (
	"bufio"
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var bin string // folder with gorun, the test programs and the examples

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gompi-tests")
	if err != nil {
		panic(err)
	}
	bin = dir
	for _, p := range []string{"../cmd/gorun", "./progs/conform", "./progs/failer", "./progs/idlecpu", "./progs/burst",
		"../examples/ring", "../examples/pingpong", "../examples/halo", "../cmd/gompi-soak"} {
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

// transports are the multi-process transport selections every conformance
// and fault test runs over.
var transports = []struct{ name, btl string }{
	{"tcp", "self,tcp"},
	{"sm", "self,sm"},
	{"verbs", "self,verbs"},
}

func prog(name string) string { return filepath.Join(bin, name) }

// gorun runs gorun with args and a deadline; it returns stdout+stderr and the exit code.
func gorun(t *testing.T, timeout time.Duration, args ...string) (string, int) {
	t.Helper()
	return gorunEnv(t, timeout, nil, args...)
}

// gorunEnv is gorun with extra environment entries for gorun itself.
func gorunEnv(t *testing.T, timeout time.Duration, env []string, args ...string) (string, int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, prog("gorun"), args...)
	cmd.Env = append(os.Environ(), env...)
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

// running is a gorun job whose output the test reads while it runs.
type running struct {
	t      *testing.T
	cmd    *exec.Cmd
	ctx    context.Context
	cancel context.CancelFunc
	stdin  io.WriteCloser
	args   []string

	mu      sync.Mutex
	out     strings.Builder // stdout and stderr, merged line by line
	changed chan struct{}   // closed and replaced whenever out grows or the output ends
	eof     bool
	readers sync.WaitGroup
}

// start starts gorun with args; the job is killed when timeout passes.
func start(t *testing.T, timeout time.Duration, env []string, args ...string) *running {
	t.Helper()
	return startCmd(t, timeout, env, prog("gorun"), args...)
}

// startCmd is start for any command (gorun behind a wrapper).
func startCmd(t *testing.T, timeout time.Duration, env []string, name string, args ...string) *running {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	r := &running{t: t, ctx: ctx, cancel: cancel, args: args, changed: make(chan struct{})}
	r.cmd = exec.CommandContext(ctx, name, args...)
	r.cmd.Env = append(os.Environ(), env...)
	var err error
	r.stdin, err = r.cmd.StdinPipe()
	require.NoError(t, err)
	pr, pw, err := os.Pipe()
	require.NoError(t, err)
	r.cmd.Stdout, r.cmd.Stderr = pw, pw
	if err := r.cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		cancel()
		t.Fatalf("start gorun: %v", err)
	}
	pw.Close()
	r.readers.Add(1)
	go func() {
		defer r.readers.Done()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			r.mu.Lock()
			r.out.WriteString(sc.Text() + "\n")
			close(r.changed)
			r.changed = make(chan struct{})
			r.mu.Unlock()
		}
		pr.Close()
		r.mu.Lock()
		r.eof = true
		close(r.changed)
		r.changed = make(chan struct{})
		r.mu.Unlock()
	}()
	t.Cleanup(func() {
		cancel()
		r.cmd.Wait()
		r.readers.Wait()
	})
	return r
}

// output returns the output so far.
func (r *running) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

// await waits until re matches the output and returns the submatches of
// its first match; it fails the test when the output ends or d passes first.
func (r *running) await(re *regexp.Regexp, d time.Duration) []string {
	r.t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		r.mu.Lock()
		m := re.FindStringSubmatch(r.out.String())
		eof, changed, out := r.eof, r.changed, r.out.String()
		r.mu.Unlock()
		if m != nil {
			return m
		}
		if eof {
			r.t.Fatalf("gorun %v ended without printing %q:\n%s", r.args, re, out)
		}
		select {
		case <-changed:
		case <-timer.C:
			r.t.Fatalf("gorun %v: no %q within %v:\n%s", r.args, re, d, out)
		}
	}
}

// wait waits for gorun to end (within the job's timeout) and returns its
// whole output and exit code.
func (r *running) wait() (string, int) {
	r.t.Helper()
	err := r.cmd.Wait()
	r.readers.Wait()
	out := r.output()
	if r.ctx.Err() != nil {
		r.t.Fatalf("gorun %v did not end in time:\n%s", r.args, out)
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		r.t.Fatalf("gorun %v: %v", r.args, err)
	}
	return out, code
}

var (
	reJobID = regexp.MustCompile(`gorun: job ([0-9a-f]+): `)
	reStore = regexp.MustCompile(`gorun: job [0-9a-f]+: .* store at (\S+)`)
	rePID   = regexp.MustCompile(`gorun: rank (\d+): pid (\d+)`)
)

// jobOf returns the job id and the rank pids that gorun --verbose printed.
func jobOf(t *testing.T, out string) (string, map[int]int) {
	t.Helper()
	m := reJobID.FindStringSubmatch(out)
	require.NotNil(t, m, "no job id in the output (--verbose):\n%s", out)
	pids := map[int]int{}
	for _, p := range rePID.FindAllStringSubmatch(out, -1) {
		r, _ := strconv.Atoi(p[1])
		pid, _ := strconv.Atoi(p[2])
		pids[r] = pid
	}
	return m[1], pids
}

// holders lists the processes of this host that belong to job id: any
// process with GOMPI_JOB_ID=id in its environment (ranks and whatever they
// started), and any process that maps or holds a descriptor of one of the
// job's shared-memory segments (memfd "gompi-sm.<id>.<rank>").
func holders(id string) []string {
	envMark := []byte("GOMPI_JOB_ID=" + id + "\x00")
	segMark := "gompi-sm." + id + "."
	var found []string
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		pid := filepath.Base(d)
		if pid == strconv.Itoa(os.Getpid()) {
			continue
		}
		what := []string{}
		if env, err := os.ReadFile(d + "/environ"); err == nil && strings.Contains(string(env)+"\x00", string(envMark)) {
			what = append(what, "job environment")
		}
		if maps, err := os.ReadFile(d + "/maps"); err == nil && strings.Contains(string(maps), segMark) {
			what = append(what, "maps a segment")
		}
		fds, _ := filepath.Glob(d + "/fd/*")
		for _, fd := range fds {
			if l, err := os.Readlink(fd); err == nil && strings.Contains(l, segMark) {
				what = append(what, "holds "+l)
				break
			}
		}
		if len(what) > 0 {
			cmdline, _ := os.ReadFile(d + "/cmdline")
			state := ""
			if st, err := os.ReadFile(d + "/stat"); err == nil {
				if i := strings.LastIndexByte(string(st), ')'); i > 0 && i+2 < len(st) {
					state = " state " + string(st[i+2])
				}
			}
			found = append(found, "pid "+pid+" ("+strings.ReplaceAll(string(cmdline), "\x00", " ")+state+"): "+strings.Join(what, ", "))
		}
	}
	return found
}

// shmEntries returns the names in /dev/shm that mention gompi.
func shmEntries() map[string]bool {
	m := map[string]bool{}
	ents, _ := os.ReadDir("/dev/shm")
	for _, e := range ents {
		if strings.Contains(strings.ToLower(e.Name()), "gompi") {
			m[e.Name()] = true
		}
	}
	return m
}

// requireNoLeftovers checks, once gorun has returned, that nothing of job
// id is left on the host: no process (rank, or a child a rank started),
// no holder of a shared segment, no new gompi entry in /dev/shm (shmBefore
// was taken before the job), no file in the job's TMPDIR (tmp, if not
// empty), and that the given pids are gone. A SIGKILLed process can take a
// moment to leave the process table after gorun reaped its rank, so the
// check retries for up to 5 s before it fails.
func requireNoLeftovers(t *testing.T, id string, pids []int, shmBefore map[string]bool, tmp string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var left []string
	for {
		left = holders(id)
		for _, pid := range pids {
			if err := syscall.Kill(pid, 0); err == nil || err == syscall.EPERM {
				if st, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat"); err == nil && !strings.Contains(string(st), ") Z ") {
					left = append(left, "pid "+strconv.Itoa(pid)+" still running: "+string(st))
				}
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	require.Empty(t, left, "job %s left processes or segment holders behind", id)
	for name := range shmEntries() {
		require.True(t, shmBefore[name], "new /dev/shm entry %q after job %s", name, id)
	}
	if tmp != "" {
		ents, err := os.ReadDir(tmp)
		require.NoError(t, err)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		require.Empty(t, names, "files left in the job's TMPDIR %s", tmp)
	}
}
