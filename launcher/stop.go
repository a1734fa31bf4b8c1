// The job loop's handling of store events and signals, and the stopping of
// a job: its stages from failure notice to SIGKILL, and the flushing of output.

package launcher

import (
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/gompi-org/gompi/launcher/store"
)

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
