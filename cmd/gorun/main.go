// Command gorun starts a gompi job on this host, or with --host/--hostfile
// on several (one gorun daemon per host, started by the launch agent):
//
//	gorun -np N [flags] PROGRAM [ARGS...]
//
// PROGRAM is an executable (a path, or a name looked up in PATH), a Go main
// package directory, a .go file, or a Go package path; gorun builds Go
// sources first. gorun serves the job's wire-up store, forwards the ranks'
// output line by line, its standard input to rank 0 (on whichever host it
// runs) and SIGINT/SIGTERM to every rank, and stops the job when a rank
// fails.
//
// Exit status: 0 when every rank exited 0; otherwise the status of the first
// rank that failed (128+n for death by signal n, 1 for exiting without
// Finalize), the code given to Abort, 124 when --timeout expired, and 2 for
// a bad command line. See package launcher for the details.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/gompi-org/gompi/launcher"
)

// exitUsage is the exit status for a bad command line.
const exitUsage = 2

func main() {
	if len(os.Args) > 1 && os.Args[1] == launcher.DaemonFlag {
		// The daemon of one host of a job on several hosts.
		os.Exit(launcher.RunDaemon(os.Stdin, os.Stdout, os.Stderr))
	}
	if len(os.Args) > 1 && os.Args[1] == launcher.SlurmRankFlag {
		// One rank of a job that gorun started with srun.
		err := launcher.RunSlurmRank(os.Args[2:])
		fmt.Fprintf(os.Stderr, "gorun: %v\n", err)
		os.Exit(launcher.ExitFailure)
	}
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

// run is gorun without the process around it; it returns the exit status.
func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, help, err := parseArgs(args, os.LookupEnv)
	if help {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "gorun: %v\n%s", err, usage)
		return exitUsage
	}
	cfg.Stdin, cfg.Stdout, cfg.Stderr = stdin, stdout, stderr

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	cfg.Signals = sigs

	code, err := launcher.Run(context.Background(), cfg)
	var je *launcher.JobError
	if err != nil && !errors.As(err, &je) { // a JobError was printed as it happened
		fmt.Fprintf(stderr, "gorun: %v\n", err)
	}
	return code
}

const usage = `usage: gorun -np N [flags] PROGRAM [ARGS...]

PROGRAM is an executable, a Go main package directory, a .go file or a Go
package path (built first). Flags after PROGRAM belong to the program.

  -n, --np N                  number of ranks (required)
      --tag-output            prefix every output line with "[rank] "
      --timeout DURATION      stop the job after DURATION (e.g. 30s); exit status 124
  -x VAR[=value]              set VAR for every rank (VAR alone: gorun's value); repeatable
      --param NAME=VALUE      set a gompi parameter; repeatable
      --btl LIST              transports to use, e.g. self,sm,tcp or ^tcp (param btl)
      --eager-limit BYTES     btl_{self,sm,tcp,verbs}_eager_limit
      --max-send-size BYTES   btl_{self,sm,tcp,verbs}_max_send_size
      --protocol NAME         pml_force_protocol: eager, rdma_put, rdma_get,
                              send_pipeline or rdma_pipeline
      --send-pipeline-depth N pml_send_pipeline_depth
      --stats                 ranks report statistics (GOMPI_STATS=1)
      --verbose               print launch progress (GOMPI_VERBOSE=1)
      --oversubscribe         allow more ranks than CPUs without a notice
      --host LIST             run on these hosts: a,b (one slot each), a:4 (four slots)
      --hostfile FILE         hosts from a file: "name [slots=N]" per line (Open MPI's format)
      --launch-agent CMD      runs gorun's daemon on a host: CMD HOST gorun --daemon
                              (default: ssh; e.g. "ip netns exec" for network namespaces)
      --launcher MODE         how ranks start: local, slurm (one srun step), or auto
                              (default: slurm inside a Slurm allocation, else local)
      --grace DURATION        time between failure notice, SIGTERM and SIGKILL (default 2s)
      --enable-recovery       a rank's death does not end the job: the others get
                              ErrProcFailed for operations naming it and go on; gorun
                              exits non-zero at the end, naming the dead
      --pgo PROFILE           profile a Go PROGRAM is built with (go build -pgo): a file,
                              auto (its own default.pgo) or off; default: gompi's
                              profile of its message paths, unless the program's folder
                              has a default.pgo
  -h, --help                  show this help

Each rank gets GOMAXPROCS = gorun's GOMAXPROCS / N (at least 1), its share
of the processors, unless GOMAXPROCS is set in the environment or with -x.
`

