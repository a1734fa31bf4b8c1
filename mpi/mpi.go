// Package mpi is gompi's public API: MPI-style point-to-point messaging
// between the ranks of a job.
//
// A job is either N processes started by gorun (each calls Init and
// Finalize) or N goroutine ranks inside one process started by Run. Ranks
// exchange messages through a communicator (*Comm) with MPI semantics:
// tags and wildcards, non-overtaking order between a pair of ranks,
// blocking, nonblocking and persistent calls, probes, cancel, the four
// send modes, and derived datatypes (package convertor) through Typed.
// docs/from-c-mpi.md maps each MPI call to its counterpart here.
//
//	err := mpi.Run(2, func(world *mpi.Comm) error {
//		buf := make([]float64, 4)
//		if world.Rank() == 0 {
//			return world.Send(buf, 1, 7)
//		}
//		_, err := world.Recv(buf, 0, 7)
//		return err
//	})
//
// Every method is safe to call from any goroutine, and progress never
// depends on the caller testing requests.
package mpi

import (
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/self"
	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/pml"
)

// Special ranks and tags.
const (
	AnySource = -1                  // Recv/Probe: match a message from any rank
	AnyTag    = -1                  // Recv/Probe: match any tag
	ProcNull  = -2                  // Send/Recv with ProcNull complete at once and move no data
	TagUB     = 1<<30 - 1           // largest valid tag; valid user tags are 0..TagUB
	Undefined = convertor.Undefined // Status.Elements when the byte count is not a whole number of elements; Split color for "no communicator"
)

// BsendOverhead is the attached-buffer space each buffered message takes
// beyond its packed size (MPI_BSEND_OVERHEAD).
const BsendOverhead = 64

// The error classes. Every error this package returns wraps one of them.
var (
	ErrTruncate   = mpierr.ErrTruncate   // receive buffer too small: the buffer holds the message's prefix, Status.Count the bytes stored
	ErrRank       = mpierr.ErrRank       // dest/source out of range
	ErrTag        = mpierr.ErrTag        // tag out of range
	ErrComm       = mpierr.ErrComm       // nil or freed communicator
	ErrBuffer     = mpierr.ErrBuffer     // bad buffer (unsupported type, Bsend without room)
	ErrCount      = mpierr.ErrCount      // count/datatype do not fit the buffer
	ErrType       = mpierr.ErrType       // bad or uncommitted datatype
	ErrProcFailed = mpierr.ErrProcFailed // the peer process died or became unreachable
	ErrNotInit    = mpierr.ErrNotInit    // Init not called, or called after Finalize
	ErrArg        = mpierr.ErrArg        // another invalid argument (bad option, parameter or request)
	ErrAborted    = mpierr.ErrAborted    // the job was ended by Comm.Abort
)

// Option configures Init and Run.
type Option func(*options)

type options struct {
	params [][2]string
}

// WithParam sets a tunable parameter by name, e.g.
// WithParam("btl_self_eager_limit", "4k"). It overrides the environment
// (GOMPI_<NAME>). An unknown name or bad value makes Init/Run fail with
// ErrArg. gompi-info lists every parameter.
func WithParam(name, value string) Option {
	return func(o *options) { o.params = append(o.params, [2]string{name, value}) }
}

// instance is one rank's state: its engine, transports and world.
type instance struct {
	rank, size int
	params     *params.Set
	engine     *pml.Engine
	dispatch   *btl.Dispatcher
	modules    []btl.Module
	world      *Comm
	abort      func(code int, err error) // ends the whole job
	closed     atomic.Bool
	logf       func(string, ...any)
	unused     []string // transports that could not be opened, and why
}

func newOptions(opts []Option) *options {
	o := &options{}
	for _, f := range opts {
		if f != nil {
			f(o)
		}
	}
	return o
}

