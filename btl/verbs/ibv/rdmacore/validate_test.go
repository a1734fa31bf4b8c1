//go:build rdmacore && linux && cgo

package rdmacore

import (
	"errors"
	"testing"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

func TestValidateModify(t *testing.T) {
	lim := limits{ports: 1, pkeyTblLen: 1, gidTblLen: 4}
	initA := ibv.QPAttr{State: ibv.QPSInit, Port: 1, AccessFlags: ibv.AccessRemoteWrite}
	rtr := ibv.QPAttr{State: ibv.QPSRTR, PathMTU: ibv.MTU1024, DestQPN: 5, RQPSN: 7, MaxDestRdAtomic: 1, MinRNRTimer: 1,
		AH: ibv.AH{IsGlobal: true, SGIDIndex: 1, Port: 1}}
	rts := ibv.QPAttr{State: ibv.QPSRTS, SQPSN: 9, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 1}
	ok := func(cur ibv.QPState, a ibv.QPAttr, m ibv.AttrMask) {
		t.Helper()
		if err := validateModify(cur, &a, m, lim); err != nil {
			t.Errorf("%v->%v mask %#x: %v", cur, a.State, m, err)
		}
	}
	bad := func(cur ibv.QPState, a ibv.QPAttr, m ibv.AttrMask) {
		t.Helper()
		if err := validateModify(cur, &a, m, lim); !errors.Is(err, ibv.ErrInvalid) {
			t.Errorf("%v->%v mask %#x: %v, want ErrInvalid", cur, a.State, m, err)
		}
	}
	ok(ibv.QPSReset, initA, ibv.MaskResetToInit)
	ok(ibv.QPSInit, rtr, ibv.MaskInitToRTR)
	ok(ibv.QPSRTR, rts, ibv.MaskRTRToRTS)
	ok(ibv.QPSInit, ibv.QPAttr{State: ibv.QPSInit, AccessFlags: 0}, ibv.AttrState|ibv.AttrAccessFlags)
	ok(ibv.QPSRTS, ibv.QPAttr{State: ibv.QPSRTS, MinRNRTimer: 3}, ibv.AttrState|ibv.AttrMinRNRTimer)
	for _, s := range []ibv.QPState{ibv.QPSReset, ibv.QPSInit, ibv.QPSRTR, ibv.QPSRTS, ibv.QPSErr} {
		ok(s, ibv.QPAttr{State: ibv.QPSReset}, ibv.AttrState)
		ok(s, ibv.QPAttr{State: ibv.QPSErr}, ibv.AttrState)
	}
	// Illegal transitions.
	bad(ibv.QPSReset, rtr, ibv.MaskInitToRTR)
	bad(ibv.QPSReset, rts, ibv.MaskRTRToRTS)
	bad(ibv.QPSInit, rts, ibv.MaskRTRToRTS)
	bad(ibv.QPSRTS, initA, ibv.MaskResetToInit)
	bad(ibv.QPSErr, initA, ibv.MaskResetToInit)
	// Each required attribute missing.
	for _, c := range []struct {
		cur  ibv.QPState
		a    ibv.QPAttr
		mask ibv.AttrMask
	}{{ibv.QPSReset, initA, ibv.MaskResetToInit}, {ibv.QPSInit, rtr, ibv.MaskInitToRTR}, {ibv.QPSRTR, rts, ibv.MaskRTRToRTS}} {
		for bit := ibv.AttrMask(2); bit <= c.mask; bit <<= 1 {
			if c.mask&bit != 0 {
				bad(c.cur, c.a, c.mask&^bit)
			}
		}
		bad(c.cur, c.a, c.mask|ibv.AttrQKey) // UD only
	}
	// Values out of range.
	for _, edit := range []func(*ibv.QPAttr){
		func(a *ibv.QPAttr) { a.Port = 0 },
		func(a *ibv.QPAttr) { a.Port = 2 },
		func(a *ibv.QPAttr) { a.PKeyIndex = 1 },
		func(a *ibv.QPAttr) { a.AccessFlags = 1 << 7 },
	} {
		a := initA
		edit(&a)
		bad(ibv.QPSReset, a, ibv.MaskResetToInit)
	}
	for _, edit := range []func(*ibv.QPAttr){
		func(a *ibv.QPAttr) { a.PathMTU = 0 },
		func(a *ibv.QPAttr) { a.PathMTU = 6 },
		func(a *ibv.QPAttr) { a.DestQPN = 1 << 24 },
		func(a *ibv.QPAttr) { a.RQPSN = 1 << 24 },
		func(a *ibv.QPAttr) { a.MinRNRTimer = 32 },
		func(a *ibv.QPAttr) { a.AH.SGIDIndex = 4 },
	} {
		a := rtr
		edit(&a)
		bad(ibv.QPSInit, a, ibv.MaskInitToRTR)
	}
	for _, edit := range []func(*ibv.QPAttr){
		func(a *ibv.QPAttr) { a.SQPSN = 1 << 24 },
		func(a *ibv.QPAttr) { a.Timeout = 32 },
		func(a *ibv.QPAttr) { a.RetryCnt = 8 },
		func(a *ibv.QPAttr) { a.RNRRetry = 8 },
	} {
		a := rts
		edit(&a)
		bad(ibv.QPSRTR, a, ibv.MaskRTRToRTS)
	}
}

func TestValidateAccess(t *testing.T) {
	for acc, want := range map[ibv.Access]bool{
		0: true, ibv.AccessRemoteRead: true, ibv.AccessLocalWrite | ibv.AccessRemoteWrite: true,
		ibv.AccessRemoteWrite: false, ibv.AccessRemoteAtomic: false, ibv.AccessRemoteWrite | ibv.AccessRemoteRead: false, 1 << 6: false,
	} {
		if err := validateAccess(acc); (err == nil) != want {
			t.Errorf("access %#x: %v", acc, err)
		}
	}
}
