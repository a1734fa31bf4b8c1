package ibvtest

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

var dataCases = []testCase{
	{name: "SendRecvScatterGather", pair: true, run: caseSendRecvScatterGather},
	{name: "SendLarge", pair: true, run: caseSendLarge},
	{name: "SendOrder", pair: true, run: caseSendOrder},
	{name: "WritesVisibleAtCompletion", pair: true, run: caseWritesVisibleAtCompletion},
	{name: "CompletionOrderMixed", pair: true, run: caseCompletionOrderMixed},
	{name: "WriteWithImm", pair: true, run: caseWriteWithImm},
	{name: "SendWithImm", pair: true, run: caseSendWithImm},
	{name: "ReadZero", pair: true, run: caseReadZero},
	{name: "Read", pair: true, run: caseRead},
	{name: "ReadOneGiB", pair: true, run: caseReadOneGiB},
	{name: "SendZeroEmptySGL", pair: true, run: caseSendZeroEmptySGL},
	{name: "Unsignaled", pair: true, run: caseUnsignaled},
	{name: "SigAll", pair: true, run: caseSigAll},
	{name: "InlineSend", pair: true, run: caseInlineSend},
}

func sendWR(id uint64, sges ...ibv.SGEntry) ibv.SendWR {
	return ibv.SendWR{ID: id, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: sges}
}

// caseSendRecvScatterGather: a SEND gathered from three SGEs (two MRs)
// lands scattered over two receive SGEs in order, and byte_len counts it.
func caseSendRecvScatterGather(t *testing.T, e *env) {
	if d := e.dev(0).Device(); d.MaxSGE < 3 {
		t.Skipf("device allows %d SGEs per request; the case needs 3", d.MaxSGE)
	}
	a, b := e.pair(sideOpts{cap: ibv.QPCap{MaxSendSGE: 3, MaxRecvSGE: 2}})
	m1 := e.mr(a.pd, pattern(5000, 20), allAccess)
	m2 := e.mr(a.pd, pattern(100, 21), allAccess)
	want := append(append(append([]byte{}, m1.Buf()[10:110]...), m2.Buf()[99:100]...), m1.Buf()[1000:5000]...)
	r := e.buf(b.pd, 6000)
	e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(r, 0, 2000), ibv.SGE(r, 3000, 3000)}})
	e.postSend(a, sendWR(1, ibv.SGE(m1, 10, 100), ibv.SGE(m2, 99, 1), ibv.SGE(m1, 1000, 4000)))
	e.status(e.wc(a.scq), 1, ibv.WCSuccess, "gathered send")
	wc := e.wc(b.rcq)
	e.status(wc, 1, ibv.WCSuccess, "scattered receive")
	e.opcode(wc, ibv.WCRecv, "scattered receive")
	if wc.ByteLen != uint32(len(want)) {
		t.Fatalf("byte_len %d, want %d", wc.ByteLen, len(want))
	}
	e.sameBytes(r.Buf()[:2000], want[:2000], "first receive SGE")
	e.sameBytes(r.Buf()[3000:3000+len(want)-2000], want[2000:], "second receive SGE")
	e.sameBytes(r.Buf()[2000:3000], make([]byte, 1000), "the gap between the receive SGEs")
}

// caseSendLarge: a SEND of many MTUs arrives whole.
func caseSendLarge(t *testing.T, e *env) {
	const n = 1<<20 + 3
	a, b := e.pair(sideOpts{})
	src := e.mr(a.pd, pattern(n, 22), allAccess)
	dst := e.buf(b.pd, n)
	e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, n)}})
	e.postSend(a, sendWR(1, ibv.SGE(src, 0, n)))
	e.status(e.wc(a.scq), 1, ibv.WCSuccess, "1 MiB send")
	wc := e.wc(b.rcq)
	e.status(wc, 1, ibv.WCSuccess, "1 MiB receive")
	if wc.ByteLen != n {
		t.Fatalf("byte_len %d, want %d", wc.ByteLen, n)
	}
	e.sameBytes(dst.Buf(), src.Buf(), "1 MiB received")
}

