package launcher

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

func TestForwardLines(t *testing.T) {
	long := strings.Repeat("y", maxLine+100)
	for _, tc := range []struct {
		name, in string
		tag      bool
		want     []string // the writes, in order
	}{
		{"tagged", "a\nbc\npartial", true, []string{"[3] a\n", "[3] bc\n", "[3] partial\n"}},
		{"untagged keeps the partial line as is", "a\npartial", false, []string{"a\n", "partial"}},
		{"empty lines", "\n\n", true, []string{"[3] \n", "[3] \n"}},
		{"no output", "", true, nil},
		{"over-long line in pieces, one tag", long + "\nz\n", true,
			[]string{"[3] " + long[:maxLine-4], long[maxLine-4:] + "\n", "[3] z\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w recorder
			o := newOutput(&w, io.Discard, tc.tag)
			// A reader that returns one byte at a time, as a slow pipe may.
			o.forward(&oneByteReader{strings.NewReader(tc.in)}, false, 3)
			if len(w.writes) != len(tc.want) {
				t.Fatalf("%d writes, want %d", len(w.writes), len(tc.want))
			}
			for i := range w.writes {
				if w.writes[i] != tc.want[i] {
					t.Errorf("write %d: %.60q..., want %.60q...", i, w.writes[i], tc.want[i])
				}
			}
		})
	}
}

type recorder struct{ writes []string }

func (r *recorder) Write(p []byte) (int, error) {
	r.writes = append(r.writes, string(bytes.Clone(p)))
	return len(p), nil
}

type oneByteReader struct{ r io.Reader }

func (o *oneByteReader) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}
