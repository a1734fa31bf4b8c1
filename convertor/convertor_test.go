package convertor

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sort"
	"testing"
)

// checkConvertor runs every property of pack and unpack for count elements
// of t (committed, data at bytes ≥ 0) against the model m, drawing chunk
// sizes and positions from r.
func checkConvertor(t Datatype, m *mtype, count int, r *rand.Rand) error {
	mem := randBytes(r, m.bufLen(count)+r.IntN(3))
	want := m.stream(mem, count)
	contig := m.contiguous(count)
	// starts[i] is the stream offset of basic element i.
	var starts []int
	at := 0
	for _, rn := range m.runs(count) {
		starts = append(starts, at)
		at += rn.size
	}
	// snap returns the start of the basic element containing stream offset pos.
	snap := func(pos int) int {
		i := sort.SearchInts(starts, pos+1) - 1
		return starts[i]
	}

	// Pack at once.
	p, err := NewPacker(mem, count, t)
	if err != nil {
		return fmt.Errorf("NewPacker: %v", err)
	}
	if p.Size() != len(want) {
		return fmt.Errorf("Size %d, model %d", p.Size(), len(want))
	}
	full := make([]byte, len(want)+5)
	if n := p.Pack(full); n != len(want) || !bytes.Equal(full[:n], want) || !p.Done() {
		return fmt.Errorf("Pack at once: %d bytes %x, want %x", n, full[:n], want)
	}
	if s, ok := p.Contiguous(); ok != contig {
		return fmt.Errorf("Contiguous() = %v, model %v", ok, contig)
	} else if ok && !bytes.Equal(s, want) {
		return fmt.Errorf("Contiguous() memory %x, want %x", s, want)
	}

	// Pack in random chunks: each chunk ends at a basic element boundary
	// (the largest that fits) unless none fits.
	p.SetPosition(0)
	var got []byte
	for !p.Done() {
		chunk := make([]byte, r.IntN(40))
		at := p.Position()
		n := p.Pack(chunk)
		exp := min(len(chunk), len(want)-at)
		if !contig && at+len(chunk) < len(want) {
			if q := snap(at + len(chunk)); q > at {
				exp = q - at
			}
		}
		if n != exp || p.Position() != at+n {
			return fmt.Errorf("Pack(%d) at %d = %d, want %d", len(chunk), at, n, exp)
		}
		got = append(got, chunk[:n]...)
	}
	if !bytes.Equal(got, want) {
		return fmt.Errorf("chunked pack %x, want %x", got, want)
	}

	// Unpack at once and in chunks into fresh memory: touched bytes equal
	// the original, holes keep their old contents.
	for _, chunked := range []bool{false, true} {
		dst := randBytes(r, len(mem))
		orig := bytes.Clone(dst)
		u, err := NewUnpacker(dst, count, t)
		if err != nil {
			return fmt.Errorf("NewUnpacker: %v", err)
		}
		for at := 0; at < len(want); {
			k := len(want) - at + r.IntN(3)
			if chunked {
				k = r.IntN(40)
			}
			n := u.Unpack(want[at:min(at+k, len(want))])
			if n != min(k, len(want)-at) || u.Position() != at+n {
				return fmt.Errorf("Unpack(%d) at %d = %d", k, at, n)
			}
			at += n
		}
		if err := checkUnpacked(m, count, mem, orig, dst); err != nil {
			return fmt.Errorf("unpack (chunked %v): %v", chunked, err)
		}
	}

	// SetPosition to random offsets, forwards and backwards.
	for range 8 {
		pos := r.IntN(len(want) + 3)
		real := p.SetPosition(pos)
		exp := min(pos, len(want))
		if !contig && exp < len(want) {
			exp = snap(exp)
		}
		if real != exp || p.Position() != real {
			return fmt.Errorf("packer SetPosition(%d) = %d, want %d", pos, real, exp)
		}
		chunk := make([]byte, r.IntN(64)+16)
		n := p.Pack(chunk)
		if !bytes.Equal(chunk[:n], want[real:real+n]) {
			return fmt.Errorf("pack after SetPosition(%d): %x, want %x", pos, chunk[:n], want[real:real+n])
		}
	}
	dst := randBytes(r, len(mem))
	orig := bytes.Clone(dst)
	u, _ := NewUnpacker(dst, count, t)
	// Unpack the stream in shuffled fragments, as a pipelined receive does.
	var cuts []int
	for at := 0; at < len(want); at += 1 + r.IntN(24) {
		cuts = append(cuts, at)
	}
	cuts = append(cuts, len(want))
	order := r.Perm(len(cuts) - 1)
	for _, i := range order {
		if got := u.SetPosition(cuts[i]); got != cuts[i] {
			return fmt.Errorf("unpacker SetPosition(%d) = %d", cuts[i], got)
		}
		if n := u.Unpack(want[cuts[i]:cuts[i+1]]); n != cuts[i+1]-cuts[i] {
			return fmt.Errorf("unpack fragment [%d,%d) = %d", cuts[i], cuts[i+1], n)
		}
	}
	if err := checkUnpacked(m, count, mem, orig, dst); err != nil {
		return fmt.Errorf("unpack of shuffled fragments: %v", err)
	}
	return nil
}

