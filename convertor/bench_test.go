package convertor

import (
	"testing"

	"github.com/gompi-org/gompi/internal/sys"
)

// The layouts measured here (and by bench/packc/pack.c with Open MPI's
// MPI_Pack, for comparison):
//
//   - column: column 17 of a 4096x4096 row-major float64 matrix,
//     Vector(4096, 1, 4096, Float64): 4096 blocks of 8 bytes, 32 KiB apart;
//   - halo: the halo faces of a 1024x1024 row-major float64 grid with a
//     ghost layer 2 cells wide (a 5x5 or 4th-order stencil), as Subarrays of
//     the grid: side=west is the 1020x2 strip of interior cells next to the
//     west ghost columns (1020 blocks of 16 bytes, 8 KiB apart), side=north
//     the 2x1020 strip under the north ghost rows (2 blocks of 8160 bytes);
//   - contig: 4 MiB of contiguous bytes, against copy().
//
// Every convertor benchmark resets its Convertor each iteration: the cost of
// setting up a message is part of the measured time. A benchmark and its
// hand-loop (or copy) counterpart use the very same buffers: memmove speed
// depends on the relative alignment of source and destination (up to 1.5x
// here), which would otherwise decide the comparison.

const (
	colN   = 4096
	colIdx = 17
	haloN  = 1024
	haloW  = 2
)

func commit(b *testing.B, dt Datatype, err error) Datatype {
	if err != nil {
		b.Fatal(err)
	}
	dt, err = dt.Commit()
	if err != nil {
		b.Fatal(err)
	}
	return dt
}

var (
	matrix []float64 // colN x colN, shared by the column benchmarks
	colBuf []float64 // the packed column
)

func columnSetup(b *testing.B) ([]float64, Datatype) {
	if matrix == nil {
		matrix = make([]float64, colN*colN)
		for i := range matrix {
			matrix[i] = float64(i)
		}
		colBuf = make([]float64, colN)
	}
	col, err := Vector(colN, 1, colN, Float64)
	return matrix, commit(b, col, err)
}

func BenchmarkPackColumn(b *testing.B) {
	m, col := columnSetup(b)
	mem := sys.AsBytes(m)[colIdx*8:]
	out := sys.AsBytes(colBuf)
	var c Convertor
	b.SetBytes(colN * 8)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Reset(mem, 1, col, true); err != nil {
			b.Fatal(err)
		}
		if c.Pack(out) != len(out) {
			b.Fatal("short pack")
		}
	}
}

func BenchmarkPackColumnLoop(b *testing.B) {
	m, _ := columnSetup(b)
	out := colBuf
	b.SetBytes(colN * 8)
	b.ReportAllocs()
	for b.Loop() {
		for i := range out {
			out[i] = m[i*colN+colIdx]
		}
	}
}

func BenchmarkUnpackColumn(b *testing.B) {
	m, col := columnSetup(b)
	mem := sys.AsBytes(m)[colIdx*8:]
	in := sys.AsBytes(colBuf)
	var c Convertor
	b.SetBytes(colN * 8)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Reset(mem, 1, col, false); err != nil {
			b.Fatal(err)
		}
		if c.Unpack(in) != len(in) {
			b.Fatal("short unpack")
		}
	}
}

func BenchmarkUnpackColumnLoop(b *testing.B) {
	m, _ := columnSetup(b)
	in := colBuf
	b.SetBytes(colN * 8)
	b.ReportAllocs()
	for b.Loop() {
		for i, v := range in {
			m[i*colN+colIdx] = v
		}
	}
}

// haloSides are the halo faces measured: a subarray of the grid each.
var haloSides = []struct {
	name               string
	subsizes, starts   []int
	rows, cols, r0, c0 int // the same strip for the hand loops
}{
	{"west", []int{haloN - 2*haloW, haloW}, []int{haloW, haloW}, haloN - 2*haloW, haloW, haloW, haloW},
	{"north", []int{haloW, haloN - 2*haloW}, []int{haloW, haloW}, haloW, haloN - 2*haloW, haloW, haloW},
}

var (
	grid    []float64 // haloN x haloN, shared by the halo benchmarks
	haloBuf []float64 // a packed face
)

func haloSetup(b *testing.B, sub, start []int) ([]float64, []float64, Datatype) {
	if grid == nil {
		grid = make([]float64, haloN*haloN)
		for i := range grid {
			grid[i] = float64(i)
		}
		haloBuf = make([]float64, 2*haloN*haloW)
	}
	dt, err := Subarray([]int{haloN, haloN}, sub, start, RowMajor, Float64)
	dt = commit(b, dt, err)
	return grid, haloBuf[:dt.Size()/8], dt
}

