package sm

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/atom"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/sys"
)

// pollBudget bounds the fragments taken from each fast box and from the
// FIFO in one Progress call (vader: 31).
const pollBudget = 31

// Block's sleeps.
const (
	napTime    = 2 * time.Millisecond   // unannounced sleep while another goroutine polls
	sleepTime  = 100 * time.Millisecond // announced sleep; senders wake it
	pendingNap = 50 * time.Microsecond  // own sends are queued: look again soon
	// announceGrace is the first announced sleep (see Block).
	announceGrace = 50 * time.Microsecond
)

// Progress polls the fast boxes, then the FIFO (at most pollBudget
// fragments each), dispatching every fragment on the calling goroutine,
// then posts queued sends and reports failed peers. It returns the number
// of events handled. One goroutine polls at a time: a concurrent call
// returns 0 at once. No allocation and no system call unless a peer is
// being connected, woken or reported.
func (m *Module) Progress() int {
	if !m.pollMu.TryLock() {
		return 0
	}
	n, held := m.PollHeld()
	if held {
		m.pollMu.Unlock()
	}
	return n
}

// BeginPoll takes the poll lock for a run of PollHeld calls, as a waiter
// spinning on a request does (btl.HeldPoller): two locked instructions
// per run instead of two per poll, and a tighter loop, so that a fragment
// is seen sooner after it lands. False when another goroutine polls now.
// The holder must call EndPoll soon (the PML does within 256 polls) and
// before it blocks.
func (m *Module) BeginPoll() bool { return m.pollMu.TryLock() }

// EndPoll releases the poll lock taken by BeginPoll.
func (m *Module) EndPoll() { m.pollMu.Unlock() }

// PollHeld is Progress for the holder of the poll lock. held reports
// whether the caller still holds it: a call that leaves completions or a
// peer's help to run releases it first, as those run unlocked.
func (m *Module) PollHeld() (n int, held bool) {
	n = m.progress()
	if m.later == nil && !m.helpNow {
		return n, true
	}
	later := m.later
	m.later = nil
	help := m.helpNow
	m.helpNow = false
	m.pollMu.Unlock()
	for _, d := range later { // completions run without the poll lock
		d.run()
	}
	if help {
		m.lifeMu.RLock() // own segment stays mapped
		m.helpIdle()
		m.lifeMu.RUnlock()
	}
	return n, false
}

func (m *Module) progress() int {
	if m.closed.Load() {
		return 0
	}
	m.pollCount++
	c := m.pollCount
	if c&63 == 0 {
		m.polls.Store(c) // for Block: someone polls (coarse, saves an atomic add per call)
	}
	n := 0
	for _, b := range m.rx {
		if b.p.failed.Load() == nil {
			n += m.pollBox(b, pollBudget)
		}
	}
	// The FIFO (peers without a fast box to us yet) is looked at when the
	// boxes had nothing, and on every 8th call regardless: a call that
	// just delivered from a box returns sooner to the waiter it may have
	// completed (sm 8 B ping-pong 0.320 -> 0.312 us, bench/ab.sh).
	if n == 0 || c&7 == 0 {
		n += m.pollFifo()
	}
	if m.pendingN.Load() > 0 {
		n += m.drainAll()
	}
	// Idle: a run of calls that found nothing, made by a waiter polling
	// in a loop (the PML runs its deferred work in each call, so it has
	// none either). Then a peer's help post (help.go) is taken up, after
	// the poll lock is released.
	if n > 0 {
		m.lastWork = c
	} else if c&15 == 0 && m.helpPosted() && m.idle(c) {
		m.helpNow = true
	}
	// Peers' state words are looked at on events and every 1024 polls
	// (catches a peer that closed while nothing else happened).
	if m.events.Load() || c&1023 == 0 {
		n += m.handleEvents()
	}
	return n
}

