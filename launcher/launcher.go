// Package launcher is gorun's job control: it starts the ranks of a job on
// this host, serves their wire-up store (package launcher/store), forwards
// their output, input and signals, and stops the whole job when one rank
// fails. Linux only.
//
// The entry point is Run, which cmd/gorun calls with the parsed command line:
//
//	code, err := launcher.Run(ctx, launcher.Config{NP: 4, Program: "./examples/ring", ...})
//
// Every rank gets its place in the job through environment variables (see
// Run); the mpi package reads them in Init.
package launcher

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/launcher/store"
)

// The environment variables of the launch contract.
const (
	EnvRank           = "GOMPI_RANK"           // this rank, 0..size-1
	EnvSize           = "GOMPI_SIZE"           // number of ranks in the job
	EnvLocalRank      = "GOMPI_LOCAL_RANK"     // rank among the job's ranks on this host
	EnvLocalSize      = "GOMPI_LOCAL_SIZE"     // number of the job's ranks on this host
	EnvNode           = "GOMPI_NODE"           // the host's name in gorun's host list (jobs on several hosts)
	EnvJobID          = "GOMPI_JOB_ID"         // random hex id, the same for every rank of a job
	EnvStore          = "GOMPI_STORE"          // host:port of the wire-up store
	EnvSecret         = "GOMPI_SECRET"         // hex of the 32-byte job secret
	EnvOversubscribed = "GOMPI_OVERSUBSCRIBED" // "1" when there are more ranks than CPUs
	EnvFlagParams     = "GOMPI_FLAG_PARAMS"    // "name=value" entries joined with "\n"
	EnvStats          = "GOMPI_STATS"          // "1" with --stats
	EnvVerbose        = "GOMPI_VERBOSE"        // "1" with --verbose
)

// jobVars are the variables that identify a job; inherited values (from a
// gorun that started this one) are removed before the new ones are set.
var jobVars = []string{EnvRank, EnvSize, EnvLocalRank, EnvLocalSize, EnvJobID, EnvStore,
	EnvSecret, EnvOversubscribed, EnvFlagParams}

// Exit codes that are not a rank's own.
const (
	ExitFailure = 1   // a rank exited 0 without calling Finalize, or Run was cancelled
	ExitTimeout = 124 // Config.Timeout expired (as coreutils' timeout)
)

// DefaultGrace is the default of Config.Grace.
const DefaultGrace = 2 * time.Second

