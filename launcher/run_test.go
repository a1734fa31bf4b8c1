package launcher_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/launcher"
)

// syncBuffer is a bytes.Buffer safe for the launcher's writers, which tells
// a waiting test when it grows.
type syncBuffer struct {
	mu      sync.Mutex
	b       bytes.Buffer
	changed chan struct{} // capacity 1, or nil
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed != nil {
		select {
		case s.changed <- struct{}{}:
		default:
		}
	}
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func runCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestRunCopiesReaderToRankZero(t *testing.T) {
	var out, errOut syncBuffer
	in := strings.Repeat("x", 100_000) + "\nend\n"
	code, err := launcher.Run(runCtx(t), launcher.Config{
		NP: 2, Program: rankprogBin, Args: []string{"echo"},
		Stdin: strings.NewReader(in), Stdout: &out, Stderr: &errOut, Oversubscribe: true,
	})
	if code != 0 || err != nil {
		t.Fatalf("Run = %d, %v; stderr:\n%s", code, err, errOut.String())
	}
	other := "rank 1 read 0 bytes of stdin\n"
	if got := out.String(); strings.Replace(got, other, "", 1) != in || !strings.Contains(got, other) {
		t.Errorf("stdout: %d bytes, want rank 0's copy of %d bytes and rank 1's line", len(got), len(in))
	}
}

func TestRunReportsJobError(t *testing.T) {
	var errOut syncBuffer
	code, err := launcher.Run(runCtx(t), launcher.Config{
		NP: 2, Program: rankprogBin, Args: []string{"exit", "0", "5"}, Stderr: &errOut,
	})
	var je *launcher.JobError
	if code != 5 || !errors.As(err, &je) || je.Rank != 0 || je.Code != 5 || je.Reason != "exited with status 5" || je.PID <= 0 {
		t.Fatalf("Run = %d, %#v", code, err)
	}
	if want := "gorun: " + je.Error() + "\n"; !strings.Contains(errOut.String(), want) {
		t.Errorf("stderr %q lacks %q", errOut.String(), want)
	}
}

func TestRunCancelStopsRanks(t *testing.T) {
	ctx, cancel := context.WithCancel(runCtx(t))
	var errOut syncBuffer
	out := syncBuffer{changed: make(chan struct{}, 1)}
	done := make(chan struct{})
	var code int
	var err error
	go func() {
		defer close(done)
		code, err = launcher.Run(ctx, launcher.Config{
			NP: 2, Program: rankprogBin, Args: []string{"hang", "nochild"},
			Stdout: &out, Stderr: &errOut, Grace: 100 * time.Millisecond,
		})
	}()
	// Cancel once both ranks run: watch their output.
	for strings.Count(out.String(), "ready") < 2 {
		select {
		case <-done:
			t.Fatalf("Run ended early: %d, %v; stderr:\n%s", code, err, errOut.String())
		case <-out.changed:
		}
	}
	cancel()
	<-done
	var je *launcher.JobError
	if code != launcher.ExitFailure || !errors.As(err, &je) || je.Rank != -1 || !strings.Contains(je.Reason, "cancel") {
		t.Fatalf("Run = %d, %v", code, err)
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for name, cfg := range map[string]launcher.Config{
		"no ranks":    {NP: 0, Program: rankprogBin},
		"no program":  {NP: 1},
		"param name":  {NP: 1, Program: rankprogBin, Params: [][2]string{{"a=b", "c"}}},
		"param value": {NP: 1, Program: rankprogBin, Params: [][2]string{{"a", "b\nc"}}},
		"env entry":   {NP: 1, Program: rankprogBin, Env: []string{"NOEQUALS"}},
		"missing":     {NP: 1, Program: "/no/such/file"},
	} {
		code, err := launcher.Run(runCtx(t), cfg)
		if code != launcher.ExitFailure || !errors.Is(err, mpierr.ErrArg) {
			t.Errorf("%s: Run = %d, %v; want ExitFailure and ErrArg", name, code, err)
		}
	}
}
