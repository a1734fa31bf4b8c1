package soft

import (
	"bytes"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

func fill(b []byte, seed byte) {
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>12)
	}
}

func TestSendRecv(t *testing.T) {
	for _, size := range []int{0, 1, 100, 4096, 4097, 3*4096 + 5, 200000} {
		a, b := newPair(t, Config{}, Config{}, defaultOpts())
		fill(a.buf[:size], 3)
		_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 7, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 10, size+10)}}})
		require.NoError(t, err)
		_, err = a.qp.PostSend([]ibv.SendWR{{ID: 9, Opcode: ibv.WRSendWithImm, Imm: 0xdeadbeef, Flags: ibv.FlagSignaled,
			SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, size)}}})
		require.NoError(t, err)
		wc := pollOne(t, a.scq, ibv.WCSuccess)
		require.Equal(t, uint64(9), wc.ID)
		require.Equal(t, ibv.WCSend, wc.Opcode)
		wc = pollOne(t, b.rcq, ibv.WCSuccess)
		require.Equal(t, uint64(7), wc.ID)
		require.Equal(t, ibv.WCRecv, wc.Opcode)
		require.Equal(t, uint32(size), wc.ByteLen)
		require.Equal(t, uint32(0xdeadbeef), wc.Imm)
		require.Equal(t, ibv.WCWithImm, wc.Flags&ibv.WCWithImm)
		require.Equal(t, a.qp.QPN(), wc.SrcQP)
		require.True(t, bytes.Equal(a.buf[:size], b.buf[10:10+size]), "size %d", size)
	}
}

func TestWriteReadImm(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	const n = 300000
	fill(a.buf[:n], 1)
	_, err := a.qp.PostSend([]ibv.SendWR{{ID: 1, Opcode: ibv.WRRDMAWrite, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, n)}, RemoteAddr: b.mr.Addr() + 5, RKey: b.mr.RKey()}})
	require.NoError(t, err)
	require.Equal(t, ibv.WCRDMAWrite, pollOne(t, a.scq, ibv.WCSuccess).Opcode)
	require.True(t, bytes.Equal(a.buf[:n], b.buf[5:5+n]))

	_, err = b.qp.PostRecv([]ibv.RecvWR{{ID: 2}})
	require.NoError(t, err)
	fill(a.buf[:n], 9)
	_, err = a.qp.PostSend([]ibv.SendWR{{ID: 3, Opcode: ibv.WRRDMAWriteWithImm, Imm: 42, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, n)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}})
	require.NoError(t, err)
	pollOne(t, a.scq, ibv.WCSuccess)
	wc := pollOne(t, b.rcq, ibv.WCSuccess)
	require.Equal(t, ibv.WCRecvRDMAWithImm, wc.Opcode)
	require.Equal(t, uint32(42), wc.Imm)
	require.Equal(t, uint32(n), wc.ByteLen)
	require.True(t, bytes.Equal(a.buf[:n], b.buf[:n]))

	fill(b.buf[:n], 77)
	_, err = a.qp.PostSend([]ibv.SendWR{{ID: 4, Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(a.mr, 1000, n)}, RemoteAddr: b.mr.Addr() + 3, RKey: b.mr.RKey()}})
	require.NoError(t, err)
	wc = pollOne(t, a.scq, ibv.WCSuccess)
	require.Equal(t, ibv.WCRDMARead, wc.Opcode)
	require.True(t, bytes.Equal(a.buf[1000:1000+n], b.buf[3:3+n]))
	_ = time.Second
}
