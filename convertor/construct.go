package convertor

import (
	"fmt"
	"math"
	"math/bits"
	"strings"
	"unicode/utf8"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// Order is the storage order of the dimensions of an array given to Subarray.
type Order int

const (
	// RowMajor (C order): the last dimension varies fastest.
	RowMajor Order = iota
	// ColMajor (Fortran order): the first dimension varies fastest.
	ColMajor
)

// Contiguous returns count copies of old laid end to end (each old.Extent()
// bytes after the previous). Errors: ErrType for the zero old; ErrCount for
// count < 0 or a size out of range.
func Contiguous(count int, old Datatype) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	if count < 0 {
		return Datatype{}, countErr("Contiguous: count %d < 0", count)
	}
	var c calc
	l := c.rep(count, old.Extent(), old.d.lay)
	return finish(&c, l, "Contiguous(%d, %v)", count, old)
}

// Vector returns count blocks of blocklen copies of old; block i starts
// i*stride elements (of old's extent) after the first. stride may be
// negative or smaller than blocklen. Errors: ErrType for the zero old;
// ErrCount for a negative count or blocklen, or a size or bound out of range.
func Vector(count, blocklen, stride int, old Datatype) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	if count < 0 || blocklen < 0 {
		return Datatype{}, countErr("Vector: count %d, blocklen %d", count, blocklen)
	}
	var c calc
	step := c.mul(c.span(stride), old.Extent())
	l := c.rep(count, step, c.rep(blocklen, old.Extent(), old.d.lay))
	return finish(&c, l, "Vector(%d, %d, %d, %v)", count, blocklen, stride, old)
}

// Hvector is Vector with the stride between blocks given in bytes, with
// the same errors.
func Hvector(count, blocklen int, strideBytes int, old Datatype) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	if count < 0 || blocklen < 0 {
		return Datatype{}, countErr("Hvector: count %d, blocklen %d", count, blocklen)
	}
	var c calc
	l := c.rep(count, c.span(strideBytes), c.rep(blocklen, old.Extent(), old.d.lay))
	return finish(&c, l, "Hvector(%d, %d, %d, %v)", count, blocklen, strideBytes, old)
}

// Indexed returns len(blocklens) blocks; block i is blocklens[i] copies of
// old starting displs[i] elements (of old's extent) from the origin. The
// blocks are packed in the order given, whatever their displacements.
// Errors: ErrType for the zero old or slices of different lengths; ErrCount
// for a negative block length, or a displacement, size or bound out of range.
func Indexed(blocklens, displs []int, old Datatype) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	if len(blocklens) != len(displs) {
		return Datatype{}, typeErr("Indexed: %d blocklens but %d displs", len(blocklens), len(displs))
	}
	var c calc
	ext := old.Extent()
	l := c.blocks(len(blocklens), func(i int) (int, int, *layout, int) {
		return blocklens[i], c.mul(c.span(displs[i]), ext), &old.d.lay, ext
	})
	return finish(&c, l, "Indexed(%s, %s, %v)", ints(blocklens), ints(displs), old)
}

// Hindexed is Indexed with the displacements given in bytes, with the same
// errors.
func Hindexed(blocklens []int, displsBytes []int, old Datatype) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	if len(blocklens) != len(displsBytes) {
		return Datatype{}, typeErr("Hindexed: %d blocklens but %d displs", len(blocklens), len(displsBytes))
	}
	var c calc
	ext := old.Extent()
	l := c.blocks(len(blocklens), func(i int) (int, int, *layout, int) {
		return blocklens[i], c.span(displsBytes[i]), &old.d.lay, ext
	})
	return finish(&c, l, "Hindexed(%s, %s, %v)", ints(blocklens), ints(displsBytes), old)
}

// IndexedBlock is Indexed with every block blocklen copies long, with the
// same errors.
func IndexedBlock(blocklen int, displs []int, old Datatype) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	if blocklen < 0 {
		return Datatype{}, countErr("IndexedBlock: blocklen %d < 0", blocklen)
	}
	var c calc
	ext := old.Extent()
	l := c.blocks(len(displs), func(i int) (int, int, *layout, int) {
		return blocklen, c.mul(c.span(displs[i]), ext), &old.d.lay, ext
	})
	return finish(&c, l, "IndexedBlock(%d, %s, %v)", blocklen, ints(displs), old)
}

