// Command conform is a multi-process conformance program run by the tests
// under gorun: every size from 0 B to 16 MiB between every pair of ranks,
// every byte checked, plus ordering of mixed eager/rendezvous messages to
// an AnyTag receiver, wildcards, probes and derived datatypes (vector,
// indexed, struct with holes, subarray; see types.go) in both directions
// between rank 0 and the last rank. It prints "conform ok" on rank 0 when
// everything held.
//
//	conform [wait]
//
// With "wait", every rank first takes part in a barrier (so the transports
// are connected), then rank 0 prints "conform: ready" and reads one line of
// its standard input before the checks start.
package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
	"github.com/gompi-org/gompi/mpi/mpitest"
)

func main() {
	w, err := mpi.Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, "conform: init:", err)
		os.Exit(1)
	}
	if len(os.Args) > 1 && os.Args[1] == "wait" {
		if err := w.Barrier(); err != nil {
			fmt.Fprintf(os.Stderr, "conform: rank %d: barrier: %v\n", w.Rank(), err)
			os.Exit(1)
		}
		if w.Rank() == 0 {
			fmt.Println("conform: ready")
			if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
				fmt.Fprintln(os.Stderr, "conform: reading stdin:", err)
				os.Exit(1)
			}
		}
	}
	if err := run(w); err != nil {
		fmt.Fprintf(os.Stderr, "conform: rank %d: %v\n", w.Rank(), err)
		os.Exit(1)
	}
	if err := mpi.Finalize(); err != nil {
		fmt.Fprintln(os.Stderr, "conform: finalize:", err)
		os.Exit(1)
	}
	if w.Rank() == 0 {
		fmt.Println("conform ok")
	}
}

func pattern(n, seed int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + seed*7 + i>>8)
	}
	return b
}

// waitContext: a receive nobody sends to gives up when its context ends
// (the waiter is parked in a transport's Block by then), and can be
// cancelled afterwards.
func waitContext(w *mpi.Comm) error {
	peer := (w.Rank() + 1) % w.Size()
	r, err := w.Irecv(make([]byte, 8), peer, 4321)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := r.WaitContext(ctx); !errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("WaitContext of a receive nobody sends to = %v, want context.DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		return fmt.Errorf("WaitContext returned %v after its deadline", d)
	}
	if err := r.Cancel(); err != nil {
		return err
	}
	st, err := r.Wait()
	if err != nil || !st.Cancelled {
		return fmt.Errorf("cancelled receive: status %+v, err %v", st, err)
	}
	return nil
}

// asyncProgress: a large message from the last rank, already waiting at
// rank 0 (Probe), is received with Irecv, and rank 0 then makes no MPI call
// for half a second. The sender's blocking Send must still complete within
// that time (the library progresses by itself), which the sender shows by
// sending the time its Send returned.
func asyncProgress(w *mpi.Comm) error {
	const size, tag, tagTime = 1 << 20, 4400, 4401
	const quiet = 500 * time.Millisecond
	last := w.Size() - 1
	switch w.Rank() {
	case last:
		if err := w.Send(pattern(size, 99), 0, tag); err != nil {
			return err
		}
		t, _ := time.Now().MarshalBinary()
		return w.Send(t, 0, tagTime)
	case 0:
		if _, err := w.Probe(last, tag); err != nil {
			return err
		}
		buf := make([]byte, size)
		r, err := w.Irecv(buf, last, tag)
		if err != nil {
			return err
		}
		time.Sleep(quiet) // no MPI call meanwhile
		quietEnd := time.Now()
		tb := make([]byte, 64)
		st, err := w.Recv(tb, last, tagTime)
		if err != nil {
			return err
		}
		var sent time.Time
		if err := sent.UnmarshalBinary(tb[:st.Count]); err != nil {
			return err
		}
		if _, err := r.Wait(); err != nil {
			return err
		}
		if !bytes.Equal(buf, pattern(size, 99)) {
			return fmt.Errorf("asynchronous progress: wrong data")
		}
		if !sent.Before(quietEnd) {
			return fmt.Errorf("asynchronous progress: the sender's Send returned %v after rank 0 stopped calling MPI, only %v after rank 0 called MPI again",
				sent.Sub(quietEnd.Add(-quiet)), sent.Sub(quietEnd))
		}
	}
	return nil
}

