package mpi_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

// deadline bounds every mpi.Run of these tests: a run that has not
// returned by then fails its test (with the goroutine stacks) instead of
// hanging the test binary.
const deadline = 20 * time.Second

// job gives the ranks of one run a way to wait on Go channels (used to
// order events across ranks) that gives up as soon as any rank failed, so
// a failing rank never leaves a peer stuck on a channel.
type job struct {
	dead chan struct{}
	once sync.Once
}

func newJob() *job { return &job{dead: make(chan struct{})} }

var errPeerFailed = errors.New("test: another rank failed")

// wait blocks until ch is closed or another rank failed.
func (j *job) wait(ch <-chan struct{}) error {
	select {
	case <-ch:
		return nil
	case <-j.dead:
		return errPeerFailed
	}
}

// recv takes one value from ch, or fails when another rank failed.
func recvFrom[T any](j *job, ch <-chan T) (T, error) {
	select {
	case v := <-ch:
		return v, nil
	case <-j.dead:
		var zero T
		return zero, errPeerFailed
	}
}

// signal sends on ch, or fails when another rank failed.
func (j *job) signal(ch chan<- struct{}) error {
	select {
	case ch <- struct{}{}:
		return nil
	case <-j.dead:
		return errPeerFailed
	}
}

func (j *job) fail() { j.once.Do(func() { close(j.dead) }) }

// within runs f and fails the test if f has not returned by the deadline
// (printing the goroutine stacks) instead of letting it hang.
func within(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		var b strings.Builder
		pprof.Lookup("goroutine").WriteTo(&b, 1)
		s := b.String()
		if len(s) > 20000 {
			s = s[:20000] + "\n... (truncated)"
		}
		t.Fatalf("%s did not return within %v; goroutines:\n%s", what, deadline, s)
	}
}

// runJob runs body on n goroutine ranks with mpi.Run and returns Run's
// error. It fails the test if Run does not return within the deadline.
func runJob(t testing.TB, j *job, n int, body func(w *mpi.Comm) error, opts ...mpi.Option) error {
	t.Helper()
	var err error
	within(t, fmt.Sprintf("mpi.Run(%d)", n), func() {
		err = mpi.Run(n, func(w *mpi.Comm) error {
			err := body(w)
			if err != nil {
				j.fail()
			}
			return err
		}, opts...)
	})
	if err != nil {
		j.fail()
	}
	return err
}

// run is runJob with a fresh job.
func run(t testing.TB, n int, body func(w *mpi.Comm) error, opts ...mpi.Option) error {
	t.Helper()
	return runJob(t, newJob(), n, body, opts...)
}

// mustRun fails the test when the run returns an error.
func mustRun(t testing.TB, n int, body func(w *mpi.Comm) error, opts ...mpi.Option) {
	t.Helper()
	if err := run(t, n, body, opts...); err != nil {
		t.Fatal(err)
	}
}

// mustRunJob is mustRun with a caller-made job.
func mustRunJob(t testing.TB, j *job, n int, body func(w *mpi.Comm) error, opts ...mpi.Option) {
	t.Helper()
	if err := runJob(t, j, n, body, opts...); err != nil {
		t.Fatal(err)
	}
}

// fill writes a pseudo-random pattern determined by seed into b.
func fill(b []byte, seed uint64) {
	x := seed*0x9E3779B97F4A7C15 + 0x2545F4914F6CDD1D
	next := func() uint64 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		return x
	}
	i := 0
	for ; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], next())
	}
	for ; i < len(b); i++ {
		b[i] = byte(next())
	}
}

// master is a long pseudo-random stream; the pattern of a seed is a
// window of it starting at an offset chosen by the seed, so messages with
// different seeds carry different bytes, any shift of data is visible,
// and patterns cost a copy instead of a generator loop (which matters
// under the race detector).
var master = sync.OnceValue(func() []byte {
	b := make([]byte, 17<<20)
	fill(b, 1)
	return b
})

const masterWindows = 1 << 20 // offsets 0..masterWindows-1

// expected returns the n bytes of the pattern of seed; the caller must not
// modify them.
func expected(n int, seed uint64) []byte {
	m := master()
	off := int((seed*0x9E3779B97F4A7C15)>>44) % masterWindows
	if off+n > len(m) {
		b := make([]byte, n)
		fill(b, seed)
		return b
	}
	return m[off : off+n : off+n]
}

// pattern returns a fresh copy of the pattern of seed.
func pattern(n int, seed uint64) []byte {
	return append([]byte(nil), expected(n, seed)...)
}

// diff describes the first difference between got and want, or "" when
// they are equal.
func diff(got, want []byte) string {
	if bytes.Equal(got, want) {
		return ""
	}
	if len(got) != len(want) {
		return fmt.Sprintf("length %d, want %d", len(got), len(want))
	}
	for i := range got {
		if got[i] != want[i] {
			return fmt.Sprintf("byte %d of %d is %#02x, want %#02x", i, len(got), got[i], want[i])
		}
	}
	return ""
}

// checkBytes returns an error naming what when got differs from want.
func checkBytes(what string, got, want []byte) error {
	if d := diff(got, want); d != "" {
		return fmt.Errorf("%s: %s", what, d)
	}
	return nil
}

// wantErr returns an error unless err wraps class.
func wantErr(what string, err, class error) error {
	if !errors.Is(err, class) {
		return fmt.Errorf("%s: got error %v, want one wrapping %v", what, err, class)
	}
	return nil
}

// forces are the values of pml_force_protocol ("" = automatic).
var forces = []string{"", "eager", "rdma_put", "rdma_get", "send_pipeline", "rdma_pipeline"}

// forceName names a subtest after a forced protocol.
func forceName(f string) string {
	if f == "" {
		return "auto"
	}
	return f
}

// smallPipeline makes the self transport cut messages into many pieces:
// several FRAGs per message (max_send_size), a PUT pipeline with several
// PUTs and a FRAG tail, and a shallow send pipeline.
var smallPipeline = []mpi.Option{
	mpi.WithParam("btl_self_max_send_size", "4k"),
	mpi.WithParam("btl_self_rdma_pipeline_frag_size", "64k"),
	mpi.WithParam("btl_self_rdma_pipeline_send_length", "128k"),
	mpi.WithParam("pml_send_pipeline_depth", "2"),
	mpi.WithParam("pml_recv_pipeline_depth", "2"),
}

// protocolOpts returns the options forcing protocol f, optionally with
// the small pipeline settings.
func protocolOpts(f string, small bool) []mpi.Option {
	opts := []mpi.Option{mpi.WithParam("pml_force_protocol", f)}
	if small {
		opts = append(opts, smallPipeline...)
	}
	return opts
}

// protocolCases calls fn for every forced protocol, with default and small
// pipeline settings, each as a parallel subtest.
func protocolCases(t *testing.T, fn func(t *testing.T, opts []mpi.Option)) {
	for _, f := range forces {
		for _, small := range []bool{false, true} {
			name := forceName(f)
			if small {
				name += "/small_frags"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				fn(t, protocolOpts(f, small))
			})
		}
	}
}

// mustType commits the datatype a constructor returned; a constructor
// error is a bug in the test itself, so it panics.
func mustType(dt convertor.Datatype, err error) convertor.Datatype {
	if err != nil {
		panic(err)
	}
	dt, err = dt.Commit()
	if err != nil {
		panic(err)
	}
	return dt
}

// goroutines runs fn(0..n-1) concurrently and joins their errors.
func goroutines(n int, fn func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = fn(i)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}