// caseSendOrder: N SENDs of distinct sizes and contents consume the N
// receives in post order, and their completions come in post order.
func caseSendOrder(t *testing.T, e *env) {
	const n = 48
	a, b := e.pair(sideOpts{cap: ibv.QPCap{MaxSendWR: n, MaxRecvWR: n}})
	src := e.buf(a.pd, n*2048)
	dst := e.buf(b.pd, n*2048)
	size := func(i int) int { return 1 + i*41%2048 }
	for i := range n {
		fill(src.Buf()[i*2048:(i+1)*2048], byte(i))
		e.postRecv(b, ibv.RecvWR{ID: uint64(1000 + i), SGList: []ibv.SGEntry{ibv.SGE(dst, i*2048, 2048)}})
	}
	wrs := make([]ibv.SendWR, n)
	for i := range wrs {
		wrs[i] = sendWR(uint64(i), ibv.SGE(src, i*2048, size(i)))
	}
	e.postSend(a, wrs...)
	for i, wc := range e.wcs(a.scq, n) {
		e.status(wc, uint64(i), ibv.WCSuccess, fmt.Sprintf("send completion %d", i))
		e.opcode(wc, ibv.WCSend, "send completion")
	}
	for i, wc := range e.wcs(b.rcq, n) {
		e.status(wc, uint64(1000+i), ibv.WCSuccess, fmt.Sprintf("receive completion %d", i))
		if int(wc.ByteLen) != size(i) {
			t.Fatalf("receive %d: byte_len %d, want %d (the %d-th send)", i, wc.ByteLen, size(i), i)
		}
		e.sameBytes(dst.Buf()[i*2048:i*2048+size(i)], src.Buf()[i*2048:i*2048+size(i)], fmt.Sprintf("receive %d", i))
	}
}

// caseWritesVisibleAtCompletion: the data of WRITEs posted before a SEND
// (or a WRITE_WITH_IMM) is in place when the responder polls that
// message's receive completion.
func caseWritesVisibleAtCompletion(t *testing.T, e *env) {
	const n, size = 24, 3000
	for _, last := range []ibv.WROpcode{ibv.WRSend, ibv.WRRDMAWriteWithImm} {
		t.Run(last.String(), func(t *testing.T) {
			e := e.sub(t)
			a, b := e.pair(sideOpts{})
			src := e.mr(a.pd, pattern(n*size, 23), allAccess)
			dst := e.buf(b.pd, n*size+64)
			e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, n*size, 64)}})
			var wrs []ibv.SendWR
			for i := range n {
				wrs = append(wrs, ibv.SendWR{ID: uint64(i), Opcode: ibv.WRRDMAWrite, SGList: []ibv.SGEntry{ibv.SGE(src, i*size, size)},
					RemoteAddr: dst.Addr() + uint64(i*size), RKey: dst.RKey()})
			}
			final := ibv.SendWR{ID: 99, Opcode: last, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 64)}, Imm: 5}
			if last == ibv.WRRDMAWriteWithImm {
				final.RemoteAddr, final.RKey = dst.Addr()+n*size, dst.RKey()
			}
			e.postSend(a, append(wrs, final)...)
			e.status(e.wc(b.rcq), 1, ibv.WCSuccess, "the message after the WRITEs")
			e.sameBytes(dst.Buf()[:n*size], src.Buf(), "WRITE data at the message's completion")
			e.status(e.wc(a.scq), 99, ibv.WCSuccess, "the signaled message (the WRITEs were unsignaled)")
		})
	}
}

