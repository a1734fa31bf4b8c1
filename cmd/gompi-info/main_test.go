package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func runInfo(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var out, errw bytes.Buffer
	code := run(args, &out, &errw)
	return code, out.String(), errw.String()
}

// The parameter table shows every contract parameter with its default,
// value and where the value came from.
func TestParameterTable(t *testing.T) {
	t.Setenv("GOMPI_BTL_TCP_EAGER_LIMIT", "32k")
	code, out, _ := runInfo(t, "--param", "pml_send_pipeline_depth=7")
	require.Equal(t, 0, code)
	for _, name := range []string{"btl", "btl_self_eager_limit", "btl_tcp_rndv_eager_limit", "btl_sm_flags",
		"pml_send_pipeline_depth", "pml_force_protocol"} {
		require.Regexp(t, regexp.MustCompile(`(?m)^`+name+`\s`), out, "parameter %s listed", name)
	}
	require.Regexp(t, `(?m)^pml_send_pipeline_depth\s+int\s+3\s+7\s+flag\s`, out)
	require.Regexp(t, `(?m)^btl_tcp_eager_limit\s+size\s+64k\s+32k\s+environment\s`, out)
	require.Regexp(t, `(?m)^btl_self_eager_limit\s+size\s+1k\s+1k\s+default\s`, out)
	require.Contains(t, out, "self   usable")
}

// --protocols lists, per transport, which protocol each size range gets,
// and follows the parameters.
func TestProtocolTable(t *testing.T) {
	code, out, _ := runInfo(t, "--protocols", "--param", "btl_self_eager_limit=4k")
	require.Equal(t, 0, code)
	self := out[strings.Index(out, "  self ("):]
	require.Contains(t, self, "257 B .. 4080 B              eager_prepared")
	require.Contains(t, self, "rdma_get")
	// sm cannot open without a peer on the host, yet its table follows
	// from its parameters.
	require.Regexp(t, `(?s)  sm \(.*?eager payload <= 16432 B.*?16433 B \.\. `, out)

	code, out, _ = runInfo(t, "--protocols", "--param", "pml_force_protocol=send_pipeline")
	require.Equal(t, 0, code)
	self = out[strings.Index(out, "  self ("):]
	require.Regexp(t, `0 B and up\s+send_pipeline`, self)
	require.NotContains(t, self, "rdma_get")

	// Every bound in bytes, so that neighbouring rows read alike.
	code, out, _ = runInfo(t, "--protocols")
	require.Equal(t, 0, code)
	require.NotRegexp(t, `\d [KMG]iB`, out[strings.Index(out, "Protocols by message size"):])
}

// --help prints the usage line and the flags, and exits 0.
func TestHelp(t *testing.T) {
	code, _, errs := runInfo(t, "--help")
	require.Equal(t, 0, code)
	require.Contains(t, errs, "usage: gompi-info [--protocols] [--param name=value]")
	require.Contains(t, errs, "--protocols")
}

// Bad flags and bad parameter values: an error that names the problem and
// a non-zero exit status.
func TestBadArguments(t *testing.T) {
	code, _, errs := runInfo(t, "--no-such-flag")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "no-such-flag")

	code, _, errs = runInfo(t, "--param", "novalue")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "want name=value")

	code, _, errs = runInfo(t, "--param", "btl_self_eager_limit=lots")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "btl_self_eager_limit")

	code, _, errs = runInfo(t, "--param", "no_such_param=1")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "no_such_param")
}
