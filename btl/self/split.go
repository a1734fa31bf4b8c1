package self

import (
	"runtime"
	"sync/atomic"
)

// Shared copies.
//
// A Put or Get in-process is one copy between two user buffers, made by
// the goroutine that asks for it. In a blocking rendezvous the other rank
// has nothing to do meanwhile: its goroutine spins in a wait, polling
// (Poll). A copy of at least btl_self_split bytes is therefore cut into
// chunks of at most btl_self_split_chunk and offered to the world as a
// job: the asking goroutine takes chunks, and so does any rank of the
// world that polls with nothing handed over to it, so that two cores copy
// at once (btl/sm's shared Get does the same between processes, docs/sm.md).
// Neither side waits for the other to start: a rank that is busy or
// parked takes no chunk and the asker copies them all; the asker only
// waits, at the end, for chunks a helper has begun. One job at a time per
// world: a copy that finds the slot taken is made alone.
//
// Only worlds that spin (handsOff: btl_self_spin > 0, no more ranks than
// processors) post jobs; in others nobody polls while it waits. A rank
// that polls once (Test, Iprobe) while a job is posted takes chunks too,
// alongside the asker, until none is left to take: unlike sm's owner,
// which helps only once it measures itself idle, such a call can return
// up to about half the copy's time later.

// copyJob is one shared copy.
type copyJob struct {
	dst, src []byte
	chunk    int
	chunks   int64
	next     atomic.Int64 // next chunk to take
	left     atomic.Int64 // chunks not copied yet
}

// take copies chunks of j until none is left to take; it reports whether
// it copied any.
func (j *copyJob) take() bool {
	did := false
	for {
		i := j.next.Add(1) - 1
		if i >= j.chunks {
			return did
		}
		lo := int(i) * j.chunk
		hi := min(lo+j.chunk, len(j.src))
		copy(j.dst[lo:hi], j.src[lo:hi])
		j.left.Add(-1)
		did = true
	}
}

// copyShared copies src into dst (of the same length), sharing the work
// with the ranks of m's world that poll when the copy is large enough.
// Both buffers are the caller's again when it returns: every chunk is
// copied by then.
func (m *Module) copyShared(dst, src []byte) {
	if m.split == 0 || len(src) < m.split || !m.handsOff() {
		copy(dst, src)
		return
	}
	chunk := max(m.splitChunk, minSplitChunk)
	if len(src) > cachedMax {
		chunk = max(chunk, streamChunk)
	}
	j := &copyJob{dst: dst[:len(src)], src: src, chunk: chunk, chunks: int64((len(src) + chunk - 1) / chunk)}
	j.left.Store(j.chunks)
	w := m.w
	if !w.job.CompareAndSwap(nil, j) {
		copy(dst, src)
		return
	}
	j.take()
	w.job.CompareAndSwap(j, nil)
	// Chunks a helper took are being copied: wait for them, yielding
	// now and then in case that helper shares this processor.
	for i := 1; j.left.Load() != 0; i++ {
		if i&63 == 0 {
			runtime.Gosched()
		}
	}
}

// help takes chunks of the world's shared copy, if one is posted; it
// reports whether it copied any.
func (m *Module) help() bool {
	if j := m.w.job.Load(); j != nil {
		return j.take()
	}
	return false
}

// Chunk sizes. copy() (runtime.memmove) writes a copy of streamChunk
// bytes or more with non-temporal stores, past the caches, and smaller
// ones through them. Chunks under it keep a copy of up to cachedMax bytes
// in the last-level cache (32 MiB on the project's machine: a ping-pong's
// four buffers of 8 MiB), where the next copy from it finds them; copies
// beyond it get chunks that stream, as copy() would stream them whole
// (in-process 64 MiB ping-pong, chunks of 256 KiB: 7.5 ms against 3.9
// copied whole; docs/PERFORMANCE.md has the sweep).
const (
	minSplitChunk = 64 << 10 // below it a chunk's atomic operations cost more than the second core saves
	streamChunk   = 1 << 20
	cachedMax     = 8 << 20
)