// pollBox takes up to budget entries from fast box b. A malformed entry
// fails the peer with a protocol error; nothing outside the ring is read.
// Consecutive inline entries of a tag with a RunHandler (the PML's eager
// matching) are handed over as one run, before anything else is
// dispatched and before their ring space is given back.
func (m *Module) pollBox(b *rxBox, budget int) int {
	pos, seq := b.pos, b.seq
	n, bytes := 0, 0
	run, runTag := 0, btl.Tag(0) // m.runHdr/m.runData[:run], not dispatched yet
	var e entry
	for n < budget {
		phys := int(pos & b.mask)
		w := word64(b.ring, phys).Load()
		if w == 0 {
			break
		}
		// The common entry, a well-formed inline one, is checked here in
		// registers (phys is aligned: pos moves by aligned steps, and
		// the ring's size is a multiple of entryAlign), its end against
		// len(b.ring) so that the slicing below needs no check of its
		// own; anything else goes through decodeEntry, which names the
		// fault (bench/instr.sh: 46 instructions a message fewer than
		// decodeEntry and the slicing it replaces).
		kind, hn, ln := uint8(w>>16), int(uint16(w>>32)), int(uint16(w>>48))
		next := alignUp(entryHdr+ln, entryAlign)
		if kind != entryInline || uint16(w) != seq || ln > b.inlineLimit || hn > ln || phys+entryHdr+ln > len(b.ring) {
			if err := decodeEntry(&e, w, phys, b.size, b.inlineLimit, seq); err != nil {
				run = m.flushRun(b, run, runTag)
				m.fail(b.p, protoErr(b.p, err))
				break
			}
			kind, hn, ln, next = e.kind, e.hdrLen, e.n, e.next
		}
		seq++
		switch kind {
		case entryInline:
			ent := b.ring[phys+entryHdr : phys+entryHdr+ln : phys+entryHdr+ln]
			h, data := ent[:hn:hn], ent[hn:]
			tag := btl.Tag(w >> 24)
			if run > 0 && tag != runTag {
				run = m.flushRun(b, run, runTag)
			}
			if n > 0 && m.env.Dispatch.TakesRuns(tag) {
				m.runHdr[run], m.runData[run] = h, data
				run, runTag = run+1, tag
			} else {
				// A call's first fragment goes at once: most often it is
				// the only one (a ping-pong) and its waiter is waiting
				// (gathering it cost the 0 B ping-pong 0.266 -> 0.283 us).
				// Runs gather from the second on.
				m.env.Dispatch.Dispatch(b.p.ep, tag, h, data)
			}
			bytes += ln
			n++
		case entryFrag:
			run = m.flushRun(b, run, runTag)
			k, ok := m.recvFrag(b.p, ln, false)
			if !ok {
				budget = 0 // the peer is failed: stop here
			}
			bytes += k
			n++
		}
		pos += uint64(next)
		if pos&(line-1) == 0 && n == 1 {
			// The next entry starts a new cache line, which the sender
			// dirtied when it zeroed that header: reading it now is a
			// transfer between cores before this call can return to the
			// waiter it may just have completed. The next call reads it
			// (sm 8 B ping-pong 0.310 -> 0.281 us, rate unchanged). Not
			// after a skip alone: the call then goes on to the entry at
			// the ring's start, so that it reports what it found. A call
			// that found two entries has a stream to work through and
			// takes it in runs, whatever the entries' size (stopping at
			// each line after entries longer than one cost the 64 B
			// message rate 13% and 256 B 7%: 96-byte entries then went
			// two to a call, bench/ab.sh rate).
			break
		}
		if pos&(line-1) == 0 && n > 1 {
			// A stream (this call took more than one entry): ask for the
			// line four ahead, so that its transfer from the sender's
			// cache overlaps the work on these (rate 8 B 10.1 -> 10.7
			// M/s, 41 alternated runs; two lines ahead 10.4). Not for a
			// call's first entry: a ping-pong's next line is the one the
			// sender writes next.
			atom.Prefetch(&b.ring[(pos+4*line)&b.mask])
		}
		if pos-b.published >= b.publishEvery {
			// A quarter ring taken in this call: give it back now (its
			// run first, which points into it), or a long call holds the
			// sender up for its whole length.
			if run > 0 {
				run = m.flushRun(b, run, runTag)
			}
			b.ctrl.Store(pos)
			b.published = pos
		}
		if m.pendingN.Load() > 0 {
			// A handler may have run long (a single copy of megabytes):
			// post this process's queued sends now, or the peer starves
			// while this loop works through its budget.
			m.drainAll()
		}
	}
	if run > 0 {
		m.flushRun(b, run, runTag)
	}
	if pos != b.pos {
		b.pos, b.seq = pos, seq
		if pos-b.published >= b.publishEvery || b.p.failed.Load() != nil {
			// The sender may reuse the space. Publishing once per quarter
			// ring saves a store to a shared line per fragment and never
			// stalls the sender: with everything consumed, at most a
			// quarter of the ring is unpublished, and the largest inline
			// entry with its skip takes at most half.
			b.ctrl.Store(pos)
			b.published = pos
		}
		m.recvN += int64(n)
		m.recvB += int64(bytes)
	}
	return n
}

