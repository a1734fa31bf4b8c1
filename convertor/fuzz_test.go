package convertor

import (
	"bytes"
	"errors"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// argDecoder turns fuzz bytes into constructor arguments: mostly small
// numbers, sometimes hostile ones.
type argDecoder struct{ b []byte }

var hostile = []int{
	math.MaxInt, math.MinInt, math.MaxInt >> 1, -(math.MaxInt >> 1), 1 << 62, -1 << 62,
	1 << 40, 1 << 31, 1<<31 - 1, -1 << 31, 1 << 20, -1, 0, 1 << 61, maxSpan, maxSpan + 1,
}

func (d *argDecoder) byte() int {
	if len(d.b) == 0 {
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return int(v)
}

func (d *argDecoder) int() int {
	k := d.byte()
	if k < 240 {
		return k - 40 // -40 .. 199
	}
	return hostile[(k-240)%len(hostile)]
}

func (d *argDecoder) ints(n int) []int {
	xs := make([]int, n)
	for i := range xs {
		xs[i] = d.int()
	}
	return xs
}

// FuzzConstructors calls the constructors with decoded, possibly hostile
// arguments. Every call must return a datatype or an error of class ErrType
// or ErrCount, never panic; every datatype made must have sane bounds and,
// when small enough to pack, round-trip and pack the same bytes as its
// unoptimized description.
func FuzzConstructors(f *testing.F) {
	f.Add([]byte{0, 3, 1, 4, 2, 44, 1})
	f.Add([]byte{1, 5, 2, 9, 0, 6, 41, 43, 45, 40, 44, 48, 3})
	f.Add([]byte{5, 2, 3, 42, 44, 43, 44, 46, 45, 2, 8, 1, 2, 50})
	f.Add([]byte{6, 3, 46, 44, 42, 43, 41, 41, 40, 0, 0, 1, 2, 7, 2, 0, 36, 60})
	f.Add([]byte{7, 2, 240, 1, 9, 41, 2, 241, 3})
	f.Add([]byte{2, 4, 2, 250, 1, 3, 4, 4, 40, 30, 8, 0, 60})
	f.Fuzz(func(t *testing.T, data []byte) {
		d := &argDecoder{b: data}
		stack := []Datatype{Float64, Int32, Byte}
		pick := func() Datatype {
			k := d.byte()
			if k == 255 {
				return Datatype{}
			}
			return stack[k%len(stack)]
		}
		for step := 0; step < 6 && len(d.b) > 0; step++ {
			var dt Datatype
			var err error
			switch d.byte() % 9 {
			case 0:
				dt, err = Contiguous(d.int(), pick())
			case 1:
				dt, err = Vector(d.int(), d.int(), d.int(), pick())
			case 2:
				dt, err = Hvector(d.int(), d.int(), d.int(), pick())
			case 3:
				n, m := d.byte()%5, d.byte()%5
				dt, err = Indexed(d.ints(n), d.ints(m), pick())
			case 4:
				n, m := d.byte()%5, d.byte()%5
				dt, err = Hindexed(d.ints(n), d.ints(m), pick())
			case 5:
				dt, err = IndexedBlock(d.int(), d.ints(d.byte()%5), pick())
			case 6:
				n, m, k := d.byte()%4, d.byte()%4, d.byte()%4
				types := make([]Datatype, k)
				for i := range types {
					types[i] = pick()
				}
				dt, err = Struct(d.ints(n), d.ints(m), types)
			case 7:
				n, m, k := d.byte()%4, d.byte()%4, d.byte()%4
				dt, err = Subarray(d.ints(n), d.ints(m), d.ints(k), Order(d.byte()%3), pick())
			default:
				dt, err = Resized(pick(), d.int(), d.int())
			}
			if err != nil {
				if !errors.Is(err, mpierr.ErrType) && !errors.Is(err, mpierr.ErrCount) {
					t.Fatalf("error of no class: %v", err)
				}
				continue
			}
			if !dt.Valid() || dt.Size() < 0 || dt.Extent() < 0 || dt.TrueExtent() < 0 || dt.IsContiguous() && dt.TrueExtent() != dt.Size() {
				t.Fatalf("%v: size %d extent %d true extent %d", dt, dt.Size(), dt.Extent(), dt.TrueExtent())
			}
			stack = append(stack, dt)
		}
		top := stack[len(stack)-1]
		if _, err := top.Commit(); err != nil {
			t.Fatal(err)
		}
		count := 1 + d.byte()%3
		if top.TrueLB() < 0 || top.TrueLB() > 1<<16 || top.Size() > 1<<16 || top.Extent() > 1<<16 || top.TrueExtent() > 1<<16 {
			// Too big to pack here: the convertor must refuse or cope.
			if c, err := NewPacker(make([]byte, 64), count, top); err == nil {
				c.SetPosition(c.Size() / 2)
				c.Pack(make([]byte, 64))
			}
			return
		}
		roundTrip(t, top, count)
	})
}

// roundTrip packs count elements of dt, unpacks them into fresh memory and
// packs again, and compares with the unoptimized program's stream.
func roundTrip(t *testing.T, dt Datatype, count int) {
	n := (count-1)*dt.Extent() + dt.TrueLB() + dt.TrueExtent()
	if dt.Size() == 0 {
		n = 0
	}
	mem := make([]byte, n)
	for i := range mem {
		mem[i] = byte(i*7 + 1)
	}
	pack := func(dt Datatype, mem []byte) []byte {
		c, err := NewPacker(mem, count, dt)
		if err != nil {
			t.Fatalf("%v x %d over %d bytes: %v", dt, count, len(mem), err)
		}
		s := make([]byte, c.Size())
		if k := c.Pack(s); k != len(s) {
			t.Fatalf("%v: packed %d of %d", dt, k, len(s))
		}
		return s
	}
	s := pack(dt, mem)
	if raw := pack(unoptimized(dt), mem); !bytes.Equal(s, raw) {
		t.Fatalf("%v: optimized program packs %x, description %x\n%v", dt, s, raw, dt.d.prog.Load())
	}
	back := make([]byte, len(mem))
	u, _ := NewUnpacker(back, count, dt)
	if k := u.Unpack(s); k != len(s) {
		t.Fatalf("%v: unpacked %d of %d", dt, k, len(s))
	}
	if again := pack(dt, back); !bytes.Equal(again, s) {
		t.Fatalf("%v: pack after unpack %x, want %x", dt, again, s)
	}
}

// FuzzPackUnpack builds a random datatype from the fuzz bytes together with
// its model, and checks pack and unpack in random chunks and at random
// positions against the model.
func FuzzPackUnpack(f *testing.F) {
	f.Add([]byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add([]byte{3, 1, 2, 4, 4, 1, 3, 9, 200, 3, 17, 1, 2})
	f.Add([]byte{3, 6, 2, 2, 9, 1, 40, 7, 3, 1, 1, 0, 30, 2, 9, 2, 4})
	f.Add([]byte{4, 7, 3, 2, 4, 5, 1, 3, 3, 2, 1, 0, 1, 8})
	f.Add([]byte{2, 8, 3, 9, 1, 33, 2, 1})
	f.Add([]byte{4, 1, 4, 2, 3, 1, 7, 0, 4, 2, 2, 5, 1, 6, 3, 2, 8, 4, 4, 4})
	for seed := range 20 {
		r := rand.New(rand.NewPCG(uint64(seed), 7))
		f.Add(randBytes(r, 8+r.IntN(40)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		h := fnv.New64a()
		h.Write(data)
		r := rand.New(rand.NewPCG(h.Sum64(), 3))
		src := &byteSource{b: data}
		g := &gen{r: src}
		dt, m, err := g.typ(1 + src.IntN(4))
		if err != nil {
			t.Fatalf("constructor: %v", err)
		}
		if err := checkShape(dt, m); err != nil {
			t.Fatal(err)
		}
		if dt, m, err = usable(dt, m); err != nil {
			t.Fatal(err)
		}
		count := src.IntN(4)
		if err := checkConvertor(dt, m, count, r); err != nil {
			t.Fatalf("%v x %d: %v\nprogram:\n%v", dt, count, err, dt.d.prog.Load())
		}
	})
}
