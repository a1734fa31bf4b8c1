package btl_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/fake"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// component is a registered test transport: one fake module (on a
// network of its own), or err.
type component struct {
	name string
	err  error
}

func (c component) Name() string { return c.name }

func (c component) Open(env *btl.Env) ([]btl.Module, error) {
	if c.err != nil {
		return nil, c.err
	}
	cfg := fake.DefaultConfig()
	cfg.Name = c.name
	return []btl.Module{fake.NewNetwork().Attach(env.Rank, env.Dispatch, cfg)}, nil
}

// The only components of this test binary (btl/fake registers none).
func init() {
	btl.RegisterComponent(component{name: "optest-a-ok"})
	btl.RegisterComponent(component{name: "optest-b-none", err: mpierr.Errorf(mpierr.ErrNotSupported, "no such device")})
	btl.RegisterComponent(component{name: "optest-c-arg", err: mpierr.Errorf(mpierr.ErrArg, "bad eager limit")})
}

func names(mods []btl.Module) []string {
	var out []string
	for _, m := range mods {
		out = append(out, m.Name())
	}
	return out
}

// TestOpen: the btl list selects the components; one not usable here is
// left out with its reason; one with a bad parameter fails Open with an
// ErrArg naming it, and the modules opened before it come back to close.
func TestOpen(t *testing.T) {
	env := func() *btl.Env { return &btl.Env{Size: 1, Dispatch: &btl.Dispatcher{}, Logf: t.Logf} }

	mods, unused, err := btl.Open(env(), "^optest-c-arg")
	require.NoError(t, err)
	require.Equal(t, []string{"optest-a-ok"}, names(mods))
	require.Len(t, unused, 1)
	require.Contains(t, unused[0], "optest-b-none: ")
	require.Contains(t, unused[0], "no such device")
	require.NoError(t, mods[0].Close())

	mods, unused, err = btl.Open(env(), "optest-b-none")
	require.NoError(t, err)
	require.Empty(t, mods)
	require.Len(t, unused, 1)

	mods, _, err = btl.Open(env(), "")
	require.ErrorIs(t, err, mpierr.ErrArg)
	require.Contains(t, err.Error(), "transport optest-c-arg: ")
	require.Equal(t, []string{"optest-a-ok"}, names(mods), "the modules opened before the failure")
	require.NoError(t, mods[0].Close())
}

// TestReach: every module is asked; the endpoint of the highest
// exclusivity wins, the earlier module's on a tie; with none, each
// module's refusal is reported.
func TestReach(t *testing.T) {
	// Rank 0's modules on three networks: a (exclusivity 10) reaches ranks
	// 1 and 2; b and c (20 each) reach rank 1 only.
	mod := func(n *fake.Network, name string, excl int, peers ...int) btl.Module {
		cfg := fake.DefaultConfig()
		cfg.Name, cfg.Exclusivity = name, excl
		m := n.Attach(0, &btl.Dispatcher{}, cfg)
		for _, p := range peers {
			n.Attach(p, &btl.Dispatcher{}, cfg)
		}
		return m
	}
	a := mod(fake.NewNetwork(), "a", 10, 1, 2)
	b := mod(fake.NewNetwork(), "b", 20, 1)
	c := mod(fake.NewNetwork(), "c", 20, 1)
	mods := []btl.Module{a, b, c}

	for _, tc := range []struct {
		peer    int
		want    string
		refused int
	}{
		{peer: 1, want: "b"},
		{peer: 2, want: "a", refused: 2},
		{peer: 3, refused: 3},
	} {
		t.Run(fmt.Sprint("peer=", tc.peer), func(t *testing.T) {
			ep, reasons := btl.Reach(mods, tc.peer)
			require.Len(t, reasons, tc.refused)
			if tc.want == "" {
				require.Nil(t, ep)
				return
			}
			require.NotNil(t, ep)
			require.Equal(t, tc.want, ep.Module().Name())
			require.Equal(t, tc.peer, ep.Peer())
		})
	}
}
