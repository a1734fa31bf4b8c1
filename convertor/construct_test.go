package convertor

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// must returns a function that fails t on a constructor error and commits
// the constructor's datatype: must(t)(Vector(...)).
func must(t *testing.T) func(Datatype, error) Datatype {
	return func(dt Datatype, err error) Datatype {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		dt, err = dt.Commit()
		if err != nil {
			t.Fatal(err)
		}
		return dt
	}
}

// TestConstructors checks each constructor, on hand-picked arguments, against
// the model: size, bounds, and pack/unpack of 1 to 3 elements.
func TestConstructors(t *testing.T) {
	f64, i32, c128 := mPredef(8), mPredef(4), mPredef(16)
	pair := func() (Datatype, *mtype) { // struct {int32 a; float64 b} with a hole
		dt, err := Struct([]int{1, 1}, []int{0, 8}, []Datatype{Int32, Float64})
		if err != nil {
			t.Fatal(err)
		}
		return dt, mStruct([]int{1, 1}, []int{0, 8}, []*mtype{i32, f64})
	}
	pt, pm := pair()
	resized, err := Resized(Int32, -4, 12)
	if err != nil {
		t.Fatal(err)
	}
	mres := mResized(i32, -4, 12)
	cases := []struct {
		name string
		make func() (Datatype, error)
		m    *mtype
	}{
		{"Contiguous", func() (Datatype, error) { return Contiguous(5, Float64) }, mContiguous(5, f64)},
		{"ContiguousOfStruct", func() (Datatype, error) { return Contiguous(3, pt) }, mContiguous(3, pm)},
		{"Vector", func() (Datatype, error) { return Vector(4, 2, 5, Int32) }, mVector(4, 2, 5, i32)},
		{"VectorColumn", func() (Datatype, error) { return Vector(6, 1, 6, Float64) }, mVector(6, 1, 6, f64)},
		{"VectorNegStride", func() (Datatype, error) { return Vector(3, 1, -2, Float64) }, mVector(3, 1, -2, f64)},
		{"VectorOverlap", func() (Datatype, error) { return Vector(3, 3, 1, Int32) }, mVector(3, 3, 1, i32)},
		{"Hvector", func() (Datatype, error) { return Hvector(3, 2, 20, Int32) }, mHvector(3, 2, 20, i32)},
		{"HvectorOfStruct", func() (Datatype, error) { return Hvector(2, 2, 50, pt) }, mHvector(2, 2, 50, pm)},
		{"Indexed", func() (Datatype, error) { return Indexed([]int{2, 0, 1, 3}, []int{5, 1, 0, 9}, Int32) },
			mIndexed([]int{2, 0, 1, 3}, []int{5, 1, 0, 9}, i32)},
		{"IndexedRegular", func() (Datatype, error) { return Indexed([]int{1, 1, 1, 1}, []int{0, 3, 6, 9}, Float64) },
			mIndexed([]int{1, 1, 1, 1}, []int{0, 3, 6, 9}, f64)},
		{"Hindexed", func() (Datatype, error) { return Hindexed([]int{1, 2}, []int{40, 3}, Complex128) },
			mHindexed([]int{1, 2}, []int{40, 3}, c128)},
		{"IndexedBlock", func() (Datatype, error) { return IndexedBlock(2, []int{4, 0, 9}, Float64) },
			mIndexed([]int{2, 2, 2}, []int{4, 0, 9}, f64)},
		{"StructHoles", func() (Datatype, error) { return pt, nil }, pm},
		{"StructMixed", func() (Datatype, error) {
			return Struct([]int{2, 1, 3}, []int{0, 8, 24}, []Datatype{Int32, Float64, Int16})
		}, mStruct([]int{2, 1, 3}, []int{0, 8, 24}, []*mtype{i32, f64, mPredef(2)})},
		{"Subarray2DRow", func() (Datatype, error) {
			return Subarray([]int{5, 7}, []int{3, 2}, []int{1, 4}, RowMajor, Float64)
		}, mSubarray([]int{5, 7}, []int{3, 2}, []int{1, 4}, RowMajor, f64)},
		{"Subarray2DCol", func() (Datatype, error) {
			return Subarray([]int{5, 7}, []int{3, 2}, []int{1, 4}, ColMajor, Float64)
		}, mSubarray([]int{5, 7}, []int{3, 2}, []int{1, 4}, ColMajor, f64)},
		{"Subarray3D", func() (Datatype, error) {
			return Subarray([]int{4, 3, 5}, []int{2, 3, 2}, []int{1, 0, 2}, RowMajor, Int32)
		}, mSubarray([]int{4, 3, 5}, []int{2, 3, 2}, []int{1, 0, 2}, RowMajor, i32)},
		{"SubarrayOfStruct", func() (Datatype, error) {
			return Subarray([]int{3, 3}, []int{2, 2}, []int{1, 0}, ColMajor, pt)
		}, mSubarray([]int{3, 3}, []int{2, 2}, []int{1, 0}, ColMajor, pm)},
		{"Resized", func() (Datatype, error) { return Contiguous(3, resized) }, mContiguous(3, mres)},
		{"ResizedStruct", func() (Datatype, error) { return Resized(pt, 0, 24) }, mResized(pm, 0, 24)},
		{"Empty", func() (Datatype, error) { return Contiguous(0, Float64) }, mContiguous(0, f64)},
		{"ZeroBlocks", func() (Datatype, error) { return Indexed([]int{0, 0}, []int{3, 1}, Float64) },
			mIndexed([]int{0, 0}, []int{3, 1}, f64)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dt, err := tc.make()
			if err != nil {
				t.Fatal(err)
			}
			if err := checkShape(dt, tc.m); err != nil {
				t.Fatal(err)
			}
			dt, m, err := usable(dt, tc.m)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(1, 2))
			for count := range 4 {
				for range 20 {
					if err := checkConvertor(dt, m, count, r); err != nil {
						t.Fatalf("count %d: %v\nprogram:\n%v", count, err, dt.d.prog.Load())
					}
				}
			}
		})
	}
}

