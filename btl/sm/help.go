package sm

import (
	"runtime"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/internal/sys"
)

// Shared Get. A large Get (the receiver of an RDMA direct get reading the
// sender's registered memory) is cut into chunks that two processes copy
// at once: the reader takes chunks with process_vm_readv, and the owner of
// the memory, asked through a help slot in its own segment, takes chunks
// with process_vm_writev from its memory into the reader's buffer. On this
// project's 2-core machine two such copies move 1.6-1.7x the bytes of one.
// Neither side waits for the
// other to start: a helper that is busy elsewhere (computing, asleep)
// simply takes no chunk and the reader copies them all; the reader only
// waits, at the end, for chunks the helper has begun.
//
// The help slot of requester l (its local rank) is line helpSlot0+64*l of
// the helper's header page:
//
//	 0 claim  seq<<32 | next chunk; low half helpClosed while being set up
//	 8 src    address of the data in the helper
//	16 dst    address of the buffer in the requester
//	24 len    bytes
//	32 chunk  bytes per chunk
//	40 done   bytes copied so far, by either side
//	48 fail   non-zero: a chunk the helper took failed (the requester then
//	          copies everything again itself)
//
// A chunk is taken by incrementing claim's low half: the requester with
// an add, the helper with a compare-and-swap from the value it read before
// reading the other words. The requester closes the slot (low half
// helpClosed, new seq) before it rewrites the words, so a helper whose swap
// succeeds read the words of the request it claimed from. The requester
// returns only once done == len, after which no chunk of that request is
// in flight. The helper copies only from its own live registrations
// (anything else in a slot is ignored), and the kernel checks dst.
const (
	offHelpPosts = 384 // u64 in the helper's header: bumped after each post
	helpSlot0    = 512
	maxHelpSlots = (headerSize - helpSlot0) / line // local ranks 0..55 can ask

	hClaim = 0
	hSrc   = 8
	hDst   = 16
	hLen   = 24
	hChunk = 32
	hDone  = 40
	hFail  = 48

	helpClosed = 0xFFFFFFFF

	// minSplit is the smallest Get the parameter may ask to share, cut in
	// halves of at least minChunk. Below it the hand-off costs more than
	// the half copy saves. (The reader's buffer, which the helper writes
	// by address, is pinned for the call: see sharedGet.)
	minSplit  = 32 << 10
	minChunk  = 16 << 10
	helpSpins = 64 // reader's polls of done between yields
	idlePolls = 16 // Progress calls in a row that found nothing before the rate of calls is measured (idle)
)

// helpClaimedHook, when set (tests), runs after the helper claimed a chunk
// and before it copies it.
var helpClaimedHook atomic.Pointer[func()]

// helpSlot is the help slot of requester l in segment seg.
type helpSlot struct {
	claim, src, dst, len, chunk, done, fail *atomic.Uint64
}

func slotOf(seg []byte, l int) helpSlot {
	b := helpSlot0 + line*l
	return helpSlot{word64(seg, b+hClaim), word64(seg, b+hSrc), word64(seg, b+hDst), word64(seg, b+hLen),
		word64(seg, b+hChunk), word64(seg, b+hDone), word64(seg, b+hFail)}
}

// chunkFor returns the chunk size of a shared Get of n bytes: half of it
// (whole pages), so that even the smallest shared Get is two chunks, but
// at most max: each chunk is a system call, and past 512 KiB larger ones
// gain nothing.
func chunkFor(n, max uint64) uint64 {
	half := (n/2 + 4095) &^ 4095
	return min(max, half)
}

// canShare says whether a Get of n bytes from e's peer is shared with it:
// not while this process has registered memory of its own, that is large
// sends waiting for their readers. Then traffic likely flows both ways and
// the peer is busy reading too: its help would only make this reader wait
// for its last chunk (gompi-bench bibw 4 MiB: 20.9 GB/s with sharing, 21.6
// without; with this rule as without).
func (e *endpoint) canShare(n int) bool {
	split := e.m.cfg.getSplit
	return split > 0 && n >= split && e.m.local < maxHelpSlots && e.p.helpPosts != nil && e.m.nregs.Load() == 0
}

// sharedGet copies len(local) bytes at addr of the peer into local, with
// the peer's help when it gives any. It returns the reader's own copy
// error (for cmaFailed) or the peer's failure.
func (e *endpoint) sharedGet(local []byte, addr uintptr) error {
	p := e.p
	e.m.lifeMu.RLock() // the segments stay mapped
	defer e.m.lifeMu.RUnlock()
	if e.m.closed.Load() || p.seg == nil || !e.helpMu.TryLock() { // TryLock: another Get to this peer has the slot
		return sys.CMARead(p.pid, local, addr)
	}
	defer e.helpMu.Unlock()
	// The helper writes into local by address while this call runs: pin
	// it, so that it is in the heap (Pin's argument escapes, so no caller
	// can pass a goroutine's stack, which moves when it grows or shrinks)
	// and stays where it is until the helper is done.
	var pin runtime.Pinner
	pinBytes(&pin, local)
	defer pin.Unpin()
	// The helper's process_vm_writev pins local's pages: huge pages help
	// there as in a send buffer (huge.go).
	e.m.hugeNote(local)
	s := slotOf(p.seg, e.m.local)
	n := uint64(len(local))
	chunk := chunkFor(n, uint64(e.m.cfg.getChunk))
	chunks := (n + chunk - 1) / chunk
	e.helpSeq++
	seq := uint64(e.helpSeq) << 32
	s.claim.Store(seq | helpClosed)
	s.src.Store(uint64(addr))
	s.dst.Store(uint64(sys.Addr(local)))
	s.len.Store(n)
	s.chunk.Store(chunk)
	s.done.Store(0)
	s.fail.Store(0)
	s.claim.Store(seq)
	p.helpPosts.Add(1)
	p.wake()
	var own error
	for {
		i := uint64(uint32(s.claim.Add(1) - 1))
		if i >= chunks {
			break
		}
		lo := i * chunk
		hi := min(lo+chunk, n)
		if own == nil {
			own = sys.CMARead(p.pid, local[lo:hi], addr+uintptr(lo))
		}
		s.done.Add(hi - lo)
	}
	// Wait for the chunks the helper took: each is one system call of a
	// running process, unless it died. (A helper that closes its module
	// finishes its chunk first: help holds its lifeMu.)
	for i := 1; s.done.Load() < n; i++ {
		if i%helpSpins == 0 {
			if err := p.failure(); err != nil {
				return err
			}
			if p.state.Load()>>32 == stateDead {
				return e.peerGone()
			}
			runtime.Gosched()
		}
	}
	if own != nil {
		return own
	}
	if s.fail.Load() != 0 {
		return sys.CMARead(p.pid, local, addr)
	}
	return nil
}

