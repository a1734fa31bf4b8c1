package pml

import (
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/gompi-org/gompi/btl"
)

// pollers drives the transports that need polling (btl.Poller). Waiters
// poll them while they spin; one background goroutine per engine keeps
// them moving while the application computes (asynchronous progress),
// sleeping in Block when there is nothing to do.
type pollers struct {
	list []*polled
	stop chan struct{}
	wg   sync.WaitGroup
}

type polled struct {
	p  btl.Poller
	mu sync.Mutex // one Progress call at a time: FIFOs have a single consumer
}

func (ps *pollers) add(p btl.Poller) { ps.list = append(ps.list, &polled{p: p}) }

func (ps *pollers) active() bool { return len(ps.list) > 0 }

// progress polls every transport that nobody else is polling right now.
func (ps *pollers) progress() int {
	n := 0
	for _, p := range ps.list {
		if p.mu.TryLock() {
			n += p.p.Progress()
			p.mu.Unlock()
		}
	}
	return n
}

// block sleeps in the first transport's Block until wake or done fires or
// the transport may have work, then polls once.
func (ps *pollers) block(wake <-chan struct{}, done <-chan struct{}) {
	if done != nil {
		select {
		case <-done:
			return
		default:
		}
	}
	ps.list[0].p.Block(wake)
	ps.progress()
}

// start runs the background progress goroutine.
func (ps *pollers) start() {
	if !ps.active() {
		return
	}
	ps.stop = make(chan struct{})
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		idle := 0
		for {
			select {
			case <-ps.stop:
				return
			default:
			}
			if ps.progress() > 0 {
				idle = 0
				continue
			}
			idle++
			if idle < 64 {
				runtime.Gosched()
				continue
			}
			ps.list[0].p.Block(ps.stop)
			idle = 0
		}
	}()
}

func (ps *pollers) close() {
	if ps.stop != nil {
		close(ps.stop)
		ps.wg.Wait()
		ps.stop = nil
	}
}

var _ = atomic.Int32{}