// caseCompletionOrderMixed: completions of WRITEs, READs and SENDs on one
// QP come in post order with their opcodes.
func caseCompletionOrderMixed(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	local := e.mr(a.pd, pattern(16*4096, 24), allAccess)
	remote := e.mr(b.pd, pattern(16*4096, 25), allAccess)
	rb := e.buf(b.pd, 16*4096)
	ops := []ibv.WROpcode{ibv.WRRDMARead, ibv.WRRDMAWrite, ibv.WRSend, ibv.WRRDMARead, ibv.WRSend, ibv.WRRDMAWrite, ibv.WRRDMARead, ibv.WRRDMARead, ibv.WRSend, ibv.WRRDMAWrite}
	want := map[ibv.WROpcode]ibv.WCOpcode{ibv.WRRDMARead: ibv.WCRDMARead, ibv.WRRDMAWrite: ibv.WCRDMAWrite, ibv.WRSend: ibv.WCSend}
	var wrs []ibv.SendWR
	for i, op := range ops {
		off := i * 4096
		n := 4096 - i*300
		wr := ibv.SendWR{ID: uint64(i), Opcode: op, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(local, off, n)},
			RemoteAddr: remote.Addr() + uint64(off), RKey: remote.RKey()}
		if op == ibv.WRSend {
			e.postRecv(b, ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(rb, off, 4096)}})
		}
		wrs = append(wrs, wr)
	}
	// What WRITEs and SENDs carry and what READs bring back: the patterns
	// the MRs were registered with (the responder's memory is not read
	// here, before its device has ordered anything after the test).
	before, remoteBefore := pattern(16*4096, 24), pattern(16*4096, 25)
	e.postSend(a, wrs...)
	for i, wc := range e.wcs(a.scq, len(ops)) {
		e.status(wc, uint64(i), ibv.WCSuccess, fmt.Sprintf("completion %d (%v)", i, ops[i]))
		e.opcode(wc, want[ops[i]], fmt.Sprintf("completion %d (%v)", i, ops[i]))
	}
	e.wcs(b.rcq, 3)
	e.sync(a, b)
	for i, op := range ops {
		off, n := i*4096, 4096-i*300
		switch op {
		case ibv.WRRDMARead:
			e.sameBytes(local.Buf()[off:off+n], remoteBefore[off:off+n], fmt.Sprintf("READ %d", i))
		case ibv.WRRDMAWrite:
			e.sameBytes(remote.Buf()[off:off+n], before[off:off+n], fmt.Sprintf("WRITE %d", i))
		case ibv.WRSend:
			e.sameBytes(rb.Buf()[off:off+n], before[off:off+n], fmt.Sprintf("SEND %d", i))
		}
	}
}

// caseWriteWithImm: WRITE_WITH_IMM carries its immediate unchanged, into
// a receive with no SGE, as WCRecvRDMAWithImm with the WRITE's length as
// byte_len and the data in place.
func caseWriteWithImm(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	imms := []uint32{0, 0xFFFFFFFF, 0xFFFFFFFE, 0x01020304}
	sizes := []int{0, 1, 5000, 64}
	src := e.mr(a.pd, pattern(8192, 26), allAccess)
	dst := e.buf(b.pd, 4*8192)
	for i := range imms {
		e.postRecv(b, ibv.RecvWR{ID: uint64(10 + i)})
	}
	for i, imm := range imms {
		e.postSend(a, ibv.SendWR{ID: uint64(i), Opcode: ibv.WRRDMAWriteWithImm, Flags: ibv.FlagSignaled, Imm: imm,
			SGList: []ibv.SGEntry{ibv.SGE(src, 0, sizes[i])}, RemoteAddr: dst.Addr() + uint64(i*8192), RKey: dst.RKey()})
	}
	for i, wc := range e.wcs(a.scq, len(imms)) {
		e.status(wc, uint64(i), ibv.WCSuccess, "WRITE_WITH_IMM")
		e.opcode(wc, ibv.WCRDMAWrite, "WRITE_WITH_IMM at the requester")
	}
	for i, wc := range e.wcs(b.rcq, len(imms)) {
		what := fmt.Sprintf("WRITE_WITH_IMM %#x of %d bytes", imms[i], sizes[i])
		e.status(wc, uint64(10+i), ibv.WCSuccess, what)
		e.opcode(wc, ibv.WCRecvRDMAWithImm, what)
		if wc.Imm != imms[i] || wc.Flags&ibv.WCWithImm == 0 {
			t.Fatalf("%s: imm %#x flags %#x, want imm %#x with WCWithImm", what, wc.Imm, wc.Flags, imms[i])
		}
		if int(wc.ByteLen) != sizes[i] {
			t.Fatalf("%s: byte_len %d", what, wc.ByteLen)
		}
		if wc.QPNum != b.qp.QPN() {
			t.Fatalf("%s: completion names QP %#x, want %#x", what, wc.QPNum, b.qp.QPN())
		}
		e.sameBytes(dst.Buf()[i*8192:i*8192+sizes[i]], src.Buf()[:sizes[i]], what)
		e.sameBytes(dst.Buf()[i*8192+sizes[i]:(i+1)*8192], make([]byte, 8192-sizes[i]), what+": bytes past it")
	}
}