// TestSubarrayBytes packs sub-blocks of a 4x5 byte array whose bytes are
// their own index, with the expected bytes written out by hand.
func TestSubarrayBytes(t *testing.T) {
	mem := make([]byte, 20)
	for i := range mem {
		mem[i] = byte(i)
	}
	for _, tc := range []struct {
		order Order
		want  []byte
	}{
		// Row-major: element (i, j) at 5i+j; rows 1-2, columns 1-3.
		{RowMajor, []byte{6, 7, 8, 11, 12, 13}},
		// Column-major: element (i, j) at i+4j; (i fastest) rows 1-2, columns 1-3.
		{ColMajor, []byte{5, 6, 9, 10, 13, 14}},
	} {
		sizes := []int{4, 5}
		if tc.order == ColMajor {
			sizes = []int{4, 5}
		}
		dt := must(t)(Subarray(sizes, []int{2, 3}, []int{1, 1}, tc.order, Byte))
		if dt.Extent() != 20 || dt.LB() != 0 || dt.Size() != 6 {
			t.Fatalf("%v: extent %d lb %d size %d", dt, dt.Extent(), dt.LB(), dt.Size())
		}
		c, err := NewPacker(mem, 1, dt)
		if err != nil {
			t.Fatal(err)
		}
		got := make([]byte, 6)
		if n := c.Pack(got); n != 6 || !bytes.Equal(got, tc.want) {
			t.Errorf("%v: packed %v, want %v", dt, got, tc.want)
		}
	}
}

