package launcher

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseHosts(t *testing.T) {
	h, err := ParseHosts("a,b:3, a")
	require.NoError(t, err)
	require.Equal(t, []Host{{"a", 2}, {"b", 3}}, h)
	for _, bad := range []string{"", ",", "a:0", "a:x", "-oProxyCommand=x", "a b", "a;b"} {
		_, err := ParseHosts(bad)
		require.Error(t, err, "%q", bad)
	}
}

func TestReadHostfile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "hosts")
	require.NoError(t, os.WriteFile(p, []byte("# cluster\nnode1 slots=4 max_slots=8\n\nnode2   # one slot\nnode1 slots=2\n"), 0o644))
	h, err := ReadHostfile(p)
	require.NoError(t, err)
	require.Equal(t, []Host{{"node1", 6}, {"node2", 1}}, h)
	for _, bad := range []string{"node1 slots=0\n", "node1 slots\n", "node1 cores=2\n", "# nothing\n"} {
		require.NoError(t, os.WriteFile(p, []byte(bad), 0o644))
		_, err := ReadHostfile(p)
		require.Error(t, err, "%q", bad)
	}
	_, err = ReadHostfile(filepath.Join(t.TempDir(), "missing"))
	require.Error(t, err)
}

func TestMapRanks(t *testing.T) {
	hosts := []Host{{"a", 2}, {"b", 1}}
	m, err := mapRanks(hosts, 3, false)
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 1}, {2}}, m)
	m, err = mapRanks(hosts, 2, false)
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 1}, nil}, m)
	_, err = mapRanks(hosts, 4, false)
	require.Error(t, err)
	m, err = mapRanks(hosts, 6, true)
	require.NoError(t, err)
	require.Equal(t, [][]int{{0, 1, 3, 5}, {2, 4}}, m)
	require.Equal(t, "a: 0-1,3,5, b: 2,4", describeMap(hosts, m))
}
