package soft

import (
	"errors"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

func writeWR(id uint64, src ibv.MR, n int, dst ibv.MR, off uint64) ibv.SendWR {
	return ibv.SendWR{ID: id, Opcode: ibv.WRRDMAWrite, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(src, 0, n)}, RemoteAddr: dst.Addr() + off, RKey: dst.RKey()}
}

// waitState waits until q is in st.
func waitState(t *testing.T, q ibv.QP, st ibv.QPState) {
	t.Helper()
	dl := deadline(t, 10*time.Second)
	for q.State() != st {
		if time.Now().After(dl) {
			t.Fatalf("QP in %v, want %v", q.State(), st)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRemoteAccessErrors(t *testing.T) {
	cases := []struct {
		name string
		opts func(*pairOpts)
		wr   func(a, b *end, other ibv.MR) ibv.SendWR
	}{
		{"bad rkey", nil, func(a, b *end, _ ibv.MR) ibv.SendWR {
			w := writeWR(1, a.mr, 100, b.mr, 0)
			w.RKey ^= 0x5a5a5a5a
			return w
		}},
		{"rkey of another PD", nil, func(a, b *end, other ibv.MR) ibv.SendWR { return writeWR(1, a.mr, 100, other, 0) }},
		{"past the end", nil, func(a, b *end, _ ibv.MR) ibv.SendWR { return writeWR(1, a.mr, 100, b.mr, uint64(b.mr.Len()-50)) }},
		{"before the start", nil, func(a, b *end, _ ibv.MR) ibv.SendWR { return writeWR(1, a.mr, 100, b.mr, ^uint64(0)) }},
		{"MR without remote write", func(o *pairOpts) { o.mrAccess = ibv.AccessLocalWrite | ibv.AccessRemoteRead },
			func(a, b *end, _ ibv.MR) ibv.SendWR { return writeWR(1, a.mr, 100, b.mr, 0) }},
		{"QP without remote write", func(o *pairOpts) { o.access = ibv.AccessRemoteRead },
			func(a, b *end, _ ibv.MR) ibv.SendWR { return writeWR(1, a.mr, 100, b.mr, 0) }},
		{"READ, MR without remote read", func(o *pairOpts) { o.mrAccess = ibv.AccessLocalWrite | ibv.AccessRemoteWrite },
			func(a, b *end, _ ibv.MR) ibv.SendWR {
				w := writeWR(1, a.mr, 100, b.mr, 0)
				w.Opcode = ibv.WRRDMARead
				return w
			}},
		{"READ, QP without remote read", func(o *pairOpts) { o.access = ibv.AccessRemoteWrite },
			func(a, b *end, _ ibv.MR) ibv.SendWR {
				w := writeWR(1, a.mr, 100, b.mr, 0)
				w.Opcode = ibv.WRRDMARead
				return w
			}},
		{"atomic, QP without remote atomic", func(o *pairOpts) { o.access = ibv.AccessRemoteWrite | ibv.AccessRemoteRead },
			func(a, b *end, _ ibv.MR) ibv.SendWR {
				return ibv.SendWR{ID: 1, Opcode: ibv.WRAtomicFetchAndAdd, Flags: ibv.FlagSignaled, CompareAdd: 1,
					SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, 8)}, RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()}
			}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := defaultOpts()
			o.bufSize = 4096
			if c.opts != nil {
				c.opts(&o)
			}
			a, b := newPair(t, Config{}, Config{}, o)
			pd2, err := b.ctx.AllocPD()
			require.NoError(t, err)
			other, err := pd2.RegMR(make([]byte, 4096), ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead)
			require.NoError(t, err)
			t.Cleanup(func() { other.Dereg(); pd2.Dealloc() })
			_, err = b.qp.PostRecv([]ibv.RecvWR{{ID: 5}})
			require.NoError(t, err)
			_, err = a.qp.PostSend([]ibv.SendWR{c.wr(a, b, other), sendWR(2, a.mr, 10)})
			require.NoError(t, err)
			wc := pollOne(t, a.scq, ibv.WCRemAccessErr)
			require.Equal(t, uint64(1), wc.ID)
			require.Equal(t, uint64(2), pollOne(t, a.scq, ibv.WCWRFlushErr).ID, "the request after the failed one")
			require.Equal(t, ibv.QPSErr, a.qp.State())
			waitState(t, b.qp, ibv.QPSErr)
			require.Equal(t, uint64(5), pollOne(t, b.rcq, ibv.WCWRFlushErr).ID, "the responder's posted receive")
			require.NotZero(t, b.ctx.(*devContext).Counters().ErrNAKsSent)
		})
	}
}

