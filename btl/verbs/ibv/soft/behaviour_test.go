package soft

import (
	"bytes"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/internal/params"
	"github.com/stretchr/testify/require"
)

// TestStateMachine walks an RC QP through allowed and refused
// transitions; a refused one changes nothing, not even the attributes.
func TestStateMachine(t *testing.T) {
	o := defaultOpts()
	o.noConnect = true
	a, b := newPair(t, Config{}, Config{}, o)
	init := ibv.QPAttr{State: ibv.QPSInit, Port: 1, AccessFlags: ibv.AccessRemoteWrite}
	rtr := ibv.QPAttr{State: ibv.QPSRTR, PathMTU: ibv.MTU1024, DestQPN: b.qp.QPN(), RQPSN: 5, MaxDestRdAtomic: 4,
		MinRNRTimer: 3, AH: ibv.AH{IsGlobal: true, DGID: b.gid(), Port: 1}}
	rts := ibv.QPAttr{State: ibv.QPSRTS, SQPSN: 9, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}
	with := func(a ibv.QPAttr, f func(*ibv.QPAttr)) *ibv.QPAttr { f(&a); return &a }
	steps := []struct {
		name string
		attr *ibv.QPAttr
		mask ibv.AttrMask
		ok   bool
		want ibv.QPState
	}{
		{"RESET -> RTR", &rtr, ibv.MaskInitToRTR, false, ibv.QPSReset},
		{"RESET -> RTS", &rts, ibv.MaskRTRToRTS, false, ibv.QPSReset},
		{"RESET -> INIT without port", &init, ibv.MaskResetToInit &^ ibv.AttrPort, false, ibv.QPSReset},
		{"RESET -> INIT with port 2", with(init, func(a *ibv.QPAttr) { a.Port = 2 }), ibv.MaskResetToInit, false, ibv.QPSReset},
		{"RESET -> INIT with an RTR attribute", &init, ibv.MaskResetToInit | ibv.AttrPathMTU, false, ibv.QPSReset},
		{"RESET -> INIT", &init, ibv.MaskResetToInit, true, ibv.QPSInit},
		{"INIT -> INIT access", with(init, func(a *ibv.QPAttr) { a.AccessFlags = ibv.AccessRemoteRead }), ibv.AttrAccessFlags, true, ibv.QPSInit},
		{"INIT -> RTS", &rts, ibv.MaskRTRToRTS, false, ibv.QPSInit},
		{"INIT -> RTR without AV", &rtr, ibv.MaskInitToRTR &^ ibv.AttrAV, false, ibv.QPSInit},
		{"INIT -> RTR MTU 8192", with(rtr, func(a *ibv.QPAttr) { a.PathMTU = 6 }), ibv.MaskInitToRTR, false, ibv.QPSInit},
		{"INIT -> RTR QPN of 25 bits", with(rtr, func(a *ibv.QPAttr) { a.DestQPN = 1 << 24 }), ibv.MaskInitToRTR, false, ibv.QPSInit},
		{"INIT -> RTR local AV", with(rtr, func(a *ibv.QPAttr) { a.AH.IsGlobal = false }), ibv.MaskInitToRTR, false, ibv.QPSInit},
		{"INIT -> RTR max_dest_rd_atomic 200", with(rtr, func(a *ibv.QPAttr) { a.MaxDestRdAtomic = 200 }), ibv.MaskInitToRTR, false, ibv.QPSInit},
		{"INIT -> RTR current state wrong", with(rtr, func(a *ibv.QPAttr) { a.CurState = ibv.QPSRTS }), ibv.MaskInitToRTR | ibv.AttrCurState, false, ibv.QPSInit},
		{"INIT -> RTR", &rtr, ibv.MaskInitToRTR, true, ibv.QPSRTR},
		{"RTR -> RTS retry_cnt 8", with(rts, func(a *ibv.QPAttr) { a.RetryCnt = 8 }), ibv.MaskRTRToRTS, false, ibv.QPSRTR},
		{"RTR -> RTS timeout 32", with(rts, func(a *ibv.QPAttr) { a.Timeout = 32 }), ibv.MaskRTRToRTS, false, ibv.QPSRTR},
		{"RTR -> RTS without sq_psn", &rts, ibv.MaskRTRToRTS &^ ibv.AttrSQPSN, false, ibv.QPSRTR},
		{"RTR -> RTS", &rts, ibv.MaskRTRToRTS, true, ibv.QPSRTS},
		{"RTS -> RTS min_rnr_timer", with(rts, func(a *ibv.QPAttr) { a.MinRNRTimer = 20 }), ibv.AttrMinRNRTimer, true, ibv.QPSRTS},
		{"RTS -> RTS path MTU", with(rts, func(a *ibv.QPAttr) { a.PathMTU = ibv.MTU256 }), ibv.AttrPathMTU, false, ibv.QPSRTS},
		{"RTS -> INIT", &init, ibv.MaskResetToInit, false, ibv.QPSRTS},
		{"RTS -> SQD", &ibv.QPAttr{State: ibv.QPSSQD}, ibv.AttrState, true, ibv.QPSSQD},
		{"SQD -> RTS", &ibv.QPAttr{State: ibv.QPSRTS}, ibv.AttrState, true, ibv.QPSRTS},
		{"RTS -> ERR", &ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState, true, ibv.QPSErr},
		{"ERR -> RTS", &rts, ibv.MaskRTRToRTS, false, ibv.QPSErr},
		{"ERR -> RESET", &ibv.QPAttr{State: ibv.QPSReset}, ibv.AttrState, true, ibv.QPSReset},
		{"RESET -> INIT again", &init, ibv.MaskResetToInit, true, ibv.QPSInit},
	}
	for _, s := range steps {
		before, err := a.qp.Query()
		require.NoError(t, err)
		err = a.qp.Modify(s.attr, s.mask)
		if s.ok {
			require.NoError(t, err, s.name)
		} else {
			require.ErrorIs(t, err, ibv.ErrInvalid, s.name)
			after, err := a.qp.Query()
			require.NoError(t, err)
			require.Equal(t, before, after, "%s changed the QP", s.name)
		}
		require.Equal(t, s.want, a.qp.State(), s.name)
	}
	q, err := a.qp.Query()
	require.NoError(t, err)
	require.Equal(t, ibv.AccessRemoteWrite, q.AccessFlags)
}