// caseSendWithImm: SEND_WITH_IMM gives a WCRecv with the immediate.
func caseSendWithImm(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	src := e.mr(a.pd, pattern(100, 27), allAccess)
	dst := e.buf(b.pd, 100)
	e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 100)}})
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRSendWithImm, Flags: ibv.FlagSignaled, Imm: 0xA1B2C3D4, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 100)}})
	e.status(e.wc(a.scq), 1, ibv.WCSuccess, "SEND_WITH_IMM")
	wc := e.wc(b.rcq)
	e.status(wc, 1, ibv.WCSuccess, "receive of SEND_WITH_IMM")
	e.opcode(wc, ibv.WCRecv, "receive of SEND_WITH_IMM")
	if wc.Imm != 0xA1B2C3D4 || wc.Flags&ibv.WCWithImm == 0 || wc.ByteLen != 100 {
		t.Fatalf("receive of SEND_WITH_IMM: %s, want imm 0xa1b2c3d4 with WCWithImm, 100 bytes", fmtWC(wc))
	}
	e.sameBytes(dst.Buf(), src.Buf(), "SEND_WITH_IMM data")
}

// caseReadZero: a READ of 0 bytes completes successfully.
func caseReadZero(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	local := e.buf(a.pd, 8)
	remote := e.mr(b.pd, pattern(8, 28), allAccess)
	wc := e.remoteOp(a, ibv.WRRDMARead, local, 0, 0, remote.Addr(), remote.RKey(), 1)
	e.status(wc, 1, ibv.WCSuccess, "READ of 0 bytes")
	e.opcode(wc, ibv.WCRDMARead, "READ of 0 bytes")
	e.sameBytes(local.Buf(), make([]byte, 8), "the 0-byte READ's destination")
	e.state(a.qp, ibv.QPSRTS, "after a 0-byte READ")
}

// caseRead: READs of one byte and of many MTUs bring the remote bytes and
// report their length.
func caseRead(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	const n = 64<<10 + 5
	remote := e.mr(b.pd, pattern(n, 29), allAccess)
	local := e.buf(a.pd, n)
	for i, size := range []int{1, n} {
		wc := e.remoteOp(a, ibv.WRRDMARead, local, 0, size, remote.Addr(), remote.RKey(), uint64(i))
		e.status(wc, uint64(i), ibv.WCSuccess, fmt.Sprintf("READ of %d bytes", size))
		e.opcode(wc, ibv.WCRDMARead, "READ")
		if int(wc.ByteLen) != size {
			t.Errorf("READ of %d bytes: byte_len %d", size, wc.ByteLen)
		}
		e.sameBytes(local.Buf()[:size], remote.Buf()[:size], fmt.Sprintf("READ of %d bytes", size))
	}
}

// caseReadOneGiB: one READ of 1 GiB brings every byte.
func caseReadOneGiB(t *testing.T, e *env) {
	const n = 1 << 30
	switch {
	case testing.Short():
		t.Skip("a 1 GiB READ (2 GiB of buffers) is skipped under -short")
	case raceEnabled:
		t.Skip("a 1 GiB READ is skipped under the race detector (every byte copied is checked, ten times slower)")
	}
	if d := e.dev(0).Device(); d.MaxMRSize != 0 && d.MaxMRSize < n {
		t.Skipf("device's largest MR is %d bytes", d.MaxMRSize)
	}
	a, b := e.pair(sideOpts{})
	src := make([]byte, n)
	fill(src[:1<<20], 30)
	for k := 1 << 20; k < n; k *= 2 {
		copy(src[k:], src[:k])
	}
	src[n-1] ^= 0xFF // the last byte differs from its period
	remote := e.mr(b.pd, src, ibv.AccessLocalWrite|ibv.AccessRemoteRead)
	local := e.buf(a.pd, n)
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(local, 0, n)}, RemoteAddr: remote.Addr(), RKey: remote.RKey()})
	wc := e.wcsWithin(a.scq, 1, 5*time.Minute)[0]
	e.status(wc, 1, ibv.WCSuccess, "READ of 1 GiB")
	if wc.ByteLen != n {
		t.Errorf("READ of 1 GiB: byte_len %d", wc.ByteLen)
	}
	if !bytes.Equal(local.Buf(), src) {
		e.sameBytes(local.Buf(), src, "1 GiB READ")
	}
}

// caseSendZeroEmptySGL: a 0-byte SEND with no SGE lands in a receive with
// no SGE.
func caseSendZeroEmptySGL(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	e.postRecv(b, ibv.RecvWR{ID: 3})
	e.postSend(a, ibv.SendWR{ID: 4, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled})
	e.status(e.wc(a.scq), 4, ibv.WCSuccess, "0-byte SEND without SGEs")
	wc := e.wc(b.rcq)
	e.status(wc, 3, ibv.WCSuccess, "receive without SGEs")
	e.opcode(wc, ibv.WCRecv, "receive without SGEs")
	if wc.ByteLen != 0 || wc.Flags&ibv.WCWithImm != 0 {
		t.Fatalf("receive without SGEs: %s, want 0 bytes and no imm", fmtWC(wc))
	}
}

