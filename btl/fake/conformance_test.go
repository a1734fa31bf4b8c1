package fake_test

import (
	"runtime"
	"sync"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/btl/fake"
)

// peers attaches n ranks to net and describes them for the suite.
func peers(net *fake.Network, n int) []btltest.Peer {
	ps := make([]btltest.Peer, n)
	for r := range n {
		d := &btl.Dispatcher{}
		m := net.Attach(r, d, fake.DefaultConfig())
		ps[r] = btltest.Peer{Module: m, Dispatch: d, Kill: func() { net.Kill(r); m.Close() }, WouldBlock: net.WouldBlock}
	}
	return ps
}

// TestConformanceInline runs the transport suite over an inline network:
// every operation happens during its call, as over btl/self.
func TestConformanceInline(t *testing.T) {
	btltest.Run(t, func(t *testing.T, n int) []btltest.Peer {
		net := fake.NewNetwork()
		net.SetInline(true)
		net.SetTraceStarts(false)
		return peers(net, n)
	})
}

// TestConformanceQueued runs the suite over a queued network that a
// goroutine delivers, oldest operation first, as an asynchronous transport
// would: completions and Flushes come later, from that goroutine.
func TestConformanceQueued(t *testing.T) {
	btltest.Run(t, func(t *testing.T, n int) []btltest.Peer {
		net := fake.NewNetwork()
		net.SetTraceStarts(false)
		ps := peers(net, n)
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if !net.Step() {
					runtime.Gosched()
				}
			}
		}()
		t.Cleanup(func() { close(stop); wg.Wait() })
		return ps
	})
}
