package pmi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/launcher/pmi"
	"github.com/gompi-org/gompi/launcher/pmi/pmitest"
)

var _ btl.Store = (*pmi.Store)(nil)

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// joinAll joins every rank of srv's job concurrently (version 1 or 2,
// or 0 for PMI-1 over the PMI_PORT handshake); hosts, when not nil,
// names each rank's host.
func joinAll(t *testing.T, srv *pmitest.Server, size, version int, hosts []string) []*pmi.Job {
	t.Helper()
	ctx := testCtx(t)
	jobs := make([]*pmi.Job, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		wg.Add(1)
		go func() {
			defer wg.Done()
			env := srv.Env(r)
			if version == 0 {
				env = func(k string) string {
					if k == "PMI_ID" {
						return fmt.Sprint(r)
					}
					return ""
				}
			}
			c, err := pmi.New(ctx, srv.Conn(r), version == 2, version == 0, env)
			if err != nil {
				errs[r] = err
				return
			}
			host := func() (string, error) { return "host0", nil }
			if hosts != nil {
				host = func() (string, error) { return hosts[r], nil }
			}
			jobs[r], errs[r] = pmi.NewJob(ctx, c, env, host)
		}()
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, j := range jobs {
			if j != nil {
				j.Close()
			}
		}
	})
	for r, err := range errs {
		require.NoError(t, err, "rank %d", r)
	}
	return jobs
}

func TestJoinAgreesOnJob(t *testing.T) {
	for _, v := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("version=%d", v), func(t *testing.T) {
			srv := pmitest.NewServer(4)
			srv.Mapping = "(vector,(0,2,2))"
			defer srv.Close()
			jobs := joinAll(t, srv, 4, v, nil)
			for r, j := range jobs {
				require.Equal(t, r, j.Rank)
				require.Equal(t, 4, j.Size)
				require.Equal(t, r%2, j.LocalRank)
				require.Equal(t, 2, j.LocalSize)
				require.Len(t, j.JobID, 16)
				require.Len(t, j.Secret, 32)
				require.Equal(t, jobs[0].JobID, j.JobID)
				require.Equal(t, jobs[0].Secret, j.Secret)
			}
			require.NotEqual(t, make([]byte, 32), jobs[0].Secret)
		})
	}
}

func TestLocalRanksFromHostNames(t *testing.T) {
	srv := pmitest.NewServer(5)
	srv.Mapping = ""
	defer srv.Close()
	jobs := joinAll(t, srv, 5, 1, []string{"a", "b", "a", "a", "b"})
	want := [][2]int{{0, 3}, {0, 2}, {1, 3}, {2, 3}, {1, 2}}
	for r, j := range jobs {
		require.Equal(t, want[r], [2]int{j.LocalRank, j.LocalSize}, "rank %d", r)
		require.Equal(t, "hostnames", j.Local)
	}
}

// TestStoreWireUp publishes values of every size (chunked past the
// server's value limit) under short and long keys, fences, and reads
// every rank's back.
func TestStoreWireUp(t *testing.T) {
	for _, v := range []int{1, 2} {
		t.Run(fmt.Sprintf("version=%d", v), func(t *testing.T) {
			const size = 3
			srv := pmitest.NewServer(size)
			defer srv.Close()
			jobs := joinAll(t, srv, size, v, nil)
			ctx := testCtx(t)
			long := "btl.sm.local." + strings.Repeat("h", 80) + ".0"
			val := func(r, n int) []byte { return bytes.Repeat([]byte{byte(r), 0, ';', ' ', 0xff}, n)[:n] }
			sizes := []int{0, 1, 700, 800, 5000}
			var wg sync.WaitGroup
			getBefore := make(chan error, 1)
			go func() {
				// A Get before the fence waits for it.
				b, err := jobs[0].Store.Get(ctx, "k.1.1")
				if err == nil && !bytes.Equal(b, val(1, 1)) {
					err = fmt.Errorf("got %x", b)
				}
				getBefore <- err
			}()
			for r, j := range jobs {
				for _, n := range sizes {
					require.NoError(t, j.Store.Set(fmt.Sprintf("k.%d.%d", r, n), val(r, n)))
				}
				require.NoError(t, j.Store.Set(long+fmt.Sprint(r), val(r, 3000)))
				wg.Add(1)
				go func() { defer wg.Done(); require.NoError(t, j.Fence(ctx, "wireup")) }()
			}
			wg.Wait()
			require.NoError(t, <-getBefore)
			for _, j := range jobs {
				for r := range size {
					for _, n := range sizes {
						b, err := j.Store.Get(ctx, fmt.Sprintf("k.%d.%d", r, n))
						require.NoError(t, err)
						require.True(t, bytes.Equal(val(r, n), b), "rank %d size %d", r, n)
					}
					b, err := j.Store.Get(ctx, long+fmt.Sprint(r))
					require.NoError(t, err)
					require.Equal(t, val(r, 3000), b)
				}
				// A key of a shape published before the fence that no
				// rank published: an error at once.
				_, err := j.Store.Get(ctx, "k.99.0")
				require.ErrorIs(t, err, pmi.ErrNotFound)
				// Of another shape: rank 0's store, waiting until ctx ends.
				short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
				_, err = j.Store.Get(short, "btl.tcp.99")
				cancel()
				require.ErrorIs(t, err, pmi.ErrNotFound)
				require.ErrorIs(t, err, context.DeadlineExceeded)
			}
			// After the fence, a pair of ranks exchanges through rank 0's
			// store: a Get waits for the peer's Set.
			got := make(chan []byte, 1)
			go func() {
				b, err := jobs[2].Store.Get(ctx, "pair.1.2")
				if err != nil {
					t.Error(err)
				}
				got <- b
			}()
			require.NoError(t, jobs[1].Store.Set("pair.1.2", []byte("qp 77")))
			require.Equal(t, []byte("qp 77"), <-got)
			for _, j := range jobs {
				require.NoError(t, j.Close())
			}
		})
	}
}