// idle reports whether the Progress calls since the last one that found
// work (at call c) are a waiter polling in a loop: at least idlePolls of
// them, at more than one per microsecond. The PML's background goroutine
// polls a few times per nap of a millisecond or more: a process whose
// application computes does not help (it would take the application's
// core). The rate is measured over the calls since the last look, so a
// process that starts waiting after computing helps within a few dozen
// calls. The clock is read only while a help post waits and the run is
// idlePolls calls long, never on a short wait. Called with pollMu held.
func (m *Module) idle(c uint64) bool {
	run := c - m.lastWork
	if run < idlePolls {
		return false
	}
	if m.runFrom != m.lastWork+1 { // a new run: start measuring it here
		m.runFrom, m.runAt, m.runPolls = m.lastWork+1, time.Now(), run
		return false
	}
	now := time.Now()
	if int64(run-m.runPolls) > now.Sub(m.runAt).Microseconds() {
		return true
	}
	m.runAt, m.runPolls = now, run // measure the next calls afresh
	return false
}

// helpPosted reports whether a peer posted a help request that was not
// looked at yet. The caller keeps the segment mapped (lifeMu or pollMu
// held) and has seen that the module is not closed.
func (m *Module) helpPosted() bool {
	return m.helpPosts.Load() != m.helpSeen.Load()
}

// helpIdle takes chunks of every open help request in own segment until
// none is left, when a peer posted one since the last look. It runs with
// lifeMu read-held (the segment stays mapped), from Block and from
// Progress when a waiter polls without finding work (idle): only a process
// with nothing to do of its own helps. A process that is busy delivering
// or copying its own messages (both directions of a bidirectional stream)
// leaves the work to the reader: helping there measured slower (bibw 4 MiB
// 22.3 -> 20.4 GB/s with help from every Progress call).
func (m *Module) helpIdle() {
	if m.closed.Load() || !m.helpPosted() {
		return
	}
	m.helpSeen.Store(m.helpPosts.Load())
	for l := range min(len(m.peers), maxHelpSlots) {
		if l != m.local {
			m.helpPeer(l)
		}
	}
}

// helpPeer takes chunks of local peer l's request.
func (m *Module) helpPeer(l int) int {
	p := m.peers[l].p.Load()
	if p == nil || p.cmaErr != nil || p.failure() != nil || m.closed.Load() {
		return 0
	}
	if !p.mapped.Load() {
		// Its request is the first use. Mapping the requester's segment
		// checks that its pid is still this job's rank (the nonce in the
		// segment) and starts watching it: once it is seen dead, no chunk
		// goes to that pid, which another process may take over.
		p.ep.mu.Lock()
		m.attach(p)
		p.ep.mu.Unlock()
		if !p.mapped.Load() {
			return 0
		}
	}
	s := slotOf(m.seg, l)
	var mem []byte // own registered memory of the request, once found
	var memSrc, memLen uint64
	k := 0
	for {
		w := s.claim.Load()
		i := uint64(uint32(w))
		if i == helpClosed {
			return k
		}
		src, dst, n, chunk := s.src.Load(), s.dst.Load(), s.len.Load(), s.chunk.Load()
		if chunk < minChunk || n == 0 || i >= (n+chunk-1)/chunk {
			return k
		}
		if mem == nil || src != memSrc || n != memLen {
			if mem = m.registered(src, n); mem == nil {
				return k // not memory this process offered: ignore the request
			}
			memSrc, memLen = src, n
		}
		if !s.claim.CompareAndSwap(w, w+1) {
			continue
		}
		if h := helpClaimedHook.Load(); h != nil {
			(*h)()
		}
		lo := i * chunk
		hi := min(lo+chunk, n)
		if err := sys.CMAWrite(p.pid, mem[lo:hi], uintptr(dst+lo)); err != nil {
			s.fail.Store(1)
		} else {
			m.helpBytes.Add(int64(hi - lo))
		}
		s.done.Add(hi - lo)
		k++
	}
}

// registered returns own memory [addr, addr+n) as a slice of a live
// registration, or nil when no registration covers it.
func (m *Module) registered(addr, n uint64) []byte {
	m.regMu.Lock()
	defer m.regMu.Unlock()
	for r := range m.regs {
		if base := uint64(sys.Addr(r.mem)); addr >= base && n <= uint64(len(r.mem)) && addr-base <= uint64(len(r.mem))-n {
			off := addr - base
			return r.mem[off : off+n : off+n]
		}
	}
	return nil
}
