package pml

import "github.com/gompi-org/gompi/btl"

// PeerEndpoint returns the transport endpoint this engine uses for world
// rank r (nil when none was chosen, or r is out of range). Layers above
// the PML that move data themselves (the tensor rendezvous's puts) use it,
// so that their data and the engine's messages to r take the same
// endpoint, whose ordering (a Put's data lands before a fragment sent after
// the Put completed) they rely on.
func (e *Engine) PeerEndpoint(r int) btl.Endpoint {
	if r < 0 || r >= len(e.peers) {
		return nil
	}
	if p := e.peers[r].Load(); p != nil {
		return p.ep
	}
	return nil
}