// TestSQDStopsNewRequests: in SQD, posted requests wait; back in RTS they
// go.
func TestSQD(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSSQD}, ibv.AttrState))
	_, err := a.qp.PostSend([]ibv.SendWR{writeWR(1, a.mr, 100, b.mr, 0)})
	require.NoError(t, err)
	noCompletion(t, a.scq, 20*time.Millisecond)
	require.NoError(t, a.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTS}, ibv.AttrState))
	pollOne(t, a.scq, ibv.WCSuccess)
}

func TestReadSizes(t *testing.T) {
	for _, n := range []int{0, 1, 4096, 4097, 64 << 20, 1 << 30} {
		t.Run(params.FormatSize(n), func(t *testing.T) {
			if n == 1<<30 {
				if testing.Short() {
					t.Skip("a 1 GiB READ (2 GiB of memory) is skipped under -short")
				}
				if raceEnabled {
					t.Skip("a 1 GiB READ is skipped under the race detector (every copied byte is checked)")
				}
			}
			o := defaultOpts()
			o.bufSize = max(n, 4096)
			a, b := newPair(t, Config{}, Config{}, o)
			for k := 0; k < n; k += 4096 {
				b.buf[k] = byte(k>>12) | 1
				b.buf[min(k+4095, n-1)] = byte(k >> 13)
			}
			w := writeWR(1, a.mr, n, b.mr, 0)
			w.Opcode = ibv.WRRDMARead
			_, err := a.qp.PostSend([]ibv.SendWR{w})
			require.NoError(t, err)
			wc := poll(t, a.scq, 1, 120*time.Second)[0]
			require.Equal(t, ibv.WCSuccess, wc.Status, "requester %+v\nresponder %+v", a.ctx.(*devContext).Counters(), b.ctx.(*devContext).Counters())
			require.Equal(t, ibv.WCRDMARead, wc.Opcode)
			require.Equal(t, uint32(n), wc.ByteLen)
			require.True(t, bytes.Equal(a.buf[:n], b.buf[:n]))
		})
	}
}

