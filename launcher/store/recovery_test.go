package store

import (
	"errors"
	"testing"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// In recovery mode a fence completes once every live rank reached it: a
// failure before or during the fence, and a fence begun after it.
func TestRecoveryFencesSkipFailedRanks(t *testing.T) {
	ctx := testCtx(t)
	s, _ := newTestServer(t, 4)
	s.SetRecovery(true)
	c0, c1, c2 := dial(t, ctx, s, 0), dial(t, ctx, s, 1), dial(t, ctx, s, 2)
	done := make(chan error, 2)
	go func() { done <- c0.Fence(ctx, "f") }()
	go func() { done <- c1.Fence(ctx, "f") }()
	for _, c := range []*Client{c0, c1} {
		if _, _, err := c.TryGet("sync"); err != nil { // the FENCEs reached the server
			t.Fatal(err)
		}
	}
	s.NotifyFailure(3, "killed by signal 9")
	select {
	case err := <-done:
		t.Fatalf("fence returned before live rank 2 arrived: %v", err)
	default:
	}
	if err := c2.Fence(ctx, "f"); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Everyone but rank 2 waits; rank 2 dies: the fence completes.
	go func() { done <- c0.Fence(ctx, "g") }()
	go func() { done <- c1.Fence(ctx, "g") }()
	for _, c := range []*Client{c0, c1} {
		if _, _, err := c.TryGet("sync"); err != nil {
			t.Fatal(err)
		}
	}
	s.NotifyFailure(2, "exited with status 3")
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	// Without recovery the same fence fails.
	s.SetRecovery(false)
	if err := c0.Fence(ctx, "h"); !errors.Is(err, mpierr.ErrProcFailed) {
		t.Fatalf("fence with failed ranks, recovery off: %v, want ErrProcFailed", err)
	}
}
