package pmi

import (
	"bufio"
	"bytes"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// Responses as hydra 4.0.2 and Slurm's pmi2 plugin send them.
var (
	v1Samples = []string{
		"cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0",
		"cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024",
		"cmd=appnum appnum=0",
		"cmd=my_kvsname kvsname=kvs_22389_0_2019908348_vm",
		"cmd=get_result rc=0 msg=success value=(vector,(0,1,1))",
		"cmd=get_result rc=-1 msg=key_nokey_not_found value=unknown",
		"cmd=put_result rc=0 msg=success",
		"cmd=barrier_out",
		"cmd=finalize_ack",
		"cmd=initack",
		"cmd=set size=2",
		`cmd=abort exitcode=3 message=hello\ world`,
	}
	v2Samples = []string{
		"cmd=fullinit-response;pmi-version=2;pmi-subversion=0;rank=0;size=2;appnum=0;debugged=FALSE;pmiverbose=FALSE;rc=0;",
		"cmd=job-getid-response;jobid=kvs_22476_0_655202522_vm;rc=0;",
		"cmd=info-getjobattr-response;found=TRUE;value=(vector,(0,1,1));rc=0;",
		"cmd=kvs-get-response;found=TRUE;value=v;rc=0;",
		"cmd=kvs-get-response;found=FALSE;rc=0;",
		"cmd=kvs-fence-response;rc=0;",
		"cmd=kvs-fence-response;rc=1;errmsg=rank_3_died;",
		"cmd=finalize-response;rc=0;",
	}
)

func TestDecodeV1(t *testing.T) {
	m, err := decodeV1([]byte("cmd=get_result rc=0 msg=success value=(vector,(0,1,1))"))
	require.NoError(t, err)
	require.Equal(t, "get_result", m.cmd)
	v, ok := m.get("value")
	require.True(t, ok)
	require.Equal(t, "(vector,(0,1,1))", v)
	require.NoError(t, m.rcErr())

	m, err = decodeV1([]byte(`cmd=abort exitcode=3 message=hello\ world flag`))
	require.NoError(t, err)
	v, _ = m.get("message")
	require.Equal(t, "hello world", v)
	require.True(t, m.attrs[2].noValue)

	m, err = decodeV1([]byte("cmd=get_result rc=-1 msg=key_x_not_found value=unknown"))
	require.NoError(t, err)
	var se *ServerError
	require.ErrorAs(t, m.rcErr(), &se)
	require.Equal(t, "-1", se.RC)
	require.Equal(t, "key_x_not_found", se.Msg)

	for _, bad := range []string{"", "cmd=", "get_result rc=0", "cmd=x =y", "cmd=x k\x00=1", "cmd=x k;=1"} {
		_, err := decodeV1([]byte(bad))
		require.ErrorIs(t, err, ErrProtocol, "%q", bad)
	}
}

func TestDecodeV2(t *testing.T) {
	m, err := decodeV2([]byte(v2Samples[0]))
	require.NoError(t, err)
	require.Equal(t, "fullinit-response", m.cmd)
	n, err := m.getInt("size")
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, err = m.getInt("debugged")
	require.ErrorIs(t, err, ErrProtocol)
	_, err = m.getInt("missing")
	require.ErrorIs(t, err, ErrProtocol)

	m, err = decodeV2([]byte(v2Samples[6]))
	require.NoError(t, err)
	require.ErrorContains(t, m.rcErr(), "rank_3_died")

	for _, bad := range []string{"", "cmd=;", "x=1;", "cmd=a;=b;", "cmd=a;k k=1;"} {
		_, err := decodeV2([]byte(bad))
		require.ErrorIs(t, err, ErrProtocol, "%q", bad)
	}
}

func TestV1RoundTrip(t *testing.T) {
	b, err := appendV1(nil, "put", "kvsname", "kvs_1", "key", "btl.tcp.0", "value", "1:AAEC-_")
	require.NoError(t, err)
	require.Equal(t, "cmd=put kvsname=kvs_1 key=btl.tcp.0 value=1:AAEC-_\n", string(b))
	m, err := readV1(bufio.NewReader(bytes.NewReader(b)))
	require.NoError(t, err)
	require.Equal(t, msg{cmd: "put", attrs: []attr{{key: "kvsname", value: "kvs_1"}, {key: "key", value: "btl.tcp.0"}, {key: "value", value: "1:AAEC-_"}}}, m)
}

func TestV2RoundTrip(t *testing.T) {
	b, err := appendV2(nil, "kvs-put", "key", "k", "value", "v")
	require.NoError(t, err)
	require.Equal(t, "26    cmd=kvs-put;key=k;value=v;", string(b))
	m, err := readV2(bufio.NewReader(bytes.NewReader(b)))
	require.NoError(t, err)
	require.Equal(t, msg{cmd: "kvs-put", attrs: []attr{{key: "key", value: "k"}, {key: "value", value: "v"}}}, m)
	// hydra pads on the left.
	m, err = readV2(bufio.NewReader(bytes.NewReader([]byte("    28cmd=kvs-fence-response;rc=0;"))))
	require.NoError(t, err)
	require.Equal(t, "kvs-fence-response", m.cmd)
}

func TestEncodeRefusesUnsendable(t *testing.T) {
	for _, v := range []string{"a b", "a;b", `a\b`, "a\nb", "é"} {
		_, err := appendV1(nil, "put", "key", "k", "value", v)
		require.Error(t, err, "%q", v)
		_, err = appendV2(nil, "kvs-put", "key", "k", "value", v)
		require.Error(t, err, "%q", v)
	}
	_, err := appendV1(nil, "put", "key=", "v")
	require.Error(t, err)
	require.Equal(t, "a_b_c", sanitize("a b;c"))
}

func TestReadErrors(t *testing.T) {
	_, err := readV1(bufio.NewReader(bytes.NewReader([]byte("cmd=barrier_out"))))
	require.True(t, errors.Is(err, errUnexpectedEOF()), "%v", err)
	_, err = readV1(bufio.NewReader(bytes.NewReader(bytes.Repeat([]byte("a"), maxLine+10))))
	require.ErrorIs(t, err, ErrProtocol)
	for _, hdr := range []string{"abcdef", "-1    ", "999999", "+5    "} {
		_, err = readV2(bufio.NewReader(bytes.NewReader([]byte(hdr + "cmd=x;"))))
		require.ErrorIs(t, err, ErrProtocol, "%q", hdr)
	}
	_, err = readV2(bufio.NewReader(bytes.NewReader([]byte("10    cmd=x;"))))
	require.True(t, errors.Is(err, errUnexpectedEOF()), "%v", err)
}

func TestMapping(t *testing.T) {
	for _, c := range []struct {
		m     string
		size  int
		nodes []int
	}{
		{"(vector,(0,1,1))", 3, []int{0, 0, 0}},
		{"(vector,(0,2,2))", 4, []int{0, 0, 1, 1}},
		{"(vector,(0,2,4),(2,1,3))", 11, []int{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2}},
		{"(vector,(0,2,1))", 5, []int{0, 1, 0, 1, 0}},
		{" (vector,(1,1,2)) ", 2, []int{1, 1}},
	} {
		b, err := parseMapping(c.m)
		require.NoError(t, err, c.m)
		require.Equal(t, c.nodes, nodeOf(b, c.size), c.m)
	}
	nodes := []int{0, 0, 1, 0, 1}
	l, n := localOf(nodes, 3)
	require.Equal(t, []int{2, 3}, []int{l, n})
	l, n = localOf(nodes, 4)
	require.Equal(t, []int{1, 2}, []int{l, n})
	for _, bad := range []string{"", "(vector,)", "(vector,(0,1))", "(vector,(0,0,1))", "(vector,(0,1,x))", "(list,(0,1,1))", "(vector,(0,1,1)", "(vector,(-1,1,1))"} {
		_, err := parseMapping(bad)
		require.ErrorIs(t, err, ErrProtocol, "%q", bad)
	}
}
