package sm

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gompi-org/gompi/internal/sys"
)

// Huge pages for memory copied again and again. process_vm_readv and
// process_vm_writev pin the other process's pages one by one before they
// copy; of a 4 MiB range in ordinary 4 KiB pages that is half the time of
// the copy on this project's machine (a C loop of process_vm_readv: 12.6
// GB/s from such a range, 24-27 GB/s from one in transparent huge pages).
// A Go heap, like a C one, gets
// huge pages only when asked (the kernel's default "madvise" mode).
//
// So sm counts the registrations of each 2 MiB-aligned region that
// registered memory of at least hugeMinBuf bytes overlaps (the send
// buffers that readers copy from, and a shared Get's destination, which
// the helper writes into), and when a region's count reaches
// btl_sm_huge_after it asks the kernel to back that region with a huge
// page (sys.Collapse, madvise MADV_COLLAPSE) from a goroutine of its own:
// a first collapse costs 4.6-6.3 ms of a core per region on this
// project's machine (allocating the page, copying 2 MiB; a throwaway
// program timing sys.Collapse on the regions of a 16 MiB buffer), about
// 60 copies' worth of the pinning it saves: a buffer copied a few times
// would not earn it back, and it must not hold up the send. The region is asked for again every
// hugeRecheck registrations after that: its huge page is split when the
// runtime gives back free memory around the buffer, and a collapse of a
// region still huge costs some microseconds. A region whose pages stay
// pinned by a peer's copies (EAGAIN) is counted afresh; after hugeGiveUp
// refusals in a row (an older kernel, huge pages off, pages not populated)
// the module stops asking. Only the pages' backing changes, never their
// contents; but the part of a region outside the buffer that the process
// had not touched becomes resident, so the regions a buffer covers less
// than half of (small buffers, the ends of large ones) are collapsed for at
// most hugeSmallMax regions per module (128 MiB).

// hugeSeenMax bounds the regions counted (8 GiB of memory); past it the
// counts start again.
const (
	hugeMinBuf    = 16 << 10
	hugeSmallMax  = 64
	hugeSeenMax   = 4096
	hugeCharged   = 1 << 30 // in hugeSeen: counted against hugeSmallMax already
	hugeRecheck   = 256
	hugeGiveUp    = 8
	hugeRetries   = 100
	hugeRetryWait = 100 * time.Microsecond
)

// hugeNote counts a registration of mem and starts collapsing the regions
// whose count reached the threshold.
func (m *Module) hugeNote(mem []byte) {
	after := m.cfg.hugeAfter
	if after <= 0 || len(mem) < hugeMinBuf {
		return
	}
	var buf [8]uintptr
	regions := sys.HugeRegions(buf[:0], mem)
	var todo []uintptr
	m.hugeMu.Lock()
	if m.hugeOff {
		m.hugeMu.Unlock()
		return
	}
	if m.hugeSeen == nil || len(m.hugeSeen) >= hugeSeenMax {
		m.hugeSeen = make(map[uintptr]int)
	}
	for _, a := range regions {
		v := m.hugeSeen[a]
		n, charged := (v&^hugeCharged)+1, v&hugeCharged != 0
		// Asked for at the after-th registration, and again every
		// hugeRecheck: the huge page is split again when the runtime
		// gives back free memory of the region's other objects (a
		// collapse of a region still huge costs some microseconds).
		ask := n == after || n > after && (n-after)%hugeRecheck == 0
		if ask && !charged && sys.HugeCover(a, mem) < sys.HugePage/2 {
			if m.hugeSmall >= hugeSmallMax {
				continue
			}
			m.hugeSmall++
			charged = true
		}
		if n >= hugeCharged {
			n = after // keep the count below the flag bit
		}
		v = n
		if charged {
			v |= hugeCharged
		}
		m.hugeSeen[a] = v
		if ask {
			todo = append(todo, a)
		}
	}
	// Close waits for the goroutine (bg), after it set hugeClosed under
	// hugeMu: an Add made here under hugeMu comes before that Wait.
	start := len(todo) > 0 && !m.hugeClosed
	if start {
		m.bg.Add(1)
	}
	m.hugeMu.Unlock()
	if start {
		go m.collapse(todo)
	}
}

// collapse asks for a huge page behind each region of todo, until the
// module closes.
func (m *Module) collapse(todo []uintptr) {
	defer m.bg.Done()
	for _, a := range todo {
		if m.closed.Load() {
			return
		}
		err := sys.Collapse(a)
		// EAGAIN: a page of the region is pinned (a peer's copy from it
		// in progress) or locked: try again in the gaps between copies.
		for try := 0; errors.Is(err, unix.EAGAIN) && try < hugeRetries && !m.closed.Load(); try++ {
			time.Sleep(hugeRetryWait)
			err = sys.Collapse(a)
		}
		m.hugeMu.Lock()
		switch {
		case err == nil:
			m.hugeFails = 0
			m.hugeRegions++
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.EPERM), errors.Is(err, unix.ENOSYS):
			m.hugeFails++
			if m.hugeFails >= hugeGiveUp {
				m.hugeOff = true
			}
		default: // busy all along, or no huge page free now: count again
			if v := m.hugeSeen[a]; v&^hugeCharged >= m.cfg.hugeAfter {
				m.hugeSeen[a] = v & hugeCharged // charged to the budget once
			}
		}
		m.hugeMu.Unlock()
	}
}
