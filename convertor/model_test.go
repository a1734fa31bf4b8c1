package convertor

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"
)

// The test model of a datatype: its type map spelled out element by element,
// built straight from the MPI definitions of the constructors. The tests
// compare the real datatypes and convertors against it.

// ment is one basic element: size bytes at disp.
type ment struct{ disp, size int }

type mtype struct {
	ents    []ment // basic elements in packing order
	lb, ub  int    // bounds; meaningful when bounded
	bounded bool   // the type map has entries (data or bound markers)
}

func mPredef(size int) *mtype {
	return &mtype{ents: []ment{{0, size}}, ub: size, bounded: true}
}

func (m *mtype) size() int {
	s := 0
	for _, e := range m.ents {
		s += e.size
	}
	return s
}

func (m *mtype) extent() int { return m.ub - m.lb }

func (m *mtype) trueBounds() (int, int) {
	if len(m.ents) == 0 {
		return 0, 0
	}
	lo, hi := m.ents[0].disp, m.ents[0].disp+m.ents[0].size
	for _, e := range m.ents {
		lo, hi = min(lo, e.disp), max(hi, e.disp+e.size)
	}
	return lo, hi
}

// copyAt is one copy of a type at a displacement.
type copyAt struct {
	t *mtype
	d int
}

// place concatenates copies: the type map of a derived type.
func place(copies []copyAt) *mtype {
	r := &mtype{}
	for _, c := range copies {
		for _, e := range c.t.ents {
			r.ents = append(r.ents, ment{e.disp + c.d, e.size})
		}
		if c.t.bounded {
			lb, ub := c.t.lb+c.d, c.t.ub+c.d
			if !r.bounded {
				r.lb, r.ub, r.bounded = lb, ub, true
			}
			r.lb, r.ub = min(r.lb, lb), max(r.ub, ub)
		}
	}
	return r
}

func mContiguous(n int, old *mtype) *mtype {
	var cs []copyAt
	for i := range n {
		cs = append(cs, copyAt{old, i * old.extent()})
	}
	return place(cs)
}

func mHvector(count, bl, strideBytes int, old *mtype) *mtype {
	var cs []copyAt
	for i := range count {
		for j := range bl {
			cs = append(cs, copyAt{old, i*strideBytes + j*old.extent()})
		}
	}
	return place(cs)
}

func mVector(count, bl, stride int, old *mtype) *mtype {
	return mHvector(count, bl, stride*old.extent(), old)
}

func mHindexed(bls, displs []int, old *mtype) *mtype {
	var cs []copyAt
	for i := range bls {
		for j := range bls[i] {
			cs = append(cs, copyAt{old, displs[i] + j*old.extent()})
		}
	}
	return place(cs)
}

func mIndexed(bls, displs []int, old *mtype) *mtype {
	var cs []copyAt
	for i := range bls {
		for j := range bls[i] {
			cs = append(cs, copyAt{old, (displs[i] + j) * old.extent()})
		}
	}
	return place(cs)
}

func mStruct(bls, displs []int, types []*mtype) *mtype {
	var cs []copyAt
	for i := range bls {
		for j := range bls[i] {
			cs = append(cs, copyAt{types[i], displs[i] + j*types[i].extent()})
		}
	}
	return place(cs)
}

// mSubarray enumerates the sub-block's indices in storage order.
func mSubarray(sizes, subsizes, starts []int, order Order, old *mtype) *mtype {
	n := len(sizes)
	stride := make([]int, n) // in elements
	total := 1
	for k := range n {
		d := k // the k-th fastest dimension
		if order == RowMajor {
			d = n - 1 - k
		}
		stride[d] = total
		total *= sizes[d]
	}
	var cs []copyAt
	idx := make([]int, n)
	var rec func(k int) // k: the k-th slowest dimension
	rec = func(k int) {
		if k == n {
			off := 0
			for d := range n {
				off += (starts[d] + idx[d]) * stride[d]
			}
			cs = append(cs, copyAt{old, off * old.extent()})
			return
		}
		d := k
		if order == ColMajor {
			d = n - 1 - k
		}
		for i := range subsizes[d] {
			idx[d] = i
			rec(k + 1)
		}
	}
	rec(0)
	r := place(cs)
	r.lb, r.ub, r.bounded = 0, total*old.extent(), true
	return r
}