// transports are the transports whose limits the named size flags set.
var transports = []string{"self", "sm", "tcp", "verbs"}

// paramList collects parameters from --param and the named flags in
// command-line order.
type paramList struct{ params [][2]string }

// paramFlag is a pflag.Value that appends parameters to a paramList.
type paramFlag struct {
	list  *paramList
	names []string // the parameters this flag sets; nil for --param NAME=VALUE
	typ   string
	last  string
}

func (f *paramFlag) String() string { return f.last }
func (f *paramFlag) Type() string   { return f.typ }
func (f *paramFlag) Set(v string) error {
	f.last = v
	if f.names == nil {
		name, value, ok := strings.Cut(v, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return fmt.Errorf("%q is not NAME=VALUE", v)
		}
		f.list.params = append(f.list.params, [2]string{name, value})
		return nil
	}
	if v == "" {
		return errors.New("empty value")
	}
	for _, n := range f.names {
		f.list.params = append(f.list.params, [2]string{n, v})
	}
	return nil
}

// newFlagSet defines gorun's flags, writing parameters into params.
func newFlagSet(params *paramList) *pflag.FlagSet {
	fs := pflag.NewFlagSet("gorun", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.SetInterspersed(false) // flags after PROGRAM belong to it
	fs.SortFlags = false
	fs.IntP("np", "n", 0, "number of ranks")
	fs.Bool("tag-output", false, "prefix output lines with [rank]")
	fs.Duration("timeout", 0, "stop the job after this long")
	fs.StringArrayP("x", "x", nil, "VAR[=value] for every rank")
	fs.Var(&paramFlag{list: params, typ: "NAME=VALUE"}, "param", "set a parameter")
	fs.Var(&paramFlag{list: params, names: []string{"btl"}, typ: "list"}, "btl", "transports")
	named := func(flag, pattern, typ string) {
		var names []string
		for _, t := range transports {
			names = append(names, fmt.Sprintf(pattern, t))
		}
		fs.Var(&paramFlag{list: params, names: names, typ: typ}, flag, pattern)
	}
	named("eager-limit", "btl_%s_eager_limit", "bytes")
	named("max-send-size", "btl_%s_max_send_size", "bytes")
	fs.Var(&paramFlag{list: params, names: []string{"pml_force_protocol"}, typ: "name"}, "protocol", "force a protocol")
	fs.Var(&paramFlag{list: params, names: []string{"pml_send_pipeline_depth"}, typ: "int"}, "send-pipeline-depth", "FRAGs in flight")
	fs.Bool("stats", false, "statistics")
	fs.Bool("verbose", false, "launch progress")
	fs.Bool("oversubscribe", false, "allow more ranks than CPUs")
	fs.Duration("grace", launcher.DefaultGrace, "stop step interval")
	fs.Bool("enable-recovery", false, "survivors go on when a rank dies")
	fs.String("launcher", "auto", "local, slurm or auto")
	fs.String("host", "", "hosts")
	fs.String("hostfile", "", "hostfile")
	fs.String("launch-agent", launcher.DefaultAgent, "launch agent")
	fs.String("pgo", "", "profile for go build -pgo")
	fs.BoolP("help", "h", false, "help")
	return fs
}

// parseArgs turns gorun's arguments into a launcher.Config. help reports
// -h/--help. lookupEnv resolves -x VAR.
func parseArgs(args []string, lookupEnv func(string) (string, bool)) (cfg launcher.Config, help bool, err error) {
	var params paramList
	fs := newFlagSet(&params)
	if err := fs.Parse(normalizeNP(fs, args)); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return cfg, true, nil
		}
		return cfg, false, err
	}
	if help, _ = fs.GetBool("help"); help {
		return cfg, true, nil
	}
	if !fs.Changed("np") {
		return cfg, false, errors.New("missing -np N (the number of ranks)")
	}
	cfg.NP, _ = fs.GetInt("np")
	if cfg.NP < 1 {
		return cfg, false, fmt.Errorf("-np %d: need at least 1 rank", cfg.NP)
	}
	if fs.NArg() == 0 {
		return cfg, false, errors.New("missing PROGRAM")
	}
	cfg.Program, cfg.Args = fs.Arg(0), fs.Args()[1:]
	cfg.TagOutput, _ = fs.GetBool("tag-output")
	cfg.Stats, _ = fs.GetBool("stats")
	cfg.Verbose, _ = fs.GetBool("verbose")
	cfg.Oversubscribe, _ = fs.GetBool("oversubscribe")
	cfg.EnableRecovery, _ = fs.GetBool("enable-recovery")
	if cfg.PGO, _ = fs.GetString("pgo"); fs.Changed("pgo") && cfg.PGO == "" {
		return cfg, false, errors.New("--pgo: want a profile file, auto or off")
	}
	if cfg.Timeout, _ = fs.GetDuration("timeout"); cfg.Timeout < 0 {
		return cfg, false, fmt.Errorf("--timeout %v: must not be negative", cfg.Timeout)
	}
	if cfg.Grace, _ = fs.GetDuration("grace"); cfg.Grace <= 0 {
		return cfg, false, fmt.Errorf("--grace %v: must be positive", cfg.Grace)
	}
	switch l, _ := fs.GetString("launcher"); l {
	case "auto":
		cfg.Launch = launcher.LaunchLocal
		if launcher.InSlurmAllocation(func(k string) string { v, _ := lookupEnv(k); return v }) {
			cfg.Launch = launcher.LaunchSlurm
		}
	case launcher.LaunchLocal, launcher.LaunchSlurm:
		cfg.Launch = l
	default:
		return cfg, false, fmt.Errorf("--launcher %q: want local, slurm or auto", l)
	}
	if h, _ := fs.GetString("host"); h != "" {
		if cfg.Hosts, err = launcher.ParseHosts(h); err != nil {
			return cfg, false, err
		}
	}
	if hf, _ := fs.GetString("hostfile"); hf != "" {
		if cfg.Hosts != nil {
			return cfg, false, errors.New("--host and --hostfile exclude each other")
		}
		if cfg.Hosts, err = launcher.ReadHostfile(hf); err != nil {
			return cfg, false, err
		}
	}
	if cfg.Hosts != nil && !fs.Changed("launcher") {
		cfg.Launch = launcher.LaunchLocal
	}
	cfg.Agent, _ = fs.GetString("launch-agent")
	xs, _ := fs.GetStringArray("x")
	for _, x := range xs {
		name, _, hasValue := strings.Cut(x, "=")
		if name == "" || strings.ContainsAny(name, " \t\n") {
			return cfg, false, fmt.Errorf("-x %q: not VAR or VAR=value", x)
		}
		if !hasValue {
			v, ok := lookupEnv(name)
			if !ok {
				return cfg, false, fmt.Errorf("-x %s: %s is not set in gorun's environment", name, name)
			}
			x = name + "=" + v
		}
		cfg.Env = append(cfg.Env, x)
	}
	cfg.Params = params.params
	return cfg, false, nil
}