// completions: rank 1 sends rank 0 messages of several sizes (eager and
// rendezvous) on as many tags, in reverse tag order, rounds of them; rank
// 0 receives each round with Irecvs completed by Waitany, by Waitsome and
// by a loop of Test, and checks that every request completes once, with
// its own message.
func completions(w *mpi.Comm) error {
	const tag0 = 4500
	sizes := []int{0, 8, 300, 70000, 1 << 20}
	modes := []string{"Waitany", "Waitsome", "Test"}
	switch w.Rank() {
	case 1:
		for round := range modes {
			for k := len(sizes) - 1; k >= 0; k-- {
				if err := w.Send(pattern(sizes[k], 40+10*round+k), 0, tag0+k); err != nil {
					return err
				}
			}
		}
	case 0:
		for round, mode := range modes {
			bufs := make([][]byte, len(sizes))
			reqs := make([]*mpi.Request, len(sizes))
			for k, sz := range sizes {
				bufs[k] = make([]byte, sz)
				r, err := w.Irecv(bufs[k], 1, tag0+k)
				if err != nil {
					return err
				}
				reqs[k] = r
			}
			seen := make([]bool, len(sizes))
			done := func(k int, st mpi.Status) error {
				if seen[k] {
					return fmt.Errorf("%s: request %d completed twice", mode, k)
				}
				seen[k] = true
				if st.Tag != tag0+k || st.Count != sizes[k] || !bytes.Equal(bufs[k], pattern(sizes[k], 40+10*round+k)) {
					return fmt.Errorf("%s: request %d: status %+v or its bytes are wrong", mode, k, st)
				}
				return nil
			}
			switch mode {
			case "Waitany":
				for range sizes {
					k, st, err := mpi.Waitany(reqs)
					if err != nil {
						return err
					}
					if k < 0 {
						return fmt.Errorf("Waitany: no request left early")
					}
					if err := done(k, st); err != nil {
						return err
					}
				}
				if k, _, err := mpi.Waitany(reqs); k != -1 || err != nil {
					return fmt.Errorf("Waitany with every request done: %d, %v", k, err)
				}
			case "Waitsome":
				for n := 0; n < len(sizes); {
					idx, sts, err := mpi.Waitsome(reqs)
					if err != nil {
						return err
					}
					if len(idx) == 0 {
						return fmt.Errorf("Waitsome: no request left early")
					}
					for i, k := range idx {
						if err := done(k, sts[i]); err != nil {
							return err
						}
					}
					n += len(idx)
				}
			case "Test":
				for k, r := range reqs {
					for {
						st, ok, err := r.Test()
						if err != nil {
							return err
						}
						if ok {
							if err := done(k, st); err != nil {
								return err
							}
							break
						}
					}
				}
			}
		}
	}
	return nil
}

