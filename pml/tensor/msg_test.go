package tensor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"
)

// encode returns m's bytes: version, kind, body (send encodes into a
// recycled buffer with encodeTo).
func encode(m message) []byte { return encodeTo(make([]byte, 0, 128), m) }

// samples holds a valid instance of every message kind.
func samples() []message {
	m := meta{dtype: Float32, shape: []int64{2, 3}, bytes: 24}
	return []message{
		&requestMsg{entries: []reqEntry{
			{index: 1, step: 7, name: "grad/w"},
			{index: 2, step: -1, name: "grad/b", hasMeta: true, meta: m, handle: []byte{1, 2, 3, 4}, transport: "sm"},
			{index: 3, step: 7, name: "dead", hasMeta: true, meta: meta{dtype: Int64, shape: []int64{5}, dead: true}},
		}},
		&requestMsg{re: true, entries: []reqEntry{{index: 9, step: 1, name: "s", hasMeta: true, meta: meta{dtype: String, shape: []int64{2}, bytes: 9}}}},
		&requestMsg{entries: []reqEntry{{index: 10, step: 2, name: "big", hasMeta: true, meta: meta{dtype: Uint8, shape: []int64{1 << 20}, bytes: 1 << 20}, pull: true}},
			released: []uint32{3, 0x01000004}},
		&metaMsg{entries: []metaEntry{{index: 1, meta: m}, {index: 0xffffffff, meta: meta{dtype: Bool, shape: []int64{}, bytes: 1}}}},
		&notifyMsg{entries: []notifyEntry{{index: 1, via: viaPut}, {index: 2, via: viaInline, hasSum: true, sum: 0xdeadbeef, inline: []byte("abc")},
			{index: 3, via: viaMessage}, {index: 4, via: viaNone, hasSum: true}, {index: 5, via: viaGet, handle: []byte{9, 8, 7}}}},
		&errorMsg{index: 5, text: "invalid dtype 99"},
		&errorMsg{index: 6, text: "loss is NaN", class: classAborted},
		&errorMsg{index: 7, text: "closed", class: classClosed},
		&cancelMsg{indices: []uint32{1, 2, 3}},
		&cancelMsg{cancelled: true, indices: []uint32{4}},
		&abortMsg{text: "boom"},
		&abortMsg{closed: true},
		&releaseMsg{indices: []uint32{1, 0xfeffffff}},
	}
}

func TestMessageRoundTrip(t *testing.T) {
	for _, m := range samples() {
		t.Run(m.kind().String(), func(t *testing.T) {
			b := encode(m)
			got, n, err := decode(b)
			if err != nil {
				t.Fatal(err)
			}
			if n != len(b) {
				t.Fatalf("used %d of %d bytes", n, len(b))
			}
			if !reflect.DeepEqual(normal(got), normal(m)) {
				t.Fatalf("round trip:\n got %#v\nwant %#v", got, m)
			}
		})
	}
}

// normal maps empty slices to nil, which the encoding does not tell apart,
// and drops the pool's link of a single-entry message (an allocation
// detail).
func normal(m message) message {
	switch m := m.(type) {
	case *requestMsg:
		c := *m
		c.one = nil
		c.entries = append([]reqEntry(nil), m.entries...)
		for i := range c.entries {
			if len(c.entries[i].meta.shape) == 0 {
				c.entries[i].meta.shape = nil
			}
		}
		return &c
	case *metaMsg:
		c := *m
		c.entries = append([]metaEntry(nil), m.entries...)
		for i := range c.entries {
			if len(c.entries[i].meta.shape) == 0 {
				c.entries[i].meta.shape = nil
			}
		}
		return &c
	case *notifyMsg:
		c := *m
		c.one = nil
		c.entries = append([]notifyEntry(nil), m.entries...)
		for i := range c.entries {
			if len(c.entries[i].inline) == 0 {
				c.entries[i].inline = nil
			}
			if len(c.entries[i].handle) == 0 {
				c.entries[i].handle = nil
			}
		}
		return &c
	}
	return m
}

func TestDecodeRejects(t *testing.T) {
	valid := encode(samples()[0])
	cases := map[string][]byte{
		"empty":        nil,
		"version":      {wireVersion - 1, byte(kindAbort), 0},
		"kind":         {wireVersion, 77},
		"truncated":    valid[:len(valid)-1],
		"trailing":     append(append([]byte{}, valid...), 0),
		"huge count":   binary.AppendUvarint([]byte{wireVersion, byte(kindCancel)}, 1<<40),
		"bad meta":     (&metaMsg{entries: []metaEntry{{index: 1, meta: meta{dtype: Float32, shape: []int64{3}, bytes: 11}}}}).appendBody([]byte{wireVersion, byte(kindMeta)}),
		"bad dtype":    (&metaMsg{entries: []metaEntry{{index: 1, meta: meta{dtype: 200, bytes: 0}}}}).appendBody([]byte{wireVersion, byte(kindMeta)}),
		"negative dim": (&metaMsg{entries: []metaEntry{{index: 1, meta: meta{dtype: Uint8, shape: []int64{-1}}}}}).appendBody([]byte{wireVersion, byte(kindMeta)}),
		"overflow":     (&metaMsg{entries: []metaEntry{{index: 1, meta: meta{dtype: Float64, shape: []int64{1 << 62, 1 << 62}}}}}).appendBody([]byte{wireVersion, byte(kindMeta)}),
		"empty name":   (&requestMsg{entries: []reqEntry{{index: 1}}}).appendBody([]byte{wireVersion, byte(kindRequest)}),
		"re no meta":   (&requestMsg{re: true, entries: []reqEntry{{index: 1, name: "x"}}}).appendBody([]byte{wireVersion, byte(kindReRequest)}),
		"via":          {wireVersion, byte(kindNotify), 1, 1, 9, 0},
		"index > u32":  binary.AppendUvarint([]byte{wireVersion, byte(kindError)}, 1<<33),
		"error class":  {wireVersion, byte(kindError), 1, 1, 'x', byte(classCount)},
		"no class":     {wireVersion, byte(kindError), 1, 1, 'x'},
		"pull+handle":  (&requestMsg{entries: []reqEntry{{index: 1, name: "x", handle: []byte{1}, pull: true}}}).appendBody([]byte{wireVersion, byte(kindRequest)}),
		"no released":  {wireVersion, byte(kindRequest), 1, 1, 0, 1, 'x', 0},
	}
	for name, b := range cases {
		t.Run(name, func(t *testing.T) {
			if _, _, err := decode(b); !errors.Is(err, ErrBadMessage) {
				t.Fatalf("decode(%x) = %v, want ErrBadMessage", b, err)
			}
		})
	}
}

