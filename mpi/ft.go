package mpi

import "github.com/gompi-org/gompi/internal/params"

// Failures among survivors, ULFM's point-to-point part.
//
// A job started with gorun --enable-recovery (the enable_recovery
// parameter) goes on when a rank dies: gorun tells the survivors, and
// each survivor's pending and later operations that name the dead rank
// fail with ErrProcFailed (within a few milliseconds of the death on one
// host: gorun reaps the process and notifies at once; a transport that
// notices the loss first reports it itself). In detail:
//
//   - sends to the dead rank fail, pending and later, in every mode
//     (an eager send that the transport had taken before the death may
//     have completed normally, as it would have anyway);
//   - receives and probes naming the dead rank fail, pending and later,
//     with one exception: an eager message that arrived before the death
//     stays deliverable, and a receive that matches it completes
//     normally;
//   - receives and probes from AnySource fail while the communicator has
//     a dead rank that FailureAck has not acknowledged: a pending one at
//     the failure, a later one when no arrived message matches it. After
//     FailureAck they work again, matching the live ranks' messages (and
//     arrived ones of the dead);
//   - Barrier, Dup and Split on a communicator with a dead rank fail on
//     every rank that takes part, instead of waiting for it;
//   - everything among the survivors keeps working, with nothing lost.
//
// Without enable_recovery a rank's death ends the job (gorun stops the
// others after the notice), and in-process (Run) a failing rank aborts
// the others. With it, a rank of Run whose body returns an error or
// panics counts as a dead process for the others: that is the in-process
// way to test a program's failure handling.

func init() {
	params.Register(params.Def{Name: "enable_recovery", Kind: params.Bool, Default: "false",
		Help: "a rank's death does not end the job: survivors get ErrProcFailed for operations naming it (gorun --enable-recovery; in Run, a rank whose body fails counts as dead)"})
}

// FailureAck acknowledges the failures of c's ranks known now
// (MPI_Comm_failure_ack): receives and probes from AnySource posted
// afterwards no longer fail because of them, and FailedRanks lists them.
// A failure that becomes known later is acknowledged by the next call.
// It returns ErrComm for a nil or freed communicator.
func (c *Comm) FailureAck() error {
	if err := c.valid(); err != nil {
		return err
	}
	return c.pc.FailureAck()
}

// FailedRanks returns the ranks of c (numbered in c) whose failure
// FailureAck acknowledged, ascending (MPI_Comm_failure_get_acked); empty
// when none or c is invalid. The slice is the caller's.
func (c *Comm) FailedRanks() []int {
	if c.valid() != nil {
		return []int{}
	}
	return c.pc.FailedRanks()
}
