package ibvtest

import (
	"context"
	"fmt"
	"runtime"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// Poll polls cq until it has taken n completions or ctx ends, and returns
// the completions taken, oldest first. It returns early with the CQ's
// error (ErrCQOverrun) or with ctx.Err() when ctx ends first; the
// completions taken until then are returned with the error. Between empty
// polls it yields and then sleeps with a growing pause (up to 1 ms), so a
// software provider sharing the CPU keeps running.
func Poll(ctx context.Context, cq ibv.CQ, n int) ([]ibv.WC, error) {
	out := make([]ibv.WC, 0, n)
	buf := make([]ibv.WC, min(max(n, 1), 64))
	idle := 0
	for len(out) < n {
		k, err := cq.Poll(buf[:min(len(buf), n-len(out))])
		out = append(out, buf[:k]...)
		if err != nil {
			return out, fmt.Errorf("poll CQ: %w", err)
		}
		if k > 0 {
			idle = 0
			continue
		}
		if err := ctx.Err(); err != nil {
			return out, fmt.Errorf("%d of %d completions: %w", len(out), n, err)
		}
		idle++
		pause(idle)
	}
	return out, nil
}

// PollFor polls cq for d and returns every completion taken (and the CQ's
// error, if any). It shows the absence of completions: a correct device
// passes whatever d is; a longer d only catches a wrong one more often.
func PollFor(cq ibv.CQ, d time.Duration) ([]ibv.WC, error) {
	var out []ibv.WC
	buf := make([]ibv.WC, 16)
	end := time.Now().Add(d)
	idle := 0
	for time.Now().Before(end) {
		k, err := cq.Poll(buf)
		out = append(out, buf[:k]...)
		if err != nil {
			return out, fmt.Errorf("poll CQ: %w", err)
		}
		if k > 0 {
			idle = 0
			continue
		}
		idle++
		pause(idle)
	}
	return out, nil
}

func pause(idle int) {
	switch {
	case idle < 16:
		runtime.Gosched()
	case idle < 64:
		time.Sleep(10 * time.Microsecond)
	case idle < 256:
		time.Sleep(100 * time.Microsecond)
	default:
		time.Sleep(time.Millisecond)
	}
}
