//go:build amd64 && !race

package atom

import "sync/atomic"

// StoreRel64 stores v into *p with release order (see the package doc).
//
//go:noescape
func StoreRel64(p *atomic.Uint64, v uint64)

// PrefetchW asks for the cache line at p in the exclusive state, to be
// written soon (a hint: it never faults and does not wait).
//
//go:noescape
func PrefetchW(p *byte)

// Prefetch asks for the cache line at p, to be read soon (a hint: it
// never faults and does not wait).
//
//go:noescape
func Prefetch(p *byte)
