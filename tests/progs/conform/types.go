package main

import (
	"bytes"
	"fmt"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

// span is a run of bytes of a typed buffer, in the order it is packed.
type span struct{ off, n int }

// typeCase is a derived datatype with an oracle: spans lists, independently
// of the convertor, where the packed bytes of count elements lie in memory.
type typeCase struct {
	name   string
	dt     convertor.Datatype
	count  int
	memLen int
	spans  []span
}

func (c *typeCase) packedLen() int {
	n := 0
	for _, s := range c.spans {
		n += s.n
	}
	return n
}

// gather is the packed stream of mem according to the oracle.
func (c *typeCase) gather(mem []byte) []byte {
	out := make([]byte, 0, c.packedLen())
	for _, s := range c.spans {
		out = append(out, mem[s.off:s.off+s.n]...)
	}
	return out
}

// scatter writes a packed stream into mem according to the oracle.
func (c *typeCase) scatter(mem, packed []byte) {
	p := 0
	for _, s := range c.spans {
		copy(mem[s.off:s.off+s.n], packed[p:p+s.n])
		p += s.n
	}
}

func commit(t convertor.Datatype, err error) convertor.Datatype {
	if err != nil {
		panic(err)
	}
	t, err = t.Commit()
	if err != nil {
		panic(err)
	}
	return t
}

// vectorCase: count elements of Vector(blocks, blen, stride) of Float64.
func vectorCase(name string, blocks, blen, stride, count int) typeCase {
	dt := commit(convertor.Vector(blocks, blen, stride, convertor.Float64))
	ext := ((blocks-1)*stride + blen) * 8
	c := typeCase{name: name, dt: dt, count: count, memLen: count * ext}
	for e := range count {
		for b := range blocks {
			c.spans = append(c.spans, span{e*ext + b*stride*8, blen * 8})
		}
	}
	return c
}

// indexedCase: Indexed blocks of Int32 with irregular lengths and gaps, listed
// in an order that is not the memory order; count elements.
func indexedCase(name string, nblocks, count int) typeCase {
	lens := make([]int, nblocks)
	pos := make([]int, nblocks)
	at := 0
	for i := range nblocks {
		lens[i] = 1 + (i*37)%211
		pos[i] = at
		at += lens[i] + 1 + (i*13)%29 // a gap after every block
	}
	// List order: odd blocks backwards, then even blocks forwards; block 0
	// (at displacement 0, so the lower bound is 0) lands in the middle.
	var order []int
	for i := nblocks - 1; i >= 0; i-- {
		if i%2 == 1 {
			order = append(order, i)
		}
	}
	for i := 0; i < nblocks; i += 2 {
		order = append(order, i)
	}
	bl, dl := make([]int, nblocks), make([]int, nblocks)
	for k, i := range order {
		bl[k], dl[k] = lens[i], pos[i]
	}
	dt := commit(convertor.Indexed(bl, dl, convertor.Int32))
	last := nblocks - 1
	ext := (pos[last] + lens[last]) * 4 // lb 0, ub = end of the highest block
	c := typeCase{name: name, dt: dt, count: count, memLen: count * ext}
	for e := range count {
		for k := range order {
			c.spans = append(c.spans, span{e*ext + dl[k]*4, bl[k] * 4})
		}
	}
	return c
}

// structCase: a Go-like struct {a int32; _ [4]byte; b [3]float64; c byte; _ byte;
// d int16; _ [4]byte} (holes at 4..8, 33 and 36..40), extent 40; count elements.
func structCase(name string, count int) typeCase {
	st, err := convertor.Struct([]int{1, 3, 1, 1}, []int{0, 8, 32, 34},
		[]convertor.Datatype{convertor.Int32, convertor.Float64, convertor.Byte, convertor.Int16})
	dt := commit(convertor.Resized(commit(st, err), 0, 40))
	c := typeCase{name: name, dt: dt, count: count, memLen: count * 40}
	for e := range count {
		b := e * 40
		c.spans = append(c.spans, span{b, 4}, span{b + 8, 24}, span{b + 32, 1}, span{b + 34, 2})
	}
	return c
}

// subarray3DCase: the block subs at starts of a row-major sizes array of Float64.
func subarray3DCase(name string, sizes, subs, starts [3]int) typeCase {
	dt := commit(convertor.Subarray(sizes[:], subs[:], starts[:], convertor.RowMajor, convertor.Float64))
	c := typeCase{name: name, dt: dt, count: 1, memLen: sizes[0] * sizes[1] * sizes[2] * 8}
	for i := range subs[0] {
		for j := range subs[1] {
			idx := ((starts[0]+i)*sizes[1]+starts[1]+j)*sizes[2] + starts[2]
			c.spans = append(c.spans, span{idx * 8, subs[2] * 8})
		}
	}
	return c
}

// subarrayColCase: a column-major 2-D sub-block of Int64, count whole arrays.
func subarrayColCase(name string, sizes, subs, starts [2]int, count int) typeCase {
	dt := commit(convertor.Subarray(sizes[:], subs[:], starts[:], convertor.ColMajor, convertor.Int64))
	ext := sizes[0] * sizes[1] * 8
	c := typeCase{name: name, dt: dt, count: count, memLen: count * ext}
	for e := range count {
		for j := range subs[1] {
			idx := starts[0] + sizes[0]*(starts[1]+j)
			c.spans = append(c.spans, span{e*ext + idx*8, subs[0] * 8})
		}
	}
	return c
}

func typeCases() []typeCase {
	return []typeCase{
		vectorCase("vector/small", 8, 2, 5, 1),
		vectorCase("vector/large", 2048, 96, 160, 2), // 3 MiB packed
		indexedCase("indexed/small", 9, 1),
		indexedCase("indexed/large", 6000, 2), // ~2.5 MB packed
		structCase("struct/small", 3),
		structCase("struct/large", 90000), // ~2.8 MB packed
		subarrayColCase("subarray-col/small", [2]int{10, 12}, [2]int{3, 4}, [2]int{2, 5}, 2),
		subarray3DCase("subarray-3d/large", [3]int{64, 96, 128}, [3]int{50, 70, 90}, [3]int{5, 13, 17}), // 2.5 MB packed
	}
}

const sentinel = 0xEE

func filled(n int, b byte) []byte {
	m := make([]byte, n)
	for i := range m {
		m[i] = b
	}
	return m
}

// runTypes sends every typed case from src to dst three ways: typed to
// contiguous (checks packing), contiguous to typed (checks unpacking and
// that the holes stay untouched) and typed to typed.
func runTypes(w *mpi.Comm, src, dst int) error {
	me := w.Rank()
	for k, c := range typeCases() {
		tag := 1000 + 3*k
		mem := pattern(c.memLen, k+src) // the sender's typed memory
		packed := c.gather(mem)         // what must arrive
		if me == src {
			if err := w.Send(mpi.Typed(mem, c.count, c.dt), dst, tag); err != nil {
				return fmt.Errorf("%s: typed send: %w", c.name, err)
			}
			if err := w.Send(packed, dst, tag+1); err != nil {
				return fmt.Errorf("%s: contiguous send: %w", c.name, err)
			}
			if err := w.Send(mpi.Typed(mem, c.count, c.dt), dst, tag+2); err != nil {
				return fmt.Errorf("%s: typed send: %w", c.name, err)
			}
			continue
		}
		// Typed -> contiguous.
		got := filled(len(packed)+64, sentinel)
		st, err := w.Recv(got, src, tag)
		if err != nil {
			return fmt.Errorf("%s: typed->contiguous recv: %w", c.name, err)
		}
		if st.Count != len(packed) || !bytes.Equal(got[:len(packed)], packed) || !bytes.Equal(got[len(packed):], filled(64, sentinel)) {
			return fmt.Errorf("%s: typed->contiguous: count %d (want %d), bytes differ at %d", c.name, st.Count, len(packed), firstDiff(got, packed))
		}
		// Contiguous -> typed, and typed -> typed: the same memory results.
		want := filled(c.memLen, sentinel)
		c.scatter(want, packed)
		for i, t := range []int{tag + 1, tag + 2} {
			recv := filled(c.memLen, sentinel)
			st, err := w.Recv(mpi.Typed(recv, c.count, c.dt), src, t)
			if err != nil {
				return fmt.Errorf("%s: recv %d into typed: %w", c.name, i, err)
			}
			if st.Elements(c.dt) != c.count || !bytes.Equal(recv, want) {
				return fmt.Errorf("%s: recv %d into typed: %d elements (want %d), memory differs at byte %d",
					c.name, i, st.Elements(c.dt), c.count, firstDiff(recv, want))
			}
		}
	}
	return nil
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
