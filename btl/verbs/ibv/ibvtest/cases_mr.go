package ibvtest

import (
	"fmt"
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

var mrCases = []testCase{
	{name: "RegAccessNeedsLocalWrite", run: caseRegAccessNeedsLocalWrite},
	{name: "RegZeroLength", pair: true, run: caseRegZeroLength},
	{name: "RegOverlapping", pair: true, run: caseRegOverlapping},
	{name: "WriteWithoutRemoteWrite", pair: true, run: caseWriteWithoutRemoteWrite},
	{name: "ReadWithoutRemoteRead", pair: true, run: caseReadWithoutRemoteRead},
	{name: "RKeyOfAnotherPD", pair: true, run: caseRKeyOfAnotherPD},
	{name: "RemoteOutOfBounds", pair: true, run: caseRemoteOutOfBounds},
	{name: "DeregisteredRKey", pair: true, run: caseDeregisteredRKey},
	{name: "BadLKey", pair: true, run: caseBadLKey},
	{name: "QPAccessGating", pair: true, run: caseQPAccessGating},
}

// caseRegAccessNeedsLocalWrite: remote write or atomic access without
// local write is ErrInvalid at RegMR.
func caseRegAccessNeedsLocalWrite(t *testing.T, e *env) {
	pd := e.pd(e.dev(0))
	for _, acc := range []ibv.Access{ibv.AccessRemoteWrite, ibv.AccessRemoteAtomic, ibv.AccessRemoteWrite | ibv.AccessRemoteRead} {
		mr, err := pd.RegMR(make([]byte, 64), acc)
		if err == nil {
			_ = mr.Dereg()
		}
		wantErr(t, err, ibv.ErrInvalid, fmt.Sprintf("RegMR with access %#x", acc))
	}
	// Local read is implied: an MR with no flags at all registers.
	e.mr(pd, make([]byte, 64), 0)
	e.mr(pd, make([]byte, 64), ibv.AccessRemoteRead)
}

// remoteOp posts one signaled RDMA WRITE or READ of n bytes between
// local[loff:] and (addr, rkey) and returns its completion.
func (e *env) remoteOp(s *side, op ibv.WROpcode, local ibv.MR, loff, n int, addr uint64, rkey uint32, id uint64) ibv.WC {
	e.t.Helper()
	e.postSend(s, ibv.SendWR{ID: id, Opcode: op, Flags: ibv.FlagSignaled,
		SGList: []ibv.SGEntry{ibv.SGE(local, loff, n)}, RemoteAddr: addr, RKey: rkey})
	return e.wc(s.scq)
}

// remoteErr checks a requester completion of a remote access violation:
// the status and the requester's QP in ERR.
func (e *env) remoteErr(s *side, wc ibv.WC, id uint64, what string) {
	e.t.Helper()
	e.status(wc, id, ibv.WCRemAccessErr, what)
	if wc.QPNum != s.qp.QPN() {
		e.t.Fatalf("%s: completion names QP %#x, want %#x", what, wc.QPNum, s.qp.QPN())
	}
	e.state(s.qp, ibv.QPSErr, what+": the requester after its error completion")
}

// caseRegZeroLength: an empty region registers, serves a 0-byte SEND and
// a 0-byte WRITE, and a 1-byte WRITE into it is a remote access error.
func caseRegZeroLength(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	za := e.mr(a.pd, make([]byte, 0), allAccess)
	zb := e.mr(b.pd, make([]byte, 0), allAccess)
	if za.Len() != 0 || len(za.Buf()) != 0 {
		t.Fatalf("zero-length MR: Len %d, Buf %d bytes", za.Len(), len(za.Buf()))
	}
	e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(zb, 0, 0)}})
	e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(za, 0, 0)}})
	e.status(e.wc(a.scq), 1, ibv.WCSuccess, "0-byte send from an empty MR")
	r := e.wc(b.rcq)
	e.status(r, 1, ibv.WCSuccess, "0-byte receive into an empty MR")
	if r.ByteLen != 0 {
		t.Fatalf("0-byte receive: byte_len %d", r.ByteLen)
	}
	e.status(e.remoteOp(a, ibv.WRRDMAWrite, za, 0, 0, zb.Addr(), zb.RKey(), 2), 2, ibv.WCSuccess, "0-byte WRITE into an empty MR")
	one := e.buf(a.pd, 1)
	e.remoteErr(a, e.remoteOp(a, ibv.WRRDMAWrite, one, 0, 1, zb.Addr(), zb.RKey(), 3), 3, "1-byte WRITE into an empty MR")
}