func sendWR(id uint64, mr ibv.MR, n int) ibv.SendWR {
	return ibv.SendWR{ID: id, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(mr, 0, n)}}
}

func TestWriteImmAccessErrorCompletesReceive(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 5}, {ID: 6}})
	require.NoError(t, err)
	w := writeWR(1, a.mr, 100, b.mr, 0)
	w.Opcode, w.RKey = ibv.WRRDMAWriteWithImm, w.RKey+1
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.NoError(t, err)
	pollOne(t, a.scq, ibv.WCRemAccessErr)
	require.Equal(t, uint64(5), pollOne(t, b.rcq, ibv.WCLocProtErr).ID)
	require.Equal(t, uint64(6), pollOne(t, b.rcq, ibv.WCWRFlushErr).ID)
}

func TestLocalProtectionError(t *testing.T) {
	t.Run("send lkey", func(t *testing.T) {
		a, b := newPair(t, Config{}, Config{}, defaultOpts())
		_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 5, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 100)}}})
		require.NoError(t, err)
		good := sendWR(1, a.mr, 10)
		bad := sendWR(2, a.mr, 10)
		bad.SGList[0].LKey ^= 0xffff
		_, err = a.qp.PostSend([]ibv.SendWR{good, bad, sendWR(3, a.mr, 10)})
		require.NoError(t, err)
		require.Equal(t, uint64(1), pollOne(t, a.scq, ibv.WCSuccess).ID)
		require.Equal(t, uint64(2), pollOne(t, a.scq, ibv.WCLocProtErr).ID)
		require.Equal(t, uint64(3), pollOne(t, a.scq, ibv.WCWRFlushErr).ID)
		require.Equal(t, ibv.QPSErr, a.qp.State())
	})
	t.Run("READ into a region without local write", func(t *testing.T) {
		a, b := newPair(t, Config{}, Config{}, defaultOpts())
		ro, err := a.pd.RegMR(make([]byte, 100), ibv.AccessRemoteRead)
		require.NoError(t, err)
		t.Cleanup(func() { ro.Dereg() })
		w := writeWR(1, ro, 100, b.mr, 0)
		w.Opcode = ibv.WRRDMARead
		_, err = a.qp.PostSend([]ibv.SendWR{w})
		require.NoError(t, err)
		pollOne(t, a.scq, ibv.WCLocProtErr)
	})
	t.Run("receive lkey", func(t *testing.T) {
		a, b := newPair(t, Config{}, Config{}, defaultOpts())
		_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 5, SGList: []ibv.SGEntry{{Addr: b.mr.Addr(), Length: 100, LKey: b.mr.LKey() + 1}}}})
		require.NoError(t, err)
		_, err = a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 10)})
		require.NoError(t, err)
		pollOne(t, b.rcq, ibv.WCLocProtErr)
		pollOne(t, a.scq, ibv.WCRemOpErr)
	})
}

func TestReceiveTooSmall(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 5, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 100)}}, {ID: 6}})
	require.NoError(t, err)
	_, err = a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 101)})
	require.NoError(t, err)
	require.Equal(t, uint64(5), pollOne(t, b.rcq, ibv.WCLocLenErr).ID)
	require.Equal(t, uint64(6), pollOne(t, b.rcq, ibv.WCWRFlushErr).ID)
	pollOne(t, a.scq, ibv.WCRemInvReqErr)
	require.Equal(t, ibv.QPSErr, a.qp.State())
	require.Equal(t, ibv.QPSErr, b.qp.State())
}

func TestFlushOnError(t *testing.T) {
	o := defaultOpts()
	o.noConnect = true
	a, b := newPair(t, Config{}, Config{}, o)
	// Aim a at a QP number nobody has: nothing is ever acknowledged.
	connect(t, a, b, o)
	require.NoError(t, b.qp.Destroy())
	b.qp = nil
	for i := range 5 {
		w := sendWR(uint64(i), a.mr, 10)
		if i%2 == 1 {
			w.Flags = 0 // unsignalled requests are flushed with a completion too
		}
		_, err := a.qp.PostSend([]ibv.SendWR{w})
		require.NoError(t, err)
	}
	_, err := a.qp.PostRecv([]ibv.RecvWR{{ID: 10}, {ID: 11}})
	require.NoError(t, err)
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState))
	for i := range 5 {
		require.Equal(t, uint64(i), pollOne(t, a.scq, ibv.WCWRFlushErr).ID)
	}
	require.Equal(t, uint64(10), pollOne(t, a.rcq, ibv.WCWRFlushErr).ID)
	require.Equal(t, uint64(11), pollOne(t, a.rcq, ibv.WCWRFlushErr).ID)
	// Later requests complete flushed at once.
	_, err = a.qp.PostSend([]ibv.SendWR{sendWR(20, a.mr, 10)})
	require.NoError(t, err)
	require.Equal(t, uint64(20), pollOne(t, a.scq, ibv.WCWRFlushErr).ID)
	_, err = a.qp.PostRecv([]ibv.RecvWR{{ID: 21}})
	require.NoError(t, err)
	require.Equal(t, uint64(21), pollOne(t, a.rcq, ibv.WCWRFlushErr).ID)
}