// checkUnpacked checks that dst has src's bytes where the layout touches and
// orig's bytes elsewhere.
func checkUnpacked(m *mtype, count int, src, orig, dst []byte) error {
	touched := make([]bool, len(dst))
	for _, rn := range m.runs(count) {
		for i := rn.disp; i < rn.disp+rn.size; i++ {
			touched[i] = true
		}
	}
	for i := range dst {
		if touched[i] && dst[i] != src[i] {
			return fmt.Errorf("byte %d = %#x, want the packed %#x", i, dst[i], src[i])
		}
		if !touched[i] && dst[i] != orig[i] {
			return fmt.Errorf("hole byte %d changed", i)
		}
	}
	return nil
}

func TestRandomDatatypes(t *testing.T) {
	n := 3000
	if testing.Short() || raceEnabled {
		n = 500
	}
	for seed := range n {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		g := &gen{r: r}
		dt, m, err := g.typ(1 + r.IntN(4))
		if err != nil {
			t.Fatalf("seed %d: constructor: %v", seed, err)
		}
		if err := checkShape(dt, m); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		dt, m, err = usable(dt, m)
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		count := r.IntN(4)
		if err := checkConvertor(dt, m, count, r); err != nil {
			t.Fatalf("seed %d: %v x %d (extent %d):\n%v\nprogram:\n%v", seed, dt, count, dt.Extent(), err, dt.d.prog.Load())
		}
		// The same with the description compiled as it is, unoptimized:
		// the optimizer must not change a byte.
		raw := unoptimized(dt)
		if err := checkConvertor(raw, m, count, r); err != nil {
			t.Fatalf("seed %d: unoptimized %v x %d:\n%v\nprogram:\n%v", seed, dt, count, err, raw.d.prog.Load())
		}
	}
}

// unoptimized returns a committed copy of t whose program is its
// description compiled without optimization.
func unoptimized(t Datatype) Datatype {
	d := &desc{name: t.d.name, lay: t.d.lay}
	d.prog.Store(compile(&d.lay, false))
	return Datatype{d}
}

// TestGeneratorCoverage guards the property tests against a generator that
// drifts to trivial types: enough of them must be non-contiguous, keep loops
// after optimization, fold over the element count, or mix element sizes.
func TestGeneratorCoverage(t *testing.T) {
	var noncontig, loops, fold, mixed int
	const n = 1000
	for seed := range n {
		r := rand.New(rand.NewPCG(uint64(seed), 1))
		g := &gen{r: r}
		dt, m, err := g.typ(1 + r.IntN(4))
		if err != nil {
			t.Fatal(err)
		}
		if dt, m, err = usable(dt, m); err != nil {
			t.Fatal(err)
		}
		p := dt.d.prog.Load()
		sizes := map[int]bool{}
		for _, o := range p.ops[1:] {
			switch o.kind {
			case kLoop:
				loops++
			case kData:
				sizes[o.esz] = true
			}
		}
		if !m.contiguous(2) {
			noncontig++
		}
		if p.fold {
			fold++
		}
		if len(sizes) > 1 {
			mixed++
		}
	}
	t.Logf("of %d types: %d non-contiguous, %d inner loops, %d folded, %d mixed", n, noncontig, loops, fold, mixed)
	if noncontig < n/3 || loops < n/20 || fold < n/10 || mixed < n/100 {
		t.Fatal("the random datatypes are too simple")
	}
}

// TestConvertorReuse drives one Convertor through Reset after Reset over
// random datatypes and counts, each time abandoning the previous stream at
// a random point: Reset's short way for one element and the walk state set
// on first use must give the same bytes as a new Convertor.
func TestConvertorReuse(t *testing.T) {
	n := 2000
	if testing.Short() || raceEnabled {
		n = 300
	}
	var c Convertor
	for seed := range n {
		r := rand.New(rand.NewPCG(uint64(seed), 2))
		g := &gen{r: r}
		dt, m, err := g.typ(1 + r.IntN(4))
		if err == nil {
			dt, m, err = usable(dt, m)
		}
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		count := r.IntN(3)
		if r.IntN(2) == 0 {
			count = 1 // the short way
		}
		mem := randBytes(r, m.bufLen(count))
		want := m.stream(mem, count)
		for pass := range 3 {
			if err := c.Reset(mem, count, dt, true); err != nil {
				t.Fatalf("seed %d: Reset: %v", seed, err)
			}
			var got []byte
			switch pass {
			case 0: // all at once
				buf := make([]byte, len(want))
				got = buf[:c.Pack(buf)]
			case 1: // from a random position on
				at := c.SetPosition(r.IntN(len(want) + 1))
				buf := make([]byte, len(want))
				got = append(append([]byte(nil), want[:at]...), buf[:c.Pack(buf)]...)
			case 2: // in random chunks
				for !c.Done() {
					buf := make([]byte, 1+r.IntN(24))
					got = append(got, buf[:c.Pack(buf)]...)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("seed %d pass %d: %v x %d: packed %x, want %x", seed, pass, dt, count, got, want)
			}
			// Abandon a partial pack before the next Reset.
			if len(want) > 0 {
				c.Reset(mem, count, dt, true)
				c.Pack(make([]byte, r.IntN(len(want))))
			}
		}
		dst := randBytes(r, len(mem))
		orig := bytes.Clone(dst)
		if err := c.Reset(dst, count, dt, false); err != nil {
			t.Fatalf("seed %d: Reset unpacker: %v", seed, err)
		}
		for off := 0; off < len(want); {
			k := min(len(want)-off, 1+r.IntN(24))
			if c.Unpack(want[off:off+k]) != k {
				t.Fatalf("seed %d: short unpack", seed)
			}
			off += k
		}
		if err := checkUnpacked(m, count, mem, orig, dst); err != nil {
			t.Fatalf("seed %d: %v x %d: %v", seed, dt, count, err)
		}
	}
}