func TestGetBeforeFenceEndsWithContext(t *testing.T) {
	srv := pmitest.NewServer(1)
	defer srv.Close()
	j := joinAll(t, srv, 1, 1, nil)[0]
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := j.Store.Get(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestFenceFailsWhenServerGoes: a fence in progress when the process
// manager goes away fails instead of hanging, and later requests fail at
// once.
func TestFenceFailsWhenServerGoes(t *testing.T) {
	srv := pmitest.NewServer(2)
	c, err := pmi.New(testCtx(t), srv.Conn(0), false, false, srv.Env(0))
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- c.Fence(testCtx(t)) }()
	srv.Close()
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("fence did not fail after the server closed")
	}
	_, _, err = c.Get(testCtx(t), "k")
	require.ErrorIs(t, err, pmi.ErrBroken)
}

// TestFenceContext: a fence that ctx ends returns the context's error,
// and the connection is then unusable (it would be out of step).
func TestFenceContext(t *testing.T) {
	srv := pmitest.NewServer(2)
	defer srv.Close()
	c, err := pmi.New(testCtx(t), srv.Conn(0), true, false, srv.Env(0))
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = c.Fence(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, c.Put(testCtx(t), "k", "v"), pmi.ErrBroken)
}

func TestAbortAndFinalize(t *testing.T) {
	for _, v := range []int{1, 2} {
		srv := pmitest.NewServer(2)
		jobs := joinAll(t, srv, 2, v, nil)
		require.NoError(t, jobs[1].Abort(7, "rank 1: gave up; no hope"))
		require.NoError(t, jobs[0].Finalize())
		deadline := time.Now().Add(10 * time.Second)
		for len(srv.Aborts()) == 0 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		require.Len(t, srv.Aborts(), 1)
		require.Contains(t, srv.Aborts()[0], "rank_1:_gave_up__no_hope")
		if v == 1 {
			require.Contains(t, srv.Aborts()[0], "exitcode 7")
		}
		require.True(t, srv.Finalized(0))
		require.False(t, srv.Finalized(1))
		srv.Close()
	}
}

func TestDialRejectsBadEnvironment(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	ctx := testCtx(t)
	for _, m := range []map[string]string{
		{},
		{"PMI_FD": "x"},
		{"PMI_FD": "3", "GOMPI_PMI": "3"},
		{"PMI_PORT": "127.0.0.1:1", "PMI_ID": "0"},
	} {
		_, err := pmi.Dial(ctx, env(m))
		require.Error(t, err, "%v", m)
	}
	require.False(t, pmi.Detect(env(map[string]string{})))
	require.True(t, pmi.Detect(env(map[string]string{"PMI_FD": "5"})))
	srv := pmitest.NewServer(2)
	defer srv.Close()
	bad := func(k string) string {
		if k == "PMI_RANK" {
			return "2"
		}
		return srv.Env(0)(k)
	}
	_, err := pmi.New(ctx, srv.Conn(0), false, false, bad)
	require.Error(t, err)
	require.False(t, errors.Is(err, pmi.ErrNotFound))
}

// TestWireUpManyRanks: 256 ranks on 16 nodes join, publish and read
// their neighbours' values; local ranks follow the mapping.
func TestWireUpManyRanks(t *testing.T) {
	for _, v := range []int{1, 2} {
		t.Run(fmt.Sprintf("version=%d", v), func(t *testing.T) {
			const size = 256
			srv := pmitest.NewServer(size)
			srv.Mapping = "(vector,(0,16,16))"
			defer srv.Close()
			jobs := joinAll(t, srv, size, v, nil)
			ctx := testCtx(t)
			var wg sync.WaitGroup
			errs := make([]error, size)
			for r, j := range jobs {
				require.Equal(t, r%16, j.LocalRank)
				require.Equal(t, 16, j.LocalSize)
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[r] = func() error {
						if err := j.Store.Set(fmt.Sprintf("addr.%d", r), []byte{byte(r), byte(r >> 8)}); err != nil {
							return err
						}
						if err := j.Fence(ctx, "wireup"); err != nil {
							return err
						}
						p := (r + 1) % size
						b, err := j.Store.Get(ctx, fmt.Sprintf("addr.%d", p))
						if err != nil {
							return err
						}
						if !bytes.Equal(b, []byte{byte(p), byte(p >> 8)}) {
							return fmt.Errorf("rank %d read %x for rank %d", r, b, p)
						}
						return nil
					}()
				}()
			}
			wg.Wait()
			for r, err := range errs {
				require.NoError(t, err, "rank %d", r)
			}
		})
	}
}