// normalizeNP rewrites the MPI spelling "-np N" (which pflag would read as
// -n with the value "p") to "--np N" among gorun's own flags, that is before
// PROGRAM.
func normalizeNP(fs *pflag.FlagSet, args []string) []string {
	out := append([]string(nil), args...)
	for i := 0; i < len(out); i++ {
		a := out[i]
		switch {
		case a == "--" || !strings.HasPrefix(a, "-") || a == "-":
			return out // PROGRAM (or the end of the flags) reached
		case a == "-np" || strings.HasPrefix(a, "-np="):
			out[i] = "-" + a
			if a == "-np" {
				i++ // its value
			}
		case strings.HasPrefix(a, "--"):
			name := strings.TrimPrefix(a, "--")
			if strings.Contains(name, "=") {
				continue
			}
			if f := fs.Lookup(name); f != nil && f.NoOptDefVal == "" {
				i++ // its value is the next argument
			}
		default: // a cluster of shorthands: -x VAR, -xVAR, -n4, -h
			for k := 1; k < len(a); k++ {
				f := fs.ShorthandLookup(a[k : k+1])
				if f != nil && f.NoOptDefVal == "" {
					if k == len(a)-1 {
						i++ // the value is the next argument
					}
					break
				}
			}
		}
	}
	return out
}
