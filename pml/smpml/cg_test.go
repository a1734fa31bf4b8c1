package smpml

import (
	"context"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"testing"

	"github.com/gompi-org/gompi/pml"
)

// TestCGWindow runs CG_WINDOWS windows of gompi-bench rate (8 B, or
// CG_SIZE bytes) on one goroutine (see BenchmarkPMLRateWindow), the
// sending and the receiving halves in separate functions, for an
// instruction counter (valgrind
// --tool=callgrind --toggle-collect=*cgRecv*, bench/instr.sh). Each half
// makes the PML calls that mpi makes for it: 64 IsendHandle or
// IrecvHandle, then mpi.Comm.WaitallRelease's (waitallRelease).
func TestCGWindow(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("CG_WINDOWS"))
	if n == 0 {
		t.Skip("CG_WINDOWS not set")
	}
	c0, c1 := pmlPair(t, [2]string{"pml_wait_spin", "1s"})
	sz, _ := strconv.Atoi(os.Getenv("CG_SIZE"))
	if sz == 0 {
		sz = 8
	}
	w := &cgWin{sb: pml.Buffer{Bytes: make([]byte, sz)}, rb: pml.Buffer{Bytes: make([]byte, sz)}}
	checkSendsAtOnce(t, c0, c1, w)
	growStack(64)
	runtime.GC() // none in the counted windows: the loop allocates nothing
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	for range n {
		cgSend(t, c0, w)
		cgRecv(t, c1, w)
		c0.Engine().Progress() // the receiver's CREDITs (pml flow control), uncounted
	}
}

