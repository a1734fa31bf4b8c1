//go:build rdmacore && linux && cgo

// Completion channels and completion queues: GetEvent waits on the
// channel's non-blocking fd with poll(2) beside an eventfd that the
// caller's context or Close signals; Poll copies a CQ's completions out in
// batches of pollBatch.

package rdmacore

/*
#include "shim.h"
*/
import "C"

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"golang.org/x/sys/unix"
)

// channel is a completion channel.
type channel struct {
	c    *devContext
	ch   *C.struct_ibv_comp_channel
	wake int // eventfd: a waiter's context ended, or Close

	getMu sync.Mutex // held by GetEvent while it waits; Close takes it to wait for it

	mu     sync.Mutex
	users  int // CQs; guarded by mu
	closed atomic.Bool
}

var _ ibv.CompChannel = (*channel)(nil)

func (ch *channel) hold() error {
	ch.mu.Lock()
	defer ch.mu.Unlock()
	if ch.closed.Load() {
		return fmt.Errorf("rdmacore: channel: %w", ibv.ErrClosed)
	}
	ch.users++
	return nil
}

func (ch *channel) release() {
	ch.mu.Lock()
	ch.users--
	ch.mu.Unlock()
}

func (ch *channel) signal() {
	one := [8]byte{1}
	_, _ = unix.Write(ch.wake, one[:])
}

// GetEvent takes the next CQ event: it tries the non-blocking channel fd
// and, when empty, waits in poll(2) for it or for the eventfd that ctx's
// end (or Close) writes.
func (ch *channel) GetEvent(ctx context.Context) (ibv.CQ, error) {
	ch.getMu.Lock()
	defer ch.getMu.Unlock()
	fds := []unix.PollFd{{Fd: int32(ch.ch.fd), Events: unix.POLLIN}, {Fd: int32(ch.wake), Events: unix.POLLIN}}
	for {
		if ch.closed.Load() {
			return nil, fmt.Errorf("rdmacore: channel: %w", ibv.ErrClosed)
		}
		var q *C.struct_ibv_cq
		switch r := syscall.Errno(C.gompi_get_cq_event(ch.ch, &q)); r {
		case 0:
			ch.c.mu.Lock()
			cq := ch.c.cqs[q]
			ch.c.mu.Unlock()
			if cq == nil {
				panic("rdmacore: completion event for a CQ the device does not know")
			}
			cq.events.Add(1)
			return cq, nil
		case syscall.EAGAIN:
		default:
			return nil, errnoErr("rdmacore: ibv_get_cq_event", r)
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		stop := context.AfterFunc(ctx, ch.signal)
		_, err := unix.Poll(fds, -1)
		stop()
		if err != nil && err != unix.EINTR {
			return nil, fmt.Errorf("rdmacore: poll completion channel: %w", err)
		}
		if fds[1].Revents != 0 {
			var b [8]byte
			_, _ = unix.Read(ch.wake, b[:]) // reset; a stale signal only costs a loop
		}
	}
}

// Close destroys the channel; ErrBusy while CQs use it. A GetEvent
// waiting on it returns ErrClosed.
func (ch *channel) Close() error {
	ch.mu.Lock()
	if ch.closed.Load() {
		ch.mu.Unlock()
		return fmt.Errorf("rdmacore: channel: %w", ibv.ErrClosed)
	}
	if ch.users > 0 {
		n := ch.users
		ch.mu.Unlock()
		return fmt.Errorf("rdmacore: close channel with %d CQs: %w", n, ibv.ErrBusy)
	}
	ch.closed.Store(true)
	ch.mu.Unlock()
	ch.signal()
	ch.getMu.Lock() // a GetEvent in progress has returned
	defer ch.getMu.Unlock()
	_ = unix.Close(ch.wake)
	if r := C.ibv_destroy_comp_channel(ch.ch); r != 0 {
		return errnoErr("rdmacore: ibv_destroy_comp_channel", syscall.Errno(r))
	}
	ch.c.release()
	return nil
}

// pollBatch is how many completions one ibv_poll_cq call takes.
const pollBatch = 64

// cq is a completion queue.
type cq struct {
	c  *devContext
	cq *C.struct_ibv_cq
	ch *channel

	pollMu sync.Mutex       // serialises Poll over raw and out
	raw    *C.struct_ibv_wc // pollBatch entries of C memory
	out    *C.gompi_wc      // pollBatch entries of C memory

	overrun       atomic.Bool  // the device reported IBV_EVENT_CQ_ERR
	events, acked atomic.Int64 // completion events taken and acknowledged
	mu            sync.Mutex
	users         int // QPs; guarded by mu
	closed        bool
}

var _ ibv.CQ = (*cq)(nil)

func (q *cq) hold() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("rdmacore: CQ: %w", ibv.ErrClosed)
	}
	q.users++
	return nil
}