// Struct returns len(types) blocks; block i is blocklens[i] copies of
// types[i] starting displsBytes[i] bytes from the origin. Unlike a C
// compiler, Struct adds no padding after the last member: to give the type
// the extent of a Go struct with trailing padding, wrap it in Resized.
// Errors: ErrType for slices of different lengths or a zero type; ErrCount
// for a negative block length, or a displacement, size or bound out of range.
func Struct(blocklens []int, displsBytes []int, types []Datatype) (Datatype, error) {
	if len(blocklens) != len(displsBytes) || len(blocklens) != len(types) {
		return Datatype{}, typeErr("Struct: %d blocklens, %d displs, %d types", len(blocklens), len(displsBytes), len(types))
	}
	for i, t := range types {
		if !t.Valid() {
			return Datatype{}, typeErr("Struct: types[%d] is the zero Datatype", i)
		}
	}
	var c calc
	l := c.blocks(len(types), func(i int) (int, int, *layout, int) {
		return blocklens[i], c.span(displsBytes[i]), &types[i].d.lay, types[i].Extent()
	})
	names := make([]string, 0, min(len(types), listMax+1))
	for i, t := range types {
		if i == listMax {
			names = append(names, fmt.Sprintf("…(%d)", len(types)))
			break
		}
		names = append(names, t.String())
	}
	return finish(&c, l, "Struct(%s, %s, [%s])", ints(blocklens), ints(displsBytes), strings.Join(names, " "))
}

// Subarray returns the sub-block of an n-dimensional array of old elements
// (n = len(sizes) ≥ 1) with extents subsizes starting at index starts, in
// the given storage order. The result's lower bound is 0 and its extent is
// that of the whole array, so count > 1 steps from one full array to the
// next. Requires sizes[i] ≥ 1, 0 ≤ subsizes[i] and
// 0 ≤ starts[i] ≤ sizes[i]-subsizes[i], else ErrCount; slices of different
// lengths or none, an unknown order or the zero old are ErrType.
func Subarray(sizes, subsizes, starts []int, order Order, old Datatype) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	n := len(sizes)
	if n == 0 || len(subsizes) != n || len(starts) != n {
		return Datatype{}, typeErr("Subarray: %d sizes, %d subsizes, %d starts", n, len(subsizes), len(starts))
	}
	if order != RowMajor && order != ColMajor {
		return Datatype{}, typeErr("Subarray: unknown order %d", int(order))
	}
	for i := range n {
		if sizes[i] < 1 || subsizes[i] < 0 || subsizes[i] > sizes[i] || starts[i] < 0 || starts[i] > sizes[i]-subsizes[i] {
			return Datatype{}, countErr("Subarray: dimension %d: size %d, subsize %d, start %d", i, sizes[i], subsizes[i], starts[i])
		}
	}
	// dims lists the dimensions from the fastest varying to the slowest.
	dim := func(k int) int {
		if order == RowMajor {
			return n - 1 - k
		}
		return k
	}
	var c calc
	l := old.d.lay
	stride, offset := old.Extent(), 0
	for k := range n {
		d := dim(k)
		l = c.rep(subsizes[d], stride, l)
		offset = c.add(offset, c.mul(starts[d], stride))
		stride = c.mul(stride, sizes[d])
	}
	l = c.shift(l, offset)
	l.resize(0, stride)
	ord := "RowMajor"
	if order == ColMajor {
		ord = "ColMajor"
	}
	return finish(&c, l, "Subarray(%s, %s, %s, %s, %v)", ints(sizes), ints(subsizes), ints(starts), ord, old)
}