// flushRun dispatches the first run entries of m.runHdr/m.runData (tag
// tag) from b's peer and returns 0 (the length of the next run).
func (m *Module) flushRun(b *rxBox, run int, tag btl.Tag) int {
	if run == 0 {
		return 0
	}
	// The slices stay in the arrays until overwritten: they point into
	// the mapped segment, which they do not keep alive.
	m.env.Dispatch.DispatchRun(b.p.ep, tag, m.runHdr[:run], m.runData[:run])
	return 0
}

// pollFifo takes up to pollBudget fragments from own FIFO.
func (m *Module) pollFifo() int {
	h := m.head
	n, bytes := 0, 0
	for n < pollBudget {
		l, idx, ok := m.fifo.pop(h)
		if !ok {
			break
		}
		h++
		n++
		p := m.peerAt(l)
		if p == nil || p.failed.Load() != nil {
			continue // a dead or unknown sender: nobody to deliver for
		}
		k, _ := m.recvFrag(p, idx, true)
		bytes += k
		if m.pendingN.Load() > 0 {
			m.drainAll() // as in pollBox
		}
	}
	if n > 0 {
		m.head = h
		m.recvN += int64(n)
		m.recvB += int64(bytes)
	}
	return n
}

// recvFrag delivers fragment idx of peer p and hands it back to p. It
// returns the fragment's size and false when the fragment was malformed
// (p is then failed).
func (m *Module) recvFrag(p *peer, idx int, viaFifo bool) (int, bool) {
	if idx < 0 || idx >= p.lay.nfrags() {
		m.fail(p, protoErr(p, fmt.Errorf("fragment index %d of %d", idx, p.lay.nfrags())))
		return 0, false
	}
	off, capacity := p.lay.frag(idx)
	f, err := decodeFrag(word64(p.seg, off+fragMeta).Load(), word64(p.seg, off+fragDest).Load(), capacity, m.local)
	if err == nil && f.flags&flagSetupFbox != 0 {
		switch {
		case !viaFifo || p.rx != nil:
			err = errors.New("second fast-box set-up")
		case f.fbox >= p.lay.fboxCount:
			err = fmt.Errorf("fast box %d of %d", f.fbox, p.lay.fboxCount)
		default:
			m.addRx(newRxBox(p, f.fbox))
		}
	}
	if err != nil {
		m.fail(p, protoErr(p, err))
		return 0, false
	}
	pl := off + fragHdr
	m.env.Dispatch.Dispatch(p.ep, btl.Tag(f.tag), p.seg[pl:pl+f.hdrLen:pl+f.hdrLen], p.seg[pl+f.hdrLen:pl+f.n:pl+f.n])
	word64(p.seg, off+fragState).Store(0) // release: the sender may reuse it
	return f.n, true
}

func (m *Module) addRx(b *rxBox) {
	b.p.rx = b
	m.rx = append(m.rx, b)
}