// TestStructHoles unpacks two elements of a struct with holes and checks the
// holes keep their bytes.
func TestStructHoles(t *testing.T) {
	// struct { int32 a; /* 4 bytes hole */ float64 b; int16 c; /* 6 bytes hole */ }
	st := must(t)(Struct([]int{1, 1, 1}, []int{0, 8, 16}, []Datatype{Int32, Float64, Int16}))
	st = must(t)(Resized(st, 0, 24))
	if st.Size() != 14 || st.Extent() != 24 || st.TrueExtent() != 18 || st.IsContiguous() {
		t.Fatalf("size %d extent %d true extent %d contiguous %v", st.Size(), st.Extent(), st.TrueExtent(), st.IsContiguous())
	}
	src := make([]byte, 48)
	for i := range src {
		src[i] = byte(i + 1)
	}
	packed := make([]byte, 28)
	p, _ := NewPacker(src, 2, st)
	if n := p.Pack(packed); n != 28 {
		t.Fatalf("packed %d", n)
	}
	want := append(append(append(append(append(append([]byte{},
		src[0:4]...), src[8:16]...), src[16:18]...), src[24:28]...), src[32:40]...), src[40:42]...)
	if !bytes.Equal(packed, want) {
		t.Fatalf("packed %v\nwant %v", packed, want)
	}
	dst := bytes.Repeat([]byte{0xEE}, 48)
	u, _ := NewUnpacker(dst, 2, st)
	u.Unpack(packed)
	for i := range dst {
		hole := (i%24 >= 4 && i%24 < 8) || i%24 >= 18
		if hole && dst[i] != 0xEE || !hole && dst[i] != src[i] {
			t.Fatalf("byte %d = %#x (hole %v)", i, dst[i], hole)
		}
	}
}

// TestResized lays a resized int32 (extent 12) three times.
func TestResized(t *testing.T) {
	r := must(t)(Resized(Int32, 0, 12))
	if r.Extent() != 12 || r.Size() != 4 || r.IsContiguous() {
		t.Fatalf("extent %d size %d", r.Extent(), r.Size())
	}
	mem := make([]byte, 28)
	for i := range mem {
		mem[i] = byte(i)
	}
	c, err := NewPacker(mem, 3, r)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 12)
	c.Pack(got)
	want := []byte{0, 1, 2, 3, 12, 13, 14, 15, 24, 25, 26, 27}
	if !bytes.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// 3 elements need bytes [0, 28): one byte less is an error.
	if _, err := NewPacker(mem[:27], 3, r); !errors.Is(err, mpierr.ErrCount) {
		t.Fatalf("short buffer: %v", err)
	}
	// Resizing to extent 0 stacks the elements on the same bytes.
	z := must(t)(Resized(Int32, 0, 0))
	c, _ = NewPacker(mem, 3, z)
	c.Pack(got)
	if !bytes.Equal(got, []byte{0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3}) {
		t.Fatalf("extent 0: %v", got)
	}
}

