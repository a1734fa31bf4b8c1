package convertor

import (
	"math/bits"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// Convertor packs count elements of a datatype laid over user memory into a
// contiguous stream (a packer), or unpacks such a stream back into the
// memory (an unpacker), in pieces of any size, resumable at any offset of
// the packed stream.
//
// The stream of count elements of t is the data of element 0 in t's packing
// order, then element 1, and so on: Size() = count*t.Size() bytes. Element i
// lies at byte i*t.Extent() of the memory, plus t's displacements.
//
// The Convertor holds on to the memory slice given to NewPacker, NewUnpacker
// or Reset until the next Reset; the caller must not change the memory of a
// packer (or read that of an unpacker) while it is in use if it wants a
// consistent result. A Convertor is not safe for concurrent use, and must
// not be copied (it may point into itself): reuse one with Reset. The zero
// Convertor is an empty one (Size 0).
type Convertor struct {
	mem  []byte
	size int  // packed bytes
	pos  int  // packed bytes done
	pack bool // a packer: SetPosition snaps back to a basic element

	// contig: the stream is mem[start : start+size].
	contig bool
	start  int

	// The walk (when !contig): prog is the program being walked (the
	// datatype's, or &c.local when the elements fold into one data record).
	prog  *program
	outer int     // iterations of the outer loop prog.ops[0]
	stack []frame // active loops, stack[0] the outer one
	sp    int     // frames in use
	pc    int     // record being walked
	blk   int     // data record: block in progress
	off   int     // data record: bytes of that block done
	// single: the program is one data record run once, so a Pack or
	// Unpack of the whole stream from its start is one gather or scatter.
	single bool
	// fresh: the walk state (pc, blk, off, stack, sp) is not set yet and
	// stands for the start of the stream; the walker sets it when it first
	// needs it (begin), so that a Reset followed by a Pack of the whole
	// stream writes no more of c than it must.
	fresh bool

	// The program of elements folded into one data record (prog points
	// here then), built by Reset without allocating.
	local     program
	localOps  [3]op
	localKids [1]int32
}

// frame is an active loop of the walk.
type frame struct {
	pc   int // the loop record
	iter int // iteration in progress
	n    int // iterations in all
	base int // byte offset in mem of this iteration's origin
}

// NewPacker prepares to pack count elements of t laid over buf (send side).
// buf is the whole user memory; element i starts at byte i*t.Extent() (plus
// the type's displacements). The Convertor reads buf until it is Reset or
// dropped.
//
// Errors: t invalid or uncommitted: ErrType; count < 0: ErrCount; a byte of
// the layout (true lower bound to true upper bound over count elements)
// outside [0, len(buf)): ErrCount.
func NewPacker(buf []byte, count int, t Datatype) (*Convertor, error) {
	c := new(Convertor)
	if err := c.Reset(buf, count, t, true); err != nil {
		return nil, err
	}
	return c, nil
}

// NewUnpacker is NewPacker for the receive side: the Convertor writes into
// buf until it is Reset or dropped.
func NewUnpacker(buf []byte, count int, t Datatype) (*Convertor, error) {
	c := new(Convertor)
	if err := c.Reset(buf, count, t, false); err != nil {
		return nil, err
	}
	return c, nil
}

// Reset re-initializes c as a packer (pack true) or an unpacker of count
// elements of t over buf, at position 0, with the errors of NewPacker. It
// allocates only when t nests loops deeper than any type c saw before. On
// error c is left empty (Size 0).
func (c *Convertor) Reset(buf []byte, count int, t Datatype, pack bool) error {
	// The short way: one element of a non-contiguous type with data (a
	// halo, a matrix column: the common derived-datatype message), where
	// the checks reduce to the data bounds and no fold is needed. The walk
	// state is set by the walker when first needed (fresh).
	if d := t.d; count == 1 && d != nil {
		p := d.prog.Load()
		l := &d.lay
		if p != nil && !l.dense && l.size > 0 && l.tlb >= 0 && l.tub <= len(buf) && len(c.stack) >= p.depth {
			c.mem, c.size, c.pos, c.pack = buf, l.size, 0, pack
			c.contig, c.start, c.fresh = false, 0, true
			c.prog, c.outer = p, 1
			c.single = len(p.ops) == 3
			return nil
		}
	}
	return c.reset(buf, count, t, pack)
}

// reset is Reset's general way.
func (c *Convertor) reset(buf []byte, count int, t Datatype, pack bool) error {
	var p *program
	if t.d != nil {
		p = t.d.prog.Load()
	}
	size, ok := packedSize(len(buf), count, t.d)
	if p == nil || !ok {
		*c = Convertor{stack: c.stack, pack: pack}
		return resetError(buf, count, t)
	}
	l := &t.d.lay
	c.mem, c.size, c.pos, c.pack = buf, size, 0, pack
	if size == 0 || l.dense && (count == 1 || l.ub-l.lb == l.size) {
		c.contig, c.start = true, 0
		if size > 0 {
			c.start = l.tlb
		}
		c.prog, c.sp, c.single = nil, 0, false
		return nil
	}
	c.contig, c.start, c.fresh = false, 0, true
	c.prog, c.outer = p, count
	if p.fold {
		c.foldInto(p, count, size)
	}
	// [loop, data, end] run once: the whole stream is one data record.
	c.single = c.outer == 1 && len(c.prog.ops) == 3
	if len(c.stack) < p.depth {
		c.stack = make([]frame, p.depth)
	}
	return nil
}

// ContiguousRange returns the memory of count elements of t over buf when
// they are one contiguous run (what Contiguous would return on a
// Convertor made by NewPacker or NewUnpacker), without making a
// Convertor. ok is false when they are not contiguous; err is NewPacker's
// error for arguments it refuses.
func ContiguousRange(buf []byte, count int, t Datatype) (mem []byte, ok bool, err error) {
	var p *program
	if t.d != nil {
		p = t.d.prog.Load()
	}
	size, fits := packedSize(len(buf), count, t.d)
	if p == nil || !fits {
		return nil, false, resetError(buf, count, t)
	}
	l := &t.d.lay
	if size == 0 {
		return buf[:0:0], true, nil
	}
	if l.dense && (count == 1 || l.ub-l.lb == l.size) {
		return buf[l.tlb : l.tlb+size : l.tlb+size], true, nil
	}
	return nil, false, nil
}

// begin sets the walk state to the start of the stream.
func (c *Convertor) begin() {
	c.pc, c.blk, c.off = 1, 0, 0
	c.stack[0] = frame{pc: 0, n: c.outer}
	c.sp = 1
	c.fresh = false
}

// foldInto makes c walk count elements of p, whose body folds, as the one
// data record c.local.
func (c *Convertor) foldInto(p *program, count, size int) {
	d := p.ops[1]
	d.count *= count
	d.stride = p.foldStride
	d.psize = size
	c.localOps = [3]op{
		{kind: kLoop, count: 1, bsize: size, psize: size, k0: 0, k1: 1},
		d,
		{kind: kEnd},
	}
	c.localKids[0] = 1
	c.local = program{ops: c.localOps[:], kids: c.localKids[:], depth: 1}
	c.prog, c.outer = &c.local, 1
}

// packedSize returns count*d.size and whether count elements of d lie
// within a buffer of n bytes (false also for a zero or uncommitted d, or a
// negative count). It is Reset's check, kept small: Reset is on every
// message's path; resetError says what is wrong.
func packedSize(n, count int, d *desc) (int, bool) {
	if d == nil || count < 0 {
		return 0, false
	}
	l := &d.lay
	hi, size := bits.Mul(uint(count), uint(l.size))
	if hi != 0 || size > maxSpan {
		return 0, false
	}
	if size == 0 {
		return 0, true
	}
	// The data bytes of count elements span [tlb, (count-1)*extent + tub).
	hi, span := bits.Mul(uint(count-1), uint(l.ub-l.lb))
	return int(size), hi == 0 && span <= maxSpan && l.tlb >= 0 && int(span)+l.tub <= n
}

// resetError returns the error of a Reset that packedSize refused.
func resetError(buf []byte, count int, t Datatype) error {
	switch {
	case !t.Valid():
		return mpierr.Errorf(mpierr.ErrType, "convertor: the zero Datatype")
	case !t.Committed():
		return mpierr.Errorf(mpierr.ErrType, "convertor: %v is not committed", t)
	case count < 0:
		return mpierr.Errorf(mpierr.ErrCount, "convertor: count %d < 0", count)
	}
	l := &t.d.lay
	return mpierr.Errorf(mpierr.ErrCount, "convertor: %d elements of %v (size %d, extent %d, data in [%d, %d)) do not fit in %d bytes",
		count, t, l.size, l.ub-l.lb, l.tlb, l.tub, len(buf))
}

// Size returns the packed size of the whole stream: count * t.Size().
func (c *Convertor) Size() int { return c.size }

// Position returns how many bytes of the packed stream are done.
func (c *Convertor) Position() int { return c.pos }

// Done reports whether the whole stream is done (Position() == Size()).
func (c *Convertor) Done() bool { return c.pos == c.size }

// Contiguous returns the memory of the whole packed stream (len == Size())
// and true when the stream is one contiguous run of the memory in order,
// such as count elements of a contiguous type, or one element of a type
// whose data is gap-free and ascending. The slice aliases the memory given
// to the Convertor; RDMA and zero-copy paths use it in place of Pack and
// Unpack. Otherwise it returns nil, false.
func (c *Convertor) Contiguous() ([]byte, bool) {
	if !c.contig {
		return nil, false
	}
	return c.mem[c.start : c.start+c.size : c.start+c.size], true
}

// SetPosition moves to offset pos of the packed stream, clamped to
// [0, Size()], and returns the position reached. Moving backwards is
// allowed. On an unpacker, and whenever Contiguous() is true, the position
// is exactly pos. On a packer of a non-contiguous stream the position snaps
// back to the start of the basic element (Int32, Float64, ...) that contains
// pos, as in Open MPI, so the caller must use the returned value.
//
// The cost is proportional to the loop nesting of the type times the log of
// its number of records per loop body, not to pos.
func (c *Convertor) SetPosition(pos int) int {
	pos = min(max(pos, 0), c.size)
	if c.contig || pos == c.size {
		c.pos = pos
		return pos
	}
	// Descend from the outer loop: at each loop pick the iteration by
	// division, then the record of the body by binary search.
	ops := c.prog.ops
	outer := &ops[0]
	e := div(pos, outer.bsize)
	rem := pos - e*outer.bsize
	c.stack[0] = frame{pc: 0, iter: e, n: c.outer, base: e * outer.stride}
	c.sp = 1
	c.fresh = false
	l := outer
	for {
		kids := c.prog.kids[l.k0:l.k1]
		lo, hi := 0, len(kids)-1 // the last kid with pstart <= rem
		for lo < hi {
			mid := int(uint(lo+hi+1) >> 1)
			if ops[kids[mid]].pstart <= rem {
				lo = mid
			} else {
				hi = mid - 1
			}
		}
		k := int(kids[lo])
		o := &ops[k]
		rem -= o.pstart
		if o.kind == kLoop {
			it := div(rem, o.bsize)
			rem -= it * o.bsize
			parent := &c.stack[c.sp-1]
			c.stack[c.sp] = frame{pc: k, iter: it, n: o.count, base: parent.base + it*o.stride}
			c.sp++
			l = o
			continue
		}
		c.pc = k
		c.blk = div(rem, o.blen)
		c.off = rem - c.blk*o.blen
		if c.pack && c.off > 0 {
			snap := c.off % o.esz
			c.off -= snap
			pos -= snap
		}
		c.pos = pos
		return pos
	}
}

// Pack copies the stream from Position() on into dst, advances, and returns
// the bytes written. It packs whole basic elements only, as many as fit;
// but when not even one whole element fits into a non-empty dst it packs
// part of one, so a caller always progresses (the next Pack finishes that
// element first). A contiguous stream is packed exactly: min(len(dst),
// Size()-Position()) bytes with one copy. dst is not retained.
//
// Pack works on an unpacker as well; the kind of a Convertor only decides
// how SetPosition treats a position inside a basic element.
func (c *Convertor) Pack(dst []byte) int {
	if c.contig {
		n := copy(dst, c.mem[c.start+c.pos:c.start+c.size])
		c.pos += n
		return n
	}
	if c.single && c.pos == 0 && len(dst) >= c.size {
		d := &c.prog.ops[1]
		gather(dst[:c.size], c.mem, d.disp, d.stride, d.blen, d.count)
		c.pos = c.size
		return c.size
	}
	return c.walk(dst, true)
}

// Unpack copies src into the memory from Position() on, advances, and
// returns the bytes consumed: min(len(src), Size()-Position()). src may end
// anywhere, even inside a basic element: its bytes go straight to their
// place and the next Unpack continues there. src is not retained.
func (c *Convertor) Unpack(src []byte) int {
	if c.contig {
		n := copy(c.mem[c.start+c.pos:c.start+c.size], src)
		c.pos += n
		return n
	}
	if c.single && c.pos == 0 && len(src) >= c.size {
		d := &c.prog.ops[1]
		scatter(c.mem, src[:c.size], d.disp, d.stride, d.blen, d.count)
		c.pos = c.size
		return c.size
	}
	return c.walk(src, false)
}

// walk moves the stream s (the destination when packing, the source when
// unpacking) from the current position on, and returns the bytes moved.
// It is the one walker behind Pack and Unpack: pack only chooses the
// direction of the copies and whether to stop at basic elements.
func (c *Convertor) walk(s []byte, pack bool) int {
	if c.pos == c.size { // also an empty Convertor, which has no program
		return 0
	}
	if c.fresh {
		c.begin()
	}
	done := 0
	ops := c.prog.ops
	for done < len(s) && c.pos < c.size {
		o := &ops[c.pc]
		switch o.kind {
		case kData:
			n, more := c.data(o, s[done:], done == 0, pack)
			done += n
			c.pos += n
			if !more {
				return done
			}
		case kLoop:
			top := &c.stack[c.sp-1]
			c.stack[c.sp] = frame{pc: c.pc, n: o.count, base: top.base}
			c.sp++
			c.pc++
		case kEnd:
			top := &c.stack[c.sp-1]
			top.iter++
			if top.iter < top.n {
				top.base += ops[top.pc].stride
				c.pc = top.pc + 1
			} else {
				c.sp--
				c.pc++
			}
		}
	}
	return done
}

// data moves the current data record from block c.blk, byte c.off on,
// as far as s allows, and reports whether the record was finished (the walk
// may go on). first says nothing was moved yet by this Pack or Unpack.
func (c *Convertor) data(o *op, s []byte, first, pack bool) (int, bool) {
	base := c.stack[c.sp-1].base + o.disp
	n := 0
	if c.off > 0 { // finish the block begun earlier
		k := c.take(o, len(s), first, pack)
		c.move(base+c.blk*o.stride+c.off, s[:k], pack)
		n, c.off = k, c.off+k
		if c.off < o.blen {
			return n, false
		}
		c.off = 0
		c.blk++
	}
	nb := o.count - c.blk // whole blocks: all that are left if they fit
	if room := len(s) - n; room < nb*o.blen {
		nb = room / o.blen
	}
	if nb > 0 {
		m := nb * o.blen
		if pack {
			gather(s[n:n+m], c.mem, base+c.blk*o.stride, o.stride, o.blen, nb)
		} else {
			scatter(c.mem, s[n:n+m], base+c.blk*o.stride, o.stride, o.blen, nb)
		}
		n += m
		c.blk += nb
	}
	if c.blk == o.count {
		c.blk = 0
		c.pc++
		return n, true
	}
	// Part of the next block: s has less room than one block.
	k := c.take(o, len(s)-n, first && n == 0, pack)
	c.move(base+c.blk*o.stride, s[n:n+k], pack)
	c.off = k
	return n + k, false
}

// take returns how many bytes of the current block to move when room bytes
// of stream are left: all the rest of the block if they fit; otherwise, when
// unpacking, room; when packing, up to the last basic element boundary that
// fits, or room when that is nothing and nothing was packed yet.
func (c *Convertor) take(o *op, room int, first, pack bool) int {
	rest := o.blen - c.off
	if room >= rest {
		return rest
	}
	if !pack {
		return room
	}
	k := (c.off+room)/o.esz*o.esz - c.off
	if k <= 0 {
		if first {
			return room
		}
		return 0
	}
	return k
}

// div is a / b for a, b ≥ 0, without the cost of a division when a < b
// (64-bit division takes tens of cycles, and SetPosition and the walker
// divide on every call).
func div(a, b int) int {
	if a < b {
		return 0
	}
	return a / b
}

// move copies the bytes between s and mem[at:].
func (c *Convertor) move(at int, s []byte, pack bool) {
	if pack {
		copy(s, c.mem[at:at+len(s)])
	} else {
		copy(c.mem[at:at+len(s)], s)
	}
}
