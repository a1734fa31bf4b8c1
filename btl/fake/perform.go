package fake

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/gompi-org/gompi/btl"
)

// How an operation travels: queued by its endpoint (or performed at once
// inline), performed when the test delivers it, then completed; RDMA
// handles resolved against the registered regions.

func dataSuffix(data []byte) string {
	if len(data) == 0 {
		return ""
	}
	return fmt.Sprintf(" data=%dB", len(data))
}

func (n *Network) describeLocked(op *Op) string {
	if op.Kind.IsSend() {
		return fmt.Sprintf("%s %s%s", op.Kind, n.format(op.Tag, op.Hdr), dataSuffix(op.Data))
	}
	return fmt.Sprintf("%s %s[%d,+%d)", op.Kind, HandleString(op.Handle), op.Off, op.Len)
}

// enqueue queues op (or, inline, performs it at once). It returns whether
// the operation is complete.
func (n *Network) enqueue(op *Op) (done bool) {
	n.mu.Lock()
	n.nextOp++
	op.ID = n.nextOp
	if n.inline {
		n.mu.Unlock()
		op.cb, op.async = nil, false // reported as done by the caller
		n.perform(op)
		return true
	}
	n.queue = append(n.queue, op)
	if op.async {
		n.live[op] = struct{}{}
	}
	if n.starts {
		n.logLocked("  +#%d %d->%d %s", op.ID, op.From, op.To, n.shortLocked(op))
	}
	n.mu.Unlock()
	return false
}

// shortLocked is the first word of the description: the kind and the
// header's name, or the RDMA range.
func (n *Network) shortLocked(op *Op) string {
	if !op.Kind.IsSend() {
		return n.describeLocked(op)
	}
	d := n.format(op.Tag, op.Hdr)
	if i := strings.IndexByte(d, ' '); i > 0 {
		d = d[:i]
	}
	return op.Kind.String() + " " + d
}

// perform delivers op: dispatches a fragment or runs an RDMA operation,
// then calls its completion.
func (n *Network) perform(op *Op) {
	n.mu.Lock()
	if op.ownership && !bytes.Equal(op.orig, op.Data) {
		n.violateLocked("#%d %d->%d %s: the buffer changed while the transport owned it", op.ID, op.From, op.To, op.Kind)
	}
	if err := n.dead[link{op.From, op.To}]; err != nil {
		n.logLocked("#%d %d->%d %s: link cut", op.ID, op.From, op.To, n.describeLocked(op))
		n.mu.Unlock()
		n.complete(op, err)
		return
	}
	to, from := n.mods[op.To], n.mods[op.From]
	if to == nil || from == nil || to.isClosed() || from.isClosed() {
		n.logLocked("#%d %d->%d %s: closed", op.ID, op.From, op.To, n.describeLocked(op))
		n.mu.Unlock()
		n.complete(op, btl.ErrClosed)
		return
	}
	if op.Kind.IsSend() {
		n.logLocked("#%d %d->%d %s", op.ID, op.From, op.To, n.describeLocked(op))
		n.mu.Unlock()
		ep, err := to.AddProc(op.From)
		if errors.Is(err, btl.ErrClosed) {
			// The receiver closed after the check above: as if before it.
			n.complete(op, btl.ErrClosed)
			return
		} else if err != nil {
			panic("fake: reverse endpoint: " + err.Error())
		}
		from.count(func(c *btl.Counters) { c.FragsSent++; c.BytesSent += int64(len(op.Hdr) + len(op.Data)) })
		to.count(func(c *btl.Counters) { c.FragsRecv++; c.BytesRecv += int64(len(op.Hdr) + len(op.Data)) })
		// The handler gets its own copies, scribbled over afterwards: a
		// handler that keeps them past the call sees garbage.
		h := append([]byte(nil), op.Hdr...)
		d := append([]byte(nil), op.Data...)
		to.disp.Dispatch(ep, op.Tag, h, d)
		scribble(h)
		scribble(d)
		n.complete(op, nil)
		return
	}
	err := op.Fail
	if err == nil {
		var rg *region
		rg, err = n.lookupLocked(op.Handle, op.Off, op.Len, op.To, op.Kind)
		if err != nil && errors.Is(err, errReleased) {
			n.violateLocked("#%d %s on a released registration", op.ID, op.Kind)
		}
		if err == nil {
			if op.Kind == KindPut {
				copy(rg.mem[op.Off:op.Off+op.Len], op.Data)
			} else {
				copy(op.local, rg.mem[op.Off:op.Off+op.Len])
			}
		}
	}
	status := "ok"
	if err != nil {
		status = "FAILED: " + err.Error()
	}
	n.logLocked("#%d %d->%d %s %s", op.ID, op.From, op.To, n.describeLocked(op), status)
	n.mu.Unlock()
	if err == nil {
		if op.Kind == KindPut {
			from.count(func(c *btl.Counters) { c.Puts++; c.PutBytes += int64(op.Len) })
		} else {
			from.count(func(c *btl.Counters) { c.Gets++; c.GetBytes += int64(op.Len) })
		}
	}
	n.complete(op, err)
}

