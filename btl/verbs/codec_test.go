package verbs

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
)

func sampleAddr() addr {
	return addr{LID: 7, Port: 1, MTU: ibv.MTU1024, QPN: 0x12345, PSN: 0xABCDEF,
		GID: ibv.GIDFromAddr(netip.MustParseAddr("127.3.4.5")), RingAddr: 0x10000, RingKey: 0xdeadbeef,
		RingSize: 256 << 10, Credits: 64}
}

func TestAddrRoundTrip(t *testing.T) {
	a := sampleAddr()
	b := a.encode()
	require.Len(t, b, addrLen)
	got, err := decodeAddr(b)
	require.NoError(t, err)
	require.Equal(t, a, got)
}

func TestAddrRejects(t *testing.T) {
	good := sampleAddr().encode()
	mut := func(f func(b []byte)) []byte { b := bytes.Clone(good); f(b); return b }
	le := binary.LittleEndian
	cases := map[string][]byte{
		"empty":        nil,
		"short":        good[:addrLen-1],
		"long":         append(bytes.Clone(good), 0),
		"magic":        mut(func(b []byte) { b[0] = 'X' }),
		"mtu 0":        mut(func(b []byte) { b[7] = 0 }),
		"mtu 6":        mut(func(b []byte) { b[7] = 6 }),
		"qpn 25 bits":  mut(func(b []byte) { le.PutUint32(b[8:], 1<<24) }),
		"psn 25 bits":  mut(func(b []byte) { le.PutUint32(b[12:], 1<<24) }),
		"ring 0":       mut(func(b []byte) { le.PutUint32(b[44:], 0) }),
		"ring odd":     mut(func(b []byte) { le.PutUint32(b[44:], 256<<10+1) }),
		"ring huge":    mut(func(b []byte) { le.PutUint32(b[44:], 1<<31) }),
		"ring wraps":   mut(func(b []byte) { le.PutUint64(b[32:], ^uint64(0)-100) }),
		"credits 0":    mut(func(b []byte) { le.PutUint32(b[48:], 0) }),
		"credits huge": mut(func(b []byte) { le.PutUint32(b[48:], maxCredits+1) }),
	}
	for name, b := range cases {
		_, err := decodeAddr(b)
		require.ErrorIs(t, err, mpierr.ErrProtocol, name)
	}
}

func FuzzAddr(f *testing.F) {
	f.Add(sampleAddr().encode())
	f.Add([]byte("GVB1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		a, err := decodeAddr(b)
		if err != nil {
			return
		}
		require.LessOrEqual(t, a.QPN, uint32(0xFFFFFF))
		require.NotZero(t, a.MTU.Bytes())
		require.GreaterOrEqual(t, a.RingSize, uint32(minRingSize))
		again, err := decodeAddr(a.encode())
		require.NoError(t, err)
		require.Equal(t, a, again)
	})
}

func TestFrameRoundTrip(t *testing.T) {
	ring := make([]byte, 1024)
	h := frameHdr{length: 100, kind: frameMsg, tag: 0x41, hdrLen: 16, seq: 9}
	h.put(ring[128:])
	got, err := decodeFrame(ring[128:], 9)
	require.NoError(t, err)
	require.Equal(t, h, got)
	pad := frameHdr{length: 1024 - 512, kind: framePad, seq: 10}
	pad.put(ring[512:])
	got, err = decodeFrame(ring[512:], 10)
	require.NoError(t, err)
	require.Equal(t, pad, got)
}

func TestFrameRejects(t *testing.T) {
	good := func() []byte {
		b := make([]byte, 256)
		(&frameHdr{length: 64, kind: frameMsg, tag: 1, hdrLen: 8, seq: 3}).put(b)
		return b
	}
	le := binary.LittleEndian
	cases := map[string]func(b []byte) []byte{
		"short":            func(b []byte) []byte { return b[:frameHdrLen-1] },
		"kind 0":           func(b []byte) []byte { b[4] = 0; return b },
		"kind 9":           func(b []byte) []byte { b[4] = 9; return b },
		"reserved":         func(b []byte) []byte { b[6] = 1; return b },
		"wrong seq":        func(b []byte) []byte { le.PutUint32(b[12:], 4); return b },
		"length 0":         func(b []byte) []byte { le.PutUint32(b[0:], 0); return b },
		"past ring end":    func(b []byte) []byte { le.PutUint32(b[0:], 257); return b },
		"huge length":      func(b []byte) []byte { le.PutUint32(b[0:], ^uint32(0)); return b },
		"hdr past frame":   func(b []byte) []byte { le.PutUint32(b[8:], 64-frameHdrLen+1); return b },
		"huge hdr":         func(b []byte) []byte { le.PutUint32(b[8:], ^uint32(0)); return b },
		"pad short of end": func(b []byte) []byte { b[4] = uint8(framePad); return b },
	}
	_, err := decodeFrame(good(), 3)
	require.NoError(t, err)
	for name, f := range cases {
		_, err := decodeFrame(f(good()), 3)
		require.ErrorIs(t, err, mpierr.ErrProtocol, name)
	}
}

// FuzzControlSlot feeds arbitrary ring contents to the decoder: it must
// return an error or a frame that lies within the ring, never panic.
func FuzzControlSlot(f *testing.F) {
	for _, h := range []frameHdr{{length: 16, kind: frameMsg, seq: 0}, {length: 200, kind: frameMsg, tag: 0x41, hdrLen: 16},
		{length: 256, kind: framePad}, {length: 16, kind: frameClose}} {
		b := make([]byte, 256)
		h.put(b)
		f.Add(b, h.seq)
	}
	f.Fuzz(func(t *testing.T, b []byte, seq uint32) {
		h, err := decodeFrame(b, seq)
		if err != nil {
			require.ErrorIs(t, err, mpierr.ErrProtocol)
			return
		}
		require.LessOrEqual(t, int(h.length), len(b))
		require.LessOrEqual(t, frameHdrLen+int(h.hdrLen), int(h.length))
		f := b[frameHdrLen:h.length]
		_ = f[:h.hdrLen]
	})
}

func TestHandle(t *testing.T) {
	h := make([]byte, handleLen)
	encodeHandle(h, 0x1000, 4096, 0x77)
	a, k, err := decodeHandle(h, 100, 3996)
	require.NoError(t, err)
	require.Equal(t, uint64(0x1000+100), a)
	require.Equal(t, uint32(0x77), k)
	for _, c := range []struct {
		h      []byte
		off, n int
	}{{nil, 0, 0}, {h[:23], 0, 1}, {h, -1, 1}, {h, 0, 4097}, {h, 4096, 1}, {h, 1 << 62, 1}, {h, 1, -1}} {
		_, _, err := decodeHandle(c.h, c.off, c.n)
		require.ErrorIs(t, err, btl.ErrBadHandle, "%d+%d", c.off, c.n)
	}
	bad := bytes.Clone(h)
	bad[20] = 0
	_, _, err = decodeHandle(bad, 0, 1)
	require.ErrorIs(t, err, btl.ErrBadHandle)
}
