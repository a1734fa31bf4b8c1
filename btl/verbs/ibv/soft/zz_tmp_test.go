package soft

import (
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

func BenchmarkZZCounters(b *testing.B) {
	const size = 4 << 20
	o := defaultOpts()
	o.bufSize = size
	o.timeout = 8
	x, y := newPair(b, Config{Seed: 1, Drop: 0.02}, Config{Seed: 2, Drop: 0.02}, o)
	b.SetBytes(size)
	wc := make([]ibv.WC, 16)
	inflight := 0
	wr := []ibv.SendWR{{Opcode: ibv.WRRDMAWrite, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(x.mr, 0, size)}, RemoteAddr: y.mr.Addr(), RKey: y.mr.RKey()}}
	for i := 0; i < b.N; i++ {
		for inflight >= 4 {
			k, err := x.scq.Poll(wc)
			require.NoError(b, err)
			inflight -= k
		}
		_, err := x.qp.PostSend(wr)
		require.NoError(b, err)
		inflight++
	}
	for inflight > 0 {
		k, _ := x.scq.Poll(wc)
		inflight -= k
	}
	b.StopTimer()
	b.Logf("N=%d\nx %+v\ny %+v", b.N, x.ctx.(*devContext).Counters(), y.ctx.(*devContext).Counters())
}

func TestZZRNR(t *testing.T) {
	o := defaultOpts()
	o.rnrRetry = 2
	o.minRNR = 1
	a, b := newPair(t, Config{}, Config{}, o)
	_, err := a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 10), sendWR(2, a.mr, 10)})
	require.NoError(t, err)
	pollOne(t, a.scq, ibv.WCRNRRetryExcErr)
	t.Logf("a %+v\nb %+v", a.ctx.(*devContext).Counters(), b.ctx.(*devContext).Counters())
}
