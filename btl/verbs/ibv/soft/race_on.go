//go:build race

package soft

import "sync/atomic"

// wireFence gives the race detector the order the network gives: a
// packet is built (reading registered memory) before it is sent, and
// received before it is executed (writing registered memory), and its
// answer comes after. The kernel carries that order between goroutines,
// unseen by the detector; a read-modify-write of one atomic at each end
// shows it. Built only with -race.
var wireFence atomic.Uint64

func wireSync() { wireFence.Add(1) }
