package launcher

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTasksOnNode(t *testing.T) {
	for _, c := range []struct {
		list string
		node int
		want int
	}{
		{"2", 0, 2}, {"2(x3),1", 0, 2}, {"2(x3),1", 2, 2}, {"2(x3),1", 3, 1}, {"4,1(x2)", 2, 1},
	} {
		n, err := tasksOnNode(c.list, c.node)
		require.NoError(t, err, c.list)
		require.Equal(t, c.want, n, "%s node %d", c.list, c.node)
	}
	for _, c := range []struct {
		list string
		node int
	}{{"", 0}, {"2", 1}, {"x", 0}, {"2(x0)", 0}, {"0", 0}, {"2(x3", 0}, {"2", -1}} {
		_, err := tasksOnNode(c.list, c.node)
		require.Error(t, err, "%q node %d", c.list, c.node)
	}
}

func TestRelabelLine(t *testing.T) {
	for in, want := range map[string]string{
		"0: ring\n":     "[0] ring\n",
		" 12: x: y\n":   "[12] x: y\n",
		"srun: error\n": "srun: error\n",
		"3:x\n":         "3:x\n",
		": a\n":         ": a\n",
	} {
		require.Equal(t, want, string(relabelLine([]byte(in), true)))
	}
}