func (m *Module) dropRx(p *peer) {
	if p.rx == nil {
		return
	}
	m.rx = slices.DeleteFunc(m.rx, func(b *rxBox) bool { return b.p == p })
	p.rx = nil
}

// drainAll posts queued sends of every endpoint that has some.
func (m *Module) drainAll() int {
	m.pendMu.Lock()
	eps := append(m.drainEps[:0], m.pendEps...) // no allocation: drainAll runs under the poll lock
	m.pendMu.Unlock()
	defer func() { clear(eps); m.drainEps = eps[:0] }()
	n := 0
	for _, e := range eps {
		e.mu.Lock()
		var d drained
		if e.err == nil {
			d = e.drain()
		}
		if len(e.pending) == 0 {
			e.listed = false
			m.pendMu.Lock()
			m.pendEps = slices.DeleteFunc(m.pendEps, func(x *endpoint) bool { return x == e })
			m.pendingN.Store(int32(len(m.pendEps)))
			m.pendMu.Unlock()
		}
		e.mu.Unlock()
		if len(d.ok) > 0 {
			e.p.wake()
		}
		if len(d.ok)+len(d.failed) > 0 {
			m.later = append(m.later, d)
		}
		n += len(d.ok) + len(d.failed)
	}
	return n
}

// handleEvents looks at every peer: a peer that closed gets its queued
// sends failed with ErrClosed; a failed one is reported to the Dispatcher
// once (after what it sent before dying is delivered), its queued sends
// fail, and the fragments posted to it come back.
func (m *Module) handleEvents() int {
	m.events.Store(false)
	n := 0
	for i := range m.peers {
		p := m.peers[i].p.Load()
		if p == nil || p.reported {
			continue
		}
		if p.mapped.Load() && p.failure() == nil && !p.closed.Load() {
			switch p.state.Load() >> 32 {
			case stateDead:
				m.fail(p, fmt.Errorf("sm: rank %d died: %w", p.rank, mpierr.ErrProcFailed))
			case stateClosed:
				p.closed.Store(true)
			}
		}
		err := p.failure()
		if err == nil {
			if p.closed.Load() {
				p.reported = true
				cerr := fmt.Errorf("sm: rank %d closed its shared-memory transport: %w", p.rank, btl.ErrClosed)
				failed := p.ep.terminate(cerr, nil)
				m.pool.reclaim(p.local)
				m.later = append(m.later, drained{failed: failed, err: cerr})
			}
			continue
		}
		if p.rx != nil && !errors.Is(err, mpierr.ErrProtocol) {
			// Deliver what the peer sent before it died (bounded).
			for i := 0; i < 1024 && m.pollBox(p.rx, pollBudget) > 0; i++ {
			}
		}
		p.reported = true
		m.dropRx(p)
		failed := p.ep.terminate(err, nil)
		m.pool.reclaim(p.local)
		m.env.Logf("sm: rank %d: peer rank %d failed: %v", m.rank, p.rank, err)
		m.env.Dispatch.PeerFailed(p.rank, err)
		m.later = append(m.later, drained{failed: failed, err: err})
		n++
	}
	return n
}

// look is Block's look for work: would Progress find something? It
// waits for a Progress in flight to finish (that one may take the work).
func (m *Module) look() bool {
	if m.events.Load() || m.closed.Load() {
		return true
	}
	m.pollMu.Lock()
	work := m.fifo.peekFull(m.head)
	for _, b := range m.rx {
		work = work || word64(b.ring, int(b.pos&b.mask)).Load() != 0
	}
	m.pollMu.Unlock()
	return work
}

func signalled(wake <-chan struct{}) bool {
	select {
	case <-wake:
		return true
	default:
		return false
	}
}

// sustainedPolls is how many Progress calls during one nap mean another
// goroutine is polling in a loop (one that spins makes tens of thousands
// in napTime; the PML's background goroutine makes about a hundred each
// time it wakes).
const sustainedPolls = 1024

