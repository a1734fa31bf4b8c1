//go:build rdmacore && linux && cgo

package rdmacore

import (
	"fmt"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// transitions holds, for each legal RC transition, the attributes it
// requires and the ones it may add (the IB specification's QP state table
// for RC, as the kernel's ib_modify_qp_is_ok keeps it). The provider checks
// a Modify against it before calling the driver, so that every device
// refuses the same requests with ErrInvalid and the state stays as it was.
var transitions = map[[2]ibv.QPState]struct{ req, opt ibv.AttrMask }{
	{ibv.QPSReset, ibv.QPSInit}: {req: ibv.MaskResetToInit &^ ibv.AttrState},
	{ibv.QPSInit, ibv.QPSInit}:  {opt: ibv.AttrPKeyIndex | ibv.AttrPort | ibv.AttrAccessFlags},
	{ibv.QPSInit, ibv.QPSRTR}: {req: ibv.MaskInitToRTR &^ ibv.AttrState,
		opt: ibv.AttrAltPath | ibv.AttrAccessFlags | ibv.AttrPKeyIndex},
	{ibv.QPSRTR, ibv.QPSRTS}: {req: ibv.MaskRTRToRTS &^ ibv.AttrState,
		opt: ibv.AttrCurState | ibv.AttrAltPath | ibv.AttrAccessFlags | ibv.AttrMinRNRTimer | ibv.AttrPathMigState},
	{ibv.QPSRTS, ibv.QPSRTS}: {opt: ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrAltPath | ibv.AttrPathMigState | ibv.AttrMinRNRTimer},
	{ibv.QPSRTS, ibv.QPSSQD}: {opt: ibv.AttrEnSQDAsyncNotify},
	{ibv.QPSSQD, ibv.QPSRTS}: {opt: ibv.AttrCurState | ibv.AttrAccessFlags | ibv.AttrAltPath | ibv.AttrPathMigState | ibv.AttrMinRNRTimer},
	{ibv.QPSSQD, ibv.QPSSQD}: {opt: ibv.AttrAV | ibv.AttrTimeout | ibv.AttrRetryCnt | ibv.AttrRNRRetry | ibv.AttrMaxQPRdAtomic |
		ibv.AttrMaxDestRdAtomic | ibv.AttrCurState | ibv.AttrAltPath | ibv.AttrAccessFlags | ibv.AttrPKeyIndex |
		ibv.AttrMinRNRTimer | ibv.AttrPathMigState},
	{ibv.QPSSQE, ibv.QPSRTS}: {opt: ibv.AttrCurState},
}

// limits are what validateModify checks attribute values against.
type limits struct {
	ports      int // the device's port count
	pkeyTblLen int // 0: not checked
	gidTblLen  int // 0: not checked
}

// validateModify checks a Modify of a QP in state cur: a legal
// transition, every required attribute, no attribute the transition does
// not take, and each given value in range. It returns an error wrapping
// ibv.ErrInvalid, or nil.
func validateModify(cur ibv.QPState, a *ibv.QPAttr, mask ibv.AttrMask, lim limits) error {
	next := cur
	if mask&ibv.AttrState != 0 {
		next = a.State
	}
	if next > ibv.QPSErr {
		return fmt.Errorf("modify QP: state %d: %w", next, ibv.ErrInvalid)
	}
	if mask&ibv.AttrCurState != 0 && a.CurState != cur {
		return fmt.Errorf("modify QP: current state given as %v, QP is in %v: %w", a.CurState, cur, ibv.ErrInvalid)
	}
	given := mask &^ ibv.AttrState
	switch {
	case next == ibv.QPSReset || next == ibv.QPSErr:
		// Every state may go to RESET or ERR, with no other attribute.
		if given&^ibv.AttrCurState != 0 {
			return fmt.Errorf("modify QP %v->%v: attributes %#x not taken: %w", cur, next, given, ibv.ErrInvalid)
		}
		return nil
	}
	tr, ok := transitions[[2]ibv.QPState{cur, next}]
	if !ok {
		return fmt.Errorf("modify QP: no transition %v->%v: %w", cur, next, ibv.ErrInvalid)
	}
	if missing := tr.req &^ given; missing != 0 {
		return fmt.Errorf("modify QP %v->%v: required attributes %#x missing: %w", cur, next, missing, ibv.ErrInvalid)
	}
	if extra := given &^ (tr.req | tr.opt); extra != 0 {
		return fmt.Errorf("modify QP %v->%v: attributes %#x not taken: %w", cur, next, extra, ibv.ErrInvalid)
	}
	return validateValues(a, given, lim)
}

func validateValues(a *ibv.QPAttr, m ibv.AttrMask, lim limits) error {
	bad := func(what string, v any) error {
		return fmt.Errorf("modify QP: %s %v out of range: %w", what, v, ibv.ErrInvalid)
	}
	const psnMax = 1<<24 - 1
	switch {
	case m&ibv.AttrPort != 0 && (a.Port < 1 || int(a.Port) > lim.ports):
		return bad("port", a.Port)
	case m&ibv.AttrPKeyIndex != 0 && lim.pkeyTblLen > 0 && int(a.PKeyIndex) >= lim.pkeyTblLen:
		return bad("P_Key index", a.PKeyIndex)
	case m&ibv.AttrAccessFlags != 0 && a.AccessFlags&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessRemoteAtomic) != 0:
		return bad("access flags", a.AccessFlags)
	case m&ibv.AttrPathMTU != 0 && (a.PathMTU < ibv.MTU256 || a.PathMTU > ibv.MTU4096):
		return bad("path MTU", a.PathMTU)
	case m&ibv.AttrDestQPN != 0 && a.DestQPN > psnMax:
		return bad("destination QPN", a.DestQPN)
	case m&ibv.AttrRQPSN != 0 && a.RQPSN > psnMax:
		return bad("RQ PSN", a.RQPSN)
	case m&ibv.AttrSQPSN != 0 && a.SQPSN > psnMax:
		return bad("SQ PSN", a.SQPSN)
	case m&ibv.AttrMinRNRTimer != 0 && a.MinRNRTimer > 31:
		return bad("min RNR timer", a.MinRNRTimer)
	case m&ibv.AttrTimeout != 0 && a.Timeout > 31:
		return bad("timeout", a.Timeout)
	case m&ibv.AttrRetryCnt != 0 && a.RetryCnt > 7:
		return bad("retry count", a.RetryCnt)
	case m&ibv.AttrRNRRetry != 0 && a.RNRRetry > 7:
		return bad("RNR retry", a.RNRRetry)
	case m&ibv.AttrAV != 0 && a.AH.IsGlobal && lim.gidTblLen > 0 && int(a.AH.SGIDIndex) >= lim.gidTblLen:
		return bad("source GID index", a.AH.SGIDIndex)
	case m&ibv.AttrAV != 0 && a.AH.Port != 0 && int(a.AH.Port) > lim.ports:
		return bad("address vector port", a.AH.Port)
	}
	return nil
}

// validateAccess checks RegMR's access flags: known bits only, and remote
// write or atomic only with local write (ibv_reg_mr(3)).
func validateAccess(acc ibv.Access) error {
	if acc&^(ibv.AccessLocalWrite|ibv.AccessRemoteWrite|ibv.AccessRemoteRead|ibv.AccessRemoteAtomic) != 0 {
		return fmt.Errorf("register MR: access %#x has unknown flags: %w", acc, ibv.ErrInvalid)
	}
	if acc&(ibv.AccessRemoteWrite|ibv.AccessRemoteAtomic) != 0 && acc&ibv.AccessLocalWrite == 0 {
		return fmt.Errorf("register MR: remote write or atomic access %#x without local write: %w", acc, ibv.ErrInvalid)
	}
	return nil
}