// Resized returns old with its lower bound set to lb and its extent to
// extent (≥ 0); the data is unchanged. The new bounds replace the old ones in
// every type built from the result. Errors: ErrType for the zero old;
// ErrCount for a negative extent or bounds out of range.
func Resized(old Datatype, lb, extent int) (Datatype, error) {
	if err := checkOld(old); err != nil {
		return Datatype{}, err
	}
	if extent < 0 {
		return Datatype{}, countErr("Resized: extent %d < 0", extent)
	}
	var c calc
	l := old.d.lay
	l.resize(c.span(lb), c.add(c.span(lb), c.span(extent)))
	return finish(&c, l, "Resized(%v, %d, %d)", old, lb, extent)
}

func checkOld(old Datatype) error {
	if !old.Valid() {
		return typeErr("the old datatype is the zero Datatype")
	}
	return nil
}

func typeErr(format string, args ...any) error {
	return mpierr.Errorf(mpierr.ErrType, format, args...)
}

func countErr(format string, args ...any) error {
	return mpierr.Errorf(mpierr.ErrCount, format, args...)
}

func finish(c *calc, l layout, format string, args ...any) (Datatype, error) {
	name := fmt.Sprintf(format, args...)
	if len(name) > nameMax { // deep nesting: keep names (and their cost) bounded
		cut := nameMax
		for cut > 0 && !utf8.RuneStart(name[cut]) {
			cut--
		}
		name = name[:cut] + "…"
	}
	if c.err != nil {
		return Datatype{}, fmt.Errorf("%s: %w", name, c.err)
	}
	return Datatype{&desc{name: name, lay: l}}, nil
}

// nameMax bounds the length of a datatype's String.
const nameMax = 400

// listMax is how many entries of a list String shows.
const listMax = 8

func ints(xs []int) string {
	if len(xs) <= listMax {
		return fmt.Sprint(xs)
	}
	s := fmt.Sprint(xs[:listMax])
	return s[:len(s)-1] + fmt.Sprintf(" …(%d)]", len(xs))
}

// maxSpan bounds every size, displacement and bound of a datatype, so that
// the sum of two in-range values never overflows an int.
const maxSpan = math.MaxInt >> 1

// maxOps bounds the length of a datatype's description.
const maxOps = 1 << 22

// calc does checked arithmetic for the constructors; the first overflow is
// kept in err (wrapping ErrCount) and every later result is meaningless.
type calc struct{ err error }

func (c *calc) fail(format string, args ...any) {
	if c.err == nil {
		c.err = countErr(format, args...)
	}
}

// span checks that a value given by the user is within ±maxSpan.
func (c *calc) span(v int) int {
	if v > maxSpan || v < -maxSpan {
		c.fail("%d is out of range (±%d)", v, maxSpan)
		return 0
	}
	return v
}

func (c *calc) add(a, b int) int { return c.span(a + b) }

func (c *calc) mul(a, b int) int {
	hi, lo := bits.Mul(uabs(a), uabs(b))
	if hi != 0 || lo > maxSpan {
		c.fail("%d*%d is out of range (±%d)", a, b, maxSpan)
		return 0
	}
	if a < 0 != (b < 0) {
		return -int(lo)
	}
	return int(lo)
}

func uabs(a int) uint {
	if a < 0 {
		return uint(-a) // math.MinInt stays 1<<63: still out of range
	}
	return uint(a)
}

// layout is a datatype's uncompiled description: ops is a sequence of data
// and loop records (see op) whose data displacements are relative to the
// element's origin, plus the type's size and bounds.
type layout struct {
	ops  []op
	size int // data bytes
	// lb, ub are the bounds; bounded is false when the type has no entries
	// at all (then lb = ub = 0).
	lb, ub  int
	bounded bool
	// tlb, tub bound the data bytes (both 0 when size is 0).
	tlb, tub int
	// dense: the data is one gap-free run of memory [tlb, tub) and is packed
	// in memory order.
	dense bool
}

func (l *layout) resize(lb, ub int) {
	l.lb, l.ub, l.bounded = lb, ub, true
}

// rep returns n copies of x, copy i displaced i*stride bytes.
func (c *calc) rep(n, stride int, x layout) layout {
	r := c.repBounds(n, stride, x)
	r.ops = c.appendRep(nil, n, stride, x.ops, 0)
	return r
}