// Config describes one job.
type Config struct {
	NP      int      // number of ranks, at least 1
	Program string   // executable (path or in PATH), Go package directory, .go file or package path
	Args    []string // arguments after PROGRAM

	TagOutput     bool // prefix every forwarded line with "[rank] "
	Verbose       bool // print launch progress on Stderr; set GOMPI_VERBOSE=1
	Stats         bool // set GOMPI_STATS=1
	Oversubscribe bool // the user accepts more ranks than CPUs: no notice

	// Timeout, if positive, bounds the job from the start of its ranks (a
	// build of the program does not count): when it expires every rank is
	// stopped and Run returns ExitTimeout and an error saying so.
	Timeout time.Duration

	// PGO is the profile a Go program that gorun builds is built with
	// (go build -pgo): "" for gompi's own profile (package pgo), except
	// for a program folder with a default.pgo of its own, which go build
	// then reads as usual; "auto" for go build's default (the main
	// package's default.pgo, if any); "off"; or a profile file's path.
	// An executable is run as it is.
	PGO string

	Env    []string    // extra environment entries "VAR=val" for every rank
	Params [][2]string // parameters (name, value) in order, passed in GOMPI_FLAG_PARAMS

	// Stdin is copied to rank 0 (the other ranks read /dev/null); nil means
	// no input. An *os.File that is not a terminal is handed to rank 0
	// directly when rank 0 runs on this host; any other reader, and any
	// input for a job on several hosts (stdin.go), is copied by a
	// goroutine, which Run does not wait for (a Read cannot be
	// interrupted).
	Stdin io.Reader
	// Stdout and Stderr receive the ranks' output, line by line; Stderr also
	// gets gorun's own messages. nil discards.
	Stdout, Stderr io.Writer

	// Grace is the time between the steps that stop a failed job: failure
	// notice, then SIGTERM, then SIGKILL. Zero means DefaultGrace.
	Grace time.Duration

	// EnableRecovery keeps the job going when a rank dies (gorun
	// --enable-recovery, after Open MPI's ULFM): see recovery.go.
	EnableRecovery bool

	// Signals, if not nil, delivers signals to forward to every rank (to its
	// process group). One that arrives while the program is being built
	// cancels the build instead. cmd/gorun sends SIGINT and SIGTERM here.
	Signals <-chan os.Signal

	// Launch is how the ranks start: LaunchLocal (or "") as children of
	// this process, LaunchSlurm as the tasks of one srun inside the
	// current Slurm allocation (see RunSlurmRank).
	Launch string
	// Self is the gorun executable srun or the launch agent starts on each
	// node (RunSlurmRank, RunDaemon); empty means this process's
	// executable, at the same path on every host.
	Self string

	// Hosts, when not empty, spreads the ranks over these hosts by slot
	// (mapRanks) and starts one gorun daemon per host through Agent, a
	// command that runs its arguments on the host named by its first
	// argument ("ssh", the default; "ip netns exec" for network
	// namespaces). The store then listens on every address of this host.
	// PROGRAM must exist at the same path on every host. Stdin goes to
	// rank 0 as on one host, through a connection from its host's daemon
	// back to this process (stdin.go).
	Hosts []Host
	Agent string
}

// Launch modes.
const (
	LaunchLocal = "local"
	LaunchSlurm = "slurm"
)

// JobError is the error Run returns when the job ran but did not succeed.
// Run has already printed Reason on Stderr when it returns one.
type JobError struct {
	Rank   int    // the first rank that failed or aborted; -1 for a timeout or cancellation
	PID    int    // its process id, or 0
	Reason string // how it failed: "exited with status 3", "killed by signal 9 (killed)", ...
	Code   int    // gorun's exit code
}

// Error returns "rank R (pid P) REASON", or the reason alone when no rank is
// to blame; gorun prints it after "gorun: ".
func (e *JobError) Error() string {
	if e.Rank < 0 {
		return e.Reason
	}
	return fmt.Sprintf("rank %d (pid %d) %s", e.Rank, e.PID, e.Reason)
}