// caseRegOverlapping: two MRs over overlapping parts of one buffer are
// both usable, remotely and locally, and name the same bytes.
func caseRegOverlapping(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	mem := make([]byte, 8192)
	m1 := e.mr(b.pd, mem[:6144], allAccess)
	m2 := e.mr(b.pd, mem[2048:], allAccess)
	src := e.buf(a.pd, 4096)
	fill(src.Buf(), 1)
	// Through m1 into [3000, 4000), the overlap.
	e.status(e.remoteOp(a, ibv.WRRDMAWrite, src, 0, 1000, m1.Addr()+3000, m1.RKey(), 1), 1, ibv.WCSuccess, "WRITE through the first MR")
	e.sync(a, b)
	e.sameBytes(mem[3000:4000], src.Buf()[:1000], "bytes written through the first MR")
	// Read them back through m2 (offset 952 of m2 is byte 3000).
	back := e.buf(a.pd, 1000)
	e.status(e.remoteOp(a, ibv.WRRDMARead, back, 0, 1000, m2.Addr()+952, m2.RKey(), 2), 2, ibv.WCSuccess, "READ through the second MR")
	e.sameBytes(back.Buf(), src.Buf()[:1000], "bytes read through the second MR")
	// Through m2 into its tail, then b sends from m1 and m2 (two SGEs).
	fill(src.Buf(), 2)
	e.status(e.remoteOp(a, ibv.WRRDMAWrite, src, 0, 4096, m2.Addr()+2048, m2.RKey(), 3), 3, ibv.WCSuccess, "WRITE through the second MR")
	e.sync(a, b)
	e.sameBytes(mem[4096:], src.Buf(), "bytes written through the second MR")
	dst := e.buf(a.pd, 200)
	e.postRecv(a, ibv.RecvWR{ID: 4, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 200)}})
	e.postSend(b, ibv.SendWR{ID: 4, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(m1, 5000, 100)}})
	e.postSend(b, ibv.SendWR{ID: 5, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(m2, 2952, 100)}})
	e.postRecv(a, ibv.RecvWR{ID: 5, SGList: []ibv.SGEntry{ibv.SGE(dst, 100, 100)}})
	wcs := e.wcs(b.scq, 2)
	e.status(wcs[0], 4, ibv.WCSuccess, "send from the first MR")
	e.status(wcs[1], 5, ibv.WCSuccess, "send from the second MR")
	e.wcs(a.rcq, 2)
	e.sameBytes(dst.Buf()[:100], mem[5000:5100], "data sent from the first MR")
	e.sameBytes(dst.Buf()[100:], mem[5000:5100], "data sent from the second MR")
}

// caseWriteWithoutRemoteWrite: a WRITE into an MR registered without
// REMOTE_WRITE fails with WCRemAccessErr at the requester and writes
// nothing.
func caseWriteWithoutRemoteWrite(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	dst := e.mr(b.pd, make([]byte, 256), ibv.AccessLocalWrite|ibv.AccessRemoteRead)
	src := e.buf(a.pd, 256)
	fill(src.Buf(), 3)
	e.remoteErr(a, e.remoteOp(a, ibv.WRRDMAWrite, src, 0, 256, dst.Addr(), dst.RKey(), 1), 1, "WRITE into an MR without REMOTE_WRITE")
	e.sameBytes(dst.Buf(), make([]byte, 256), "the MR without REMOTE_WRITE")
}