// TestCompiled checks the shape of compiled programs: what the optimizer
// promises.
func TestCompiled(t *testing.T) {
	body := func(dt Datatype) string {
		s := dt.d.prog.Load().String()
		lines := strings.Split(strings.TrimSpace(s), "\n")
		for i := range lines {
			lines[i] = strings.TrimPrefix(lines[i], "  ")
		}
		return strings.Join(lines[1:len(lines)-1], "\n") // without the outer loop
	}
	col := must(t)(Vector(4096, 1, 4096, Float64))
	if got, want := body(col), "data esz=8 blen=8 count=4096 stride=32768 disp=0"; got != want {
		t.Errorf("column: %s, want %s", got, want)
	}
	cont := must(t)(Contiguous(10, must(t)(Contiguous(3, Float64))))
	if got, want := body(cont), "data esz=8 blen=240 count=1 stride=240 disp=0"; got != want || !cont.IsContiguous() {
		t.Errorf("contiguous: %s, want %s", got, want)
	}
	// Int64 and Float64 members side by side merge; Int32 and Float64 do not
	// (Pack must not split a float64), yet the type is contiguous.
	same := must(t)(Struct([]int{2, 1}, []int{0, 16}, []Datatype{Int64, Float64}))
	if got, want := body(same), "data esz=8 blen=24 count=1 stride=24 disp=0"; got != want || !same.IsContiguous() {
		t.Errorf("struct of 8-byte members: %s", got)
	}
	mixed := must(t)(Struct([]int{2, 1}, []int{0, 8}, []Datatype{Int32, Float64}))
	if got := body(mixed); strings.Count(got, "data") != 2 || !mixed.IsContiguous() {
		t.Errorf("mixed struct: %s contiguous %v", got, mixed.IsContiguous())
	}
	reg := must(t)(Indexed([]int{2, 2, 2}, []int{0, 5, 10}, Int32))
	if got, want := body(reg), "data esz=4 blen=8 count=3 stride=20 disp=0"; got != want {
		t.Errorf("regular indexed: %s, want %s", got, want)
	}
	// A vector of structs keeps its loop.
	vs := must(t)(Vector(100, 1, 2, mixed))
	if got := body(vs); !strings.HasPrefix(got, "loop count=100 stride=32") {
		t.Errorf("vector of structs: %s", got)
	}
	// Rows of a plane of a 3-D array: one strided record.
	plane := must(t)(Subarray([]int{4, 4, 4}, []int{2, 2, 4}, []int{1, 0, 0}, RowMajor, Float64))
	if got, want := body(plane), "data esz=8 blen=64 count=2 stride=128 disp=128"; got != want {
		t.Errorf("plane: %s, want %s", got, want)
	}
	// Nested loops that step regularly merge into one loop.
	inner := must(t)(Vector(2, 1, 3, mixed)) // extent 4*16 = 64, iterations 48 apart
	outer := must(t)(Hvector(3, 1, 96, inner))
	if got := body(outer); !strings.HasPrefix(got, "loop count=6 stride=48\n") || strings.Count(got, "loop") != 1 {
		t.Errorf("nested loops: %s", got)
	}
	// A row of a subarray is contiguous memory for one element.
	row := must(t)(Subarray([]int{8, 8}, []int{1, 6}, []int{2, 1}, RowMajor, Float64))
	c, _ := NewPacker(make([]byte, 512), 1, row)
	if s, ok := c.Contiguous(); !ok || len(s) != 48 || &s[0] != &c.mem[(2*8+1)*8] {
		t.Errorf("subarray row: Contiguous() = %d bytes, %v", len(s), ok)
	}
	c, _ = NewPacker(make([]byte, 1024), 2, row)
	if _, ok := c.Contiguous(); ok {
		t.Errorf("two subarray rows a whole array apart are not one run")
	}
}

func TestPackWholeElements(t *testing.T) {
	v := must(t)(Vector(3, 1, 2, Float64))
	mem := make([]byte, 40)
	for i := range mem {
		mem[i] = byte(i)
	}
	c, _ := NewPacker(mem, 1, v)
	buf := make([]byte, 24)
	// 13 bytes of room: one whole element only.
	if n := c.Pack(buf[:13]); n != 8 {
		t.Fatalf("Pack(13) = %d, want 8", n)
	}
	// 5 bytes: not even one element fits, so part of one goes.
	if n := c.Pack(buf[8:13]); n != 5 {
		t.Fatalf("Pack(5) = %d, want 5", n)
	}
	// The rest of that element, then one more whole element: 3 + 8.
	if n := c.Pack(buf[13:]); n != 11 || !c.Done() {
		t.Fatalf("Pack(11) = %d, done %v", n, c.Done())
	}
	want := append(append(append([]byte{}, mem[0:8]...), mem[16:24]...), mem[32:40]...)
	if !bytes.Equal(buf, want) {
		t.Fatalf("packed %v, want %v", buf, want)
	}
	// A packer snaps back to the element start; an unpacker does not.
	if got := c.SetPosition(13); got != 8 {
		t.Fatalf("packer SetPosition(13) = %d, want 8", got)
	}
	u, _ := NewUnpacker(mem, 1, v)
	if got := u.SetPosition(13); got != 13 {
		t.Fatalf("unpacker SetPosition(13) = %d, want 13", got)
	}
	// In a mixed struct the boundaries are those of each member.
	st := must(t)(Struct([]int{1, 1}, []int{0, 4}, []Datatype{Int32, Float64}))
	st = must(t)(Resized(st, 0, 16))
	c, _ = NewPacker(make([]byte, 64), 4, st)
	for pos, want := range map[int]int{0: 0, 3: 0, 4: 4, 11: 4, 12: 12, 15: 12, 17: 16, 47: 40, 48: 48, 99: 48, -5: 0} {
		if got := c.SetPosition(pos); got != want {
			t.Errorf("struct SetPosition(%d) = %d, want %d", pos, got, want)
		}
	}
	// A contiguous stream is exact.
	c, _ = NewPacker(make([]byte, 64), 8, Float64)
	if got := c.SetPosition(13); got != 13 {
		t.Fatalf("contiguous SetPosition(13) = %d", got)
	}
	if n := c.Pack(make([]byte, 10)); n != 10 {
		t.Fatalf("contiguous Pack(10) = %d", n)
	}
}