// Run runs a job of cfg.NP ranks of cfg.Program on this host and returns
// gorun's exit code once every rank has ended:
//   - 0 and a nil error when every rank exited 0 (having called Finalize, if
//     it connected to the store);
//   - the first failure's code and a *JobError when a rank failed: exit
//     status s gives s, death by signal n gives 128+n, exiting 0 without
//     Finalize gives ExitFailure; when a rank calls Abort(code), code (or
//     ExitFailure for a code outside 0..255);
//     ExitTimeout when cfg.Timeout expired; ExitFailure when ctx ended;
//   - ExitFailure and another error when the job could not start (bad
//     Config, program not found or not buildable): nothing was left running.
//
// Every rank runs in a process group of its own and gets the environment of
// gorun without variables of an enclosing job, then cfg.Env, then
// GOMPI_RANK, GOMPI_SIZE, GOMPI_LOCAL_RANK, GOMPI_LOCAL_SIZE (rank and size:
// one host), GOMPI_JOB_ID, GOMPI_STORE, GOMPI_SECRET (never on a command
// line), GOMPI_FLAG_PARAMS (when cfg.Params is not empty),
// GOMPI_OVERSUBSCRIBED=1 (when NP > runtime.NumCPU()), GOMPI_STATS=1 and
// GOMPI_VERBOSE=1 (with the options of the same name), and GOMAXPROCS (this
// process's GOMAXPROCS divided among the ranks, at least 1) unless the
// environment or cfg.Env sets it.
//
// When a rank exits non-zero, is killed by a signal, or exits after
// connecting to the store without calling Finalize, Run prints one line
// naming the rank, pid and cause, sends the other ranks a failure notice
// through the store, waits cfg.Grace for them to exit, sends SIGTERM, and
// SIGKILL after another cfg.Grace. An Abort, a timeout or the end of ctx
// skip the notice and start at SIGTERM. Each rank's process group is
// killed when the rank exits, every rank is reaped, and a built program's
// temporary directory is removed before Run returns.
func Run(ctx context.Context, cfg Config) (exitCode int, err error) {
	if cfg.Grace <= 0 {
		cfg.Grace = DefaultGrace
	}
	out := newOutput(cfg.Stdout, cfg.Stderr, cfg.TagOutput)
	if cfg.NP < 1 {
		return ExitFailure, argErrorf("need at least one rank, got -np %d", cfg.NP)
	}
	if cfg.EnableRecovery {
		cfg.Params = append(cfg.Params[:len(cfg.Params):len(cfg.Params)], [2]string{"enable_recovery", "true"})
	}
	flagParams, err := encodeParams(cfg.Params)
	if err != nil {
		return ExitFailure, err
	}
	for _, kv := range cfg.Env {
		if k, _, ok := strings.Cut(kv, "="); !ok || k == "" {
			return ExitFailure, argErrorf("environment entry %q is not VAR=value", kv)
		}
	}

	prog, err := resolveInterruptibly(ctx, cfg)
	if err != nil {
		return ExitFailure, err
	}
	defer prog.cleanup()

	var secret [32]byte
	var jobID [8]byte
	rand.Read(secret[:])
	rand.Read(jobID[:])
	var hostRanks [][]int
	listen := "127.0.0.1:0"
	if len(cfg.Hosts) > 0 {
		if cfg.Launch == LaunchSlurm {
			return ExitFailure, argErrorf("--host/--hostfile and the Slurm launcher exclude each other")
		}
		if hostRanks, err = mapRanks(cfg.Hosts, cfg.NP, cfg.Oversubscribe); err != nil {
			return ExitFailure, err
		}
		listen = ":0"
	}
	if cfg.Launch == LaunchSlurm {
		listen = ":0" // srun may place ranks on other nodes of the allocation
	}
	srv, err := store.NewServerOn(secret[:], cfg.NP, listen)
	if err != nil {
		return ExitFailure, err
	}
	storeAddr := srv.Addr()
	if listen == ":0" {
		addrs, err := store.ReachableAddrs(srv.Addr())
		if err != nil {
			srv.Close()
			return ExitFailure, err
		}
		storeAddr = addrs[0] // non-loopback first
	}
	defer srv.Close()
	srv.SetLogger(log.New(out, "gorun: store: ", 0))
	srv.SetRecovery(cfg.EnableRecovery)

	env := baseEnv(os.Environ(), cfg.Env)
	own := len(env) - len(cfg.Env) // env[own:] is what gorun adds: a host daemon's ranks get it
	env = append(env,
		EnvSize+"="+strconv.Itoa(cfg.NP),
		EnvLocalSize+"="+strconv.Itoa(cfg.NP),
		EnvJobID+"="+hex.EncodeToString(jobID[:]),
		EnvStore+"="+storeAddr,
		EnvSecret+"="+hex.EncodeToString(secret[:]),
	)
	if flagParams != "" {
		env = append(env, EnvFlagParams+"="+flagParams)
	}
	perHost := cfg.NP // the most ranks on one host
	if hostRanks != nil {
		perHost = 0
		for _, rs := range hostRanks {
			perHost = max(perHost, len(rs))
		}
	}
	if !hasVar(env, "GOMAXPROCS") {
		// Each rank gets its share of the processors, as an MPI launcher
		// binds ranks to cores: a rank's extra Go threads (a goroutine
		// woken by a transport, the background poller, a system call's
		// hand-off) otherwise take the core its peer is using. Measured
		// on 2 CPUs with -np 2 (GOMAXPROCS=1 against the default 2,
		// docs/PERFORMANCE.md): sm bibw 64 KiB 13-18 -> 25 GB/s, sm 8 B
		// rate 2.0 -> 2.9 M/s, tcp 8 B latency 3.6 -> 3.2 us.
		env = append(env, "GOMAXPROCS="+strconv.Itoa(max(1, runtime.GOMAXPROCS(0)/perHost)))
	}
	if perHost > runtime.NumCPU() {
		env = append(env, EnvOversubscribed+"=1")
		if !cfg.Oversubscribe {
			out.printf("%d ranks on %d CPUs: oversubscribed, ranks will wait without spinning (--oversubscribe hides this notice)", cfg.NP, runtime.NumCPU())
		}
	}
	if cfg.Stats {
		env = append(env, EnvStats+"=1")
	}
	if cfg.Verbose {
		env = append(env, EnvVerbose+"=1")
		out.printf("job %x: %d ranks of %s, store at %s", jobID, cfg.NP, prog.path, srv.Addr())
	}

	j := &job{cfg: cfg, out: out, srv: srv, exits: make(chan int, cfg.NP), lost: -1}
	switch {
	case len(cfg.Hosts) > 0:
		stores, err := store.ReachableAddrs(srv.Addr())
		if err != nil {
			return ExitFailure, err
		}
		if cfg.Verbose {
			out.printf("ranks on hosts: %s; store reachable at %s", describeMap(cfg.Hosts, hostRanks), strings.Join(stores, " "))
		}
		denv := make([]string, 0, len(env)-own)
		for _, kv := range env[own:] {
			if k, _, _ := strings.Cut(kv, "="); k != EnvStore && k != EnvLocalSize {
				denv = append(denv, kv)
			}
		}
		var in *stdinRelay
		if cfg.Stdin != nil {
			if in, err = newStdinRelay(cfg.Stdin); err != nil {
				return ExitFailure, err
			}
			defer in.Close()
		}
		if err := j.startDaemons(prog.path, denv, hostRanks, stores, in); err != nil {
			j.abandon()
			return ExitFailure, fmt.Errorf("start the host daemons: %w", err)
		}
	case cfg.Launch == "" || cfg.Launch == LaunchLocal:
		for r := range cfg.NP {
			if err := j.start(r, prog.path, env); err != nil {
				j.abandon()
				return ExitFailure, fmt.Errorf("start rank %d: %w", r, err)
			}
		}
	case cfg.Launch == LaunchSlurm:
		if err := j.startSrun(prog.path, env); err != nil {
			j.abandon()
			return ExitFailure, fmt.Errorf("start srun: %w", err)
		}
	default:
		return ExitFailure, argErrorf("unknown launch mode %q", cfg.Launch)
	}
	return j.loop(ctx)
}