// caseReadWithoutRemoteRead: a READ of an MR registered without
// REMOTE_READ fails with WCRemAccessErr and reads nothing.
func caseReadWithoutRemoteRead(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	src := e.mr(b.pd, pattern(256, 4), ibv.AccessLocalWrite|ibv.AccessRemoteWrite)
	dst := e.buf(a.pd, 256)
	e.remoteErr(a, e.remoteOp(a, ibv.WRRDMARead, dst, 0, 256, src.Addr(), src.RKey(), 1), 1, "READ of an MR without REMOTE_READ")
	e.sameBytes(dst.Buf(), make([]byte, 256), "the READ's destination")
}

// caseRKeyOfAnotherPD: an rkey of an MR in another PD than the responder
// QP's is a remote access error, whatever the MR allows.
func caseRKeyOfAnotherPD(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	other := e.pd(b.c)
	dst := e.mr(other, make([]byte, 256), allAccess)
	src := e.buf(a.pd, 256)
	fill(src.Buf(), 5)
	e.remoteErr(a, e.remoteOp(a, ibv.WRRDMAWrite, src, 0, 256, dst.Addr(), dst.RKey(), 1), 1, "WRITE with an rkey of another PD")
	e.sameBytes(dst.Buf(), make([]byte, 256), "the MR of another PD")
}

// caseRemoteOutOfBounds: a remote range that leaves the MR, at either
// end, is a remote access error; the range exactly covering it is not.
func caseRemoteOutOfBounds(t *testing.T, e *env) {
	type rng struct {
		what string
		off  int64 // from the MR's start
		n    int
		ok   bool
	}
	for _, r := range []rng{
		{"the whole MR", 0, 1024, true},
		{"the last byte", 1023, 1, true},
		{"one byte past the end", 1, 1024, false},
		{"starting at the end", 1024, 1, false},
		{"one byte before the start", -1, 16, false},
		{"far past the end", 1 << 20, 16, false},
	} {
		for _, op := range []ibv.WROpcode{ibv.WRRDMAWrite, ibv.WRRDMARead} {
			t.Run(fmt.Sprintf("%v/%s", op, r.what), func(t *testing.T) {
				e := e.sub(t)
				a, b := e.pair(sideOpts{})
				// The MR sits inside a larger buffer, so out-of-bounds
				// accesses would land in memory the test can see.
				mem := make([]byte, 3072)
				fill(mem[1024:2048], 6) // before RegMR, which orders it before the device's accesses
				target := e.mr(b.pd, mem[1024:2048], allAccess)
				local := e.buf(a.pd, 2048)
				fill(local.Buf(), 7)
				wc := e.remoteOp(a, op, local, 0, r.n, uint64(int64(target.Addr())+r.off), target.RKey(), 1)
				if r.ok {
					e.status(wc, 1, ibv.WCSuccess, fmt.Sprintf("%v of %s", op, r.what))
					return
				}
				e.remoteErr(a, wc, 1, fmt.Sprintf("%v of %s", op, r.what))
				e.sameBytes(mem[:1024], make([]byte, 1024), "memory before the MR")
				e.sameBytes(mem[2048:], make([]byte, 1024), "memory after the MR")
				e.sameBytes(mem[1024:2048], pattern(1024, 6), "the MR")
			})
		}
	}
}

// caseDeregisteredRKey: once the responder deregisters an MR, a peer
// that still uses its rkey gets WCRemAccessErr.
func caseDeregisteredRKey(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	mem := make([]byte, 512)
	dst, err := b.pd.RegMR(mem, allAccess)
	must(t, err, "RegMR")
	e.cleanup("MR", dst.Dereg)
	src := e.buf(a.pd, 512)
	fill(src.Buf(), 8)
	e.status(e.remoteOp(a, ibv.WRRDMAWrite, src, 0, 256, dst.Addr(), dst.RKey(), 1), 1, ibv.WCSuccess, "WRITE before Dereg")
	addr, rkey := dst.Addr(), dst.RKey()
	must(t, dst.Dereg(), "Dereg")
	fill(src.Buf(), 9)
	e.remoteErr(a, e.remoteOp(a, ibv.WRRDMAWrite, src, 0, 256, addr+256, rkey, 2), 2, "WRITE with the rkey of a deregistered MR")
	e.sameBytes(mem[256:], make([]byte, 256), "memory of the deregistered MR")
}