func mResized(old *mtype, lb, extent int) *mtype {
	r := &mtype{ents: old.ents, lb: lb, ub: lb + extent, bounded: true}
	return r
}

// runs lists the byte runs of count elements in packing order.
func (m *mtype) runs(count int) []ment {
	var rs []ment
	for k := range count {
		for _, e := range m.ents {
			rs = append(rs, ment{k*m.extent() + e.disp, e.size})
		}
	}
	return rs
}

// stream gathers the packed stream of count elements of m over mem.
func (m *mtype) stream(mem []byte, count int) []byte {
	var s []byte
	for _, r := range m.runs(count) {
		s = append(s, mem[r.disp:r.disp+r.size]...)
	}
	return s
}

// contiguous reports whether the stream of count elements is one ascending
// run of memory.
func (m *mtype) contiguous(count int) bool {
	rs := m.runs(count)
	for i := 1; i < len(rs); i++ {
		if rs[i].disp != rs[i-1].disp+rs[i-1].size {
			return false
		}
	}
	return true
}

// bufLen is the memory count elements of m need.
func (m *mtype) bufLen(count int) int {
	if count == 0 || m.size() == 0 {
		return 0
	}
	_, tub := m.trueBounds()
	return (count-1)*m.extent() + tub
}

// source is the randomness the generator draws from: a *rand.Rand in the
// property tests, the fuzzer's bytes in the fuzz targets.
type source interface{ IntN(n int) int }

// byteSource draws from a byte string; past its end every draw is 0.
type byteSource struct{ b []byte }

func (s *byteSource) IntN(n int) int {
	v := 0
	for k := 0; k < 2 && len(s.b) > 0; k++ {
		v = v<<8 | int(s.b[0])
		s.b = s.b[1:]
		if n <= 256 {
			break
		}
	}
	return v % n
}

// gen builds random datatypes together with their models.
type gen struct {
	r source
}

var predefs = []struct {
	t Datatype
	s int
}{
	{Byte, 1}, {Int8, 1}, {Int16, 2}, {Uint16, 2}, {Int32, 4}, {Float32, 4},
	{Int64, 8}, {Float64, 8}, {Uint64, 8}, {Complex64, 8}, {Complex128, 16},
}

func (g *gen) in(lo, hi int) int { return lo + g.r.IntN(hi-lo+1) }

// cnt returns a count in [0, hi], rarely 0.
func (g *gen) cnt(hi int) int {
	if g.r.IntN(12) == 0 {
		return 0
	}
	return g.in(1, hi)
}

func (g *gen) cnts(n, hi int) []int {
	xs := make([]int, n)
	for i := range xs {
		xs[i] = g.cnt(hi)
	}
	return xs
}

func (g *gen) ints(n, lo, hi int) []int {
	xs := make([]int, n)
	for i := range xs {
		xs[i] = g.in(lo, hi)
	}
	return xs
}

// maxEnts bounds the model's size so the tests stay fast.
const maxEnts = 4000

// typ returns a random datatype of nesting at most depth, and its model.
func (g *gen) typ(depth int) (Datatype, *mtype, error) {
	t, m, err := g.typ1(depth)
	if err == nil && len(m.ents) > maxEnts {
		p := predefs[g.r.IntN(len(predefs))]
		return p.t, mPredef(p.s), nil
	}
	return t, m, err
}

