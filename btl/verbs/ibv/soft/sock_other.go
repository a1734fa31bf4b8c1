//go:build !linux

package soft

import (
	"fmt"
	"net/netip"
	"sync/atomic"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// The soft device needs Linux's batched UDP system calls; elsewhere Open
// fails with an error wrapping mpierr.ErrNotSupported.
type sock struct {
	gso         atomic.Bool
	gro         bool
	closed      atomic.Bool
	local       netip.AddrPort
	connectedTo netip.AddrPort
}

type txState struct{}

type rxState struct {
	msgs  []struct{}
	limit int
}

func newTxState(int) *txState         { return &txState{} }
func newRxState(n, size int) *rxState { return &rxState{} }

func openSock(addr netip.Addr, port int, bufBytes int, noGSO bool) (*sock, error) {
	return nil, fmt.Errorf("soft: the soft verbs device runs on Linux: %w", mpierr.ErrNotSupported)
}

func openTxSock(netip.AddrPort, netip.AddrPort, int, bool) (*sock, error) {
	return nil, mpierr.ErrNotSupported
}

func (s *sock) readLoop(func() bool)                 {}
func (s *sock) close()                               {}
func (s *sock) send(*txState, *txBatch) (int, error) { return 0, mpierr.ErrNotSupported }
func (s *sock) recv(*rxState, bool) (int, error)     { return 0, mpierr.ErrNotSupported }
func (r *rxState) datagram(int) ([]byte, int, netip.AddrPort, bool) {
	return nil, 0, netip.AddrPort{}, false
}
