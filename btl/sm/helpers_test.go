package sm

import (
	"context"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
)

// testRank is one opened rank of an in-process test job.
type testRank struct {
	m    *Module
	env  *btl.Env
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startPoller runs the loop a PML runs: Progress while there is work,
// Block when idle.
func (r *testRank) startPoller() {
	r.done = make(chan struct{})
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			if r.m.closed.Load() {
				return
			}
			if r.m.Progress() == 0 {
				r.m.Block(r.stop)
			}
		}
	}()
}

func (r *testRank) stopPoller() {
	r.once.Do(func() {
		close(r.stop)
		if r.done != nil {
			<-r.done
		}
	})
}

// openJob opens n sm modules sharing store, ranks 0..n-1 all on this host,
// with parameter overrides. They close when the test ends.
func openJob(t testing.TB, store btl.Store, n int, overrides ...[2]string) []*testRank {
	t.Helper()
	job := btltest.JobID()
	ranks := make([]*testRank, n)
	for i := range n {
		ranks[i] = openRank(t, store, job, i, n, overrides...)
	}
	return ranks
}

func openRank(t testing.TB, store btl.Store, job string, i, n int, overrides ...[2]string) *testRank {
	t.Helper()
	env, _, mods := btltest.Open(t, component{}, store, job, i, n, overrides...)
	require.Len(t, mods, 1)
	r := &testRank{m: mods[0].(*Module), env: env, stop: make(chan struct{})}
	t.Cleanup(r.stopPoller) // before btltest.Open's Close: cleanups run last first
	return r
}

// suitePeers builds the conformance suite's peers, each with a poller.
func suitePeers(overrides ...[2]string) func(t *testing.T, n int) []btltest.Peer {
	return func(t *testing.T, n int) []btltest.Peer {
		ranks := openJob(t, btltest.NewStore(), n, overrides...)
		peers := make([]btltest.Peer, n)
		for i, r := range ranks {
			r.startPoller()
			peers[i] = btltest.Peer{Module: r.m, Dispatch: r.env.Dispatch, Kill: func() {
				r.m.kill()
				r.stopPoller()
			}}
		}
		return peers
	}
}

// fileStore is a btl.Store in a directory, shared by processes.
type fileStore struct{ dir string }

func (s fileStore) path(key string) string {
	return filepath.Join(s.dir, hex.EncodeToString([]byte(key)))
}

func (s fileStore) Set(key string, value []byte) error {
	tmp := s.path(key) + ".tmp"
	if err := os.WriteFile(tmp, value, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path(key))
}

func (s fileStore) Get(ctx context.Context, key string) ([]byte, error) {
	for {
		b, err := os.ReadFile(s.path(key))
		if err == nil {
			return b, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// inbox records fragments delivered to one rank.
type inbox struct {
	mu     sync.Mutex
	frags  []rcvd
	fails  []failure
	signal chan struct{}
}

type rcvd struct {
	from      int
	tag       btl.Tag
	hdr, data []byte
}

type failure struct {
	peer int
	err  error
}

func newInbox(d *btl.Dispatcher, tags ...btl.Tag) *inbox {
	in := &inbox{signal: make(chan struct{}, 1)}
	for _, tag := range tags {
		d.Register(tag, func(ep btl.Endpoint, hdr, data []byte) {
			in.mu.Lock()
			in.frags = append(in.frags, rcvd{from: ep.Peer(), tag: tag, hdr: append([]byte(nil), hdr...), data: append([]byte(nil), data...)})
			in.mu.Unlock()
			in.note()
		})
	}
	d.OnPeerFailed(func(peer int, err error) {
		in.mu.Lock()
		in.fails = append(in.fails, failure{peer, err})
		in.mu.Unlock()
		in.note()
	})
	return in
}

func (in *inbox) note() {
	select {
	case in.signal <- struct{}{}:
	default:
	}
}

func (in *inbox) count() (int, int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return len(in.frags), len(in.fails)
}

// waitFor polls m (if poll) until cond holds or the deadline passes.
func (in *inbox) waitFor(t testing.TB, m *Module, poll bool, d time.Duration, what string, cond func(frags int, fails int) bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if poll {
			m.Progress()
		}
		f, x := in.count()
		if cond(f, x) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s (%d fragments, %d failures)", d, what, f, x)
		}
		if !poll {
			select {
			case <-in.signal:
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
}

// memfdState lists what of ours the kernel still shows for this process:
// descriptors and mappings of gompi memfds.
func memfdState(t testing.TB) []string {
	t.Helper()
	var out []string
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.Contains(l, "gompi-sm") {
			out = append(out, "fd "+e.Name()+" -> "+l)
		}
	}
	maps, err := os.ReadFile("/proc/self/maps")
	require.NoError(t, err)
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "gompi-sm") {
			out = append(out, "map "+l)
		}
	}
	return out
}

func devShm(t testing.TB) []string {
	t.Helper()
	ents, err := os.ReadDir("/dev/shm")
	if err != nil {
		return nil
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}