func TestElements(t *testing.T) {
	pair := must(t)(Contiguous(2, Float64))
	empty := must(t)(Contiguous(0, Float64))
	for _, tc := range []struct {
		t     Datatype
		bytes int
		want  int
	}{
		{pair, 0, 0}, {pair, 16, 1}, {pair, 160, 10}, {pair, 8, Undefined}, {pair, 17, Undefined},
		{pair, -16, Undefined}, {Byte, 7, 7}, {empty, 0, 0}, {empty, 8, Undefined},
		{Datatype{}, 0, Undefined},
	} {
		if got := tc.t.Elements(tc.bytes); got != tc.want {
			t.Errorf("%v.Elements(%d) = %d, want %d", tc.t, tc.bytes, got, tc.want)
		}
	}
}

func TestCommit(t *testing.T) {
	v, err := Vector(2, 1, 3, Int16)
	if err != nil {
		t.Fatal(err)
	}
	if v.Committed() || !v.Valid() || !Float64.Committed() {
		t.Fatal("Committed before Commit")
	}
	if _, err := NewPacker(make([]byte, 64), 1, v); !errors.Is(err, mpierr.ErrType) {
		t.Fatalf("uncommitted: %v", err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			c, err := v.Commit()
			if err != nil || c != v {
				t.Errorf("Commit = %v, %v", c, err)
			}
		})
	}
	wg.Wait()
	p := v.d.prog.Load()
	if c, _ := v.Commit(); !v.Committed() || c != v || v.d.prog.Load() != p {
		t.Fatal("Commit not idempotent")
	}
	if got := v.String(); got != "Vector(2, 1, 3, Int16)" {
		t.Errorf("String = %q", got)
	}
	long, _ := Indexed(make([]int, 20), make([]int, 20), Byte)
	if got := long.String(); !strings.Contains(got, "…(20)") || len(got) > 120 {
		t.Errorf("long String = %q", got)
	}
	if got := (Datatype{}).String(); got != "Datatype(invalid)" {
		t.Errorf("zero String = %q", got)
	}
}