// resolveInterruptibly resolves (and maybe builds) the program; a signal
// that arrives meanwhile cancels the build.
func resolveInterruptibly(ctx context.Context, cfg Config) (*program, error) {
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	defer close(done)
	if cfg.Signals != nil {
		go func() {
			select {
			case <-cfg.Signals:
				cancel()
			case <-done:
			}
		}()
	}
	return resolveProgram(bctx, cfg.Program, cfg.PGO)
}

// hasVar reports whether env (VAR=value entries) sets name.
func hasVar(env []string, name string) bool {
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); k == name {
			return true
		}
	}
	return false
}

// encodeParams checks the parameters and joins them for GOMPI_FLAG_PARAMS.
func encodeParams(params [][2]string) (string, error) {
	var b strings.Builder
	for i, p := range params {
		name, value := p[0], p[1]
		if name == "" || strings.ContainsAny(name, "= \t\n") {
			return "", argErrorf("bad parameter name %q", name)
		}
		if strings.Contains(value, "\n") {
			return "", argErrorf("value of parameter %s contains a newline", name)
		}
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(name + "=" + value)
	}
	return b.String(), nil
}

// baseEnv returns environ without the variables of an enclosing job and
// without those extra sets, followed by extra.
func baseEnv(environ, extra []string) []string {
	drop := make(map[string]bool)
	for _, v := range jobVars {
		drop[v] = true
	}
	for _, kv := range extra {
		k, _, _ := strings.Cut(kv, "=")
		drop[k] = true
	}
	env := make([]string, 0, len(environ)+len(extra)+12)
	for _, kv := range environ {
		if k, _, _ := strings.Cut(kv, "="); !drop[k] {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// rank is one process gorun started: a rank, or a launcher of several
// ranks (srun). Only the job loop touches it.
type rank struct {
	cmd     *exec.Cmd
	pid     int
	covers  []int    // the job ranks it runs
	name    string   // "srun" for a launcher of ranks, else ""
	ctl     *os.File // a host daemon's control pipe (its standard input), or nil
	exited  bool
	outputs chan struct{} // receives once per forwarder that finished
}

// job is the state of a running job; its loop owns it.
type job struct {
	cfg   Config
	out   *output
	srv   *store.Server
	ranks []*rank
	exits chan int // rank numbers whose process has exited (not yet reaped)
	alive int

	lost    int              // the first rank whose store connection ended before Finalize, or -1
	byLost  bool             // failure was set from a Lost event: its code may still be refined
	pipes   []*os.File       // read ends of the ranks' output pipes
	failure *JobError        // the first failure, abort, timeout or cancellation
	dead    []*JobError      // ranks that died while the job went on (EnableRecovery)
	stage   stopStage        // how far stopping has gone
	stageC  <-chan time.Time // fires when the next stop stage is due
}

// stopStage is how far stopping a failed job has gone.
type stopStage int

const (
	running  stopStage = iota
	notified           // failure notice sent; SIGTERM after Grace
	termed             // SIGTERM sent; SIGKILL after Grace
	killed             // SIGKILL sent
)

// start starts rank r and the goroutines that forward its output and report
// its exit.
func (j *job) start(r int, path string, env []string) error {
	cmd := exec.Command(path, j.cfg.Args...)
	cmd.Env = append(env[:len(env):len(env)],
		EnvRank+"="+strconv.Itoa(r),
		EnvLocalRank+"="+strconv.Itoa(r),
	)
	return j.startProc(cmd, []int{r}, "", r == 0)
}

// startProc starts cmd, which runs the job ranks covers (named name when
// it is a launcher of ranks), and the goroutines that forward its output
// and report its exit. withStdin gives it the job's standard input.
func (j *job) startProc(cmd *exec.Cmd, covers []int, name string, withStdin bool) (err error) {
	cmd.SysProcAttr = rankProcAttr()
	r := covers[0]
	tagRank := r
	if name != "" {
		tagRank = -1 // lines carry their rank as "N: " (srun --label)
	}

	// parent: our ends, kept on success; child: the rank's ends, closed in
	// gorun once the rank has its copies.
	var parent, child []*os.File
	defer func() {
		for _, f := range child {
			f.Close()
		}
		if err != nil {
			for _, f := range parent {
				f.Close()
			}
		}
	}()
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	parent, child = append(parent, outR), append(child, outW)
	errR, errW, err := os.Pipe()
	if err != nil {
		return err
	}
	parent, child = append(parent, errR), append(child, errW)
	cmd.Stdout, cmd.Stderr = outW, errW

	var stdinW *os.File
	if withStdin && j.cfg.Stdin != nil {
		if f, ok := j.cfg.Stdin.(*os.File); ok && !isCharDevice(f) {
			cmd.Stdin = f // a pipe or a file: the rank reads it directly
		} else {
			// A terminal must not be read by a rank (it is not in the
			// terminal's foreground process group): gorun copies.
			inR, inW, err := os.Pipe()
			if err != nil {
				return err
			}
			parent, child = append(parent, inW), append(child, inR)
			cmd.Stdin, stdinW = inR, inW
		}
	}
	if err := cmd.Start(); err != nil {
		return err
	}

	rk := &rank{cmd: cmd, pid: cmd.Process.Pid, covers: covers, name: name, outputs: make(chan struct{}, 2)}
	i := len(j.ranks)
	j.ranks = append(j.ranks, rk)
	j.alive++
	j.pipes = append(j.pipes, outR, errR)
	if stdinW != nil {
		go func() {
			io.Copy(stdinW, j.cfg.Stdin) // ends at EOF, or EPIPE once rank 0 is gone
			stdinW.Close()
		}()
	}
	go func() { j.out.forward(outR, false, tagRank); rk.outputs <- struct{}{} }()
	go func() { j.out.forward(errR, true, tagRank); rk.outputs <- struct{}{} }()
	go func() {
		if err := waitExited(rk.pid); err != nil {
			// Not expected for our own child; the loop's Wait reaps it anyway.
			j.out.printf("%s (pid %d): waitid: %v", rk.what(), rk.pid, err)
		}
		j.exits <- i
	}()
	if j.cfg.Verbose {
		j.out.printf("%s: pid %d", rk.what(), rk.pid)
	}
	return nil
}

// what names the process in messages: "rank 3", or "srun (ranks 0-3)".
func (rk *rank) what() string {
	if rk.name == "" {
		return "rank " + strconv.Itoa(rk.covers[0])
	}
	return fmt.Sprintf("%s (ranks %d-%d)", rk.name, rk.covers[0], rk.covers[len(rk.covers)-1])
}

// pidOf returns the pid of the process that runs job rank r.
func (j *job) pidOf(r int) int {
	if rk := j.procOf(r); rk != nil {
		return rk.pid
	}
	return 0
}

// procOf returns the process that runs job rank r, or nil.
func (j *job) procOf(r int) *rank {
	for _, rk := range j.ranks {
		for _, c := range rk.covers {
			if c == r {
				return rk
			}
		}
	}
	return nil
}

func isCharDevice(f *os.File) bool {
	fi, err := f.Stat()
	return err != nil || fi.Mode()&os.ModeCharDevice != 0
}

// loop runs the job until every rank has exited and been reaped.
func (j *job) loop(ctx context.Context) (int, error) {
	var timeout <-chan time.Time
	if j.cfg.Timeout > 0 {
		t := time.NewTimer(j.cfg.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	events := j.srv.Events()
	done := ctx.Done()
	for j.alive > 0 {
		select {
		case i := <-j.exits:
			j.reap(i)
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			j.event(ev)
		case sig := <-j.cfg.Signals:
			j.forward(sig)
		case <-timeout:
			timeout = nil
			j.stopAll(&JobError{Rank: -1, Reason: fmt.Sprintf("timed out after %v", j.cfg.Timeout), Code: ExitTimeout})
		case <-done:
			done = nil
			j.stopAll(&JobError{Rank: -1, Reason: "cancelled: " + context.Cause(ctx).Error(), Code: ExitFailure})
		case <-j.stageC:
			j.advance()
		}
	}
	j.drainOutput()
	if j.failure == nil && len(j.dead) > 0 {
		j.failure = j.deadError()
	}
	if j.failure != nil {
		return j.failure.Code, j.failure
	}
	return 0, nil
}

// reap collects process i, which has exited, and judges how it ended.
func (j *job) reap(i int) {
	rk := j.ranks[i]
	r := rk.covers[0]
	signalGroup(rk.pid, syscall.SIGKILL) // whatever the rank left in its group
	if rk.ctl != nil {
		rk.ctl.Close()
	}
	rk.cmd.Wait() // reaps; the status is in ProcessState
	rk.exited = true
	j.alive--

	// An Abort is acknowledged before Client.Abort returns, so a rank that
	// exits after aborting is always seen here as aborting, not failing.
	if ev, ok := j.srv.AbortRequest(); ok && j.failure == nil {
		j.abort(ev)
	}
	ws, _ := rk.cmd.ProcessState.Sys().(syscall.WaitStatus)
	var reason string
	var code int
	switch {
	case ws.Signaled():
		sig := ws.Signal()
		reason, code = fmt.Sprintf("killed by signal %d (%v)", int(sig), sig), 128+int(sig)
	case ws.ExitStatus() != 0:
		reason, code = fmt.Sprintf("exited with status %d", ws.ExitStatus()), ws.ExitStatus()
	}
	if rk.name != "" {
		// A launcher of ranks: blame the first rank whose store
		// connection ended before Finalize, else the first that did not
		// finalize, in the launcher's words.
		if reason != "" {
			reason = rk.name + " " + reason
		}
		r = j.lost
		for _, c := range rk.covers {
			if st := j.srv.State(c); !st.Finalized {
				if r < 0 {
					r = c
				}
				if reason == "" && st.Connected {
					r, reason, code = c, "exited without calling Finalize", ExitFailure
				}
			}
		}
		if reason != "" && r < 0 {
			r = rk.covers[0]
		}
		if j.byLost && code != 0 && j.failure != nil && j.procOf(j.failure.Rank) == rk {
			// The launcher's status says more than "lost".
			j.failure.Code, j.byLost = code, false
		}
		if reason == "" {
			if j.cfg.Verbose {
				j.out.printf("%s (pid %d) exited with status 0", rk.what(), rk.pid)
			}
			return
		}
		for _, c := range rk.covers {
			j.srv.NotifyFailure(c, reason)
		}
	} else if st := j.srv.State(r); reason == "" && st.Connected && !st.Finalized {
		reason, code = "exited without calling Finalize", ExitFailure
	}
	if reason == "" {
		if j.cfg.Verbose {
			j.out.printf("rank %d (pid %d) exited with status 0", r, rk.pid)
		}
		return
	}
	if rk.name == "" {
		j.srv.NotifyFailure(r, reason)
	}
	if j.cfg.EnableRecovery && j.failure == nil {
		j.died(&JobError{Rank: r, PID: rk.pid, Reason: reason, Code: code})
		return
	}
	if j.failure != nil {
		if j.cfg.Verbose {
			j.out.printf("rank %d (pid %d) %s", r, rk.pid, reason)
		}
		return
	}
	j.failure = &JobError{Rank: r, PID: rk.pid, Reason: reason, Code: code}
	j.out.printf("%v", j.failure)
	if j.alive > 0 {
		j.stage, j.stageC = notified, time.After(j.cfg.Grace)
	}
}

// event handles a store event.
func (j *job) event(ev store.Event) {
	switch ev.Kind {
	case store.Aborted:
		if j.failure == nil {
			j.abort(ev)
		}
	case store.Lost:
		if j.lost < 0 {
			j.lost = ev.Rank
		}
		if j.cfg.Verbose {
			j.out.printf("rank %d lost its store connection before Finalize", ev.Rank)
		}
		// gorun sees the end of its own children's ranks when it reaps
		// them; the end of a rank that srun or a host daemon runs it
		// learns here first.
		rk := j.procOf(ev.Rank)
		if rk == nil || rk.name == "" || j.failure != nil {
			return
		}
		reason := "ended before calling Finalize (" + rk.name + " says how)"
		j.srv.NotifyFailure(ev.Rank, reason)
		if j.cfg.EnableRecovery {
			j.died(&JobError{Rank: ev.Rank, PID: rk.pid, Reason: reason, Code: ExitFailure})
			return
		}
		j.failure = &JobError{Rank: ev.Rank, PID: rk.pid, Reason: reason, Code: ExitFailure}
		j.byLost = true
		j.out.printf("%v", j.failure)
		j.stage, j.stageC = notified, time.After(j.cfg.Grace)
	default:
		if j.cfg.Verbose {
			j.out.printf("rank %d %v", ev.Rank, ev.Kind)
		}
	}
}

// abort ends the job at a rank's request.
func (j *job) abort(ev store.Event) {
	reason := fmt.Sprintf("called Abort(%d)", ev.Code)
	if ev.Msg != "" {
		reason += ": " + ev.Msg
	}
	code := ev.Code
	if code < 0 || code > 255 { // an exit status cannot carry it
		code = ExitFailure
	}
	j.failure = &JobError{Rank: ev.Rank, PID: j.pidOf(ev.Rank), Reason: reason, Code: code}
	j.out.printf("%v", j.failure)
	j.terminate()
}

// stopAll stops every rank for a reason of gorun's own (timeout,
// cancellation).
func (j *job) stopAll(e *JobError) {
	if j.failure == nil {
		j.failure = e
	}
	j.out.printf("%s: stopping %d rank(s)", e.Reason, j.alive)
	j.terminate()
}

// terminate sends SIGTERM to every live rank, unless it was sent already.
func (j *job) terminate() {
	if j.stage >= termed {
		return
	}
	j.signalAll(syscall.SIGTERM)
	j.stage, j.stageC = termed, time.After(j.cfg.Grace)
}

// advance takes the next stop step when its grace period is over.
func (j *job) advance() {
	switch j.stage {
	case notified:
		j.terminate()
	case termed:
		if j.cfg.Verbose {
			j.out.printf("%d rank(s) still running after SIGTERM: sending SIGKILL", j.alive)
		}
		j.signalAll(syscall.SIGKILL)
		j.stage, j.stageC = killed, nil
	}
}

// forward passes a signal gorun received to every live rank.
func (j *job) forward(sig os.Signal) {
	s, ok := sig.(syscall.Signal)
	if !ok {
		return
	}
	if j.cfg.Verbose {
		j.out.printf("forwarding %v to %d rank(s)", s, j.alive)
	}
	j.signalAll(s)
}

func (j *job) signalAll(sig syscall.Signal) {
	for _, rk := range j.ranks {
		if rk.exited {
			continue
		}
		if rk.ctl != nil {
			// A host daemon passes the signal on to its ranks; only
			// SIGKILL ends the daemon (and, through ssh, the remote one
			// sees its input end and stops its ranks).
			fmt.Fprintf(rk.ctl, "signal %d\n", int(sig))
			if sig != syscall.SIGKILL {
				continue
			}
			rk.ctl.Close()
		}
		signalGroup(rk.pid, sig)
	}
}

// abandon kills and reaps the ranks started so far, after a later rank
// failed to start.
func (j *job) abandon() {
	j.signalAll(syscall.SIGKILL)
	for j.alive > 0 {
		i := <-j.exits
		j.ranks[i].cmd.Wait()
		j.ranks[i].exited = true
		j.alive--
	}
	j.drainOutput()
}

// drainOutput waits for the output forwarders to flush. Every rank's group is
// dead, so the pipes are at EOF unless a process left its group and still
// holds one; after Grace the pipes are closed under it.
func (j *job) drainOutput() {
	done := make(chan struct{})
	go func() {
		for _, rk := range j.ranks {
			<-rk.outputs
			<-rk.outputs
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(j.cfg.Grace):
		for _, f := range j.pipes {
			f.Close()
		}
		<-done
	}
	for _, f := range j.pipes {
		f.Close()
	}
}

// argError is a bad-configuration error: it wraps mpierr.ErrArg for
// errors.Is, but its text is the message alone, as gorun prints it.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }
func (e *argError) Unwrap() error { return mpierr.ErrArg }

func argErrorf(format string, args ...any) error {
	return &argError{msg: fmt.Sprintf(format, args...)}
}
