package pml

import (
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/self"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/stretchr/testify/require"
)

// selfComms makes n engines over btl/self, joined in context 0.
func selfComms(t *testing.T, n int, extra ...[2]string) []*Comm {
	t.Helper()
	ps, err := params.NewSet(append([][2]string{{"pml_force_protocol", ""}, {"pml_wait_spin", "0s"}}, extra...))
	require.NoError(t, err)
	w := self.NewWorld()
	engs := make([]*Engine, n)
	mods := make([]*self.Module, n)
	group := make([]int, n)
	for r := range n {
		group[r] = r
		d := &btl.Dispatcher{}
		engs[r], err = New(Config{Rank: r, Size: n, Params: ps, Dispatch: d})
		require.NoError(t, err)
		mods[r], err = w.Attach(&btl.Env{Rank: r, Size: n, Params: ps, Dispatch: d, Logf: func(string, ...any) {}})
		require.NoError(t, err)
	}
	comms := make([]*Comm, n)
	for r := range n {
		for p := range n {
			ep, err := mods[r].AddProc(p)
			require.NoError(t, err)
			require.NoError(t, engs[r].SetPeer(p, ep))
		}
		comms[r], err = engs[r].NewComm(0, r, group)
		require.NoError(t, err)
	}
	return comms
}

// Receives posted on ever new tags (a tag per iteration, a common MPI
// idiom) must not leave state behind once they matched or were cancelled:
// the per-(source, tag) posted lists were never removed from the map, so
// memory grew with the number of distinct tags ever used. Empty lists are
// kept for reuse up to a bound, and swept beyond it.
func TestPostedListsDoNotAccumulate(t *testing.T) {
	c := selfComms(t, 2)
	buf := make([]byte, 8)
	for tag := range 1000 {
		r, err := c[0].irecv(Buffer{Bytes: buf}, 1, tag)
		require.NoError(t, err)
		require.NoError(t, c[1].Send(Buffer{Bytes: buf}, 0, tag, Standard))
		require.True(t, r.Done())
		r, err = c[0].irecv(Buffer{Bytes: buf}, 1, 100000+tag)
		require.NoError(t, err)
		require.True(t, c[0].Cancel(r))
	}
	e := c[0].e
	e.mu.Lock()
	require.LessOrEqual(t, len(c[0].m.spec.m), minSweep+1, "posted lists left for tags no receive waits on")
	require.Equal(t, 0, len(c[0].m.uKey.m), "unexpected lists left")
	e.mu.Unlock()
	// Messages on ever new tags that arrive before their receives: the
	// emptied unexpected lists are swept too.
	for tag := range 1000 {
		buf[0] = byte(tag)
		require.NoError(t, c[1].Send(Buffer{Bytes: buf}, 0, 200000+tag, Standard))
		got := make([]byte, 8)
		st, err := c[0].Recv(Buffer{Bytes: got}, 1, 200000+tag)
		require.NoError(t, err)
		require.Equal(t, 200000+tag, st.Tag)
		require.Equal(t, byte(tag), got[0])
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	require.Nil(t, c[0].m.uAll.head)
	require.LessOrEqual(t, len(c[0].m.uKey.m), minSweep+1, "unexpected lists left for tags no message waits on")
}