func TestErrors(t *testing.T) {
	var zero Datatype
	uncommitted, _ := Contiguous(2, Int32)
	huge, _ := Contiguous(1<<40, Byte)
	ErrType, ErrCount := mpierr.ErrType, mpierr.ErrCount
	for _, tc := range []struct {
		name string
		f    func() error
		want error
	}{
		{"Contiguous negative", func() error { _, err := Contiguous(-1, Int32); return err }, ErrCount},
		{"Contiguous zero type", func() error { _, err := Contiguous(1, zero); return err }, ErrType},
		{"Contiguous size overflow", func() error { _, err := Contiguous(1<<40, huge); return err }, ErrCount},
		{"Vector negative count", func() error { _, err := Vector(-1, 1, 1, Int32); return err }, ErrCount},
		{"Vector negative blocklen", func() error { _, err := Vector(1, -1, 1, Int32); return err }, ErrCount},
		{"Vector stride overflow", func() error { _, err := Vector(2, 1, 1<<62, Float64); return err }, ErrCount},
		{"Vector stride bytes overflow", func() error { _, err := Vector(2, 1, 1<<59, Float64); return err }, ErrCount},
		{"Vector zero type", func() error { _, err := Vector(1, 1, 1, zero); return err }, ErrType},
		{"Hvector overflow", func() error { _, err := Hvector(2, 1, 1<<62, Byte); return err }, ErrCount},
		{"Hvector span overflow", func() error { _, err := Hvector(1<<30, 1, 1<<40, Byte); return err }, ErrCount},
		{"Hvector negative", func() error { _, err := Hvector(1, -2, 1, Byte); return err }, ErrCount},
		{"Indexed mismatch", func() error { _, err := Indexed([]int{1, 2}, []int{0}, Int32); return err }, ErrType},
		{"Indexed negative", func() error { _, err := Indexed([]int{-1}, []int{0}, Int32); return err }, ErrCount},
		{"Indexed displ overflow", func() error { _, err := Indexed([]int{1}, []int{1 << 62}, Int32); return err }, ErrCount},
		{"Hindexed displ overflow", func() error { _, err := Hindexed([]int{1}, []int{1 << 62}, Int32); return err }, ErrCount},
		{"Hindexed negative displ overflow", func() error { _, err := Hindexed([]int{1}, []int{-1 << 62}, Int32); return err }, ErrCount},
		{"Hindexed mismatch", func() error { _, err := Hindexed(nil, []int{0}, Int32); return err }, ErrType},
		{"IndexedBlock negative", func() error { _, err := IndexedBlock(-1, []int{0}, Int32); return err }, ErrCount},
		{"IndexedBlock zero type", func() error { _, err := IndexedBlock(1, []int{0}, zero); return err }, ErrType},
		{"Struct mismatch", func() error { _, err := Struct([]int{1}, []int{0, 4}, []Datatype{Int32}); return err }, ErrType},
		{"Struct mismatch types", func() error { _, err := Struct([]int{1}, []int{0}, nil); return err }, ErrType},
		{"Struct zero type", func() error { _, err := Struct([]int{1}, []int{0}, []Datatype{zero}); return err }, ErrType},
		{"Struct negative", func() error { _, err := Struct([]int{-3}, []int{0}, []Datatype{Int32}); return err }, ErrCount},
		{"Struct displ overflow", func() error {
			_, err := Struct([]int{1, 1}, []int{0, 1 << 62}, []Datatype{Int32, Int32})
			return err
		}, ErrCount},
		{"Subarray mismatch", func() error { _, err := Subarray([]int{4}, []int{2, 2}, []int{0}, RowMajor, Int32); return err }, ErrType},
		{"Subarray empty", func() error { _, err := Subarray(nil, nil, nil, RowMajor, Int32); return err }, ErrType},
		{"Subarray order", func() error { _, err := Subarray([]int{4}, []int{2}, []int{0}, Order(7), Int32); return err }, ErrType},
		{"Subarray subsize", func() error { _, err := Subarray([]int{4}, []int{5}, []int{0}, RowMajor, Int32); return err }, ErrCount},
		{"Subarray start", func() error { _, err := Subarray([]int{4}, []int{2}, []int{3}, RowMajor, Int32); return err }, ErrCount},
		{"Subarray negative start", func() error { _, err := Subarray([]int{4}, []int{2}, []int{-1}, RowMajor, Int32); return err }, ErrCount},
		{"Subarray size 0", func() error { _, err := Subarray([]int{0}, []int{0}, []int{0}, RowMajor, Int32); return err }, ErrCount},
		{"Subarray overflow", func() error {
			_, err := Subarray([]int{1 << 31, 1 << 31, 1 << 31}, []int{1, 1, 1}, []int{0, 0, 0}, RowMajor, Int32)
			return err
		}, ErrCount},
		{"Subarray zero type", func() error { _, err := Subarray([]int{4}, []int{2}, []int{0}, RowMajor, zero); return err }, ErrType},
		{"Resized negative extent", func() error { _, err := Resized(Int32, 0, -1); return err }, ErrCount},
		{"Resized overflow", func() error { _, err := Resized(Int32, 1<<62, 4); return err }, ErrCount},
		{"Resized zero type", func() error { _, err := Resized(zero, 0, 4); return err }, ErrType},
		{"Commit zero", func() error { _, err := zero.Commit(); return err }, ErrType},
		{"NewPacker zero type", func() error { _, err := NewPacker(nil, 1, zero); return err }, ErrType},
		{"NewPacker uncommitted", func() error { _, err := NewPacker(make([]byte, 8), 1, uncommitted); return err }, ErrType},
		{"NewPacker negative count", func() error { _, err := NewPacker(make([]byte, 8), -1, Int32); return err }, ErrCount},
		{"NewPacker short buffer", func() error { _, err := NewPacker(make([]byte, 7), 2, Int32); return err }, ErrCount},
		{"NewPacker count overflow", func() error { _, err := NewPacker(make([]byte, 8), 1<<62, Int64); return err }, ErrCount},
		{"NewPacker negative lb", func() error {
			dt := must(t)(Hindexed([]int{1}, []int{-4}, Int32))
			_, err := NewPacker(make([]byte, 8), 1, dt)
			return err
		}, ErrCount},
		{"NewUnpacker short buffer", func() error {
			_, err := NewUnpacker(make([]byte, 100), 1, must(t)(Vector(4, 1, 4, Float64)))
			return err
		}, ErrCount},
		{"NewUnpacker uncommitted", func() error { _, err := NewUnpacker(make([]byte, 8), 1, uncommitted); return err }, ErrType},
	} {
		err := tc.f()
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: error %v, want %v", tc.name, err, tc.want)
		}
	}
	// A failed Reset leaves an empty convertor.
	c, _ := NewPacker(make([]byte, 8), 2, Int32)
	if err := c.Reset(make([]byte, 4), 2, Int32, true); err == nil || c.Size() != 0 || c.Pack(make([]byte, 8)) != 0 {
		t.Fatalf("failed Reset: %v, size %d", err, c.Size())
	}
	var z Convertor
	if z.Pack(make([]byte, 8)) != 0 || z.Unpack(make([]byte, 8)) != 0 || z.SetPosition(5) != 0 || !z.Done() {
		t.Fatal("zero Convertor not empty")
	}
}