// Run starts n ranks as goroutines inside this process, connected by the
// in-process (self) transport, calls body on each with its world
// communicator, waits for all, and returns errors.Join of the ranks'
// errors (each prefixed with its rank). A rank whose body returns an error
// or panics aborts the others' pending and later calls (ErrAborted), so a
// failing rank never leaves the rest hanging; with the enable_recovery
// parameter it dies alone instead: the others' operations naming it fail
// with ErrProcFailed, as when a process of a gorun --enable-recovery job
// dies (see FailureAck). Run is independent of
// Init/Finalize and may be called many times, also concurrently.
func Run(n int, body func(world *Comm) error, opts ...Option) error {
	if n <= 0 {
		return mpierr.Errorf(mpierr.ErrArg, "Run needs at least one rank, got %d", n)
	}
	if body == nil {
		return mpierr.Errorf(mpierr.ErrArg, "Run needs a body")
	}
	o := newOptions(opts)
	ps, err := params.NewSet(o.params)
	if err != nil {
		return err
	}
	w := self.NewWorld()
	insts := make([]*instance, n)
	var abortOnce sync.Once
	var abortErr error // the first Abort's error: Run returns it
	abortAll := func(code int, err error) {
		abortOnce.Do(func() {
			abortErr = err
			for _, in := range insts {
				in.engine.Abort(err)
			}
		})
	}
	logf := func(string, ...any) {}
	if ps.Bool("verbose") {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "gompi: "+f+"\n", a...) }
	}
	for r := 0; r < n; r++ {
		in, err := newInstance(r, n, ps, logf)
		if err != nil {
			return err
		}
		in.abort = abortAll
		env := in.env()
		m, err := w.Attach(env)
		if err != nil {
			return err
		}
		in.modules = append(in.modules, m)
		in.engine.SetSpinner(m)
		insts[r] = in
	}
	for _, in := range insts {
		if err := in.connect(); err != nil {
			return err
		}
	}
	// With enable_recovery a failing rank dies alone (ft.go).
	recovery := ps.Bool("enable_recovery")
	die := func(r int, err error) {
		insts[r].engine.Abort(mpierr.Errorf(mpierr.ErrProcFailed, "rank %d died: %v", r, err))
		for i, in := range insts {
			if i != r {
				in.engine.PeerFailed(r, mpierr.Errorf(mpierr.ErrProcFailed, "rank %d died: %v", r, err))
			}
		}
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			in := insts[r]
			defer func() {
				if p := recover(); p != nil {
					errs[r] = fmt.Errorf("rank %d: panic: %v\n%s", r, p, debug.Stack())
					if recovery {
						die(r, fmt.Errorf("panic: %v", p))
						return
					}
					abortAll(1, mpierr.Errorf(mpierr.ErrAborted, "rank %d panicked", r))
				}
			}()
			if err := body(in.world); err != nil {
				errs[r] = fmt.Errorf("rank %d: %w", r, err)
				if recovery && !errors.Is(err, ErrAborted) {
					die(r, err)
				} else if !errors.Is(err, ErrAborted) {
					abortAll(1, mpierr.Errorf(mpierr.ErrAborted, "rank %d failed: %v", r, err))
				}
			}
		}(r)
	}
	wg.Wait()
	for _, in := range insts {
		in.close(nil)
	}
	return errors.Join(append([]error{abortErr}, errs...)...)
}

func newInstance(rank, size int, ps *params.Set, logf func(string, ...any)) (*instance, error) {
	in := &instance{rank: rank, size: size, params: ps, logf: logf}
	d := &btl.Dispatcher{}
	e, err := pml.New(pml.Config{Rank: rank, Size: size, Params: ps, Dispatch: d, Oversubscribed: os.Getenv("GOMPI_OVERSUBSCRIBED") == "1", Logf: logf,
		Stats: wantStats(ps)})
	if err != nil {
		return nil, err
	}
	in.engine = e
	in.dispatch = d
	return in, nil
}

// wantStats: gorun --stats (GOMPI_STATS=1) or the stats parameter.
func wantStats(ps *params.Set) bool { return ps.Bool("stats") || os.Getenv("GOMPI_STATS") == "1" }

func (in *instance) stats() bool { return wantStats(in.params) }

func (in *instance) env() *btl.Env {
	return &btl.Env{Rank: in.rank, Size: in.size, LocalRank: in.rank, LocalSize: in.size,
		Params: in.params, Dispatch: in.dispatch, Logf: in.logf, Oversubscribed: os.Getenv("GOMPI_OVERSUBSCRIBED") == "1",
		Stats: in.stats()}
}

// connect sets every peer's endpoint, the one btl.Reach chooses, and
// creates the world communicator.
func (in *instance) connect() error {
	for p := 0; p < in.size; p++ {
		ep, reasons := btl.Reach(in.modules, p)
		if ep == nil {
			names := []string{}
			for _, m := range in.modules {
				names = append(names, m.Name())
			}
			why := ""
			if len(reasons) > 0 {
				why = "; " + strings.Join(reasons, "; ")
			}
			if len(in.unused) > 0 {
				why += "; not usable here: " + strings.Join(in.unused, "; ")
			}
			return mpierr.Errorf(mpierr.ErrProcFailed, "rank %d: no transport reaches rank %d (transports in use: %v; btl=%q%s)", in.rank, p, names, in.params.String("btl"), why)
		}
		if err := in.engine.SetPeer(p, ep); err != nil {
			return err
		}
	}
	for _, m := range in.modules {
		if p, ok := m.(btl.Poller); ok {
			in.engine.AddPoller(p)
		}
	}
	group := make([]int, in.size)
	for i := range group {
		group[i] = i
	}
	pc, err := in.engine.NewComm(0, in.rank, group)
	if err != nil {
		return err
	}
	in.world = newComm(in, pc)
	in.engine.Start()
	return nil
}

func (in *instance) close(err error) {
	if in.closed.Swap(true) {
		return
	}
	in.engine.Close(err)
	for _, m := range in.modules {
		m.Close()
	}
}

func init() {
	params.Register(params.Def{Name: "btl", Kind: params.String, Default: "",
		Help: "transports to use: comma list (self,sm,tcp,verbs), or ^list to exclude; empty = all usable"})
	params.Register(params.Def{Name: "verbose", Kind: params.Bool, Default: "false",
		Help: "log transport selection and failures to stderr"})
}
