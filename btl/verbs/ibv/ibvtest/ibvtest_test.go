package ibvtest

import (
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

func TestCaseNamesUnique(t *testing.T) {
	seen := map[string]bool{}
	for _, n := range Cases() {
		if seen[n] {
			t.Errorf("case %q twice", n)
		}
		seen[n] = true
	}
	if len(seen) < 30 {
		t.Errorf("only %d cases", len(seen))
	}
}

// The attribute builders give exactly the masks ibv says each transition
// requires, and the values they name.
func TestAttrBuilders(t *testing.T) {
	o := DefaultConnOpts()
	local := Endpoint{QPN: 0x11, PSN: 0x222, GIDIndex: 3, Port: 1, MTU: ibv.MTU4096, Global: true}
	remote := Endpoint{QPN: 0x33, PSN: 0x444, LID: 5, MTU: ibv.MTU1024, Global: true}

	a, m := InitAttr(1, o)
	if m != ibv.MaskResetToInit || a.State != ibv.QPSInit || a.Port != 1 || a.AccessFlags != o.Access {
		t.Errorf("InitAttr: %+v mask %#x", a, m)
	}
	a, m = RTRAttr(local, remote, o)
	if m != ibv.MaskInitToRTR || a.State != ibv.QPSRTR || a.DestQPN != 0x33 || a.RQPSN != 0x444 ||
		a.PathMTU != ibv.MTU1024 || a.AH.SGIDIndex != 3 || !a.AH.IsGlobal || a.AH.DLID != 5 || a.MinRNRTimer != 1 {
		t.Errorf("RTRAttr: %+v mask %#x", a, m)
	}
	o.MTU = ibv.MTU512
	if a, _ = RTRAttr(local, remote, o); a.PathMTU != ibv.MTU512 {
		t.Errorf("RTRAttr with an MTU cap of 512: path MTU %v", a.PathMTU)
	}
	a, m = RTSAttr(local, o)
	if m != ibv.MaskRTRToRTS || a.State != ibv.QPSRTS || a.SQPSN != 0x222 || a.RetryCnt != 7 || a.RNRRetry != 7 || a.Timeout != 14 {
		t.Errorf("RTSAttr: %+v mask %#x", a, m)
	}
}

func TestPSNsAre24Bits(t *testing.T) {
	for qpn := uint32(0); qpn < 1000; qpn++ {
		if p := psnOf(qpn); p>>24 != 0 {
			t.Fatalf("psnOf(%d) = %#x", qpn, p)
		}
	}
}