// caseBadLKey: a send whose SGE names an lkey that is not registered, or
// a range past its MR, completes with WCLocProtErr; nothing is received.
func caseBadLKey(t *testing.T, e *env) {
	for _, c := range []struct {
		what string
		sge  func(mr ibv.MR) ibv.SGEntry
	}{
		{"an unknown lkey", func(mr ibv.MR) ibv.SGEntry { s := ibv.SGE(mr, 0, 64); s.LKey ^= 0x5A5A00; return s }},
		{"a range past the MR", func(mr ibv.MR) ibv.SGEntry { return ibv.SGE(mr, 32, 64) }},
	} {
		t.Run(c.what, func(t *testing.T) {
			e := e.sub(t)
			a, b := e.pair(sideOpts{})
			src := e.buf(a.pd, 64)
			dst := e.buf(b.pd, 64)
			e.postRecv(b, ibv.RecvWR{ID: 1, SGList: []ibv.SGEntry{ibv.SGE(dst, 0, 64)}})
			e.postSend(a, ibv.SendWR{ID: 1, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{c.sge(src)}})
			wc := e.wc(a.scq)
			e.status(wc, 1, ibv.WCLocProtErr, "send with "+c.what)
			e.state(a.qp, ibv.QPSErr, "requester after a local protection error")
			e.none(b.rcq, "the peer of a send with "+c.what)
		})
	}
}

// caseQPAccessGating: the responder QP's access flags gate inbound WRITE
// and READ on top of the MR's: with the flag missing the operation fails
// with a remote error and touches nothing; with it, it succeeds.
func caseQPAccessGating(t *testing.T, e *env) {
	for _, c := range []struct {
		op  ibv.WROpcode
		qp  ibv.Access
		ok  bool
		why string
	}{
		{ibv.WRRDMAWrite, ibv.AccessRemoteRead, false, "a QP without REMOTE_WRITE"},
		{ibv.WRRDMAWrite, ibv.AccessRemoteWrite, true, "a QP with REMOTE_WRITE"},
		{ibv.WRRDMARead, ibv.AccessRemoteWrite, false, "a QP without REMOTE_READ"},
		{ibv.WRRDMARead, ibv.AccessRemoteRead, true, "a QP with REMOTE_READ"},
	} {
		t.Run(fmt.Sprintf("%v to %s", c.op, c.why), func(t *testing.T) {
			e := e.sub(t)
			a := e.newSide("a", 0, sideOpts{})
			b := e.newSide("b", 1, sideOpts{})
			ob := DefaultConnOpts()
			ob.Access = c.qp
			e.connect(a, b, DefaultConnOpts(), ob)
			remote := e.mr(b.pd, pattern(128, 10), allAccess)
			local := e.buf(a.pd, 128)
			fill(local.Buf(), 11)
			wc := e.remoteOp(a, c.op, local, 0, 128, remote.Addr(), remote.RKey(), 1)
			if c.ok {
				e.status(wc, 1, ibv.WCSuccess, fmt.Sprintf("%v to %s", c.op, c.why))
				e.sync(a, b)
				e.sameBytes(local.Buf(), remote.Buf(), "both sides after the operation")
				return
			}
			// rxe answers an operation the QP does not enable with an
			// invalid-request NAK, other devices with a remote access
			// error: both are the requester's notice of the refusal.
			if wc.Status != ibv.WCRemAccessErr && wc.Status != ibv.WCRemInvReqErr || wc.ID != 1 {
				t.Fatalf("%v to %s: %s, want ID 1 with %q or %q", c.op, c.why, fmtWC(wc), ibv.WCRemAccessErr, ibv.WCRemInvReqErr)
			}
			e.state(a.qp, ibv.QPSErr, "requester after a refused operation")
			e.sameBytes(remote.Buf(), pattern(128, 10), "the responder's MR")
			e.sameBytes(local.Buf(), pattern(128, 11), "the requester's buffer")
		})
	}
}
