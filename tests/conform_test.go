package tests

import (
	"context"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestConform runs the conformance program (every size from 0 B to 16 MiB
// between every pair, byte checks, order of interleaved eager/rendezvous
// messages to an AnyTag receiver, AnySource, receives completed by Waitany,
// Waitsome and loops of Test, a ring of persistent requests
// and of SendrecvReplace, and vector, indexed, struct-with-holes and
// subarray datatypes both ways) over every transport.
func TestConform(t *testing.T) {
	for _, tr := range transports {
		for _, np := range []string{"2", "3"} {
			t.Run(tr.name+"/np="+np, func(t *testing.T) {
				out, code := gorun(t, 120*time.Second, "-np", np, "--oversubscribe", "--timeout", "100s",
					"--btl", tr.btl, prog("conform"))
				require.Equal(t, 0, code, out)
				require.Contains(t, out, "conform ok")
			})
		}
	}
}

// TestConformForcedProtocols runs the conformance program with every
// protocol forced, over every transport, and checks with --stats that the
// forced protocol really carried messages (where the transport offers it:
// tcp has no get, so rdma_get falls back there).
func TestConformForcedProtocols(t *testing.T) {
	for _, tr := range transports {
		for _, p := range []string{"eager", "rdma_put", "rdma_get", "send_pipeline", "rdma_pipeline"} {
			t.Run(tr.name+"/"+p, func(t *testing.T) {
				out, code := gorun(t, 120*time.Second, "-np", "2", "--timeout", "100s", "--btl", tr.btl, "--protocol", p,
					"--stats", "--tag-output", "--param", "btl_tcp_rdma_pipeline_frag_size=256k", prog("conform"))
				require.Equal(t, 0, code, out)
				require.Contains(t, out, "conform ok")
				if tr.name == "tcp" && p == "rdma_get" {
					return
				}
				// Both ranks sent messages with the protocol.
				for r := range 2 {
					require.Regexp(t, `(?m)^\[`+strconv.Itoa(r)+`\]\s+protocol `+p+`\S*\s+[1-9]\d* messages`, out,
						"rank %d did not use protocol %s", r, p)
				}
			})
		}
	}
}

// TestConformEagerLarge raises the eager limit to 4 MiB so that messages of
// several MiB (plain and derived datatypes) go eagerly. It sets only the
// transport's own limits, with --param (gorun's --eager-limit sets every
// transport's).
func TestConformEagerLarge(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out, code := gorun(t, 120*time.Second, "-np", "2", "--timeout", "100s", "--btl", tr.btl, "--protocol", "eager", "--stats", "--tag-output",
				"--param", "btl_"+tr.name+"_eager_limit=4m", "--param", "btl_"+tr.name+"_max_send_size=4m",
				"--param", "btl_sm_segment_size=256m", prog("conform"))
			require.Equal(t, 0, code, out)
			require.Contains(t, out, "conform ok")
			big := false
			for _, u := range regexp.MustCompile(`(?m)^\[\d+\]\s+protocol eager\S*\s+(\d+) messages (\d+) B`).FindAllStringSubmatch(out, -1) {
				n, _ := strconv.Atoi(u[1])
				b, _ := strconv.Atoi(u[2])
				big = big || b/n >= 1<<20
			}
			require.True(t, big, "no eager traffic of MiB-sized messages:\n%s", out)
		})
	}
}

func TestSingleton(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, prog("conform")).CombinedOutput()
	require.NoError(t, err, string(out))
	require.Contains(t, string(out), "conform ok")
}

// TestBurstAfterInit: with 8 ranks on 2 cores, every rank sends to every
// other right after Init, so fragments reach ranks that are still inside
// Init; every value must arrive. (Over sm only: over tcp such fragments are
// lost, see pending_tcp_early_fragment_test.go.txt.)
func TestBurstAfterInit(t *testing.T) {
	for i := range 5 {
		out, code := gorun(t, 60*time.Second, "-np", "8", "--oversubscribe", "--timeout", "30s", "--btl", "self,sm", prog("burst"))
		require.Equal(t, 0, code, "run %d:\n%s", i, out)
		require.Contains(t, out, "burst ok")
	}
}

// TestConformSharedGet runs the conformance program over sm with Gets of
// 256 KiB and more shared in 64 KiB chunks: every byte is checked by the
// program, and --stats shows that the owners of the memory copied part of
// them (they wait in Send or Wait, idle, while the receiver reads).
func TestConformSharedGet(t *testing.T) {
	out, code := gorun(t, 120*time.Second, "-np", "2", "--timeout", "100s", "--btl", "self,sm", "--stats", "--tag-output",
		"--param", "btl_sm_get_split=256k", "--param", "btl_sm_get_chunk=64k", prog("conform"))
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "conform ok")
	require.Regexp(t, `(?m)^\[\d\]\s+transport sm\s+copied [1-9]\d* B of peers' gets`, out)
}
