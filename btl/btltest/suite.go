package btltest

import (
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
)

// Peer is one world rank of a test job.
type Peer struct {
	Module   btl.Module
	Dispatch *btl.Dispatcher // the Dispatcher of the Env the module was opened with
	// Kill, if set, ends the module as a crash of its process would: no
	// goodbye to the peers. The failure tests are skipped without it.
	Kill func()
	// WouldBlock, if set, makes the module's next n Send, SendAlloc, Put
	// and Get calls refuse with ErrWouldBlock (its queues full), n < 0
	// every call until WouldBlock(0). The WouldBlock test is skipped
	// without it.
	WouldBlock func(n int)
}

// The tags the suite registers.
const (
	TagData   btl.Tag = 0x41
	TagMarker btl.Tag = 0x42
	TagCheck  btl.Tag = 0x43 // PutVisible's: its handler looks at the registered memory
)

// Timeout bounds every wait of the suite.
var Timeout = 30 * time.Second

// Run runs the conformance suite. mk builds n modules, one per world rank
// 0..n-1, able to reach one another; it is called once per subtest and
// must arrange their Close with t.Cleanup (the suite may Close or Kill some
// of them first, so Close must tolerate both).
//
// The subtests check: per-endpoint order and payload bytes of many
// fragments of random sizes up to MaxSendSize between 3 ranks; the exact
// hdr/data split; SendImmediate delivers or refuses with ErrWouldBlock (and
// then nothing arrives) and keeps no reference to its buffers;
// Alloc/SendAlloc/Free; exactly-once, per-sender-ordered delivery from 8
// concurrent goroutines; Put and Get (as the caps allow) of 0 B to 16 MiB at
// offsets, leaving the bytes outside the range untouched; undecodable
// handles and out-of-range offsets fail with ErrBadHandle and write nothing;
// after Close every operation fails with ErrClosed; a killed peer is
// reported with PeerFailed (an error wrapping mpierr.ErrProcFailed) once,
// sends in flight to it complete, later ones fail, and other peers are
// unaffected. Flush completes at once on an endpoint where nothing was
// posted, and otherwise only after every Send, SendAlloc, Put and Get
// posted before it completed, once. A fragment sent after a Put completed
// (its completion, or a Flush's) finds the Put's data in the peer's
// memory when its handler runs. An operation refused with ErrWouldBlock
// (Peer.WouldBlock) delivers and writes nothing and calls no completion.
// Every wait is bounded by Timeout; the suite retries operations refused
// with ErrWouldBlock.
//
// The Polled subtests repeat some of these while a goroutine per rank
// calls Progress in a loop, for modules that implement btl.Poller.
func Run(t *testing.T, mk func(t *testing.T, n int) []Peer) {
	t.Run("Ordered", func(t *testing.T) { testOrdered(t, mk) })
	t.Run("HdrDataSplit", func(t *testing.T) { testSplit(t, mk) })
	t.Run("SendImmediate", func(t *testing.T) { testSendImmediate(t, mk) })
	t.Run("Alloc", func(t *testing.T) { testAlloc(t, mk) })
	t.Run("ConcurrentSenders", func(t *testing.T) { testConcurrent(t, mk) })
	t.Run("PutGet", func(t *testing.T) { testPutGet(t, mk) })
	t.Run("BadHandle", func(t *testing.T) { testBadHandle(t, mk) })
	t.Run("Close", func(t *testing.T) { testClose(t, mk) })
	t.Run("PeerKilled", func(t *testing.T) { testPeerKilled(t, mk) })
	t.Run("PeerKilledBeforeConnect", func(t *testing.T) { testKilledBeforeConnect(t, mk) })
	t.Run("FlushIdle", func(t *testing.T) { testFlushIdle(t, mk) })
	t.Run("Flush", func(t *testing.T) { testFlush(t, mk) })
	t.Run("PutVisible", func(t *testing.T) { testPutVisible(t, mk) })
	t.Run("WouldBlock", func(t *testing.T) { testWouldBlock(t, mk) })
	t.Run("Polled", func(t *testing.T) {
		pmk := polled(mk)
		t.Run("Ordered", func(t *testing.T) { testOrdered(t, pmk) })
		t.Run("ConcurrentSenders", func(t *testing.T) { testConcurrent(t, pmk) })
		t.Run("PutGet", func(t *testing.T) { testPutGet(t, pmk) })
		t.Run("PeerKilled", func(t *testing.T) { testPeerKilled(t, pmk) })
		t.Run("Flush", func(t *testing.T) { testFlush(t, pmk) })
		t.Run("PutVisible", func(t *testing.T) { testPutVisible(t, pmk) })
	})
}

// polled wraps mk so that, for every module that is a btl.Poller, a
// goroutine calls Progress in a loop (as a PML spinning in a wait does)
// while the module's own goroutines deliver too; Block is called now and
// then. The subtests then check that polling changes nothing a user sees:
// bytes, order, exactly-once delivery, failure reports. Modules that are
// not Pollers run as in the plain subtests.
func polled(mk func(*testing.T, int) []Peer) func(*testing.T, int) []Peer {
	return func(t *testing.T, n int) []Peer {
		peers := mk(t, n)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for _, p := range peers {
			pl, ok := p.Module.(btl.Poller)
			if !ok {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				idle := 0
				for {
					select {
					case <-stop:
						return
					default:
					}
					if pl.Progress() > 0 {
						idle = 0
						continue
					}
					if idle++; idle%4096 == 0 {
						pl.Block(stop)
					} else {
						runtime.Gosched()
					}
				}
			}()
		}
		t.Cleanup(func() { close(stop); wg.Wait() }) // before mk's cleanups close the modules
		return peers
	}
}