func TestRNR(t *testing.T) {
	t.Run("receive posted late", func(t *testing.T) {
		o := defaultOpts()
		o.minRNR = 12 // 0.64 ms
		a, b := newPair(t, Config{}, Config{}, o)
		fill(a.buf[:5000], 4)
		_, err := a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 5000)})
		require.NoError(t, err)
		dl := deadline(t, 10*time.Second)
		for b.ctx.(*devContext).Counters().RNRNAKsSent < 3 {
			require.False(t, time.Now().After(dl), "no RNR NAKs")
			time.Sleep(time.Millisecond)
		}
		_, err = b.qp.PostRecv([]ibv.RecvWR{{ID: 2, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 5000)}}})
		require.NoError(t, err)
		pollOne(t, a.scq, ibv.WCSuccess)
		require.Equal(t, uint32(5000), pollOne(t, b.rcq, ibv.WCSuccess).ByteLen)
		require.Equal(t, a.buf[:5000], b.buf[:5000])
		require.NotZero(t, a.ctx.(*devContext).Counters().RNRNAKsReceived)
	})
	t.Run("WRITE_WITH_IMM waits for a receive too", func(t *testing.T) {
		a, b := newPair(t, Config{}, Config{}, defaultOpts())
		w := writeWR(1, a.mr, 9000, b.mr, 0)
		w.Opcode, w.Imm = ibv.WRRDMAWriteWithImm, 77
		_, err := a.qp.PostSend([]ibv.SendWR{w})
		require.NoError(t, err)
		dl := deadline(t, 10*time.Second)
		for b.ctx.(*devContext).Counters().RNRNAKsSent == 0 {
			require.False(t, time.Now().After(dl), "no RNR NAK")
			time.Sleep(time.Millisecond)
		}
		_, err = b.qp.PostRecv([]ibv.RecvWR{{ID: 2}})
		require.NoError(t, err)
		pollOne(t, a.scq, ibv.WCSuccess)
		require.Equal(t, uint32(77), pollOne(t, b.rcq, ibv.WCSuccess).Imm)
	})
	t.Run("retries exhausted", func(t *testing.T) {
		o := defaultOpts()
		o.rnrRetry = 2
		o.minRNR = 1
		a, b := newPair(t, Config{}, Config{}, o)
		_, err := a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 10), sendWR(2, a.mr, 10)})
		require.NoError(t, err)
		require.Equal(t, uint64(1), pollOne(t, a.scq, ibv.WCRNRRetryExcErr).ID)
		require.Equal(t, uint64(2), pollOne(t, a.scq, ibv.WCWRFlushErr).ID)
		require.Equal(t, ibv.QPSErr, a.qp.State())
		require.Equal(t, uint64(3), b.ctx.(*devContext).Counters().RNRNAKsSent)
	})
}

func TestRetryExhaustedPeerGone(t *testing.T) {
	o := defaultOpts()
	o.timeout = 12 // 16.8 ms
	o.retryCnt = 3
	a, b := newPair(t, Config{}, Config{}, o)
	require.NoError(t, b.qp.Destroy())
	b.qp = nil
	start := time.Now()
	_, err := a.qp.PostSend([]ibv.SendWR{writeWR(1, a.mr, 100, b.mr, 0), sendWR(2, a.mr, 1)})
	require.NoError(t, err)
	require.Equal(t, uint64(1), pollOne(t, a.scq, ibv.WCRetryExcErr).ID)
	el := time.Since(start)
	timeout := time.Duration(4096) << 12
	require.GreaterOrEqual(t, el, 4*timeout, "retry_cnt 3 means four sends, a timeout each")
	require.Less(t, el, 4*timeout+5*time.Second)
	require.Equal(t, uint64(2), pollOne(t, a.scq, ibv.WCWRFlushErr).ID)
	require.Equal(t, ibv.QPSErr, a.qp.State())
	c := a.ctx.(*devContext).Counters()
	require.Equal(t, uint64(3), c.Timeouts)
	require.NotZero(t, b.ctx.(*devContext).Counters().BadPackets, "packets for the destroyed QP are dropped and counted")
}

