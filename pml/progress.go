package pml

import (
	"sync"
	"sync/atomic"
	"time"

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
	// spinners counts goroutines in spinWait polling the transports: the
	// background goroutine naps while there are any.
	spinners atomic.Int32
	// starts runs the engine's deferred rendezvous starts; pending says
	// there are some (wantStarts, set with the engine lock held, after
	// queueing them) or that operations the transports refused wait
	// (wantRetry, while blocked is not zero): one word, so that the polls
	// test one load for both. kick wakes the background goroutine for them.
	starts  func()
	pending atomic.Uint32
	kick    chan struct{}
	// retry posts the operations the transports refused (Engine.retry);
	// blocked counts them (queue.go).
	retry   func() int
	blocked atomic.Int32
	// napper: the first transport is a btl.BackgroundNapper.
	napper bool
	// held: the first transport, when a spinning waiter may hold its poll
	// lock across polls (btl.HeldPoller); nil otherwise.
	held btl.HeldPoller
}

// deferStarts notes that starts are waiting for the next progress call and
// wakes the background goroutine, which makes that call when the
// application makes none.
func (ps *pollers) deferStarts() {
	ps.pending.Or(wantStarts)
	select {
	case ps.kick <- struct{}{}:
	default:
	}
}

// wake rings the background goroutine: operations were queued, which it
// retries with naps instead of sleeping in a transport's Block.
func (ps *pollers) wake() {
	select {
	case ps.kick <- struct{}{}:
	default:
	}
}

// Bits of pollers.pending.
const (
	wantStarts = 1 << iota // deferred rendezvous starts wait
	wantRetry              // refused operations wait (blocked != 0)
)

// runDeferred runs the deferred starts, if any, and posts again the
// operations the transports refused; true if it did either.
func (ps *pollers) runDeferred() bool {
	if ps.pending.Load() == 0 {
		return false
	}
	return ps.runDeferredSlow()
}

func (ps *pollers) runDeferredSlow() bool {
	did := false
	if ps.pending.Load()&wantStarts != 0 && ps.pending.And(^uint32(wantStarts))&wantStarts != 0 {
		ps.starts()
		did = true
	}
	if ps.pending.Load()&wantRetry != 0 && ps.retry() > 0 {
		did = true
	}
	return did
}

// queued notes operations queued (blocked raised first): the polls retry
// them until blocked is zero again (settled).
func (ps *pollers) queued() {
	ps.pending.Or(wantRetry)
	ps.wake()
}

// settled clears wantRetry once nothing is queued. An operation queued
// meanwhile (blocked raised before it sets the bit) is seen by the second
// look, which sets the bit again.
func (ps *pollers) settled() {
	if ps.blocked.Load() != 0 {
		return
	}
	ps.pending.And(^uint32(wantRetry))
	if ps.blocked.Load() != 0 {
		ps.pending.Or(wantRetry)
	}
}

// bgNap is how long the background goroutine sleeps, without telling the
// transports, while a waiter polls for it. A waiter that gives up
// spinning blocks in the transport itself, so the nap only delays
// asynchronous progress after a wait, by at most bgNap.
const bgNap = time.Millisecond

// bgNapMax bounds the naps while waiters stay: the delay of asynchronous
// progress after a long wait.
const bgNapMax = 8 * time.Millisecond

type polled struct {
	p          btl.Poller
	concurrent bool       // p serializes its own Progress calls: mu is not used
	mu         sync.Mutex // one Progress call at a time: FIFOs have a single consumer
}

func (ps *pollers) add(p btl.Poller) {
	if len(ps.list) == 0 {
		n, ok := p.(btl.BackgroundNapper)
		ps.napper = ok && n.NapInBackground()
	}
	c, ok := p.(btl.ConcurrentPoller)
	ps.list = append(ps.list, &polled{p: p, concurrent: ok && c.ConcurrentProgress()})
	if len(ps.list) == 1 && ps.list[0].concurrent {
		ps.held, _ = p.(btl.HeldPoller)
	}
}

func (ps *pollers) active() bool { return len(ps.list) > 0 }

