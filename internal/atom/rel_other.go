//go:build !amd64 || race

package atom

import "sync/atomic"

// StoreRel64 stores v into *p with (at least) release order.
func StoreRel64(p *atomic.Uint64, v uint64) { p.Store(v) }

// PrefetchW is a no-op here.
func PrefetchW(p *byte) {}

// Prefetch is a no-op here.
func Prefetch(p *byte) {}
