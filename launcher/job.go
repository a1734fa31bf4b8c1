// The state of a running job, the starting of its processes, and its loop,
// which reaps them as they exit.

package launcher

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/launcher/store"
)

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