func TestAtomics(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	b.buf[8] = 5
	_, err := a.qp.PostSend([]ibv.SendWR{
		{ID: 1, Opcode: ibv.WRAtomicFetchAndAdd, Flags: ibv.FlagSignaled, CompareAdd: 10,
			SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, 8)}, RemoteAddr: b.mr.Addr() + 8, RKey: b.mr.RKey()},
		{ID: 2, Opcode: ibv.WRAtomicCmpAndSwp, Flags: ibv.FlagSignaled, CompareAdd: 15, Swap: 99,
			SGList: []ibv.SGEntry{ibv.SGE(a.mr, 8, 8)}, RemoteAddr: b.mr.Addr() + 8, RKey: b.mr.RKey()},
	})
	require.NoError(t, err)
	require.Equal(t, ibv.WCFetchAdd, pollOne(t, a.scq, ibv.WCSuccess).Opcode)
	require.Equal(t, ibv.WCCompSwap, pollOne(t, a.scq, ibv.WCSuccess).Opcode)
	require.Equal(t, byte(5), a.buf[0], "fetch-and-add returns the old value")
	require.Equal(t, byte(15), a.buf[8], "compare-and-swap returns the old value")
	require.Equal(t, byte(99), b.buf[8])
}

func TestInlineAndUnsignaled(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	copy(a.buf, "inline!")
	_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 100)}}})
	require.NoError(t, err)
	w := sendWR(1, a.mr, 7)
	w.Flags = ibv.FlagInline // unsignalled too
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.NoError(t, err)
	copy(a.buf, "changed") // inline data was copied at post time
	_, err = a.qp.PostSend([]ibv.SendWR{writeWR(2, a.mr, 1, b.mr, 200)})
	require.NoError(t, err)
	require.Equal(t, uint64(2), pollOne(t, a.scq, ibv.WCSuccess).ID, "only the signalled request completes")
	pollOne(t, b.rcq, ibv.WCSuccess)
	require.Equal(t, "inline!", string(b.buf[:7]))
	noCompletion(t, a.scq, 5*time.Millisecond)
}

// An unsignaled SEND asks for no ACK; the responder still acknowledges
// it on its own, so that the requester's send queue slot comes back.
func TestUnsignaledAcknowledgedUnasked(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 100)}}})
	require.NoError(t, err)
	w := sendWR(1, a.mr, 8)
	w.Flags = 0
	_, err = a.qp.PostSend([]ibv.SendWR{w})
	require.NoError(t, err)
	pollOne(t, b.rcq, ibv.WCSuccess)
	dl := deadline(t, 10*time.Second)
	for {
		c, ok := CountersOf(a.ctx)
		require.True(t, ok)
		if c.PacketsReceived > 0 {
			break
		}
		require.False(t, time.Now().After(dl), "no ACK for the unsignaled SEND")
		time.Sleep(time.Millisecond)
	}
}