// complete runs op's completion with err, then tells the fences (Flush)
// that wait for op.
func (n *Network) complete(op *Op, err error) {
	if op.cb != nil {
		op.cb(err)
	}
	if !op.async {
		return
	}
	n.mu.Lock()
	delete(n.live, op)
	var done []*fence
	for _, f := range op.fences {
		if err != nil && f.err == nil {
			f.err = err
		}
		if f.out--; f.out == 0 {
			done = append(done, f)
			n.logLocked("%d->%d flush done", op.From, op.To)
		}
	}
	op.fences = nil
	n.mu.Unlock()
	for _, f := range done {
		f.cb(f.err)
	}
}

func scribble(b []byte) {
	for i := range b {
		b[i] = 0xdb
	}
}

var errReleased = errors.New("registration released")

// lookupLocked finds the registration named by handle and checks that it
// belongs to owner, covers [off, off+n) and allows the access of kind.
func (n *Network) lookupLocked(handle []byte, off, size, owner int, kind Kind) (*region, error) {
	if len(handle) != 16 {
		return nil, fmt.Errorf("fake: handle of %d bytes: %w", len(handle), btl.ErrBadHandle)
	}
	id := binary.LittleEndian.Uint64(handle)
	rg := n.regs[id]
	if rg == nil {
		if id == 0 || id > n.nextRg {
			return nil, fmt.Errorf("fake: reg%d does not exist: %w", id, btl.ErrBadHandle)
		}
		return nil, fmt.Errorf("fake: reg%d: %w: %w", id, errReleased, btl.ErrBadHandle)
	}
	if uint64(len(rg.mem)) != binary.LittleEndian.Uint64(handle[8:]) {
		return nil, fmt.Errorf("fake: reg%d: handle length mismatch: %w", id, btl.ErrBadHandle)
	}
	if rg.owner != owner {
		return nil, fmt.Errorf("fake: reg%d belongs to rank %d, not %d: %w", id, rg.owner, owner, btl.ErrBadHandle)
	}
	if off < 0 || size < 0 || off > len(rg.mem) || size > len(rg.mem)-off {
		return nil, fmt.Errorf("fake: range [%d,+%d) outside reg%d of %d bytes: %w", off, size, id, len(rg.mem), btl.ErrBadHandle)
	}
	need := btl.AccessRemoteWrite
	if kind == KindGet {
		need = btl.AccessRemoteRead
	}
	if rg.access&need == 0 {
		return nil, fmt.Errorf("fake: reg%d lacks %s access: %w", id, accessString(need), btl.ErrBadHandle)
	}
	return rg, nil
}

// HandleString names a fake registration handle ("reg3"), for traces.
func HandleString(h []byte) string {
	if len(h) != 16 {
		return fmt.Sprintf("handle(%dB)", len(h))
	}
	return fmt.Sprintf("reg%d", binary.LittleEndian.Uint64(h))
}

func accessString(a btl.Access) string {
	var p []string
	if a&btl.AccessLocalWrite != 0 {
		p = append(p, "lw")
	}
	if a&btl.AccessRemoteRead != 0 {
		p = append(p, "rr")
	}
	if a&btl.AccessRemoteWrite != 0 {
		p = append(p, "rw")
	}
	return strings.Join(p, ",")
}
