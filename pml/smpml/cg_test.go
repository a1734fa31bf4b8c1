package smpml

import (
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/gompi-org/gompi/pml"
)

// TestCGWindow runs CG_WINDOWS windows of the receiver's work in
// gompi-bench rate 8 B (see BenchmarkPMLRecvSinkWindow), the sending and
// the receiving halves in separate functions, for an instruction counter
// (valgrind --tool=callgrind --toggle-collect=*cgRecv*).
func TestCGWindow(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CG_WINDOWS"))
	if n == 0 {
		t.Skip("CG_WINDOWS not set")
	}
	c0, c1 := pmlPair(t, [2]string{"pml_wait_spin", "1s"})
	w := &cgWin{sb: pml.Buffer{Bytes: make([]byte, 8)}, rb: pml.Buffer{Bytes: make([]byte, 8)}}
	growStack(64)
	runtime.GC() // none in the counted windows: the loop allocates nothing
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for range n {
		cgSend(t, c0, w)
		cgRecv(t, c1, w)
		c0.Engine().Progress() // the receiver's CREDITs (pml flow control), uncounted
	}
}

// growStack grows the goroutine's stack by at least depth KiB, so that no
// call in the counted windows grows it: callgrind loses track of a
// function's return when the stack moves, and counts on past it.
//
//go:noinline
func growStack(depth int) byte {
	var pad [1024]byte
	pad[depth%len(pad)] = byte(depth)
	if depth > 0 {
		return growStack(depth-1) + pad[(depth*7)%len(pad)]
	}
	return pad[0]
}

type cgWin struct {
	sb, rb pml.Buffer
	reqs   [64]*pml.Request
	sinks  [64]pml.Sink
	back   []*pml.Request
}

//go:noinline
func cgSend(t *testing.T, c0 *pml.Comm, w *cgWin) {
	for range w.reqs {
		if r, err := c0.IsendNow(w.sb, 1, 1, pml.Standard); err != nil || r != nil {
			t.Fatal(err, r)
		}
	}
}

//go:noinline
func cgRecv(t *testing.T, c1 *pml.Comm, w *cgWin) {
	cgRecvPost(t, c1, w)
	cgRecvWait(t, c1, w)
}

// cgRecvPost posts the window's receives by IrecvSink, each with a sink
// of the caller's (mpi.Irecv posts the same way through IrecvHandle, whose
// Handle holds the sink).
//
//go:noinline
func cgRecvPost(t *testing.T, c1 *pml.Comm, w *cgWin) {
	var err error
	for i := range w.reqs {
		s := &w.sinks[i]
		*s = pml.Sink{}
		s.State.Init(pml.SinkMode)
		if w.reqs[i], err = c1.IrecvSink(w.rb, 0, 1, s); err != nil {
			t.Fatal(err)
		}
	}
}

// cgRecvWait waits for them as mpi.WaitallInto waits for Handles: the
// first wait polls the messages in and matches them, the other results
// are read from their sinks, and the requests go back in one batch.
//
//go:noinline
func cgRecvWait(t *testing.T, c1 *pml.Comm, w *cgWin) {
	w.back = w.back[:0]
	for i, r := range w.reqs {
		s := &w.sinks[i]
		if s.State.Load()&pml.SinkGone == 0 {
			s.State.Add(1)
			if s.State.Load()&pml.SinkGone == 0 {
				if err := c1.Engine().Wait(nil, r); err != nil {
					t.Fatal(err)
				}
			}
			if x := s.ReleaseKeep(r); x != nil {
				w.back = append(w.back, x)
			}
		}
		if _, err := s.Result(); err != nil {
			t.Fatal(err)
		}
	}
	c1.Engine().RecycleAll(w.back)
}

// TestCGRoundTrip runs CG_ROUNDS round trips of an 8-byte ping-pong (the
// blocking Send and Recv of gompi-bench latency) on one goroutine, each in
// cgRound, for an instruction counter (bench/instr.sh).
func TestCGRoundTrip(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CG_ROUNDS"))
	if n == 0 {
		t.Skip("CG_ROUNDS not set")
	}
	c0, c1 := pmlPair(t, [2]string{"pml_wait_spin", "1s"})
	b0, b1 := pml.Buffer{Bytes: make([]byte, 8)}, pml.Buffer{Bytes: make([]byte, 8)}
	growStack(64)
	runtime.GC()
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for range n {
		cgRound(t, c0, c1, b0, b1)
	}
}

//go:noinline
func cgRound(t *testing.T, c0, c1 *pml.Comm, b0, b1 pml.Buffer) {
	if err := c0.Send(b0, 1, 1, pml.Standard); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Recv(b1, 0, 1); err != nil {
		t.Fatal(err)
	}
	if err := c1.Send(b1, 0, 1, pml.Standard); err != nil {
		t.Fatal(err)
	}
	if _, err := c0.Recv(b0, 1, 1); err != nil {
		t.Fatal(err)
	}
}