// A send queue of unsignaled SENDs frees its slots as the responder
// acknowledges them: a sender that posts many more than the queue holds,
// retrying a full queue, gets every one through and the signaled last
// one completes.
func TestUnsignaledSlotsComeBack(t *testing.T) {
	o := defaultOpts()
	o.sendWR = 8
	a, b := newPair(t, Config{}, Config{}, o)
	const n = 100
	recvs := make([]ibv.RecvWR, n)
	for i := range recvs {
		recvs[i] = ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 100)}}
	}
	_, err := b.qp.PostRecv(recvs)
	require.NoError(t, err)
	dl := deadline(t, 20*time.Second)
	for i := range n {
		w := sendWR(uint64(i), a.mr, 8)
		if i < n-1 {
			w.Flags = 0
		}
		for {
			_, err := a.qp.PostSend([]ibv.SendWR{w})
			if err == nil {
				break
			}
			require.ErrorIs(t, err, ibv.ErrNoMem)
			require.False(t, time.Now().After(dl), "send queue still full after %d sends", i)
			wc := make([]ibv.WC, 1)
			_, err = a.scq.Poll(wc) // progress; nothing completes before the last
			require.NoError(t, err)
			runtime.Gosched()
		}
	}
	require.Equal(t, uint64(n-1), pollOne(t, a.scq, ibv.WCSuccess).ID, "only the signaled request completes")
	require.Len(t, poll(t, b.rcq, n, 20*time.Second), n)
}

func TestLoopbackSameDevice(t *testing.T) {
	o := defaultOpts()
	p := New(Config{})
	a, b := openEnd(t, p, o), openEnd(t, p, o)
	t.Cleanup(func() { a.close(); b.close() })
	require.Equal(t, a.gid(), b.gid(), "one provider, one device")
	connect(t, a, b, o)
	copy(a.buf, "same device")
	_, err := a.qp.PostSend([]ibv.SendWR{writeWR(1, a.mr, 11, b.mr, 0)})
	require.NoError(t, err)
	pollOne(t, a.scq, ibv.WCSuccess)
	require.Equal(t, "same device", string(b.buf[:11]))
}

// TestHostilePackets sends garbage to a device: it is dropped and
// counted, and the device keeps working.
func TestHostilePackets(t *testing.T) {
	a, b := newPair(t, Config{}, Config{}, defaultOpts())
	dev := b.ctx.(*devContext).dev
	conn, err := net.DialUDP("udp", &net.UDPAddr{IP: a.ctx.(*devContext).dev.addr.AsSlice()}, &net.UDPAddr{IP: dev.addr.AsSlice(), Port: int(dev.port)})
	require.NoError(t, err)
	defer conn.Close()
	f := flow{src: a.ctx.(*devContext).dev.addr, dst: dev.addr, sport: uint16(conn.LocalAddr().(*net.UDPAddr).Port), dport: dev.port}
	good := buildPacket(packet{bth: bth{opcode: opSendOnly, pkey: defaultPKey, destQP: b.qp.QPN(), psn: 100}}, []byte("x"), &f)
	unknownQP := buildPacket(packet{bth: bth{opcode: opSendOnly, pkey: defaultPKey, destQP: 0xfffff0, psn: 100}}, []byte("x"), &f)
	badICRC := bytes.Clone(good)
	badICRC[len(badICRC)-1] ^= 1
	for _, p := range [][]byte{{}, {1}, good[:13], append([]byte{0x30}, good[1:]...), badICRC, unknownQP, good} {
		_, err := conn.Write(p)
		require.NoError(t, err)
	}
	before := b.ctx.(*devContext).Counters()
	copy(a.buf, "still fine")
	_, err = a.qp.PostSend([]ibv.SendWR{writeWR(1, a.mr, 10, b.mr, 0)})
	require.NoError(t, err)
	pollOne(t, a.scq, ibv.WCSuccess)
	require.Equal(t, "still fine", string(b.buf[:10]))
	c := b.ctx.(*devContext).Counters()
	require.GreaterOrEqual(t, c.BadPackets, uint64(5), "%+v", before)
	require.GreaterOrEqual(t, c.ICRCErrors, uint64(1))
	require.Equal(t, ibv.QPSRTS, b.qp.State(), "a packet from a stranger does not reach the QP")
}