// shift returns x displaced by d bytes.
func (c *calc) shift(x layout, d int) layout {
	if d == 0 {
		return x
	}
	r := c.shiftBounds(x, d)
	r.ops = c.appendRep(nil, 1, 0, x.ops, d)
	return r
}

// repBounds is rep without the records.
func (c *calc) repBounds(n, stride int, x layout) layout {
	if n == 0 || c.err != nil {
		return layout{dense: true}
	}
	if n == 1 {
		x.ops = nil
		return x
	}
	span := c.mul(n-1, stride)
	lo, hi := min(0, span), max(0, span)
	r := layout{size: c.mul(n, x.size), bounded: x.bounded}
	if x.bounded {
		r.lb, r.ub = c.add(x.lb, lo), c.add(x.ub, hi)
	}
	if x.size > 0 {
		r.tlb, r.tub = c.add(x.tlb, lo), c.add(x.tub, hi)
	}
	// Copies of a dense run are dense when each starts where the last ended.
	r.dense = x.size == 0 || x.dense && stride == x.size
	return r
}

// shiftBounds is shift without the records.
func (c *calc) shiftBounds(x layout, d int) layout {
	x.ops = nil
	if x.bounded {
		x.lb, x.ub = c.add(x.lb, d), c.add(x.ub, d)
	}
	if x.size > 0 {
		x.tlb, x.tub = c.add(x.tlb, d), c.add(x.tub, d)
	}
	return x
}

// appendRep appends to dst the records of n copies of ops, copy i displaced
// d + i*stride bytes. n copies of a single block become one strided data
// record; anything else is wrapped in a loop record.
func (c *calc) appendRep(dst []op, n, stride int, ops []op, d int) []op {
	if n == 0 || len(ops) == 0 || c.err != nil {
		return dst
	}
	if len(ops) == 1 && ops[0].kind == kData && (n == 1 || ops[0].count == 1) {
		o := ops[0]
		o.disp = c.add(o.disp, d)
		if n > 1 {
			o.count, o.stride = n, stride
		}
		return append(dst, o)
	}
	if len(dst)+len(ops)+2 > maxOps {
		c.fail("description longer than %d records", maxOps)
		return dst
	}
	if n > 1 {
		dst = append(dst, op{kind: kLoop, count: n, stride: stride})
	}
	for _, o := range ops {
		if o.kind == kData {
			o.disp = c.add(o.disp, d)
		}
		dst = append(dst, o)
	}
	if n > 1 {
		dst = append(dst, op{kind: kEnd})
	}
	return dst
}

// blocks concatenates n blocks; block(i) returns block i's length (copies),
// displacement in bytes, element layout and element extent.
func (c *calc) blocks(n int, block func(i int) (blen, disp int, el *layout, ext int)) layout {
	r := layout{dense: true}
	for i := range n {
		blen, disp, el, ext := block(i)
		if blen < 0 {
			c.fail("block %d: blocklen %d < 0", i, blen)
		}
		if c.err != nil {
			return layout{}
		}
		if blen == 0 {
			continue
		}
		x := c.shiftBounds(c.repBounds(blen, ext, *el), disp)
		if x.bounded {
			if !r.bounded {
				r.lb, r.ub, r.bounded = x.lb, x.ub, true
			}
			r.lb, r.ub = min(r.lb, x.lb), max(r.ub, x.ub)
		}
		if x.size > 0 {
			if r.size == 0 {
				r.tlb, r.tub = x.tlb, x.tub
			}
			// Blocks of a dense type follow each other in memory.
			r.dense = r.dense && x.dense && (r.size == 0 || x.tlb == r.tub)
			r.tlb, r.tub = min(r.tlb, x.tlb), max(r.tub, x.tub)
			r.size = c.add(r.size, x.size)
		}
		r.ops = c.appendRep(r.ops, blen, ext, el.ops, disp)
	}
	if c.err != nil {
		return layout{}
	}
	return r
}