// FuzzDecode: no input makes decode panic, and whatever it accepts
// encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, m := range samples() {
		f.Add(encode(m))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m, n, err := decode(b)
		if err != nil {
			return
		}
		if n != len(b) {
			t.Fatalf("used %d of %d bytes", n, len(b))
		}
		again := encode(m)
		m2, _, err := decode(again)
		if err != nil {
			t.Fatalf("re-encoded message does not decode: %v", err)
		}
		if !bytes.Equal(encode(m2), again) {
			t.Fatal("encoding is not stable")
		}
	})
}

// FuzzStrings: the string tensor decoder never panics and round-trips.
func FuzzStrings(f *testing.F) {
	f.Add(encodeStrings([]string{"a", "", "bc"}), uint64(3))
	f.Fuzz(func(t *testing.T, b []byte, count uint64) {
		ss, err := decodeStrings(b, count)
		if err != nil {
			return
		}
		if !bytes.Equal(encodeStrings(ss), b) {
			t.Fatal("strings do not round-trip")
		}
	})
}

func TestPrepare(t *testing.T) {
	for _, c := range []struct {
		t  Tensor
		ok bool
	}{
		{Tensor{DType: Float32, Shape: []int64{2}, Data: make([]byte, 8)}, true},
		{Tensor{DType: Complex128, Shape: []int64{}, Data: make([]byte, 16)}, true},
		{Tensor{DType: Float32, Shape: []int64{2, 0}}, true},
		{Tensor{DType: Float32, Shape: []int64{7}, IsDead: true}, true},
		{Tensor{DType: String, Shape: []int64{2}, Strings: []string{"a", "b"}}, true},
		{Tensor{DType: 0, Shape: []int64{1}, Data: []byte{1}}, false},
		{Tensor{DType: Float32, Shape: []int64{2}, Data: make([]byte, 7)}, false},
		{Tensor{DType: Float32, Shape: []int64{-2}}, false},
		{Tensor{DType: String, Shape: []int64{3}, Strings: []string{"a"}}, false},
	} {
		_, _, err := prepare(c.t)
		if (err == nil) != c.ok {
			t.Errorf("prepare(%+v) = %v", c.t, err)
		}
	}
}

// TestFragmentHeaders: the part header round-trips; headers of the wrong
// size or with a bad flag are ErrBadMessage.
func TestFragmentHeaders(t *testing.T) {
	for _, h := range []partHdr{{ctx: 1, id: 2}, {ctx: 0xffffffff, id: 0xfffffffe, last: true}} {
		b := h.append(nil)
		got, n, err := decodePartHdr(b)
		if err != nil || n != len(b) || got != h {
			t.Fatalf("part header %+v: decoded %+v, %d, %v", h, got, n, err)
		}
	}
	for _, b := range [][]byte{nil, make([]byte, partHdrLen-1), make([]byte, partHdrLen+1), append(make([]byte, partHdrLen-1), 2)} {
		if _, _, err := decodePartHdr(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("decodePartHdr(%x) = %v, want ErrBadMessage", b, err)
		}
	}
	ctx, n, err := decodeMsgHdr([]byte{1, 2, 3, 4})
	if err != nil || n != msgHdrLen || ctx != 0x04030201 {
		t.Fatalf("message header: %#x, %d, %v", ctx, n, err)
	}
	for _, b := range [][]byte{nil, {1, 2, 3}, {1, 2, 3, 4, 5}} {
		if _, _, err := decodeMsgHdr(b); !errors.Is(err, ErrBadMessage) {
			t.Errorf("decodeMsgHdr(%x) = %v, want ErrBadMessage", b, err)
		}
	}
}

// FuzzFragmentHeaders: no header makes the decoders panic, and an
// accepted part header encodes back to the same bytes.
func FuzzFragmentHeaders(f *testing.F) {
	f.Add(partHdr{ctx: 3, id: 9, last: true}.append(nil))
	f.Add([]byte{1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, n, err := decodePartHdr(b); err == nil {
			if n != len(b) || !bytes.Equal(h.append(nil), b) {
				t.Fatalf("part header %x does not round-trip", b)
			}
		}
		if _, n, err := decodeMsgHdr(b); err == nil && n != len(b) {
			t.Fatalf("message header: used %d of %d bytes", n, len(b))
		}
	})
}
