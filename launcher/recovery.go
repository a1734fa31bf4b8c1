package launcher

import "strings"

// A job run with Config.EnableRecovery goes on when a rank dies (exits
// non-zero, is killed, or exits without calling Finalize): gorun prints
// one line naming it, sends the survivors the failure notice (their
// operations naming the dead rank then fail with ErrProcFailed), and
// stops nobody. The store's fences complete among the live ranks, so the
// survivors can finalize. Once every rank has ended, Run returns the
// first dead rank's code and a *JobError naming every dead rank. An
// Abort, a timeout, the end of ctx and forwarded signals stop the job as
// without recovery.

// died records the death of rank e.Rank in a job that goes on; the
// survivors have been notified. A rank is recorded once.
func (j *job) died(e *JobError) {
	for _, d := range j.dead {
		if d.Rank == e.Rank {
			return
		}
	}
	j.dead = append(j.dead, e)
	j.out.printf("%v; the other ranks go on (--enable-recovery)", e)
}

// deadError is Run's error for a job that went on after deaths: the
// first dead rank's, naming the others too. It is printed here, as
// failures are when they happen.
func (j *job) deadError() *JobError {
	e := *j.dead[0]
	if len(j.dead) > 1 {
		also := make([]string, 0, len(j.dead)-1)
		for _, d := range j.dead[1:] {
			also = append(also, d.Error())
		}
		e.Reason += "; also dead: " + strings.Join(also, "; ")
	}
	j.out.printf("%v (the job went on without it: --enable-recovery)", &e)
	return &e
}
