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
// GB/s from such a range, 24-27 GB/s from one in transparent huge pages;
// docs/PERFORMANCE.md, "Tenth session"). A Go heap, like a C one, gets
// huge pages only when asked (the kernel's default "madvise" mode).
//
// So sm counts the registrations of each 2 MiB-aligned region lying wholly
// inside registered memory (the send buffers that readers copy from), and
// when a region's count reaches btl_sm_huge_after it asks the kernel to
// back that region with a huge page (sys.Collapse, madvise MADV_COLLAPSE),
// from a goroutine of its own: a collapse costs about a millisecond per
// region (allocating the page, copying 2 MiB), which a buffer copied a few
// times would not earn back, and which must not hold up the send. Each
// region is asked for once; a refusal (an older kernel, huge pages off,
// pages not populated) is not retried, and after hugeGiveUp refusals in a
// row the module stops asking. Only the pages' backing changes, never
// their contents.

// hugeSeenMax bounds the regions counted (8 GiB of memory); past it the
// counts start again.
const (
	hugeSeenMax   = 4096
	hugeGiveUp    = 8
	hugeRetries   = 100
	hugeRetryWait = 100 * time.Microsecond
)

// hugeNote counts a registration of mem and starts collapsing the regions
// whose count reached the threshold.
func (m *Module) hugeNote(mem []byte) {
	after := m.cfg.hugeAfter
	if after <= 0 || len(mem) < sys.HugePage/2 {
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
		n := m.hugeSeen[a] + 1
		m.hugeSeen[a] = n
		if n == after {
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
			if m.hugeSeen[a] >= m.cfg.hugeAfter {
				m.hugeSeen[a] = 0
			}
		}
		m.hugeMu.Unlock()
	}
}