// caseUnsignaled: unsignaled SENDs produce no completion of their own; a
// later signaled one completes, and all of them were delivered in order.
func caseUnsignaled(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	src := e.mr(a.pd, pattern(400, 31), allAccess)
	dst := e.buf(b.pd, 400)
	for i := range 4 {
		e.postRecv(b, ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(dst, 100*i, 100)}})
	}
	for i := range 3 {
		e.postSend(a, ibv.SendWR{ID: uint64(i), Opcode: ibv.WRSend, SGList: []ibv.SGEntry{ibv.SGE(src, 100*i, 100)}})
	}
	e.postSend(a, sendWR(3, ibv.SGE(src, 300, 100)))
	e.status(e.wc(a.scq), 3, ibv.WCSuccess, "the signaled send after three unsignaled")
	for i, wc := range e.wcs(b.rcq, 4) {
		e.status(wc, uint64(i), ibv.WCSuccess, fmt.Sprintf("receive %d", i))
	}
	e.sameBytes(dst.Buf(), src.Buf(), "all four sends")
	e.none(a.scq, "unsignaled sends")
}

// caseSigAll: on a QP created with SigAll every send completes, flagged
// signaled or not.
func caseSigAll(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{sigAll: true})
	src := e.mr(a.pd, pattern(64, 32), allAccess)
	dst := e.buf(b.pd, 64)
	e.postSend(a,
		ibv.SendWR{ID: 1, Opcode: ibv.WRRDMAWrite, SGList: []ibv.SGEntry{ibv.SGE(src, 0, 32)}, RemoteAddr: dst.Addr(), RKey: dst.RKey()},
		ibv.SendWR{ID: 2, Opcode: ibv.WRRDMAWrite, SGList: []ibv.SGEntry{ibv.SGE(src, 32, 32)}, RemoteAddr: dst.Addr() + 32, RKey: dst.RKey()})
	for i, wc := range e.wcs(a.scq, 2) {
		e.status(wc, uint64(i+1), ibv.WCSuccess, "unflagged WRITE on a SigAll QP")
	}
	e.sync(a, b)
	e.sameBytes(dst.Buf(), src.Buf(), "SigAll WRITEs")
}

// caseInlineSend: an inline SEND copies its data at post time (the buffer
// is reusable at once) without checking the lkey; one larger than the
// QP's inline capacity is refused at post.
func caseInlineSend(t *testing.T, e *env) {
	const n = 64
	if d := e.dev(0).Device(); d.MaxInline < n {
		t.Skipf("device's largest inline send is %d bytes; the case needs %d", d.MaxInline, n)
	}
	a, b := e.pair(sideOpts{cap: ibv.QPCap{MaxInlineData: n}})
	q, err := a.qp.Query()
	must(t, err, "Query")
	limit := max(q.Cap.MaxInlineData, n)
	src := e.mr(a.pd, pattern(limit+1, 33), allAccess)
	want := append([]byte(nil), src.Buf()[:n]...)
	dst := e.buf(b.pd, limit+1)
	e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, limit+1)}})
	sge := ibv.SGE(src, 0, n)
	sge.LKey ^= 0x5A5A00 // not checked for inline data
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled | ibv.FlagInline, SGList: []ibv.SGEntry{sge}})
	clear(src.Buf()[:n]) // reused at once
	e.status(e.wc(a.scq), 1, ibv.WCSuccess, "inline send")
	wc := e.wc(b.rcq)
	e.status(wc, 1, ibv.WCSuccess, "receive of an inline send")
	if wc.ByteLen != n {
		t.Fatalf("receive of an inline send: byte_len %d, want %d", wc.ByteLen, n)
	}
	e.sameBytes(dst.Buf()[:n], want, "inline data (the source was cleared right after the post)")

	bad, err := a.qp.PostSend([]ibv.SendWR{{ID: 2, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled | ibv.FlagInline, SGList: []ibv.SGEntry{ibv.SGE(src, 0, limit+1)}}})
	if err == nil {
		t.Fatalf("an inline send of %d bytes on a QP whose inline capacity is %d was posted", limit+1, limit)
	}
	if bad != 0 {
		t.Fatalf("refused inline send: bad index %d, want 0", bad)
	}
	e.none(a.scq, "a refused inline send")
}
