package mpi

import (
	"sync"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
)

// The process-wide attached buffer of buffered mode. gompi accounts for
// its size exactly as MPI does (each message takes its packed size plus
// BsendOverhead) and packs each message into memory of its own.
var bsend struct {
	mu       sync.Mutex
	cond     *sync.Cond
	attached bool
	size     int
	used     int
}

func init() { bsend.cond = sync.NewCond(&bsend.mu) }

// BufferAttach provides size bytes for Bsend and Ibsend, process-wide.
// ErrBuffer if a buffer is already attached or size is negative.
func BufferAttach(size int) error {
	bsend.mu.Lock()
	defer bsend.mu.Unlock()
	if bsend.attached {
		return mpierr.Errorf(mpierr.ErrBuffer, "a buffer is already attached")
	}
	if size < 0 {
		return mpierr.Errorf(mpierr.ErrBuffer, "negative buffer size %d", size)
	}
	bsend.attached, bsend.size, bsend.used = true, size, 0
	return nil
}

// BufferDetach waits until every buffered message has been delivered,
// detaches the buffer and returns its size. ErrBuffer if none is attached.
func BufferDetach() (int, error) {
	bsend.mu.Lock()
	defer bsend.mu.Unlock()
	if !bsend.attached {
		return 0, mpierr.Errorf(mpierr.ErrBuffer, "no buffer attached")
	}
	for bsend.used > 0 {
		bsend.cond.Wait()
	}
	bsend.attached = false
	return bsend.size, nil
}

// bsendReserve takes room for b in the attached buffer and packs b into
// it. release gives the room back once the message is delivered.
func bsendReserve(b pml.Buffer) ([]byte, func(), error) {
	n := b.Len()
	need := n + BsendOverhead
	bsend.mu.Lock()
	if !bsend.attached {
		bsend.mu.Unlock()
		return nil, nil, mpierr.Errorf(mpierr.ErrBuffer, "Bsend without an attached buffer (BufferAttach)")
	}
	if bsend.used+need > bsend.size {
		free := bsend.size - bsend.used
		bsend.mu.Unlock()
		return nil, nil, mpierr.Errorf(mpierr.ErrBuffer, "Bsend of %d bytes (+%d overhead) does not fit: %d of %d bytes free", n, BsendOverhead, free, bsend.size)
	}
	bsend.used += need
	bsend.mu.Unlock()
	packed := make([]byte, n)
	if b.Conv != nil {
		b.Conv.SetPosition(0)
		b.Conv.Pack(packed)
	} else {
		copy(packed, b.Bytes)
	}
	var once sync.Once
	release := func() {
		once.Do(func() {
			bsend.mu.Lock()
			bsend.used -= need
			bsend.cond.Broadcast()
			bsend.mu.Unlock()
		})
	}
	return packed, release, nil
}