func BenchmarkPackHalo(b *testing.B) {
	for _, s := range haloSides {
		b.Run("side="+s.name, func(b *testing.B) {
			g, buf, dt := haloSetup(b, s.subsizes, s.starts)
			out := sys.AsBytes(buf)
			var c Convertor
			b.SetBytes(int64(dt.Size()))
			b.ReportAllocs()
			for b.Loop() {
				_ = c.Reset(sys.AsBytes(g), 1, dt, true)
				if c.Pack(out) != len(out) {
					b.Fatal("short pack")
				}
			}
		})
	}
}

func BenchmarkPackHaloLoop(b *testing.B) {
	for _, s := range haloSides {
		b.Run("side="+s.name, func(b *testing.B) {
			g, out, _ := haloSetup(b, s.subsizes, s.starts)
			b.SetBytes(int64(len(out) * 8))
			b.ReportAllocs()
			for b.Loop() {
				k := 0
				for r := s.r0; r < s.r0+s.rows; r++ {
					row := g[r*haloN+s.c0 : r*haloN+s.c0+s.cols]
					if s.cols <= 4 {
						for _, v := range row {
							out[k] = v
							k++
						}
					} else {
						k += copy(out[k:], row)
					}
				}
			}
		})
	}
}

func BenchmarkUnpackHalo(b *testing.B) {
	for _, s := range haloSides {
		b.Run("side="+s.name, func(b *testing.B) {
			g, buf, dt := haloSetup(b, s.subsizes, s.starts)
			in := sys.AsBytes(buf)
			var c Convertor
			b.SetBytes(int64(dt.Size()))
			b.ReportAllocs()
			for b.Loop() {
				_ = c.Reset(sys.AsBytes(g), 1, dt, false)
				if c.Unpack(in) != len(in) {
					b.Fatal("short unpack")
				}
			}
		})
	}
}

func BenchmarkUnpackHaloLoop(b *testing.B) {
	for _, s := range haloSides {
		b.Run("side="+s.name, func(b *testing.B) {
			g, in, _ := haloSetup(b, s.subsizes, s.starts)
			b.SetBytes(int64(len(in) * 8))
			b.ReportAllocs()
			for b.Loop() {
				k := 0
				for r := s.r0; r < s.r0+s.rows; r++ {
					row := g[r*haloN+s.c0 : r*haloN+s.c0+s.cols]
					if s.cols <= 4 {
						for j := range row {
							row[j] = in[k]
							k++
						}
					} else {
						k += copy(row, in[k:])
					}
				}
			}
		})
	}
}

const contigSize = 4 << 20

var contigSrc, contigDst []byte // shared by the contiguous benchmarks

func contigSetup() ([]byte, []byte) {
	if contigSrc == nil {
		contigSrc, contigDst = make([]byte, contigSize), make([]byte, contigSize)
	}
	return contigSrc, contigDst
}

func BenchmarkPackContig(b *testing.B) {
	src, dst := contigSetup()
	var c Convertor
	b.SetBytes(contigSize)
	b.ReportAllocs()
	for b.Loop() {
		_ = c.Reset(src, contigSize, Byte, true)
		if c.Pack(dst) != contigSize {
			b.Fatal("short pack")
		}
	}
}

func BenchmarkUnpackContig(b *testing.B) {
	src, mem := contigSetup()
	var c Convertor
	b.SetBytes(contigSize)
	b.ReportAllocs()
	for b.Loop() {
		_ = c.Reset(mem, contigSize/8, Float64, false)
		if c.Unpack(src) != contigSize {
			b.Fatal("short unpack")
		}
	}
}

func BenchmarkCopy(b *testing.B) {
	src, dst := contigSetup()
	b.SetBytes(contigSize)
	b.ReportAllocs()
	for b.Loop() {
		copy(dst, src)
	}
}

// BenchmarkSetPosition moves a packer of a vector of structs to positions
// far into the stream, as a pipelined send resuming at a fragment does.
func BenchmarkSetPosition(b *testing.B) {
	st, err := Struct([]int{1, 2}, []int{0, 8}, []Datatype{Int32, Float64})
	st = commit(b, st, err)
	v, err := Vector(1000, 2, 3, st)
	v = commit(b, v, err)
	mem := make([]byte, 4*v.Extent())
	c, err := NewPacker(mem, 4, v)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	pos := 0
	for b.Loop() {
		pos = (pos + 7919*13) % c.Size()
		c.SetPosition(pos)
	}
}
