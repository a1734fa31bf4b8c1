package pml

import (
	"testing"

	"github.com/gompi-org/gompi/btl"
)

// stubEP is an endpoint whose module reports given capabilities and limits.
type stubEP struct {
	btl.Endpoint
	m *stubModule
}

type stubModule struct {
	btl.Module
	caps btl.Caps
	lim  btl.Limits
}

func (e stubEP) Module() btl.Module      { return e.m }
func (m *stubModule) Caps() btl.Caps     { return m.caps }
func (m *stubModule) Limits() btl.Limits { return m.lim }

// The send fast path skips Select for payloads up to peer.immMax and up to
// peer.prepMax: it must answer exactly what Select answers for a standard
// or ready send of contiguous data without a forced protocol.
func TestPeerImmediateMaxAgreesWithSelect(t *testing.T) {
	for _, caps := range []btl.Caps{0, btl.CapSendImmediate, btl.CapSendImmediate | btl.CapRDMA | btl.CapSendInPlace, btl.CapSendInPlace} {
		for _, eager := range []int{0, 10, 16, 64, 1024, 4160, 16448, 1 << 20} {
			lim := btl.Limits{EagerLimit: eager, RndvEagerLimit: 512, MaxSendSize: 4096}
			p := newPeer(0, stubEP{m: &stubModule{caps: caps, lim: lim}})
			for _, mode := range []Mode{Standard, Ready} {
				for size := 0; size <= eager+2; size++ {
					if size > 2*ImmediateMax+2 && size < eager-66 {
						size = eager - 66 // and the sizes around the eager limit
					}
					got := Select(SendInfo{Mode: mode, Size: size, Contiguous: true, Caps: caps, Limits: lim})
					if imm := got == EagerImmediate; imm != (size <= p.immMax) {
						t.Fatalf("caps %v eager limit %d mode %v size %d: Select immediate %v, immMax %d", caps, eager, mode, size, imm, p.immMax)
					}
					if prep := got == EagerPrepared; prep != (size > p.immMax && size != 0 && size <= p.prepMax) {
						t.Fatalf("caps %v eager limit %d mode %v size %d: Select prepared %v, immMax %d, prepMax %d", caps, eager, mode, size, prep, p.immMax, p.prepMax)
					}
				}
			}
		}
	}
}