// checkSendsAtOnce runs one window, uncounted, checking what the counted
// ones rely on: each of the 64 sends goes to sm within its call (a Handle
// done at once), so the sender's wait, on the goroutine that also
// receives, has nothing to wait for.
func checkSendsAtOnce(tb testing.TB, c0, c1 *pml.Comm, w *cgWin) {
	tb.Helper()
	for i := range w.sends {
		h, err := c0.IsendHandle(w.sb, 1, 1, pml.Standard, nil)
		if err != nil {
			tb.Fatal(err)
		}
		if _, ok := h.Ready(); !ok {
			tb.Fatalf("send %d of the window did not go at once", i)
		}
		w.sends[i] = h
	}
	if err := waitallRelease(c0, w.sends[:]); err != nil {
		tb.Fatal(err)
	}
	cgRecv(tb, c1, w)
	c0.Engine().Progress()
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

// cgWin is a window's buffers and Handles (mpi.Requests are Handles).
type cgWin struct {
	sb, rb       pml.Buffer
	sends, recvs [64]*pml.Handle
}

// cgSend is the sending rank's window: 64 Isends and their WaitallRelease.
//
//go:noinline
func cgSend(tb testing.TB, c0 *pml.Comm, w *cgWin) {
	for i := range w.sends {
		h, err := c0.IsendHandle(w.sb, 1, 1, pml.Standard, nil)
		if err != nil {
			tb.Fatal(err)
		}
		w.sends[i] = h
	}
	if err := waitallRelease(c0, w.sends[:]); err != nil {
		tb.Fatal(err)
	}
}

// cgRecv is the receiving rank's window: 64 Irecvs (cgRecvPost) and their
// WaitallRelease (cgRecvWait).
//
//go:noinline
func cgRecv(tb testing.TB, c1 *pml.Comm, w *cgWin) {
	cgRecvPost(tb, c1, w)
	cgRecvWait(tb, c1, w)
}

//go:noinline
func cgRecvPost(tb testing.TB, c1 *pml.Comm, w *cgWin) {
	for i := range w.recvs {
		h, err := c1.IrecvHandle(w.rb, 0, 1)
		if err != nil {
			tb.Fatal(err)
		}
		w.recvs[i] = h
	}
}

// cgRecvWait waits for the window's receives: the first wait polls the
// 64 messages in and matches them, the others find their results in their
// Handles, and KeepHandles keeps the Handles for the next window's posts.
//
//go:noinline
func cgRecvWait(tb testing.TB, c1 *pml.Comm, w *cgWin) {
	if err := waitallRelease(c1, w.recvs[:]); err != nil {
		tb.Fatal(err)
	}
}

// TestCGRoundTrip runs CG_ROUNDS round trips of an 8-byte ping-pong (the
// blocking Send and Recv of gompi-bench latency) on one goroutine, each in
// cgRound, for an instruction counter (bench/instr.sh).
func TestCGRoundTrip(t *testing.T) {
	cgRepeat(t, func(c0, c1 *pml.Comm, b0, b1 pml.Buffer) { cgRound(t, c0, c1, b0, b1) })
}

// cgRepeat runs round CG_ROUNDS times on a pair of communicators over sm
// and their 8-byte buffers, with the stack grown and the collector off
// first, so that neither lands inside the counted functions. (Its name
// must not match the counted functions' patterns: callgrind toggles
// collection at every function whose name matches.)
func cgRepeat(t *testing.T, round func(c0, c1 *pml.Comm, b0, b1 pml.Buffer)) {
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
		round(c0, c1, b0, b1)
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

// TestCGSsendRoundTrip is TestCGRoundTrip with synchronous sends, as
// mpi makes a blocking Ssend's: each side starts its Ssend, the peer's
// Recv takes the RNDV and answers with the ACK, and the sender's wait
// takes the ACK (bench/instr.sh).
func TestCGSsendRoundTrip(t *testing.T) {
	cgRepeat(t, func(c0, c1 *pml.Comm, b0, b1 pml.Buffer) { cgSsendRound(t, c0, c1, b0, b1) })
}

//go:noinline
func cgSsendRound(t *testing.T, c0, c1 *pml.Comm, b0, b1 pml.Buffer) {
	cgSsendHalf(t, c0, c1, b0, b1, 1, 0, false)
	cgSsendHalf(t, c1, c0, b1, b0, 0, 1, true)
}

// cgSsendHalf: from's Ssend to to; with early, the RNDV reaches to
// before its Recv (as the Ssend answering a ping-pong's does).
func cgSsendHalf(t *testing.T, from, to *pml.Comm, sb, rb pml.Buffer, dest, src int, early bool) {
	h, err := from.IsendHandle(sb, dest, 1, pml.Synchronous, nil)
	if err != nil {
		t.Fatal(err)
	}
	if early {
		to.Engine().Progress()
	}
	if _, err := to.Recv(rb, src, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := h.Wait(nil); err != nil {
		t.Fatal(err)
	}
}

// TestCGProbeRoundTrip is TestCGRoundTrip for a receiver that learns the
// size from a probe: Probe then Recv, or with CG_MODE=mprobe, Mprobe then
// Mrecv, as mpi makes them (bench/instr.sh).
func TestCGProbeRoundTrip(t *testing.T) {
	recv := cgProbeRecv
	if os.Getenv("CG_MODE") == "mprobe" {
		recv = cgMprobeRecv
	}
	cgRepeat(t, func(c0, c1 *pml.Comm, b0, b1 pml.Buffer) { cgProbeRound(t, c0, c1, b0, b1, recv) })
}

//go:noinline
func cgProbeRound(t *testing.T, c0, c1 *pml.Comm, b0, b1 pml.Buffer, recv func(*testing.T, *pml.Comm, pml.Buffer, int)) {
	if err := c0.Send(b0, 1, 1, pml.Standard); err != nil {
		t.Fatal(err)
	}
	recv(t, c1, b1, 0)
	if err := c1.Send(b1, 0, 1, pml.Standard); err != nil {
		t.Fatal(err)
	}
	recv(t, c0, b0, 1)
}

func cgProbeRecv(t *testing.T, c *pml.Comm, b pml.Buffer, src int) {
	st, err := c.Probe(context.Background(), src, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Recv(pml.Buffer{Bytes: b.Bytes[:st.Count]}, st.Source, st.Tag); err != nil {
		t.Fatal(err)
	}
}

func cgMprobeRecv(t *testing.T, c *pml.Comm, b pml.Buffer, src int) {
	m, st, err := c.Mprobe(context.Background(), src, 1)
	if err != nil {
		t.Fatal(err)
	}
	h, err := c.Mrecv(&m, pml.Buffer{Bytes: b.Bytes[:st.Count]})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.Wait(nil); err != nil {
		t.Fatal(err)
	}
}
