package pml_test

import (
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/self"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/gompi-org/gompi/pml"
)

// selfPair makes two engines joined by the in-process transport (btl/self):
// sends are delivered and matched on the sender's goroutine. extra
// parameters are set after baseParams.
func selfPair(b *testing.B, extra ...[2]string) (recv, send *pml.Comm) {
	b.Helper()
	ps, err := params.NewSet(append(append([][2]string{}, baseParams...), extra...))
	if err != nil {
		b.Fatal(err)
	}
	w := self.NewWorld()
	var engs [2]*pml.Engine
	var mods [2]*self.Module
	for r := range 2 {
		d := &btl.Dispatcher{}
		if engs[r], err = pml.New(pml.Config{Rank: r, Size: 2, Params: ps, Dispatch: d}); err != nil {
			b.Fatal(err)
		}
		env := &btl.Env{Rank: r, Size: 2, LocalRank: r, LocalSize: 2, Params: ps, Dispatch: d, Logf: func(string, ...any) {}}
		if mods[r], err = w.Attach(env); err != nil {
			b.Fatal(err)
		}
	}
	var comms [2]*pml.Comm
	for r := range 2 {
		for p := range 2 {
			ep, err := mods[r].AddProc(p)
			if err != nil {
				b.Fatal(err)
			}
			if err := engs[r].SetPeer(p, ep); err != nil {
				b.Fatal(err)
			}
		}
		if comms[r], err = engs[r].NewComm(0, r, []int{0, 1}); err != nil {
			b.Fatal(err)
		}
	}
	return comms[0], comms[1]
}

// benchMatch keeps posted receives from source src (a rank or AnySource)
// on distinct tags, the last one on tag posted-1, and measures a message
// that matches that last-posted receive: post it, send (immediate, matched
// during the send), check. The posted count is the same at every match.
func benchMatch(b *testing.B, posted, src int) {
	recv, send := selfPair(b)
	buf := make([]byte, 8)
	for tag := range posted - 1 {
		if _, err := recv.IrecvHandle(pml.Buffer{Bytes: buf}, src, tag); err != nil {
			b.Fatal(err)
		}
	}
	last := posted - 1
	msg := make([]byte, 8)
	b.ReportAllocs()
	for b.Loop() {
		r, err := recv.IrecvHandle(pml.Buffer{Bytes: buf}, src, last)
		if err != nil {
			b.Fatal(err)
		}
		if err := send.Send(pml.Buffer{Bytes: msg}, 0, last, pml.Standard); err != nil {
			b.Fatal(err)
		}
		if !r.Done() {
			b.Fatal("not matched")
		}
	}
}

// BenchmarkMatch: matching a message to the last of 10,000 receives posted
// on distinct tags (from its source) should cost about what matching the
// only posted receive costs.
func BenchmarkMatch(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(fmt.Sprintf("posted=%d", n), func(b *testing.B) { benchMatch(b, n, 1) })
	}
}

// BenchmarkMatchAnySource is the same with AnySource receives, which
// every arrival must scan in post order (as in ob1).
func BenchmarkMatchAnySource(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(fmt.Sprintf("posted=%d", n), func(b *testing.B) { benchMatch(b, n, pml.AnySource) })
	}
}

// BenchmarkUnexpected: receiving the last of queued unexpected messages
// (distinct tags) with a specific source and tag. Flow control is off:
// with it, the sender's blocking Send past pml_unexpected_window messages
// waits for a receive (as MPI allows a standard send to), and this one
// goroutine never posts it.
func BenchmarkUnexpected(b *testing.B) {
	for _, n := range []int{1, 10000} {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			recv, send := selfPair(b, [2]string{"pml_unexpected_window", "0"})
			msg, buf := make([]byte, 8), make([]byte, 8)
			for tag := range n - 1 {
				if err := send.Send(pml.Buffer{Bytes: msg}, 0, tag, pml.Standard); err != nil {
					b.Fatal(err)
				}
			}
			last := n - 1
			b.ReportAllocs()
			for b.Loop() {
				if err := send.Send(pml.Buffer{Bytes: msg}, 0, last, pml.Standard); err != nil {
					b.Fatal(err)
				}
				if _, err := recv.Recv(pml.Buffer{Bytes: buf}, 1, last); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