// Block waits until Progress may find work, wake is signalled (or closed),
// or the module closes; it may return early. It first watches shared
// memory for up to btl_sm_spin (never when oversubscribed). It then sleeps
// on the futex word of its own segment:
//
//   - while another goroutine of this process keeps calling Progress, in
//     naps of napTime that senders are not told about (they pay no system
//     call; the poller delivers);
//   - otherwise announced: it adds itself to the sleepers count in its
//     segment, looks for work once more and sleeps; a sender that finds
//     the count non-zero after publishing bumps the futex word and wakes it.
//
// A blocked module costs no CPU beyond one wake-up per sleepTime.
func (m *Module) Block(wake <-chan struct{}) {
	m.lifeMu.RLock()
	defer m.lifeMu.RUnlock()
	// A process with nothing to do helps its peers' shared Gets (help.go):
	// on the way in, and whenever a peer's post ends the wait.
	m.helpIdle()
	defer m.helpIdle()
	if signalled(wake) || m.look() {
		return
	}
	p0 := m.polls.Load()
	others := false
	if spin := m.cfg.spin; spin > 0 {
		start := time.Now()
		for i := 1; ; i++ {
			if i%8 == 0 && (m.look() || signalled(wake) || m.helpPosted()) { // look takes the poll lock: not every turn
				return
			}
			if m.polls.Load() != p0 {
				others = true
				break
			}
			if i%64 == 0 {
				if time.Since(start) > spin {
					break
				}
				if i%4096 == 0 {
					// Rarely: Gosched wakes an idle P's thread, which takes
					// a core from the peer this rank waits for.
					runtime.Gosched()
				}
			}
		}
	}
	woken := new(atomic.Bool)
	if wake != nil {
		stop := make(chan struct{})
		m.bg.Add(1)
		go m.wakeHelper(wake, stop, woken)
		defer close(stop)
	}
	for {
		s := m.seq.Load()
		if m.look() || woken.Load() || m.helpPosted() {
			return
		}
		if m.pendingN.Load() > 0 {
			sys.FutexWait(m.seq, s, pendingNap)
			return
		}
		if others {
			sys.FutexWait(m.seq, s, napTime)
			p1 := m.polls.Load()
			others, p0 = p1-p0 >= sustainedPolls, p1
			continue
		}
		m.state.Add(1) // announce: senders now wake us
		// A sender publishes a fast-box entry with a release store and
		// then reads state (peer.wake): with no fence between them, its
		// read can be answered before the entry is visible here, so it
		// may miss this announcement while the look below misses its
		// entry. The first sleep after announcing is therefore short
		// (announceGrace, far longer than a store waits to become
		// visible), and the look after it finds such an entry; a sender
		// that publishes later sees the announcement and wakes us.
		for wait := announceGrace; ; wait = sleepTime {
			s = arm(m.seq) // the first sender to see it armed wakes us
			if m.look() || woken.Load() || m.helpPosted() {
				break
			}
			sys.FutexWait(m.seq, s, wait)
			if wait == sleepTime {
				// Peers also wake us when they close or die: have
				// Progress look at their state.
				m.events.Store(true)
				break
			}
		}
		m.state.Add(^uint64(0))
		return
	}
}

// wakeHelper turns a signal on wake into a futex wake-up of Block.
func (m *Module) wakeHelper(wake <-chan struct{}, stop <-chan struct{}, woken *atomic.Bool) {
	defer m.bg.Done()
	select {
	case <-wake:
		woken.Store(true)
		m.kick()
	case <-stop:
	}
}

// NapInBackground tells the PML's background progress goroutine to poll
// after timed naps instead of sleeping in Block: Block's futex sleep holds
// the process's processor (see btl.BackgroundNapper).
func (m *Module) NapInBackground() bool { return true }

// ConcurrentProgress reports that Progress may be called from several
// goroutines at once (one polls, the others return 0): the PML needs no
// lock of its own around it.
func (m *Module) ConcurrentProgress() bool { return true }