// progress polls every transport that nobody else is polling right now.
func (ps *pollers) progress() int {
	n := 0
	for _, p := range ps.list {
		if p.concurrent {
			n += p.p.Progress()
		} else if p.mu.TryLock() {
			n += p.p.Progress()
			p.mu.Unlock()
		}
	}
	if ps.runDeferred() {
		n++
	}
	return n
}

// progressHeld is progress for a spinning waiter: it keeps the first
// transport's poll lock (btl.HeldPoller) across calls while *held says it
// holds it, taking it when it can. Deferred starts run with it released.
func (ps *pollers) progressHeld(held *bool) int {
	n := 0
	h := ps.held
	if *held || h.BeginPoll() {
		n, *held = h.PollHeld()
	}
	if len(ps.list) > 1 { // a range over the empty rest costs a poll 19 instructions
		for _, p := range ps.list[1:] {
			if p.concurrent {
				n += p.p.Progress()
			} else if p.mu.TryLock() {
				n += p.p.Progress()
				p.mu.Unlock()
			}
		}
	}
	if ps.pending.Load() != 0 {
		if *held {
			h.EndPoll()
			*held = false
		}
		if ps.runDeferredSlow() {
			n++
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
	if ps.blocked.Load() != 0 {
		// Refused operations wait: retry them, and nap rather than sleep
		// in the transport, which need not wake when its queue drains.
		if ps.progress() == 0 {
			retryPause(wake, done)
		}
		return
	}
	if ps.runDeferred() {
		return // it may have completed what the caller waits for
	}
	// While a waiter watches the transport in Block, the background
	// goroutine naps instead of watching too: a second watcher takes a
	// core from the peer and, asleep in Block, costs each sender a wake-up.
	ps.spinners.Add(1)
	ps.list[0].p.Block(wake)
	ps.spinners.Add(-1)
	ps.progress()
}

// start runs the background progress goroutine. It polls while it finds
// work and otherwise sleeps in the first transport's Block. While a
// waiter spins (and polls), it naps instead: two goroutines polling one
// transport only contend for its poll lock, and on a machine with as many
// ranks as cores the second one takes a core from the peer.
func (ps *pollers) start() {
	if !ps.active() {
		return
	}
	ps.stop = make(chan struct{})
	ps.wg.Add(1)
	go func() {
		defer ps.wg.Done()
		t := time.NewTimer(bgNap)
		defer t.Stop()
		// sleep naps for *d, then doubles *d (up to bgNapMax); the kick
		// (deferred starts, close) ends it early. False: the engine closed.
		sleep := func(d *time.Duration) bool {
			t.Reset(*d)
			*d = min(2**d, bgNapMax)
			select {
			case <-ps.stop:
				return false
			case <-ps.kick:
			case <-t.C:
			}
			return true
		}
		idle := 0
		nap, idleNap := bgNap, bgNap
		for {
			select {
			case <-ps.stop:
				return
			default:
			}
			if ps.spinners.Load() > 0 {
				// Naps lengthen while waiters stay: a rank blocked for
				// long stays nearly idle. Deferred starts run here: a
				// waiter asleep in Block does not see them.
				if !sleep(&nap) {
					return
				}
				ps.runDeferred()
				idle = 0
				continue
			}
			nap = bgNap
			if ps.progress() > 0 {
				idle = 0
				idleNap = bgNap
				continue
			}
			if idle++; idle < 4 {
				continue
			}
			idle = 0
			if ps.blocked.Load() != 0 {
				// Refused operations wait: retry after a short nap.
				retryPause(ps.stop, nil)
				continue
			}
			if !ps.napper {
				ps.list[0].p.Block(ps.kick) // close also rings kick
				continue
			}
			// Nap on a timer, lengthening while nothing comes.
			if !sleep(&idleNap) {
				return
			}
		}
	}()
}

func (ps *pollers) close() {
	if ps.stop != nil {
		close(ps.stop)
		select {
		case ps.kick <- struct{}{}:
		default:
		}
		ps.wg.Wait()
		ps.stop = nil
	}
}

// retryPause sleeps for retryNap, or until wake or done fires.
func retryPause(wake, done <-chan struct{}) {
	t := time.NewTimer(retryNap)
	defer t.Stop()
	select {
	case <-wake:
	case <-done:
	case <-t.C:
	}
}
