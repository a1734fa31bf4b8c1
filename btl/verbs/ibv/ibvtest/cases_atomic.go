package ibvtest

import (
	"encoding/binary"
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

var atomicCases = []testCase{
	{name: "Atomics", pair: true, run: caseAtomics},
	{name: "AtomicWithoutRemoteAtomic", pair: true, run: caseAtomicWithoutRemoteAtomic},
}

func atomicWR(id uint64, op ibv.WROpcode, local ibv.MR, loff int, remote ibv.MR, roff int, cmpAdd, swap uint64) ibv.SendWR {
	return ibv.SendWR{ID: id, Opcode: op, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(local, loff, 8)},
		RemoteAddr: remote.Addr() + uint64(roff), RKey: remote.RKey(), CompareAdd: cmpAdd, Swap: swap}
}

// caseAtomics: FETCH_AND_ADD and CMP_AND_SWP act on 8 remote bytes (host
// order) and return the value they found; a compare that fails leaves the
// remote value.
func caseAtomics(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	start := make([]byte, 16)
	binary.NativeEndian.PutUint64(start[0:], 40)
	binary.NativeEndian.PutUint64(start[8:], 0xDEADBEEF)
	remote := e.mr(b.pd, start, allAccess)
	local := e.buf(a.pd, 32)
	e.postSend(a,
		atomicWR(1, ibv.WRAtomicFetchAndAdd, local, 0, remote, 0, 2, 0),
		atomicWR(2, ibv.WRAtomicCmpAndSwp, local, 8, remote, 8, 0xDEADBEEF, 7),
		atomicWR(3, ibv.WRAtomicCmpAndSwp, local, 16, remote, 8, 0xDEADBEEF, 9),
		atomicWR(4, ibv.WRAtomicFetchAndAdd, local, 24, remote, 0, 1<<63, 0))
	want := []ibv.WCOpcode{ibv.WCFetchAdd, ibv.WCCompSwap, ibv.WCCompSwap, ibv.WCFetchAdd}
	for i, wc := range e.wcs(a.scq, 4) {
		e.status(wc, uint64(i+1), ibv.WCSuccess, "atomic")
		e.opcode(wc, want[i], "atomic")
	}
	got := func(off int) uint64 { return binary.NativeEndian.Uint64(local.Buf()[off:]) }
	for i, w := range []uint64{40, 0xDEADBEEF, 7, 42} {
		if got(8*i) != w {
			t.Fatalf("atomic %d returned %#x, want %#x", i+1, got(8*i), w)
		}
	}
	e.sync(a, b)
	if v := binary.NativeEndian.Uint64(remote.Buf()[0:]); v != 42+1<<63 {
		t.Fatalf("remote counter %#x after adding 2 and 1<<63 to 40", v)
	}
	if v := binary.NativeEndian.Uint64(remote.Buf()[8:]); v != 7 {
		t.Fatalf("remote word %#x after a successful and a failed compare-and-swap, want 7", v)
	}
}

// caseAtomicWithoutRemoteAtomic: an atomic on an MR registered without
// REMOTE_ATOMIC is a remote access error and leaves the value.
func caseAtomicWithoutRemoteAtomic(t *testing.T, e *env) {
	a, b := e.pair(sideOpts{})
	start := make([]byte, 8)
	binary.NativeEndian.PutUint64(start, 5)
	remote := e.mr(b.pd, start, ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead)
	local := e.buf(a.pd, 8)
	e.postSend(a, atomicWR(1, ibv.WRAtomicFetchAndAdd, local, 0, remote, 0, 1, 0))
	e.remoteErr(a, e.wc(a.scq), 1, "FETCH_AND_ADD on an MR without REMOTE_ATOMIC")
	e.sameBytes(remote.Buf(), start, "the MR without REMOTE_ATOMIC")
}
