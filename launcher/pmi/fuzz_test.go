package pmi

import (
	"bufio"
	"bytes"
	"io"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to both stream readers and to the
// mapping parser: each returns a value or an error, never panics, and a
// message it accepts encodes back to one that decodes the same.
func FuzzDecode(f *testing.F) {
	for _, s := range v1Samples {
		f.Add([]byte(s + "\n"))
	}
	for _, s := range v2Samples {
		b := []byte("      " + s)
		copy(b, []byte(padLen(len(s))))
		f.Add(b)
	}
	f.Add([]byte("(vector,(0,2,4),(2,1,3))"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bufio.NewReader(bytes.NewReader(data))
		for {
			m, err := readV1(r)
			if err != nil {
				break
			}
			checkReencode(t, m, false)
		}
		r = bufio.NewReader(bytes.NewReader(data))
		for {
			m, err := readV2(r)
			if err != nil {
				break
			}
			checkReencode(t, m, true)
		}
		if b, err := parseMapping(string(data)); err == nil {
			nodes := nodeOf(b, 64)
			if len(nodes) != 64 {
				t.Fatalf("%d nodes for 64 ranks", len(nodes))
			}
			localOf(nodes, 63)
		}
	})
}

func padLen(n int) string {
	s := []byte("      ")
	d := []byte(itoa(n))
	copy(s, d)
	return string(s)
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for ; n > 0; n /= 10 {
		b = append([]byte{byte('0' + n%10)}, b...)
	}
	return string(b)
}

// checkReencode encodes an accepted message again when its words are
// sendable, and requires the same message back.
func checkReencode(t *testing.T, m msg, v2 bool) {
	if m.cmd == "" {
		t.Fatal("accepted a message without cmd")
	}
	kv := []string{}
	for _, a := range m.attrs {
		if a.noValue || a.value == "" || checkWord(a.key, true) != nil || checkWord(a.value, false) != nil || checkWord(m.cmd, false) != nil {
			return
		}
		kv = append(kv, a.key, a.value)
	}
	var b []byte
	var err error
	if v2 {
		b, err = appendV2(nil, m.cmd, kv...)
	} else {
		b, err = appendV1(nil, m.cmd, kv...)
	}
	if err != nil {
		return
	}
	r := bufio.NewReader(bytes.NewReader(b))
	var back msg
	if v2 {
		back, err = readV2(r)
	} else {
		back, err = readV1(r)
	}
	if err != nil || back.cmd != m.cmd || len(back.attrs) != len(m.attrs) {
		t.Fatalf("%q: re-encoded as %q, decoded %+v, %v", m.cmd, b, back, err)
	}
	for i := range back.attrs {
		if back.attrs[i] != m.attrs[i] {
			t.Fatalf("attribute %d: %+v, want %+v", i, back.attrs[i], m.attrs[i])
		}
	}
}

func errUnexpectedEOF() error { return io.ErrUnexpectedEOF }
