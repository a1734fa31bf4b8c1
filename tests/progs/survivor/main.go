// Command survivor runs under gorun --enable-recovery -np 3 and is killed
// in the middle of transfers, for tests/recovery_test.go:
//
//	survivor p2p SIZE     rank 2 (the victim) streams SIZE-byte messages to
//	                      rank 1 and receives them from rank 0 (gorun
//	                      --protocol picks the protocol)
//	survivor tensor SIZE  the same through the tensor rendezvous: rank 2
//	                      sends a SIZE-byte tensor per step to ranks 0 and
//	                      1, and receives one from rank 0
//
// Rank 2 prints "rank 2: transferring pid N" once both directions moved a
// message, and goes on until the test kills it. Ranks 0 and 1 meanwhile
// exchange checked messages of every size among themselves, and go on
// until both have seen the victim fail and 20 rounds more. Each survivor
// then checks ULFM's rules (later operations naming the victim fail with
// ErrProcFailed, AnySource receives fail until FailureAck, FailedRanks,
// Barrier fails, AnySource works after FailureAck, the tensor rendezvous
// still works between survivors), finalizes, and prints
// "rank R: victim failed at UNIXNANO after N messages: ERR" and
// "rank R: survived". Any broken rule is printed as "survivor: rank R:
// ..." with exit status 1.
package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/pml/tensor"
)

const victim = 2

var rank int

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "survivor: rank %d: %s\n", rank, fmt.Sprintf(format, a...))
	os.Exit(1)
}

// content is the payload of message seq from src: its sequence number
// first, then a pattern of both.
func content(n int, src, seq int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + src*31 + seq*13)
	}
	if n >= 8 {
		binary.LittleEndian.PutUint64(b, uint64(seq))
	}
	return b
}

