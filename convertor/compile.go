package convertor

import (
	"fmt"
	"strings"
)

// A description, and a compiled program, is a flat sequence of records in
// packing order, in the manner of Open MPI's datatype descriptions:
//
//   - a data record moves count blocks of blen bytes; block k starts at
//     disp + k*stride bytes from the current base;
//   - a loop record repeats the records up to its matching end record count
//     times; iteration i adds i*stride bytes to the base.
//
// The base starts at the element's origin; a loop's iterations shift it for
// the records inside. So every data displacement is relative to the origin
// plus the offsets of the enclosing loop iterations.
type opKind uint8

const (
	kData opKind = iota
	kLoop
	kEnd
)

type op struct {
	kind opKind
	// esz is the size of the basic elements of a data record: Pack stops
	// only at multiples of esz from a block's start. Records of different
	// element sizes are never merged.
	esz    int
	blen   int // data: bytes per block (a multiple of esz)
	count  int // data: blocks; loop: iterations
	stride int // data: bytes from one block to the next; loop: from one iteration to the next
	disp   int // data: offset of block 0 from the base

	// Set by compile, used by SetPosition:
	psize  int   // packed bytes of the whole record
	bsize  int   // loop: packed bytes of one iteration
	pstart int   // packed offset of the record in one iteration of its loop
	k0, k1 int32 // loop: its direct children are program.kids[k0:k1]
}

// program is a committed datatype's compiled form. ops[0] is an outer loop
// over the elements (its count is the convertor's count, not stored here)
// and ops[len-1] its end.
type program struct {
	ops   []op
	kids  []int32 // direct children of each loop, see op.k0
	depth int     // stack frames a walk needs at most (loops nested, outer one included)
	// fold: the body is one data record whose blocks continue with the same
	// stride from one element to the next (stride foldStride), so count
	// elements are one data record of count*foldBlocks blocks.
	fold       bool
	foldStride int
}

// node is a record in tree form, for the optimizer.
type node struct {
	op
	body []node
}

// compile turns a description into a program, optimizing it when opt is set
// (tests compile without, to check the optimizer).
func compile(l *layout, opt bool) *program {
	body, _ := parse(l.ops, 0)
	if opt {
		body = optimize(body)
	}
	p := &program{}
	outer := node{op: op{kind: kLoop, stride: l.ub - l.lb}, body: body}
	p.flatten([]node{outer}, 1)
	p.ops[0].bsize = l.size
	if len(body) == 1 && body[0].kind == kData {
		d := body[0].op
		switch ext := l.ub - l.lb; {
		case d.count == 1:
			p.fold, p.foldStride = true, ext
		case d.count*d.stride == ext:
			p.fold, p.foldStride = true, d.stride
		}
	}
	return p
}

// parse reads records from i up to the end record closing the enclosing
// loop (or the end of ops) and returns them as a tree.
func parse(ops []op, i int) ([]node, int) {
	var out []node
	for i < len(ops) {
		o := ops[i]
		switch o.kind {
		case kEnd:
			return out, i + 1
		case kLoop:
			var body []node
			body, i = parse(ops, i+1)
			out = append(out, node{op: o, body: body})
		default:
			out = append(out, node{op: o})
			i++
		}
	}
	return out, i
}

// optimize simplifies a sequence of records without changing the bytes moved
// or their order: empty records go, one-iteration loops are unrolled, loops
// over one block become strided data records, adjacent blocks of the same
// element size merge into one block or one strided record, and nested loops
// that step regularly merge into one loop.
func optimize(in []node) []node {
	var out []node
	for _, n := range in {
		if n.kind == kLoop {
			n.body = optimize(n.body)
			if n.count == 0 || len(n.body) == 0 {
				continue
			}
			if n.count == 1 {
				for _, b := range n.body {
					out = appendMerged(out, b)
				}
				continue
			}
			n = foldLoop(n)
		} else if n.count == 0 || n.blen == 0 {
			continue
		}
		out = appendMerged(out, n)
	}
	return out
}

// foldLoop turns a loop over a single record into a simpler record when the
// iterations continue the record's own pattern.
func foldLoop(n node) node {
	if len(n.body) != 1 {
		return n
	}
	b := n.body[0]
	switch {
	case b.kind == kData && b.count == 1:
		b.count, b.stride = n.count, n.stride
		return node{op: normData(b.op)}
	case b.kind == kData && b.count*b.stride == n.stride:
		b.count *= n.count
		return node{op: normData(b.op)}
	case b.kind == kLoop && b.count*b.stride == n.stride:
		b.count *= n.count
		return b
	}
	return n
}

// normData writes a data record whose blocks touch end to end as one block.
func normData(o op) op {
	if o.count > 1 && o.stride == o.blen {
		o.blen *= o.count
		o.count = 1
	}
	if o.count == 1 {
		o.stride = o.blen
	}
	return o
}

// appendMerged appends n to out, merging it into the last record when both
// are data records of the same element size and n continues the last one:
// directly after it in memory, or as its next block in a strided pattern.
func appendMerged(out []node, n node) []node {
	if n.kind == kData {
		n.op = normData(n.op)
	}
	if len(out) == 0 || n.kind != kData || out[len(out)-1].kind != kData {
		return append(out, n)
	}
	a := &out[len(out)-1]
	b := n.op
	if a.esz != b.esz {
		return append(out, n)
	}
	switch {
	case a.count == 1 && b.count == 1 && b.disp == a.disp+a.blen:
		a.blen += b.blen
		a.stride = a.blen
	case a.blen == b.blen && a.count == 1 && b.count == 1:
		a.count, a.stride = 2, b.disp-a.disp
	case a.blen == b.blen && a.count > 1 && (b.count == 1 || b.stride == a.stride) && b.disp == a.disp+a.count*a.stride:
		a.count += b.count
	default:
		return append(out, n)
	}
	a.op = normData(a.op)
	return out
}

// flatten appends the records of nodes, at loop depth depth, and returns the
// indices of the top-level ones and their total packed size.
func (p *program) flatten(nodes []node, depth int) ([]int32, int) {
	p.depth = max(p.depth, depth)
	idx := make([]int32, 0, len(nodes))
	pstart := 0
	for _, n := range nodes {
		i := len(p.ops)
		idx = append(idx, int32(i))
		o := n.op
		o.pstart = pstart
		if n.kind == kData {
			o.psize = o.count * o.blen
			p.ops = append(p.ops, o)
		} else {
			p.ops = append(p.ops, o)
			kids, bsize := p.flatten(n.body, depth+1)
			p.ops = append(p.ops, op{kind: kEnd})
			l := &p.ops[i]
			l.bsize, l.psize = bsize, o.count*bsize
			l.k0 = int32(len(p.kids))
			p.kids = append(p.kids, kids...)
			l.k1 = int32(len(p.kids))
		}
		pstart += p.ops[i].psize
	}
	return idx, pstart
}

// String lists the program, one record a line, for debugging and tests.
func (p *program) String() string {
	var b strings.Builder
	indent := 0
	for _, o := range p.ops {
		switch o.kind {
		case kData:
			fmt.Fprintf(&b, "%sdata esz=%d blen=%d count=%d stride=%d disp=%d\n",
				strings.Repeat("  ", indent), o.esz, o.blen, o.count, o.stride, o.disp)
		case kLoop:
			fmt.Fprintf(&b, "%sloop count=%d stride=%d\n", strings.Repeat("  ", indent), o.count, o.stride)
			indent++
		case kEnd:
			indent--
			fmt.Fprintf(&b, "%send\n", strings.Repeat("  ", indent))
		}
	}
	return b.String()
}