func TestNoAllocs(t *testing.T) {
	st := must(t)(Struct([]int{1, 2}, []int{0, 8}, []Datatype{Int32, Float64}))
	vs := must(t)(Vector(64, 2, 3, st))
	mem := make([]byte, 64*3*st.Extent())
	frag := make([]byte, 100)
	c, err := NewPacker(mem, 1, vs)
	if err != nil {
		t.Fatal(err)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if err := c.Reset(mem, 1, vs, true); err != nil {
			t.Fatal(err)
		}
		c.SetPosition(333)
		for !c.Done() {
			c.Pack(frag)
		}
		_ = c.Reset(mem, 1, vs, false)
		for !c.Done() {
			c.Unpack(frag)
		}
		_ = c.Reset(mem, 10, Float64, false)
		c.Unpack(frag)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per pack/unpack cycle", allocs)
	}
}

// TestDeepNesting builds a type nested 2000 constructors deep (loops 10
// deep): it must work, and its name must stay short.
func TestDeepNesting(t *testing.T) {
	dt := Float64
	for i := range 2000 {
		var err error
		switch {
		case i%200 == 0:
			dt, err = Contiguous(2, dt)
		case i%2 == 0:
			dt, err = Contiguous(1, dt)
		default:
			dt, err = Hvector(1, 1, 0, dt)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	dt = must(t)(dt, nil)
	if len(dt.String()) > nameMax+len("…") {
		t.Fatalf("name of %d bytes", len(dt.String()))
	}
	mem := make([]byte, dt.Extent())
	c, err := NewPacker(mem, 1, dt)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.Contiguous(); !ok || dt.Size() != dt.Extent() {
		t.Fatalf("size %d extent %d", dt.Size(), dt.Extent())
	}
}
