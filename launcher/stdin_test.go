package launcher

import (
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// The stdin relay gives the input to the connection that shows the token,
// whole, then end of file; a connection that shows nothing or a wrong
// token gets none of it and holds up nobody.
func TestStdinRelayToken(t *testing.T) {
	in := strings.Repeat("relayed line\n", 10000)
	r, err := newStdinRelay(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	addrs, err := r.addrs()
	if err != nil {
		t.Fatal(err)
	}
	loop := addrs[len(addrs)-1] // 127.0.0.1
	deadline := time.Now().Add(20 * time.Second)

	silent, err := net.Dial("tcp", loop) // never sends its token
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	wrong, err := net.Dial("tcp", loop)
	if err != nil {
		t.Fatal(err)
	}
	defer wrong.Close()
	wrong.SetDeadline(deadline)
	if _, err := io.WriteString(wrong, strings.Repeat("0", len(r.token))+"\n"); err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(wrong); err != nil || len(got) != 0 {
		t.Fatalf("a wrong token read %d bytes (%v), want none and end of file", len(got), err)
	}

	f, err := dialStdin([]string{loop}, r.token)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.SetReadDeadline(deadline)
	got, err := io.ReadAll(f)
	if err != nil {
		t.Fatalf("reading the relayed input: %v", err)
	}
	if string(got) != in {
		t.Fatalf("relayed %d bytes, want the %d of the input", len(got), len(in))
	}
}
