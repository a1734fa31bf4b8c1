package convertor_test

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/gompi-org/gompi/convertor"
)

// float64s lays vals out as memory, as a []float64 would be.
func float64s(vals ...float64) []byte {
	b := make([]byte, 8*len(vals))
	for i, v := range vals {
		binary.NativeEndian.PutUint64(b[8*i:], math.Float64bits(v))
	}
	return b
}

// values reads packed float64s back.
func values(b []byte) []float64 {
	v := make([]float64, len(b)/8)
	for i := range v {
		v[i] = math.Float64frombits(binary.NativeEndian.Uint64(b[8*i:]))
	}
	return v
}

// A column of a row-major 4x4 matrix: 4 blocks of one float64, a row apart.
func ExampleVector() {
	m := make([]float64, 16)
	for i := range m {
		m[i] = float64(i)
	}
	mem := float64s(m...)

	col, err := convertor.Vector(4, 1, 4, convertor.Float64)
	if err != nil {
		panic(err)
	}
	col, _ = col.Commit()
	fmt.Println(col, "size", col.Size(), "extent", col.Extent())

	// Element 0 of the type starts at the buffer's first byte: to take
	// column 1, start the buffer at m[1].
	p, err := convertor.NewPacker(mem[1*8:], 1, col)
	if err != nil {
		panic(err)
	}
	out := make([]byte, p.Size())
	p.Pack(out)
	fmt.Println(values(out))
	// Output:
	// Vector(4, 1, 4, Float64) size 32 extent 104
	// [1 5 9 13]
}

// The interior 2x3 block of a 4x5 grid of bytes numbered 0 to 19.
func ExampleSubarray() {
	grid := make([]byte, 20)
	for i := range grid {
		grid[i] = byte(i)
	}
	for _, order := range []convertor.Order{convertor.RowMajor, convertor.ColMajor} {
		dt, _ := convertor.Subarray([]int{4, 5}, []int{2, 3}, []int{1, 1}, order, convertor.Byte)
		dt, _ = dt.Commit()
		p, _ := convertor.NewPacker(grid, 1, dt)
		out := make([]byte, p.Size())
		p.Pack(out)
		fmt.Println(out, "extent", dt.Extent())
	}
	// Output:
	// [6 7 8 11 12 13] extent 20
	// [5 6 9 10 13 14] extent 20
}

// A datatype for the Go struct
//
//	type particle struct {
//		ID  int32   // offset 0
//		_   [4]byte // padding
//		Pos float64 // offset 8
//	}
//
// Struct adds no trailing padding, so Resized gives it the Go size when the
// struct has some; here the extent is already 16.
func ExampleStruct() {
	p, _ := convertor.Struct([]int{1, 1}, []int{0, 8}, []convertor.Datatype{convertor.Int32, convertor.Float64})
	p, _ = convertor.Resized(p, 0, 16)
	p, _ = p.Commit()
	fmt.Println("size", p.Size(), "extent", p.Extent(), "contiguous", p.IsContiguous())
	// Output:
	// size 12 extent 16 contiguous false
}

// Every other float64: Resized stretches one float64 to an extent of 16, so
// count elements step over the gaps.
func ExampleResized() {
	mem := float64s(0, 1, 2, 3, 4, 5, 6, 7)
	every2, _ := convertor.Resized(convertor.Float64, 0, 16)
	every2, _ = every2.Commit()
	p, _ := convertor.NewPacker(mem, 4, every2)
	out := make([]byte, p.Size())
	p.Pack(out)
	fmt.Println(values(out))
	// Output:
	// [0 2 4 6]
}

// Blocks in any order: the packed stream follows the blocks as listed.
func ExampleIndexed() {
	mem := float64s(0, 1, 2, 3, 4, 5, 6, 7)
	dt, _ := convertor.Indexed([]int{2, 1}, []int{5, 0}, convertor.Float64)
	dt, _ = dt.Commit()
	p, _ := convertor.NewPacker(mem, 1, dt)
	out := make([]byte, p.Size())
	p.Pack(out)
	fmt.Println(values(out))
	// Output:
	// [5 6 0]
}

// Packing a non-contiguous stream into fragments: Pack stops at whole basic
// elements, and a packer's SetPosition snaps back to one; an unpacker takes
// any split.
func ExampleConvertor_SetPosition() {
	mem := float64s(0, 1, 2, 3, 4, 5, 6, 7)
	odd, _ := convertor.Vector(4, 1, 2, convertor.Float64)
	odd, _ = odd.Commit()
	p, _ := convertor.NewPacker(mem[8:], 1, odd)

	frag := make([]byte, 12)
	n := p.Pack(frag)
	fmt.Println("packed", n, "bytes:", values(frag[:n]))

	// Resume the fragment that starts at stream offset 20 (inside the
	// third float64): the packer starts at its beginning instead.
	fmt.Println("resumed at", p.SetPosition(20))

	u, _ := convertor.NewUnpacker(make([]byte, 64), 1, odd)
	fmt.Println("unpacker resumed at", u.SetPosition(20))
	// Output:
	// packed 8 bytes: [1]
	// resumed at 16
	// unpacker resumed at 20
}

// Receiving into a column: unpack the stream in pieces of any size.
func ExampleNewUnpacker() {
	m := make([]byte, 4*4*8)
	col, _ := convertor.Vector(4, 1, 4, convertor.Float64)
	col, _ = col.Commit()
	u, err := convertor.NewUnpacker(m[2*8:], 1, col) // column 2
	if err != nil {
		panic(err)
	}
	stream := float64s(10, 20, 30, 40)
	for len(stream) > 0 {
		n := u.Unpack(stream[:min(5, len(stream))]) // 5 bytes at a time
		stream = stream[n:]
	}
	fmt.Println(values(m))
	// Output:
	// [0 0 10 0 0 0 20 0 0 0 30 0 0 0 40 0]
}

// How many elements a received byte count holds.
func ExampleDatatype_Elements() {
	pair, _ := convertor.Contiguous(2, convertor.Float64)
	fmt.Println(pair.Elements(48), pair.Elements(40) == convertor.Undefined)
	// Output:
	// 3 true
}

// A contiguous stream needs no packing: Contiguous hands out the memory.
func ExampleConvertor_Contiguous() {
	mem := make([]byte, 64)
	p, _ := convertor.NewPacker(mem, 8, convertor.Float64)
	b, ok := p.Contiguous()
	fmt.Println(len(b), ok)
	// Output:
	// 64 true
}