func (q *cq) release() {
	q.mu.Lock()
	q.users--
	q.mu.Unlock()
}

// Poll takes up to len(wc) completions, oldest first.
func (q *cq) Poll(wc []ibv.WC) (int, error) {
	if q.overrun.Load() {
		return 0, fmt.Errorf("rdmacore: CQ: %w", ibv.ErrCQOverrun)
	}
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	if q.closed {
		return 0, fmt.Errorf("rdmacore: CQ: %w", ibv.ErrClosed)
	}
	got := 0
	out := unsafe.Slice(q.out, pollBatch)
	for got < len(wc) {
		want := min(len(wc)-got, pollBatch)
		k := int(C.gompi_poll_cq(q.cq, C.int(want), q.raw, q.out))
		if k < 0 {
			// ibv_poll_cq reports a failure without an errno.
			return got, fmt.Errorf("rdmacore: ibv_poll_cq failed (%d) after %d completions", k, got)
		}
		for i := range k {
			o := &out[i]
			wc[got+i] = ibv.WC{
				ID:        uint64(o.id),
				Status:    ibv.WCStatus(o.status),
				Opcode:    ibv.WCOpcode(o.opcode),
				VendorErr: uint32(o.vendor_err),
				ByteLen:   uint32(o.byte_len),
				Imm:       uint32(o.imm),
				QPNum:     uint32(o.qp_num),
				SrcQP:     uint32(o.src_qp),
				Flags:     ibv.WCFlags(o.flags),
			}
		}
		got += k
		if k < want {
			break
		}
	}
	return got, nil
}

func (q *cq) ReqNotify(solicitedOnly bool) error {
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	if r := C.gompi_req_notify_cq(q.cq, s); r != 0 {
		return errnoErr("rdmacore: ibv_req_notify_cq", syscall.Errno(r))
	}
	return nil
}

func (q *cq) AckEvents(n int) {
	if n <= 0 {
		return
	}
	C.ibv_ack_cq_events(q.cq, C.uint(n))
	q.acked.Add(int64(n))
}

// Destroy releases the CQ; ErrBusy while QPs use it or while events taken
// with GetEvent are not acknowledged (ibv_destroy_cq would wait for them
// without end).
func (q *cq) Destroy() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return fmt.Errorf("rdmacore: CQ: %w", ibv.ErrClosed)
	}
	if q.users > 0 {
		return fmt.Errorf("rdmacore: destroy CQ used by %d QPs: %w", q.users, ibv.ErrBusy)
	}
	if ev, ack := q.events.Load(), q.acked.Load(); ev != ack {
		return fmt.Errorf("rdmacore: destroy CQ with %d of %d events unacknowledged: %w", ev-ack, ev, ibv.ErrBusy)
	}
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	if r := C.ibv_destroy_cq(q.cq); r != 0 {
		return errnoErr("rdmacore: ibv_destroy_cq", syscall.Errno(r))
	}
	q.closed = true
	q.c.mu.Lock()
	delete(q.c.cqs, q.cq)
	q.c.mu.Unlock()
	C.free(unsafe.Pointer(q.raw))
	C.free(unsafe.Pointer(q.out))
	if q.ch != nil {
		q.ch.release()
	}
	q.c.release()
	return nil
}
