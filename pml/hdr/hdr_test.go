package hdr

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

func samples() map[Type][]byte {
	out := map[Type][]byte{}
	m := Match{Flags: 3, Seq: 65535, Ctx: 7, Src: 12, Tag: -5}
	b := make([]byte, MaxLen)
	out[TypeMatch] = append([]byte(nil), b[:m.Encode(b)]...)
	r := Rndv{Match: m, MsgLen: 1 << 40, SrcReq: 99}
	out[TypeRndv] = append([]byte(nil), b[:r.Encode(b)]...)
	g := Rget{Match: m, MsgLen: 4096, SrcReq: 5, Handle: []byte{1, 2, 3, 4, 5}}
	out[TypeRget] = append([]byte(nil), b[:g.Encode(b)]...)
	a := Ack{Flags: FlagNoRDMA, SrcReq: 1, DstReq: 2, SendOffset: 3, SendSize: 4}
	out[TypeAck] = append([]byte(nil), b[:a.Encode(b)]...)
	f := Frag{Offset: 123456, SrcReq: 8, DstReq: 9}
	out[TypeFrag] = append([]byte(nil), b[:f.Encode(b)]...)
	p := Put{Flags: FlagAck, SrcReq: 1, DstReq: 2, Offset: 3, Size: 4, Handle: bytes.Repeat([]byte{7}, 24)}
	out[TypePut] = append([]byte(nil), b[:p.Encode(b)]...)
	n := Fin{Req: 77, Offset: 1 << 33, Size: -3}
	out[TypeFin] = append([]byte(nil), b[:n.Encode(b)]...)
	c := Credit{Grant: 65000, Ctx: 3, Dst: 2}
	out[TypeCredit] = append([]byte(nil), b[:c.Encode(b)]...)
	return out
}

func TestRoundTrip(t *testing.T) {
	b := make([]byte, MaxLen)
	m := Match{Flags: 3, Seq: 65535, Ctx: 7, Src: 12, Tag: -5}
	n := m.Encode(b)
	require.Equal(t, MatchLen, n)
	got, used, err := DecodeMatch(b[:n])
	require.NoError(t, err)
	require.Equal(t, m, got)
	require.Equal(t, MatchLen, used)

	r := Rndv{Match: m, MsgLen: 1 << 40, SrcReq: 99}
	n = r.Encode(b)
	gr, used, err := DecodeRndv(b[:n])
	require.NoError(t, err)
	require.Equal(t, r, gr)
	require.Equal(t, RndvLen, used)

	g := Rget{Match: m, MsgLen: 4096, SrcReq: 5, Handle: []byte{1, 2, 3}}
	n = g.Encode(b)
	gg, used, err := DecodeRget(b[:n])
	require.NoError(t, err)
	require.Equal(t, g, gg)
	require.Equal(t, g.Len(), used)

	a := Ack{Flags: FlagNoRDMA, SrcReq: 1, DstReq: 2, SendOffset: 3, SendSize: 4}
	n = a.Encode(b)
	ga, _, err := DecodeAck(b[:n])
	require.NoError(t, err)
	require.Equal(t, a, ga)

	f := Frag{Offset: 123456, SrcReq: 8, DstReq: 9}
	n = f.Encode(b)
	gf, _, err := DecodeFrag(b[:n])
	require.NoError(t, err)
	require.Equal(t, f, gf)

	p := Put{Flags: FlagAck, SrcReq: 1, DstReq: 2, Offset: 3, Size: 4, Handle: []byte{9, 9}}
	n = p.Encode(b)
	gp, used, err := DecodePut(b[:n])
	require.NoError(t, err)
	require.Equal(t, p, gp)
	require.Equal(t, p.Len(), used)

	fi := Fin{Req: 77, Offset: 1 << 33, Size: -3}
	n = fi.Encode(b)
	gfi, _, err := DecodeFin(b[:n])
	require.NoError(t, err)
	require.Equal(t, fi, gfi)

	c := Credit{Flags: 1, Grant: 65535, Ctx: 1 << 31, Dst: 1<<31 - 1}
	n = c.Encode(b)
	gc, used, err := DecodeCredit(b[:n])
	require.NoError(t, err)
	require.Equal(t, c, gc)
	require.Equal(t, CreditLen, used)
}

func TestShortAndWrongType(t *testing.T) {
	for typ, enc := range samples() {
		for i := 0; i < len(enc); i++ {
			_, err := decode(typ, enc[:i])
			require.Error(t, err, "%v truncated to %d", typ, i)
			require.True(t, errors.Is(err, ErrMalformed))
		}
	}
	b := samples()[TypeAck]
	_, _, err := DecodeFrag(b)
	require.ErrorIs(t, err, ErrMalformed)
	// A handle length that points past the end.
	g := samples()[TypeRget]
	g[32] = 200
	_, _, err = DecodeRget(g)
	require.ErrorIs(t, err, ErrMalformed)
}

func decode(t Type, b []byte) (int, error) {
	var n int
	var err error
	switch t {
	case TypeMatch:
		_, n, err = DecodeMatch(b)
	case TypeRndv:
		_, n, err = DecodeRndv(b)
	case TypeRget:
		_, n, err = DecodeRget(b)
	case TypeAck:
		_, n, err = DecodeAck(b)
	case TypeFrag:
		_, n, err = DecodeFrag(b)
	case TypePut:
		_, n, err = DecodePut(b)
	case TypeFin:
		_, n, err = DecodeFin(b)
	case TypeCredit:
		_, n, err = DecodeCredit(b)
	default:
		// Not a PML header: the dispatcher routes fragments by type, so
		// no decoder sees one.
		return 0, fmt.Errorf("%w: type %#x", ErrMalformed, uint8(t))
	}
	return n, err
}

func FuzzDecode(f *testing.F) {
	for _, b := range samples() {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		typ, err := Peek(b)
		if err != nil {
			return
		}
		n, err := decode(typ, b)
		if err == nil && (n > len(b) || n <= 0) {
			t.Fatalf("%v: used %d of %d bytes", typ, n, len(b))
		}
		if err == nil {
			// Re-encoding what was decoded gives the same bytes (up to the padding).
			n2, err2 := decode(typ, b[:n])
			if err2 != nil || n2 != n {
				t.Fatalf("%v: decode of own prefix: %v", typ, err2)
			}
		}
	})
}

// Words is the two-word form of Encode: the same 16 bytes, little-endian.
func TestMatchWordsAreEncode(t *testing.T) {
	for _, m := range []Match{
		{},
		{Flags: 0xa5, Seq: 0xfffe, Ctx: 0xdeadbeef, Src: -1, Tag: math.MinInt32},
		{Flags: 1, Seq: 7, Ctx: 3, Src: 123456, Tag: math.MaxInt32},
	} {
		var want [MatchLen]byte
		m.Encode(want[:])
		w0, w1 := m.Words()
		var got [MatchLen]byte
		binary.LittleEndian.PutUint64(got[:], w0)
		binary.LittleEndian.PutUint64(got[8:], w1)
		require.Equal(t, want, got, "%+v", m)
		var back Match
		require.NoError(t, back.Decode(got[:]))
		require.Equal(t, m, back)
	}
}