func main() {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "survivor:", err)
		os.Exit(1)
	}
	rank = w.Rank()
	if w.Size() != 3 || len(os.Args) < 3 {
		fail("run me as gorun -np 3 survivor p2p|tensor SIZE")
	}
	mode := os.Args[1]
	size, err := strconv.Atoi(os.Args[2])
	if err != nil || size < 8 {
		fail("bad SIZE %q", os.Args[2])
	}
	var rz *tensor.Rendezvous
	if mode == "tensor" {
		if rz, err = tensor.New(w); err != nil {
			fail("tensor.New: %v", err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if rank == victim {
		runVictim(ctx, w, rz, mode, size)
		return
	}
	survive(ctx, w, rz, mode, size)
}

// runVictim moves messages both ways until it is killed.
func runVictim(ctx context.Context, w *mpi.Comm, rz *tensor.Rendezvous, mode string, size int) {
	var moved sync.WaitGroup
	moved.Add(2)
	go func() {
		buf := make([]byte, size)
		for seq := 0; ; seq++ {
			var err error
			if mode == "tensor" {
				var t tensor.Tensor
				t, err = rz.Recv(ctx, int64(seq), "to-victim", 0)
				if err == nil && !bytes.Equal(t.Data, content(size, 0, seq)) {
					err = fmt.Errorf("tensor %d from rank 0 differs", seq)
				}
			} else {
				_, err = w.Recv(buf, 0, 2)
				if err == nil && !bytes.Equal(buf, content(size, 0, seq)) {
					err = fmt.Errorf("message %d from rank 0 differs", seq)
				}
			}
			if err != nil {
				fail("receive %d: %v", seq, err)
			}
			if seq == 0 {
				moved.Done()
			}
		}
	}()
	go func() {
		for seq := 0; ; seq++ {
			var err error
			if mode == "tensor" {
				err = rz.Send(int64(seq), "from-victim", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: content(size, victim, seq)})
				if err == nil && seq > 8 {
					// Send is passive: keep the table small.
					time.Sleep(100 * time.Microsecond)
				}
			} else {
				err = w.Send(content(size, victim, seq), 1, 1)
			}
			if err != nil {
				fail("send %d: %v", seq, err)
			}
			if seq == 0 {
				moved.Done()
			}
		}
	}()
	moved.Wait()
	fmt.Printf("rank 2: transferring pid %d\n", os.Getpid())
	<-ctx.Done()
	fail("not killed within the deadline")
}

// survive runs a survivor: the exchange with the victim and the rounds
// with the other survivor, then the checks after the failure.
func survive(ctx context.Context, w *mpi.Comm, rz *tensor.Rendezvous, mode string, size int) {
	other := 1 - rank
	var failed atomic.Bool
	victimErr := make(chan error, 1)
	var at time.Time
	var count int
	go func() {
		buf := make([]byte, size)
		var err error
		for count = 0; err == nil; count++ {
			switch {
			case mode == "tensor" && rank == 0:
				err = rz.Send(int64(count), "to-victim", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: content(size, 0, count)})
				if err == nil {
					var t tensor.Tensor
					if t, err = rz.Recv(ctx, int64(count), "from-victim", victim); err == nil && !bytes.Equal(t.Data, content(size, victim, count)) {
						fail("tensor %d from the victim differs", count)
					}
				}
			case mode == "tensor":
				var t tensor.Tensor
				if t, err = rz.Recv(ctx, int64(count), "from-victim", victim); err == nil && !bytes.Equal(t.Data, content(size, victim, count)) {
					fail("tensor %d from the victim differs", count)
				}
			case rank == 0:
				err = w.Send(content(size, 0, count), victim, 2)
			default:
				if _, err = w.Recv(buf, victim, 1); err == nil && !bytes.Equal(buf, content(size, victim, count)) {
					fail("message %d from the victim differs", count)
				}
			}
		}
		at = time.Now()
		failed.Store(true)
		victimErr <- err
	}()
	// Rounds with the other survivor: a flag byte says whether this rank
	// saw the failure; both stop 20 rounds after both flags were set.
	sizes := []int{1, 8, 4 << 10, 64 << 10, 1 << 20}
	after := -1
	for round := 0; after < 20; round++ {
		n := sizes[round%len(sizes)]
		out := content(n, rank, round)
		if failed.Load() {
			out[n-1] = 1
		} else {
			out[n-1] = 0
		}
		in := make([]byte, n)
		st, err := w.Sendrecv(out, other, 3, in, other, 3)
		if err != nil {
			fail("round %d with rank %d: %v", round, other, err)
		}
		want := content(n, other, round)
		if st.Count != n || !bytes.Equal(in[:n-1], want[:n-1]) {
			fail("round %d: %d bytes from rank %d differ", round, st.Count, other)
		}
		if after >= 0 || out[n-1] == 1 && in[n-1] == 1 {
			after++
		}
		if ctx.Err() != nil {
			fail("the victim's failure was not seen within the deadline")
		}
	}
	err := <-victimErr
	fmt.Printf("rank %d: victim failed at %d after %d messages: %v\n", rank, at.UnixNano(), count, err)
	if !errors.Is(err, mpi.ErrProcFailed) {
		fail("the operation with the victim ended with %v, want ErrProcFailed", err)
	}
	check := func(what string, err error) {
		if !errors.Is(err, mpi.ErrProcFailed) {
			fail("%s after the failure: %v, want ErrProcFailed", what, err)
		}
	}
	check("Send to the victim", w.Send(content(8, rank, 0), victim, 7))
	check("Ssend to the victim", w.Ssend(content(8, rank, 0), victim, 7))
	_, err = w.Recv(make([]byte, 8), victim, 7)
	check("Recv from the victim", err)
	_, err = w.Recv(make([]byte, 8), mpi.AnySource, 7)
	check("AnySource Recv before FailureAck", err)
	check("Barrier", w.Barrier())
	if f := w.FailedRanks(); len(f) != 0 {
		fail("FailedRanks before FailureAck: %v", f)
	}
	if err := w.FailureAck(); err != nil {
		fail("FailureAck: %v", err)
	}
	if f := w.FailedRanks(); !slices.Equal(f, []int{victim}) {
		fail("FailedRanks: %v, want [2]", f)
	}
	// AnySource works again among the survivors.
	r, err := w.Irecv(make([]byte, 64<<10), mpi.AnySource, 5)
	if err != nil {
		fail("AnySource Irecv after FailureAck: %v", err)
	}
	if err := w.Send(content(64<<10, rank, 5), other, 5); err != nil {
		fail("Send to rank %d: %v", other, err)
	}
	if st, err := r.Wait(); err != nil || st.Source != other {
		fail("AnySource receive after FailureAck: %+v %v", st, err)
	}
	if rz != nil {
		// The tensor rendezvous between the survivors.
		for step := int64(1000); step < 1010; step++ {
			if rank == 0 {
				err = rz.Send(step, "survivors", tensor.Tensor{DType: tensor.Uint8, Shape: []int64{int64(size)}, Data: content(size, 0, int(step))})
			} else {
				var t tensor.Tensor
				if t, err = rz.Recv(ctx, step, "survivors", 0); err == nil && !bytes.Equal(t.Data, content(size, 0, int(step))) {
					err = fmt.Errorf("tensor of step %d differs", step)
				}
			}
			if err != nil {
				fail("tensor between survivors: %v", err)
			}
		}
		// Both are done with it before it closes.
		if _, err := w.Sendrecv(nil, other, 6, nil, other, 6); err != nil {
			fail("sync: %v", err)
		}
		if err := rz.Close(); err != nil {
			fail("tensor Close: %v", err)
		}
	}
	if err := mpi.Finalize(); err != nil {
		fail("Finalize: %v", err)
	}
	fmt.Printf("rank %d: survived\n", rank)
}