func TestCQOverrun(t *testing.T) {
	o := defaultOpts()
	o.cqe = 4
	a, b := newPair(t, Config{}, Config{}, o)
	for i := range 10 {
		_, err := a.qp.PostSend([]ibv.SendWR{writeWR(uint64(i), a.mr, 8, b.mr, 0)})
		require.NoError(t, err)
	}
	dl := deadline(t, 10*time.Second)
	for {
		_, err := a.scq.Poll(make([]ibv.WC, 0))
		if err != nil {
			require.ErrorIs(t, err, ibv.ErrCQOverrun)
			break
		}
		require.False(t, time.Now().After(dl), "no overrun")
		time.Sleep(time.Millisecond)
	}
	_, err := a.scq.Poll(make([]ibv.WC, 4))
	require.ErrorIs(t, err, ibv.ErrCQOverrun, "the CQ stays unusable")
}

func TestPostLimits(t *testing.T) {
	o := defaultOpts()
	o.sendWR, o.recvWR = 4, 2
	o.noConnect = true
	a, b := newPair(t, Config{}, Config{}, o)
	// Before RTS: sends are refused, receives only from INIT on.
	_, err := a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 1)})
	require.ErrorIs(t, err, ibv.ErrInvalid)
	_, err = a.qp.PostRecv([]ibv.RecvWR{{ID: 1}})
	require.ErrorIs(t, err, ibv.ErrInvalid)
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSInit, Port: 1, AccessFlags: o.access}, ibv.MaskResetToInit))
	bad, err := a.qp.PostRecv([]ibv.RecvWR{{ID: 1}, {ID: 2}, {ID: 3}})
	require.ErrorIs(t, err, ibv.ErrNoMem)
	require.Equal(t, 2, bad)
	_, err = a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 1)})
	require.ErrorIs(t, err, ibv.ErrInvalid)
	require.NoError(t, b.qp.Destroy()) // nobody answers: the send queue stays full
	b.qp = nil
	connect1(t, a, b, o)
	wrs := make([]ibv.SendWR, 6)
	for i := range wrs {
		wrs[i] = sendWR(uint64(i), a.mr, 1)
	}
	bad, err = a.qp.PostSend(wrs)
	require.ErrorIs(t, err, ibv.ErrNoMem)
	require.Equal(t, 4, bad)
	// Too many SGEs, inline too large, READ with max_rd_atomic 0.
	w := sendWR(9, a.mr, 1)
	w.SGList = make([]ibv.SGEntry, 5)
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.True(t, errors.Is(err, ibv.ErrInvalid) || errors.Is(err, ibv.ErrNoMem))
}

// connect1 moves a alone to RTS towards b's device (b's QP may be gone).
func connect1(t *testing.T, a, b *end, o pairOpts) {
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTR, PathMTU: o.mtu, DestQPN: 0xabcde, RQPSN: 1,
		MaxDestRdAtomic: 1, MinRNRTimer: 1, AH: ibv.AH{IsGlobal: true, DGID: b.gid(), Port: 1}}, ibv.MaskInitToRTR))
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTS, SQPSN: 1, Timeout: 14, RetryCnt: 7, RNRRetry: 7,
		MaxRdAtomic: 0}, ibv.MaskRTRToRTS))
}

func TestPostChecks(t *testing.T) {
	o := defaultOpts()
	o.noConnect = true
	o.inline = 16
	a, b := newPair(t, Config{}, Config{}, o)
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSInit, Port: 1, AccessFlags: o.access}, ibv.MaskResetToInit))
	connect1(t, a, b, o)
	w := sendWR(1, a.mr, 1)
	w.SGList = make([]ibv.SGEntry, 5)
	_, err := a.qp.PostSend([]ibv.SendWR{w})
	require.ErrorIs(t, err, ibv.ErrInvalid, "more SGEs than max_send_sge")
	w = sendWR(1, a.mr, 17)
	w.Flags |= ibv.FlagInline
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.ErrorIs(t, err, ibv.ErrInvalid, "inline beyond max_inline_data")
	w = writeWR(1, a.mr, 8, b.mr, 0)
	w.Opcode = ibv.WRRDMARead
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.ErrorIs(t, err, ibv.ErrInvalid, "READ with max_rd_atomic 0")
}
