package tests

import (
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

var (
	tensorBuild    sync.Once
	tensorBuildErr error
	tensorBuildOut []byte
)

// buildTensor builds the tensor rendezvous's test program and example
// into the tests' bin folder (once).
func buildTensor(t *testing.T) {
	t.Helper()
	tensorBuild.Do(func() {
		tensorBuildOut, tensorBuildErr = exec.Command("go", "build", "-o", bin+"/tensorprog", "./progs/tensor").CombinedOutput()
		if tensorBuildErr == nil {
			var out []byte
			out, tensorBuildErr = exec.Command("go", "build", "-o", bin+"/tensorexample", "../examples/tensor").CombinedOutput()
			tensorBuildOut = append(tensorBuildOut, out...)
		}
	})
	require.NoError(t, tensorBuildErr, "%s", tensorBuildOut)
}

// TestTensorExchange runs the rendezvous between processes over sm and
// tcp: contents, a changed shape, strings, dead tensors, ERROR_STATUS and
// the counters (the program checks one request per tensor in the steady
// state, two at the first step and after the change).
func TestTensorExchange(t *testing.T) {
	buildTensor(t)
	for _, tr := range transports {
		for _, np := range []int{2, 3} {
			t.Run(tr.name+"/np="+strconv.Itoa(np), func(t *testing.T) {
				out, code := gorun(t, 90*time.Second, "-np", strconv.Itoa(np), "--oversubscribe", "--btl", tr.btl, "--timeout", "80s", prog("tensorprog"), "exchange")
				require.Equal(t, 0, code, out)
				oks := regexp.MustCompile(`rank \d: ok requests=(\d+) rerequests=(\d+) metas=(\d+) control=(\d+) puts=(\d+) gets=(\d+) messages=1 .* errors=2`).FindAllStringSubmatch(out, -1)
				require.Len(t, oks, np, out)
				peers := np - 1
				for _, ok := range oks {
					// 6 steps x peers tensors + 3 extra receives; re-requests at
					// steps 0 and 3 and for the string and dead tensors.
					require.Equal(t, strconv.Itoa(6*peers+3), ok[1], out)
					require.Equal(t, strconv.Itoa(2*peers+2), ok[2], out)
					require.Equal(t, ok[2], ok[3], out) // every re-request answers a META_DATA_RESPONSE
					// Writes: one per 1 MiB tensor: puts, or over sm, where
					// the receivers read them, gets. The string tensor's few
					// bytes ride in its NOTIFY (messages=1); the dead tensor
					// and the invalid one have no content.
					puts, _ := strconv.Atoi(ok[5])
					gets, _ := strconv.Atoi(ok[6])
					require.Equal(t, 6*peers, puts+gets, out)
					if tr.name == "sm" {
						require.Equal(t, 6*peers, gets, out)
					}
				}
			})
		}
	}
}

// TestTensorSteadyState: once the meta-data is cached, a tensor costs
// one control message (TENSOR_REQUEST) and one write, notified by a
// NOTIFY message, or, over verbs, by the write's immediate (no NOTIFY).
// Over sm the receiver reads the 64 KiB tensor instead (a get, announced
// by the NOTIFY; its release rides in the next request).
func TestTensorSteadyState(t *testing.T) {
	buildTensor(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out, code := gorun(t, 60*time.Second, "-np", "2", "--btl", tr.btl, "--timeout", "50s", prog("tensorprog"), "steady")
			require.Equal(t, 0, code, out)
			notifies := "1.00"
			if tr.name == "verbs" {
				notifies = "0.00"
			}
			require.Contains(t, out, "steady: control=1.00 puts=1.00 notifies="+notifies, out)
		})
	}
}

// TestTensorDeadPeer: a rank that dies fails the receives waiting for it
// with ErrProcFailed.
func TestTensorDeadPeer(t *testing.T) {
	buildTensor(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out, code := gorun(t, 60*time.Second, "-np", "2", "--btl", tr.btl, "--grace", "3s", "--timeout", "50s", prog("tensorprog"), "dead")
			require.Equal(t, 3, code, out)
			require.Contains(t, out, "gorun: rank 1 (pid ", out)
			require.Regexp(t, `rank 0: tensor recv returned: .* \(ErrProcFailed=true\)`, out)
		})
	}
}

// TestTensorAbort: one rank's Abort reaches every other rank.
func TestTensorAbort(t *testing.T) {
	buildTensor(t)
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			out, code := gorun(t, 60*time.Second, "-np", "3", "--oversubscribe", "--btl", tr.btl, "--timeout", "50s", prog("tensorprog"), "abort")
			require.Equal(t, 0, code, out)
			require.Regexp(t, `rank 0: aborted: .*loss is NaN.* \(ErrAborted=true\)`, out)
			require.Regexp(t, `rank 1: aborted: .*loss is NaN.* \(ErrAborted=true\)`, out)
			require.Regexp(t, `rank 2: aborted: loss is NaN`, out)
		})
	}
}

// TestTensorExample runs examples/tensor with 2 and 4 workers.
func TestTensorExample(t *testing.T) {
	buildTensor(t)
	for _, np := range []string{"2", "4"} {
		out, code := gorun(t, 120*time.Second, "-np", np, "--oversubscribe", "--timeout", "100s", prog("tensorexample"), "-checksum")
		require.Equal(t, 0, code, out)
		require.Contains(t, out, np+" workers agree after 8 steps", out)
	}
}