func (g *gen) typ1(depth int) (Datatype, *mtype, error) {
	if depth == 0 || g.r.IntN(10) == 0 {
		p := predefs[g.r.IntN(len(predefs))]
		return p.t, mPredef(p.s), nil
	}
	old, mo, err := g.typ(depth - 1)
	if err != nil {
		return old, mo, err
	}
	switch g.r.IntN(9) {
	case 0:
		n := g.cnt(5)
		t, err := Contiguous(n, old)
		return t, mContiguous(n, mo), err
	case 1:
		c, bl, s := g.cnt(5), g.cnt(3), g.in(-3, 6)
		t, err := Vector(c, bl, s, old)
		return t, mVector(c, bl, s, mo), err
	case 2:
		c, bl, s := g.cnt(4), g.cnt(3), g.in(-16, 64)
		t, err := Hvector(c, bl, s, old)
		return t, mHvector(c, bl, s, mo), err
	case 3:
		k := g.cnt(4)
		bls, ds := g.cnts(k, 3), g.ints(k, -2, 9)
		t, err := Indexed(bls, ds, old)
		return t, mIndexed(bls, ds, mo), err
	case 4:
		k := g.cnt(4)
		bls, ds := g.cnts(k, 3), g.ints(k, -8, 64)
		t, err := Hindexed(bls, ds, old)
		return t, mHindexed(bls, ds, mo), err
	case 5:
		k, bl := g.cnt(4), g.cnt(3)
		ds := g.ints(k, -2, 9)
		t, err := IndexedBlock(bl, ds, old)
		bls := make([]int, k)
		for i := range bls {
			bls[i] = bl
		}
		return t, mIndexed(bls, ds, mo), err
	case 6:
		k := g.in(1, 3)
		bls, ds := g.cnts(k, 3), g.ints(k, -8, 64)
		types, models := []Datatype{old}, []*mtype{mo}
		for len(types) < k {
			t, m, err := g.typ(depth - 1)
			if err != nil {
				return t, m, err
			}
			types, models = append(types, t), append(models, m)
		}
		// Often lay the members out back to back, like a packed C struct.
		if g.r.IntN(2) == 0 {
			at := 0
			for i := range ds {
				ds[i] = at - models[i].lb
				at += bls[i] * models[i].extent()
			}
		}
		t, err := Struct(bls, ds, types)
		return t, mStruct(bls, ds, models), err
	case 7:
		n := g.in(1, 3)
		sizes := g.ints(n, 1, 5)
		subs, starts := make([]int, n), make([]int, n)
		for i := range n {
			subs[i] = g.cnt(sizes[i])
			starts[i] = g.in(0, sizes[i]-subs[i])
		}
		order := Order(g.r.IntN(2))
		t, err := Subarray(sizes, subs, starts, order, old)
		return t, mSubarray(sizes, subs, starts, order, mo), err
	default:
		lb, ext := g.in(-8, 8), g.in(0, 40)
		t, err := Resized(old, lb, ext)
		return t, mResized(mo, lb, ext), err
	}
}

// usable shifts t so that its data starts at a byte ≥ 0 and commits it.
func usable(t Datatype, m *mtype) (Datatype, *mtype, error) {
	if tlb, _ := m.trueBounds(); tlb < 0 {
		var err error
		t, err = Hindexed([]int{1}, []int{-tlb}, t)
		if err != nil {
			return t, m, err
		}
		m = mHindexed([]int{1}, []int{-tlb}, m)
	}
	t, err := t.Commit()
	return t, m, err
}

// checkShape compares t's size and bounds with the model's.
func checkShape(t Datatype, m *mtype) error {
	tlb, tub := m.trueBounds()
	lb := 0
	if m.bounded {
		lb = m.lb
	}
	got := [5]int{t.Size(), t.LB(), t.Extent(), t.TrueLB(), t.TrueExtent()}
	want := [5]int{m.size(), lb, m.extent(), tlb, tub - tlb}
	if got != want {
		return fmt.Errorf("%v: size, lb, extent, true lb, true extent = %v, model %v", t, got, want)
	}
	if t.IsContiguous() != (m.contiguous(2) && m.size() == m.extent()) {
		return fmt.Errorf("%v: IsContiguous %v, model says otherwise", t, t.IsContiguous())
	}
	return nil
}

func randBytes(r *rand.Rand, n int) []byte {
	b := make([]byte, n+8)
	for i := 0; i < n; i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return b[:n:n]
}

func TestModelSelfCheck(t *testing.T) {
	// The model itself on a case worked by hand: a 3x4 row-major array of
	// int32, the 2x2 block at (1,1).
	m := mSubarray([]int{3, 4}, []int{2, 2}, []int{1, 1}, RowMajor, mPredef(4))
	want := []ment{{20, 4}, {24, 4}, {36, 4}, {40, 4}}
	if fmt.Sprint(m.ents) != fmt.Sprint(want) || m.extent() != 48 {
		t.Fatalf("model subarray = %v extent %d", m.ents, m.extent())
	}
	m = mSubarray([]int{3, 4}, []int{2, 2}, []int{1, 1}, ColMajor, mPredef(4))
	want = []ment{{16, 4}, {20, 4}, {28, 4}, {32, 4}}
	if fmt.Sprint(m.ents) != fmt.Sprint(want) {
		t.Fatalf("model col-major subarray = %v", m.ents)
	}
}
