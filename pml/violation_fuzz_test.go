package pml_test

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
	"github.com/gompi-org/gompi/pml/hdr"
	"github.com/stretchr/testify/require"
)

// fuzzIn reads a fuzzer's input as a stream of small numbers; past its
// end every read is zero.
type fuzzIn struct{ b []byte }

func (r *fuzzIn) more() bool { return len(r.b) > 0 }

func (r *fuzzIn) u8() uint8 {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *fuzzIn) u64() uint64 {
	var a [8]byte
	n := copy(a[:], r.b)
	r.b = r.b[n:]
	return binary.LittleEndian.Uint64(a[:])
}

// bytes returns up to n bytes of the input.
func (r *fuzzIn) bytes(n int) []byte {
	n = min(n, len(r.b))
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b
}

// FuzzBadPeer has a peer that follows no protocol send the victim (rank 0
// of vrig) a sequence of fragments, well-formed headers with fields drawn
// from the input (request ids among those the victim really uses, so that
// the sequence reaches the rendezvous states) or raw bytes, with the
// victim's own traffic delivered in between. Whatever the sequence, the
// victim never panics, never writes outside a receive buffer, breaks no
// rule of the transport contract, ends every request involving the bad
// peer once it has failed that peer (and refuses new ones), and still
// communicates with the good peer.
func FuzzBadPeer(f *testing.F) {
	// Seeds: each kind of header alone, and a rendezvous answered in order.
	for op := range 10 {
		f.Add([]byte{byte(op), 1, 0, 0, 0, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	}
	f.Add([]byte{1, 0, 0, 232, 3, 0, 0, 0, 0, 0, 0, 2, 96, 8, 4, 1, 1, 96, 0, 0, 0, 0, 0, 0, 0, 255, 8})
	f.Add([]byte{3, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 232, 3, 0, 0, 0, 0, 0, 0, 8, 6, 1, 0, 0, 0, 0, 0, 0, 0, 0, 232, 3})
	f.Fuzz(func(t *testing.T, in []byte) {
		v := newVrig(t)
		r := &fuzzIn{in}
		// Request ids the victim uses with the bad peer: its send's, and
		// those its ACKs and PUTs to the bad peer carry.
		ids := []uint64{0, v.sendReq(), 1 << 63}
		learn := func() {
			for _, op := range v.net.Pending() {
				if op.From != victim || op.To != bad || !op.Kind.IsSend() {
					continue
				}
				switch hdr.Type(op.Tag) {
				case hdr.TypeAck:
					if a, _, err := hdr.DecodeAck(op.Hdr); err == nil {
						ids = append(ids, a.DstReq)
					}
				case hdr.TypePut:
					if p, _, err := hdr.DecodePut(op.Hdr); err == nil {
						ids = append(ids, p.DstReq)
					}
				}
			}
		}
		id := func() uint64 {
			k := r.u8()
			if int(k) < len(ids) {
				return ids[k]
			}
			return uint64(k)
		}
		size := func() uint64 { // mostly near the sizes in play, at times anything
			if k := r.u8(); k < 250 {
				return uint64(k) * 8
			}
			return r.u64()
		}
		match := func() hdr.Match {
			return hdr.Match{Flags: r.u8(), Seq: uint16(r.u8() % 4), Ctx: uint32(r.u8() % 2), Src: bad, Tag: int32(r.u8() % 4)}
		}
		handle := func() []byte { return r.bytes(int(r.u8() % 40)) }
		for k := 0; k < 24 && r.more(); k++ {
			var typ hdr.Type
			var h []byte
			switch r.u8() % 10 {
			case 0:
				m := match()
				typ, h = hdr.TypeMatch, enc(&m)
			case 1:
				typ, h = hdr.TypeRndv, enc(&hdr.Rndv{Match: match(), MsgLen: size(), SrcReq: id()})
			case 2:
				typ, h = hdr.TypeRget, enc(&hdr.Rget{Match: match(), MsgLen: size(), SrcReq: id(), Handle: handle()})
			case 3:
				typ, h = hdr.TypeAck, enc(&hdr.Ack{Flags: r.u8(), SrcReq: id(), DstReq: id(), SendOffset: size(), SendSize: size()})
			case 4:
				typ, h = hdr.TypeFrag, enc(&hdr.Frag{Flags: r.u8(), Offset: size(), SrcReq: id(), DstReq: id()})
			case 5:
				typ, h = hdr.TypePut, enc(&hdr.Put{Flags: r.u8(), SrcReq: id(), DstReq: id(), Offset: size(), Size: size(), Handle: handle()})
			case 6:
				typ, h = hdr.TypeFin, enc(&hdr.Fin{Flags: r.u8(), Req: id(), Offset: size(), Size: int64(size())})
			case 7: // anything: a tag of the PML's and raw header bytes
				typ, h = hdr.Type(0x40+r.u8()%10), r.bytes(int(r.u8()%64))
			case 8: // the victim's own traffic goes out
				v.run()
				learn()
				continue
			default: // one operation of the victim's delivered, in any order
				if n := v.net.Len(); n > 0 {
					require.NoError(t, v.net.Deliver(int(r.u8())%n))
				}
				learn()
				continue
			}
			data := r.bytes(int(r.u8()) * 4)
			if err := v.net.Inject(bad, victim, btl.Tag(typ), h, data); err != nil {
				t.Fatalf("inject: %v", err)
			}
			v.poll()
			learn()
		}
		v.run()
		v.checkData()
		require.Empty(t, v.net.Violations())
		// A request involving the bad peer that failed it (ErrProtocol)
		// means all of them failed.
		failed := false
		for _, tr := range []*tracked{v.fromBad, v.toBad} {
			if tr.r.Done() {
				if _, err := tr.r.Result(); errors.Is(err, mpierr.ErrProcFailed) {
					failed = true
				}
			}
		}
		if failed {
			for _, tr := range []*tracked{v.fromBad, v.toBad} {
				// Done: with ErrProcFailed, or with what it completed
				// with before the peer failed.
				require.True(t, tr.r.Done(), "%s: the bad peer failed, yet it is pending", tr.name)
			}
			_, err := v.comm[victim].IrecvHandle(pml.Buffer{Bytes: make([]byte, 8)}, bad, 4)
			require.ErrorIs(t, err, mpierr.ErrProcFailed, "receive from the failed peer")
		}
		v.isend(good, victim, 1, v.goodData, pml.Standard)
		v.run()
		requireOK(t, v.fromGood, len(v.goodData))
		v.checkData()
		require.Empty(t, v.net.Violations())
	})
}
