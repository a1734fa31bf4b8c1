package tests

// A bad value of a transport parameter fails Init with a message that
// names the parameter: it used to be logged under --verbose only, so the
// job ran without that transport (or failed with "no transport reaches").

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestBadTransportParamIsReported(t *testing.T) {
	cases := []struct{ name, btl, param, name2 string }{
		{"tcp-links-default-btl", "", "btl_tcp_links=0", "btl_tcp_links"},
		{"tcp-links", "self,tcp", "btl_tcp_links=0", "btl_tcp_links"},
		{"sm-fbox-size", "self,sm", "btl_sm_fbox_size=1000", "btl_sm_fbox_size"},
		{"sm-segment-size", "self,sm", "btl_sm_segment_size=1", "btl_sm_segment_size"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			args := []string{"-np", "2", "--timeout", "30s", "--param", c.param}
			if c.btl != "" {
				args = append(args, "--btl", c.btl)
			}
			out, code := gorun(t, 60*time.Second, append(args, prog("ring"))...)
			require.NotEqual(t, 0, code, out)
			require.Contains(t, out, c.name2, out)
		})
	}
}