func TestParams(t *testing.T) {
	s, err := params.NewSet([][2]string{{ParamDrop, "0.02"}, {ParamPort, "4792"}, {ParamAddr, "127.9.9.9"}, {ParamMinTimeout, "3ms"}})
	require.NoError(t, err)
	c, err := ConfigFromParams(s)
	require.NoError(t, err)
	require.Equal(t, 0.02, c.Drop)
	require.Equal(t, 4792, c.Port)
	require.Equal(t, "127.9.9.9", c.Addr.String())
	require.Equal(t, 3*time.Millisecond, c.MinTimeout)
	for _, bad := range [][2]string{{ParamDup, "lots"}, {ParamReorder, "1.5"}, {ParamCorrupt, "-0.1"}, {ParamAddr, "nowhere"}} {
		s, err := params.NewSet([][2]string{bad})
		require.NoError(t, err)
		_, err = ConfigFromParams(s)
		require.ErrorIs(t, err, mpierr.ErrArg, "%v", bad)
	}
	p, err := ibv.NewProvider("soft", nil)
	require.NoError(t, err)
	d, err := p.Devices()
	require.NoError(t, err)
	require.Equal(t, DeviceName, d[0].Name)
}

// TestNoGoroutineLeak opens and closes devices and QPs; the goroutine
// count comes back.
func TestNoGoroutineLeak(t *testing.T) {
	base := runtime.NumGoroutine()
	for range 3 {
		o := defaultOpts()
		a := openEnd(t, New(Config{}), o)
		b := openEnd(t, New(Config{Drop: 0.1}), o)
		connect(t, a, b, o)
		_, err := a.qp.PostSend([]ibv.SendWR{writeWR(1, a.mr, 100000, b.mr, 0)})
		require.NoError(t, err)
		pollOne(t, a.scq, ibv.WCSuccess)
		a.close()
		b.close()
	}
	settleGoroutines(t, base)
}

func TestCompChannel(t *testing.T) {
	p := New(Config{})
	c, err := p.Open("")
	require.NoError(t, err)
	ch, err := c.CreateCompChannel()
	require.NoError(t, err)
	o := defaultOpts()
	e := &end{t: t, ctx: c, ch: ch}
	e.pd, _ = c.AllocPD()
	e.scq, _ = c.CreateCQ(16, nil)
	e.rcq, err = c.CreateCQ(16, ch)
	require.NoError(t, err)
	e.buf = make([]byte, 4096)
	e.mr, _ = e.pd.RegMR(e.buf, o.mrAccess)
	e.qp, err = e.pd.CreateQP(ibv.QPInitAttr{SendCQ: e.scq, RecvCQ: e.rcq, Cap: ibv.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	peer := openEnd(t, New(Config{}), o)
	t.Cleanup(func() { peer.close(); e.close() })
	connect(t, e, peer, o)
	require.ErrorIs(t, ch.Close(), ibv.ErrBusy)
	require.NoError(t, e.rcq.ReqNotify(false))
	_, err = e.qp.PostRecv([]ibv.RecvWR{{ID: 3}})
	require.NoError(t, err)
	w := writeWR(1, peer.mr, 4, e.mr, 0)
	w.Opcode = ibv.WRRDMAWriteWithImm
	_, err = peer.qp.PostSend([]ibv.SendWR{w})
	require.NoError(t, err)
	got, err := ch.GetEvent(waitCtx(t, 10*time.Second))
	require.NoError(t, err)
	require.Equal(t, e.rcq, got)
	require.ErrorIs(t, e.rcq.Destroy(), ibv.ErrBusy, "an event not acknowledged")
	got.AckEvents(1)
	require.Equal(t, uint64(3), pollOne(t, e.rcq, ibv.WCSuccess).ID)
}