func run(w *mpi.Comm) error {
	me, n := w.Rank(), w.Size()
	if n > 1 {
		if err := waitContext(w); err != nil {
			return err
		}
		if err := asyncProgress(w); err != nil {
			return err
		}
		if err := completions(w); err != nil {
			return err
		}
	}
	sizes := []int{0, 1, 8, 255, 256, 257, 1000, 4096, 65536, 65537, 1 << 20, 16 << 20}
	// Every pair (i -> j, i != j) in turn, every size.
	for src := 0; src < n; src++ {
		for dst := 0; dst < n; dst++ {
			if src == dst || (me != src && me != dst) {
				continue
			}
			for k, sz := range sizes {
				if me == src {
					if err := w.Send(pattern(sz, k+src), dst, k); err != nil {
						return fmt.Errorf("send %d B to %d: %w", sz, dst, err)
					}
				} else {
					buf := make([]byte, sz)
					st, err := w.Recv(buf, src, k)
					if err != nil {
						return fmt.Errorf("recv %d B from %d: %w", sz, src, err)
					}
					if st.Count != sz || !bytes.Equal(buf, pattern(sz, k+src)) {
						return fmt.Errorf("%d B from %d: wrong data (count %d)", sz, src, st.Count)
					}
				}
			}
		}
	}
	if err := w.Barrier(); err != nil {
		return err
	}
	// Ordering: rank 1 sends mixed sizes with different tags; rank 0 receives with AnyTag.
	if n >= 2 && me <= 1 {
		mixed := []int{10, 200000, 5, 70000, 3000000, 1, 0, 100000}
		if me == 1 {
			var reqs []*mpi.Request
			for i, sz := range mixed {
				r, err := w.Isend(pattern(sz, i), 0, 100+i)
				if err != nil {
					return err
				}
				reqs = append(reqs, r)
			}
			if _, err := mpi.Waitall(reqs); err != nil {
				return err
			}
		} else {
			for i, sz := range mixed {
				buf := make([]byte, 4<<20)
				st, err := w.Recv(buf, 1, mpi.AnyTag)
				if err != nil {
					return err
				}
				if st.Tag != 100+i || st.Count != sz || !bytes.Equal(buf[:sz], pattern(sz, i)) {
					return fmt.Errorf("ordering: message %d arrived as tag %d count %d", i, st.Tag, st.Count)
				}
			}
		}
	}
	// Windows of nonblocking messages both ways between ranks 0 and 1, from
	// two goroutines each, with a third testing the receives: pooled
	// requests (eager and single-copy rendezvous) are reused at once.
	if n >= 2 && me <= 1 {
		if err := mpitest.Windows(w, 1-me, 1000, 20, 8, []int{20 << 10, 1, 70 << 10, 9000, 300}); err != nil {
			return fmt.Errorf("windows: %w", err)
		}
	}
	// A ring of persistent requests started round after round (each round
	// carries what the buffer held at Start), then SendrecvReplace around
	// the same ring, eager and rendezvous.
	if n >= 2 {
		if err := ring(w); err != nil {
			return err
		}
	}
	// A matrix column (derived datatype) from rank 0 to the last rank.
	const dim = 512
	col, err := convertor.Vector(dim, 1, dim, convertor.Float64)
	if err != nil {
		return err
	}
	if col, err = col.Commit(); err != nil {
		return err
	}
	last := n - 1
	if last > 0 && (me == 0 || me == last) {
		if me == 0 {
			m := make([]float64, dim*dim)
			for i := range m {
				m[i] = float64(i)
			}
			if err := w.Send(mpi.Typed(m[3:], 1, col), last, 9); err != nil {
				return err
			}
		} else {
			got := make([]float64, dim)
			st, err := w.Recv(got, 0, 9)
			if err != nil {
				return err
			}
			if st.Elements(convertor.Float64) != dim {
				return fmt.Errorf("column: %d elements", st.Elements(convertor.Float64))
			}
			for i := range got {
				if got[i] != float64(i*dim+3) {
					return fmt.Errorf("column element %d = %v", i, got[i])
				}
			}
		}
	}
	// Derived datatypes both ways between rank 0 and the last rank.
	if last > 0 && (me == 0 || me == last) {
		if err := runTypes(w, 0, last); err != nil {
			return fmt.Errorf("datatypes 0->%d: %w", last, err)
		}
		if err := runTypes(w, last, 0); err != nil {
			return fmt.Errorf("datatypes %d->0: %w", last, err)
		}
	}
	// AnySource: everyone sends its rank to rank 0.
	if me != 0 {
		return w.Send([]int64{int64(me)}, 0, 50)
	}
	seen := map[int64]bool{}
	for i := 1; i < n; i++ {
		v := []int64{0}
		st, err := w.Recv(v, mpi.AnySource, 50)
		if err != nil {
			return err
		}
		if int64(st.Source) != v[0] || seen[v[0]] {
			return fmt.Errorf("AnySource: got %d from %d", v[0], st.Source)
		}
		seen[v[0]] = true
	}
	return nil
}

// ring passes buffers around the ranks with persistent requests and with
// SendrecvReplace, checking every byte of every round.
func ring(w *mpi.Comm) error {
	me, n := w.Rank(), w.Size()
	right, left := (me+1)%n, (me+n-1)%n
	for _, size := range []int{100, 300000} {
		out, in := make([]byte, size), make([]byte, size)
		send, err := w.SendInit(out, right, 60)
		if err != nil {
			return err
		}
		recv, err := w.RecvInit(in, left, 60)
		if err != nil {
			return err
		}
		for round := range 5 {
			copy(out, pattern(size, 1000*round+me))
			if err := mpi.Startall([]*mpi.Persistent{recv, send}); err != nil {
				return fmt.Errorf("persistent ring, %d B, round %d: %w", size, round, err)
			}
			if _, err := mpi.Waitall([]*mpi.Request{recv.Request(), send.Request()}); err != nil {
				return fmt.Errorf("persistent ring, %d B, round %d: %w", size, round, err)
			}
			if !bytes.Equal(in, pattern(size, 1000*round+left)) {
				return fmt.Errorf("persistent ring, %d B, round %d: wrong data", size, round)
			}
		}
		buf := pattern(size, 7000+me)
		st, err := w.SendrecvReplace(buf, right, 61, left, 61)
		if err != nil {
			return fmt.Errorf("SendrecvReplace ring, %d B: %w", size, err)
		}
		if st.Source != left || st.Count != size || !bytes.Equal(buf, pattern(size, 7000+left)) {
			return fmt.Errorf("SendrecvReplace ring, %d B: wrong data or status %+v", size, st)
		}
	}
	return nil
}
