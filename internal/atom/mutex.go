package atom

import (
	"runtime"
	"sync/atomic"
	"time"
)

// Mutex is a mutual-exclusion lock whose Unlock is a release store
// (StoreRel32) and two loads, where sync.Mutex's is a locked add. An
// uncontended Lock and Unlock in a loop cost about the same as
// sync.Mutex's (BenchmarkMutex: 17 ns each on the development host); what
// the release store saves is the wait: a locked instruction cannot finish
// before every store ahead of it has reached the cache, so a sync.Mutex
// Unlock right after a send's stores into a fast-box line that the
// receiving core still holds waited for that line to come over (about
// 90 ns here). This one lets those stores drain in the background.
//
// Waiters spin briefly, then announce themselves (waiters) and park on a
// channel; Unlock wakes one when it sees an announcement. An Unlock's load
// of waiters may be answered before its store is visible (no StoreLoad
// order), so a waiter announcing at that moment can find the lock still
// held while that Unlock finds no waiter. Parks are therefore timed: the
// first for unlockGrace (a store waits in a store buffer for nanoseconds),
// later ones doubling up to maxPark, and the waiter looks again after
// each. A missed wake-up can thus cost a waiter that long, and only in
// that narrow race; one blocked behind a long hold wakes every maxPark.
// Waiters are not queued in order: like sync.Mutex in its normal mode, a
// running goroutine can take the lock ahead of a woken one.
//
// The zero value is unlocked. A Mutex must not be copied after first use.
type Mutex struct {
	_       noCopy
	state   atomic.Uint32 // 0 free, 1 held
	waiters atomic.Int32  // goroutines announced in lockSlow
	ch      atomic.Pointer[chan struct{}]
}

const (
	// spinTries: attempts before a waiter announces itself; the second
	// half yield the processor (the holder may be waiting for it).
	spinTries = 32
	// unlockGrace is a waiter's first park; later ones double up to
	// maxPark.
	unlockGrace = 50 * time.Microsecond
	maxPark     = 5 * time.Millisecond
)

// Lock locks m, waiting until it is free.
func (m *Mutex) Lock() {
	if m.state.CompareAndSwap(0, 1) {
		return
	}
	m.lockSlow()
}

// TryLock locks m if it is free and reports whether it did.
func (m *Mutex) TryLock() bool {
	return m.state.Load() == 0 && m.state.CompareAndSwap(0, 1)
}

// Unlock unlocks m. It panics if m is not locked. As with sync.Mutex, any
// goroutine may unlock a locked Mutex.
func (m *Mutex) Unlock() {
	if m.state.Load() != 1 || m.waiters.Load() != 0 {
		m.unlockSlow()
		return
	}
	StoreRel32(&m.state, 0)
}

// unlockSlow is Unlock with waiters announced (or a misuse), out of line:
// the common Unlock is two loads and the store.
//
//go:noinline
func (m *Mutex) unlockSlow() {
	if m.state.Load() != 1 {
		panic("atom: unlock of unlocked Mutex")
	}
	StoreRel32(&m.state, 0)
	select {
	case *m.ch.Load() <- struct{}{}:
	default: // a wake-up is pending already
	}
}

func (m *Mutex) lockSlow() {
	for i := range spinTries {
		if m.TryLock() {
			return
		}
		if i >= spinTries/2 {
			runtime.Gosched()
		}
	}
	ch := m.ch.Load()
	if ch == nil {
		c := make(chan struct{}, 1)
		if !m.ch.CompareAndSwap(nil, &c) {
			ch = m.ch.Load()
		} else {
			ch = &c
		}
	}
	m.waiters.Add(1) // announce (a locked add: StoreLoad order on this side)
	defer m.waiters.Add(-1)
	park := unlockGrace
	t := time.NewTimer(park)
	defer t.Stop()
	for !m.TryLock() {
		select {
		case <-*ch:
			t.Stop()
		case <-t.C:
			park = min(2*park, maxPark)
		}
		t.Reset(park)
	}
}

// noCopy lets go vet's copylocks check flag copies of a Mutex.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}
