package tests

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestBadInput: bad command lines, programs and parameter values end with a
// clear message and a non-zero status, never a panic or a hang.
func TestBadInput(t *testing.T) {
	text := filepath.Join(t.TempDir(), "notes.txt")
	require.NoError(t, os.WriteFile(text, []byte("not a program\n"), 0o644))
	ring := prog("ring")
	cases := []struct {
		name string
		args []string
		code int    // 0: any non-zero status
		msg  string // expected in the output
	}{
		// gorun's own command line: status 2 and the usage.
		{"unknown-flag", []string{"-np", "2", "--no-such-flag", ring}, 2, "unknown flag: --no-such-flag"},
		{"np-0", []string{"-np", "0", ring}, 2, "-np 0: need at least 1 rank"},
		{"np-negative", []string{"-np", "-1", ring}, 2, "need at least 1 rank"},
		{"np-not-a-number", []string{"-np", "abc", ring}, 2, `invalid argument "abc"`},
		{"np-missing", []string{ring}, 2, "missing -np"},
		{"program-missing", []string{"-np", "2"}, 2, "missing PROGRAM"},
		{"timeout-negative", []string{"--timeout", "-1s", "-np", "2", ring}, 2, "must not be negative"},
		{"timeout-garbage", []string{"-np", "2", "--timeout", "soon", ring}, 2, `invalid duration "soon"`},
		{"grace-zero", []string{"-np", "2", "--grace", "0", ring}, 2, "must be positive"},
		{"x-no-name", []string{"-np", "2", "-x", "=foo", ring}, 2, "not VAR or VAR=value"},
		{"x-unset", []string{"-np", "2", "-x", "GOMPI_TESTS_SURELY_UNSET", ring}, 2, "is not set"},
		{"param-no-value", []string{"-np", "2", "--param", "novalue", ring}, 2, "is not NAME=VALUE"},
		{"param-bad-name", []string{"-np", "2", "--param", "a b=1", ring}, 0, "bad parameter name"},
		// Programs that cannot run.
		{"no-such-program", []string{"-np", "2", "/no/such/program"}, 0, "/no/such/program"},
		{"not-executable", []string{"-np", "2", text}, 0, "not executable"},
		{"not-a-go-package", []string{"-np", "2", t.TempDir()}, 0, "go build"},
		// Parameter values the ranks reject in Init.
		{"param-unknown", []string{"-np", "2", "--param", "no_such_param=1", ring}, 0, `unknown parameter "no_such_param"`},
		{"param-size-garbage", []string{"-np", "2", "--param", "btl_sm_eager_limit=abc", ring}, 0, `btl_sm_eager_limit="abc"`},
		{"param-size-negative", []string{"-np", "2", "--param", "btl_tcp_eager_limit=-5", ring}, 0, `btl_tcp_eager_limit="-5"`},
		{"param-duration-garbage", []string{"-np", "2", "--param", "pml_wait_spin=forever", ring}, 0, `pml_wait_spin="forever"`},
		{"param-bool-garbage", []string{"-np", "2", "--param", "stats=maybe", ring}, 0, `stats="maybe"`},
		{"protocol-unknown", []string{"-np", "2", "--protocol", "bogus", ring}, 0, `pml_force_protocol="bogus"`},
		{"btl-unknown", []string{"-np", "2", "--btl", "nosuch", ring}, 0, "no transport reaches rank"},
		{"btl-self-only", []string{"-np", "2", "--btl", "self", ring}, 0, "no transport reaches rank"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, code := gorun(t, 60*time.Second, append([]string{"--timeout", "30s"}, c.args...)...)
			if c.code != 0 {
				require.Equal(t, c.code, code, out)
			} else {
				require.NotEqual(t, 0, code, out)
			}
			require.Contains(t, out, c.msg)
			require.NotContains(t, out, "goroutine ")
			require.NotContains(t, out, "panic")
			if code == 2 {
				require.Contains(t, out, "usage: gorun -np N")
			}
		})
	}
}
