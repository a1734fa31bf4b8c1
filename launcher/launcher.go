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
	"runtime"
	"strconv"
	"strings"
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
			out.printf("%d ranks on %d CPUs: oversubscribed, waiting ranks will yield the CPU to each other (--oversubscribe hides this notice)", cfg.NP, runtime.NumCPU())
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

// argError is a bad-configuration error: it wraps mpierr.ErrArg for
// errors.Is, but its text is the message alone, as gorun prints it.
type argError struct{ msg string }

func (e *argError) Error() string { return e.msg }
func (e *argError) Unwrap() error { return mpierr.ErrArg }

func argErrorf(format string, args ...any) error {
	return &argError{msg: fmt.Sprintf(format, args...)}
}
