package tcp

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
)

var testSecret = btltest.Secret

// rank is one opened rank of a test job.
type rank struct {
	env  *btl.Env
	log  *btltest.Log
	mods []*module
}

func (r *rank) kill() {
	for _, m := range r.mods {
		m.abort()
	}
}

func (r *rank) close() {
	for _, m := range r.mods {
		m.Close()
	}
}

// openJob opens n ranks sharing store with the given parameter overrides.
// The ranks close when the test ends.
func openJob(t testing.TB, store btl.Store, n int, overrides ...[2]string) []*rank {
	t.Helper()
	ranks := make([]*rank, n)
	for i := range n {
		ranks[i] = openRank(t, store, i, n, overrides...)
	}
	return ranks
}

func openRank(t testing.TB, store btl.Store, i, n int, overrides ...[2]string) *rank {
	t.Helper()
	env, log, mods := btltest.Open(t, component{}, store, "test-job", i, n, overrides...)
	r := &rank{env: env, log: log}
	for _, m := range mods {
		r.mods = append(r.mods, m.(*module))
	}
	return r
}

// suitePeers builds the conformance suite's peers from link `link` of jobs
// opened with overrides.
func suitePeers(link int, overrides ...[2]string) func(t *testing.T, n int) []btltest.Peer {
	return func(t *testing.T, n int) []btltest.Peer {
		ranks := openJob(t, btltest.NewStore(), n, overrides...)
		peers := make([]btltest.Peer, n)
		for i, r := range ranks {
			peers[i] = btltest.Peer{Module: r.mods[link], Dispatch: r.env.Dispatch, Kill: r.kill}
		}
		return peers
	}
}

func TestConformance(t *testing.T) {
	withGet := [2]string{"btl_tcp_flags", "send,sendi,inplace,put,get"}
	for _, links := range []int{1, 2} {
		t.Run("links="+strconv.Itoa(links), func(t *testing.T) {
			btltest.Run(t, suitePeers(links-1, [2]string{paramLinks, strconv.Itoa(links)}, withGet))
		})
	}
	t.Run("defaults", func(t *testing.T) {
		btltest.Run(t, suitePeers(0))
	})
	// More ranks than cores: the readers park on the netpoller.
	t.Run("oversubscribed", func(t *testing.T) {
		btltest.Run(t, func(t *testing.T, n int) []btltest.Peer {
			store := btltest.NewStore()
			peers := make([]btltest.Peer, n)
			for i := range n {
				env, _ := btltest.Env(t, store, "test-job", i, n, withGet)
				env.Oversubscribed = true
				mods, err := component{}.Open(env)
				require.NoError(t, err)
				m := mods[0].(*module)
				require.True(t, m.sh.cfg.netpoll)
				t.Cleanup(func() { m.Close() })
				peers[i] = btltest.Peer{Module: m, Dispatch: env.Dispatch, Kill: m.abort}
			}
			return peers
		})
	})
}

func TestOpenWithoutStore(t *testing.T) {
	env, _ := btltest.Env(t, nil, "", 0, 2) // no store
	mods, err := component{}.Open(env)
	require.Empty(t, mods)
	require.ErrorContains(t, err, "needs gorun's store")
}

func TestDefaults(t *testing.T) {
	r := openJob(t, btltest.NewStore(), 2)[0]
	m := r.mods[0]
	require.Equal(t, btl.Limits{EagerLimit: 64 << 10, RndvEagerLimit: 64 << 10, MaxSendSize: 128 << 10,
		RDMAPipelineFragSize: 2147482624, RDMAPipelineSendLength: 128 << 10, MinRDMAPipelineSize: math.MaxInt32}, m.Limits())
	require.Equal(t, btl.CapSend|btl.CapSendImmediate|btl.CapSendInPlace|btl.CapPut, m.Caps())
	require.Equal(t, 100, m.Exclusivity())
	require.Equal(t, "tcp", m.Name())
	_, err := m.AddProc(0)
	require.ErrorIs(t, err, btl.ErrUnreachable)
}

func TestListenIPs(t *testing.T) {
	local := &btl.Env{Size: 2, LocalSize: 2}
	ips, err := listenIPs(local, "", "")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", ips[0].String(), "single-host jobs listen on loopback")
	for _, inc := range []string{"lo", "127.0.0.1", "127.0.0.0/8", " lo , 127.0.0.1 "} {
		ips, err := listenIPs(local, inc, "")
		require.NoError(t, err, inc)
		require.Contains(t, fmt.Sprint(ips), "127.0.0.1", inc)
		for _, ip := range ips {
			require.True(t, ip.IsLoopback(), "%s: %v", inc, ip)
		}
	}
	for _, inc := range []string{"no-such-if0", "203.0.113.0/24", ","} {
		_, err := listenIPs(local, inc, "")
		require.Error(t, err, inc)
	}
}

// btl_tcp_if_exclude takes addresses out of the default choice, and does
// not go with btl_tcp_if_include.
func TestListenIPsExclude(t *testing.T) {
	local := &btl.Env{Size: 2, LocalSize: 2}
	_, err := listenIPs(local, "lo", "eth0")
	require.ErrorIs(t, err, mpierr.ErrArg, "include and exclude together")
	ips, err := listenIPs(local, "", "203.0.113.0/24")
	require.NoError(t, err)
	require.Equal(t, "127.0.0.1", ips[0].String(), "excluding another subnet keeps loopback")
	for _, ex := range []string{"127.0.0.0/8", "127.0.0.1", loopbackIface().Name} {
		ips, err := listenIPs(local, "", ex)
		if err != nil {
			require.ErrorIs(t, err, mpierr.ErrNotSupported, "%s: no other interface here", ex)
			continue
		}
		for _, ip := range ips {
			require.False(t, ip.IsLoopback(), "%s excluded, yet %v chosen", ex, ip)
		}
	}
	_, err = listenIPs(local, "", "0.0.0.0/0,::/0,"+loopbackIface().Name)
	require.ErrorIs(t, err, mpierr.ErrNotSupported, "nothing left")
}

func TestTwoInterfacesBlob(t *testing.T) {
	// A peer publishing an unreachable address first is still reached
	// through the next one.
	store := btltest.NewStore()
	ranks := openJob(t, store, 2)
	b, err := store.Get(context.Background(), storeKey(1))
	require.NoError(t, err)
	links, addrs, err := decodeBlob(b)
	require.NoError(t, err)
	store.Set(storeKey(1), encodeBlob(links, append([]string{"127.0.0.1:1"}, addrs...)))
	w0, w1 := watch(ranks[0]), watch(ranks[1])
	roundTrip(t, ranks[0], ranks[1], w0, w1)
}
