package mpi_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
	"github.com/stretchr/testify/require"
)

// bufCase is one buffer type of the contract's Buffers list.
type bufCase struct {
	name  string
	dt    convertor.Datatype // the matching predefined datatype
	make  func(n int, seed int) any
	zero  func(n int) any
	equal func(a, b any) bool
}

type real interface {
	~int8 | ~int16 | ~int32 | ~int64 | ~int | ~uint8 | ~uint16 | ~uint32 | ~uint64 | ~uint | ~float32 | ~float64
}

func realCase[T real](name string, dt convertor.Datatype) bufCase {
	return bufCase{
		name: name, dt: dt,
		make: func(n, seed int) any {
			s := make([]T, n)
			for i := range s {
				s[i] = T(i*2654435761 + seed*97 + 1)
			}
			return s
		},
		zero:  func(n int) any { return make([]T, n) },
		equal: func(a, b any) bool { return slices.Equal(a.([]T), b.([]T)) },
	}
}

func complexCase[T complex64 | complex128](name string, dt convertor.Datatype) bufCase {
	return bufCase{
		name: name, dt: dt,
		make: func(n, seed int) any {
			s := make([]T, n)
			for i := range s {
				s[i] = T(complex(float64(i+seed), -float64(i*3+seed)))
			}
			return s
		},
		zero:  func(n int) any { return make([]T, n) },
		equal: func(a, b any) bool { return slices.Equal(a.([]T), b.([]T)) },
	}
}

var bufCases = []bufCase{
	realCase[byte]("[]byte", convertor.Byte),
	realCase[int8]("[]int8", convertor.Int8),
	realCase[int16]("[]int16", convertor.Int16),
	realCase[int32]("[]int32", convertor.Int32),
	realCase[int64]("[]int64", convertor.Int64),
	realCase[int]("[]int", convertor.Int64),
	realCase[uint16]("[]uint16", convertor.Uint16),
	realCase[uint32]("[]uint32", convertor.Uint32),
	realCase[uint64]("[]uint64", convertor.Uint64),
	realCase[uint]("[]uint", convertor.Uint64),
	realCase[float32]("[]float32", convertor.Float32),
	realCase[float64]("[]float64", convertor.Float64),
	complexCase[complex64]("[]complex64", convertor.Complex64),
	complexCase[complex128]("[]complex128", convertor.Complex128),
}

// Every buffer type of the contract travels intact, at eager and
// rendezvous sizes, with the right status.
func TestSendRecvBufferTypes(t *testing.T) {
	for _, bc := range bufCases {
		t.Run(bc.name, func(t *testing.T) {
			t.Parallel()
			mustRun(t, 2, func(w *mpi.Comm) error {
				for k, n := range []int{0, 1, 5, 3000, 40000} {
					if w.Rank() == 0 {
						if err := w.Send(bc.make(n, k), 1, k); err != nil {
							return err
						}
						continue
					}
					got := bc.zero(n)
					st, err := w.Recv(got, 0, k)
					if err != nil {
						return err
					}
					if !bc.equal(got, bc.make(n, k)) {
						return fmt.Errorf("%d elements: the received values differ", n)
					}
					if st.Source != 0 || st.Tag != k || st.Count != n*bc.dt.Size() || st.Cancelled {
						return fmt.Errorf("%d elements: status %+v, want source 0 tag %d count %d", n, st, k, n*bc.dt.Size())
					}
					if e := st.Elements(bc.dt); e != n {
						return fmt.Errorf("%d elements: Status.Elements = %d", n, e)
					}
				}
				return nil
			})
		})
	}
}

// The message is the bytes of the slice: what is sent as one type can be
// received as another.
func TestSendRecvAcrossTypes(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		vals := []uint32{1, 0xdeadbeef, 7, 1 << 31}
		if w.Rank() == 0 {
			if err := w.Send(vals, 1, 0); err != nil {
				return err
			}
			return w.Send([]float64{1.5, -2.25}, 1, 1)
		}
		got := make([]byte, 16)
		st, err := w.Recv(got, 0, 0)
		if err != nil {
			return err
		}
		want := make([]byte, 0, 16)
		for _, v := range vals {
			want = binary.NativeEndian.AppendUint32(want, v)
		}
		if err := checkBytes("[]uint32 as []byte", got[:st.Count], want); err != nil {
			return err
		}
		u := make([]uint64, 2)
		if _, err := w.Recv(u, 0, 1); err != nil {
			return err
		}
		if u[0] != 0x3ff8000000000000 || u[1] != 0xc002000000000000 {
			return fmt.Errorf("[]float64 as []uint64: got %#x", u)
		}
		return nil
	})
}

// nil and zero-length buffers make empty messages, in every send mode.
func TestEmptyMessages(t *testing.T) {
	bytesT := mustType(convertor.Contiguous(4, convertor.Byte))
	empties := []namedBuf{
		{"nil", nil},
		{"[]byte{}", []byte{}},
		{"[]byte(nil)", []byte(nil)},
		{"[]float64{}", []float64{}},
		{"[]complex128{}", []complex128{}},
		{"Typed count 0", mpi.Typed(make([]byte, 8), 0, bytesT)},
		{"Typed nil", mpi.Typed([]int32(nil), 0, convertor.Int32)},
	}
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		emptyMessages(t, empties, opts)
	})
}

type namedBuf struct {
	name string
	buf  any
}

func emptyMessages(t *testing.T, empties []namedBuf, opts []mpi.Option) {
	j := newJob()
	posted := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		for _, e := range empties {
			name, buf := e.name, e.buf
			if w.Rank() == 0 {
				if err := j.wait(posted); err != nil {
					return err
				}
				sends := []func() error{
					func() error { return w.Send(buf, 1, 1) },
					func() error { return w.Ssend(buf, 1, 2) },
					func() error { return w.Rsend(buf, 1, 3) },
					func() error {
						r, err := w.Isend(buf, 1, 4)
						if err != nil {
							return err
						}
						_, err = r.Wait()
						return err
					},
				}
				for _, send := range sends {
					if err := send(); err != nil {
						return fmt.Errorf("%s: %v", name, err)
					}
				}
				continue
			}
			var reqs []*mpi.Request
			for tag := 1; tag <= 4; tag++ {
				r, err := w.Irecv(buf, 0, tag)
				if err != nil {
					return fmt.Errorf("%s: %v", name, err)
				}
				reqs = append(reqs, r)
			}
			if err := j.signal(posted); err != nil {
				return err
			}
			sts, err := mpi.Waitall(reqs)
			if err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			for i, st := range sts {
				if st.Count != 0 || st.Source != 0 || st.Tag != i+1 {
					return fmt.Errorf("%s: status %+v, want count 0 source 0 tag %d", name, st, i+1)
				}
			}
		}
		return nil
	}, opts...)
}

// A non-empty message into an empty (nil) buffer is truncated to nothing.
func TestRecvNilBufferTruncates(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := w.Send([]byte("abc"), 1, 0); err != nil {
				return err
			}
			return w.Send([]byte("def"), 1, 0)
		}
		st, err := w.Recv(nil, 0, 0)
		if !errors.Is(err, mpi.ErrTruncate) || st.Count != 0 {
			return fmt.Errorf("3 bytes into nil: status %+v, error %v; want count 0 and ErrTruncate", st, err)
		}
		got := make([]byte, 3)
		if _, err := w.Recv(got, 0, 0); err != nil || string(got) != "def" {
			return fmt.Errorf("next message: %q, %v", got, err)
		}
		return nil
	})
}

// TagUB is a valid tag.
func TestTagUB(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			return w.Send([]byte{42}, 1, mpi.TagUB)
		}
		got := make([]byte, 1)
		st, err := w.Recv(got, 0, mpi.TagUB)
		if err != nil || st.Tag != mpi.TagUB || got[0] != 42 {
			return fmt.Errorf("tag TagUB: status %+v, data %v, error %v", st, got, err)
		}
		return nil
	})
}

// Ssend returns only after the matching receive started; the receiver
// posts it only once it saw the message arrive (Probe) and rank 0 had
// every chance to return early.
func TestSsendWaitsForReceive(t *testing.T) {
	for _, size := range []int{0, 8, 5000, 300000} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			t.Parallel()
			var returned, posted atomic.Bool
			mustRun(t, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					if err := w.Ssend(pattern(size, 1), 1, 3); err != nil {
						return err
					}
					returned.Store(true)
					if !posted.Load() {
						return errors.New("Ssend returned before the receive was posted")
					}
					return nil
				}
				if _, err := w.Probe(0, 3); err != nil {
					return err
				}
				for range 2000 {
					runtime.Gosched()
				}
				if returned.Load() {
					return errors.New("Ssend returned while the receiver had only probed")
				}
				posted.Store(true)
				got := make([]byte, size)
				if _, err := w.Recv(got, 0, 3); err != nil {
					return err
				}
				return checkBytes("Ssend data", got, expected(size, 1))
			})
		})
	}
}

// An Issend request is not complete before the receive is posted, and
// completes after.
func TestIssendCompletesAfterMatch(t *testing.T) {
	for _, size := range []int{0, 8, 5000, 300000} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			t.Parallel()
			j := newJob()
			mayPost := make(chan struct{})
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					r, err := w.Issend(pattern(size, 2), 1, 0)
					if err != nil {
						return err
					}
					for range 10 {
						if _, done, err := r.Test(); err != nil || done {
							return fmt.Errorf("Issend complete (err %v) before the receive was posted", err)
						}
						runtime.Gosched()
					}
					close(mayPost)
					st, err := r.Wait()
					if err != nil {
						return err
					}
					if st.Count != size {
						return fmt.Errorf("Issend status %+v, want count %d", st, size)
					}
					return nil
				}
				if err := j.wait(mayPost); err != nil {
					return err
				}
				got := make([]byte, size)
				if _, err := w.Recv(got, 0, 0); err != nil {
					return err
				}
				return checkBytes("Issend data", got, expected(size, 2))
			})
		})
	}
}

// Ready mode: the receive is posted before the send starts.
func TestRsend(t *testing.T) {
	sizes := []int{0, 100, 5000, 300000}
	j := newJob()
	posted := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			if err := j.wait(posted); err != nil {
				return err
			}
			var reqs []*mpi.Request
			for i, n := range sizes {
				if i%2 == 0 {
					if err := w.Rsend(pattern(n, uint64(i)), 1, i); err != nil {
						return err
					}
					continue
				}
				r, err := w.Irsend(pattern(n, uint64(i)), 1, i)
				if err != nil {
					return err
				}
				reqs = append(reqs, r)
			}
			_, err := mpi.Waitall(reqs)
			return err
		}
		bufs := make([][]byte, len(sizes))
		reqs := make([]*mpi.Request, len(sizes))
		for i, n := range sizes {
			bufs[i] = make([]byte, n)
			var err error
			if reqs[i], err = w.Irecv(bufs[i], 0, i); err != nil {
				return err
			}
		}
		close(posted)
		if _, err := mpi.Waitall(reqs); err != nil {
			return err
		}
		for i, n := range sizes {
			if err := checkBytes(fmt.Sprintf("Rsend of %d bytes", n), bufs[i], expected(n, uint64(i))); err != nil {
				return err
			}
		}
		return nil
	})
}

// Receives with AnySource and/or AnyTag report the actual source and tag.
func TestRecvWildcards(t *testing.T) {
	const n = 4
	msg := func(src, tag int) []byte { return []byte(fmt.Sprintf("from %d tag %d", src, tag)) }
	j := newJob()
	sent := make(chan struct{}, n)
	mustRunJob(t, j, n, func(w *mpi.Comm) error {
		me := w.Rank()
		if me != 0 {
			for _, tag := range []int{10 + me, 20 + me, 30 + me} {
				if err := w.Send(msg(me, tag), 0, tag); err != nil {
					return err
				}
			}
			sent <- struct{}{}
			return nil
		}
		for range n - 1 {
			if _, err := recvFrom(j, sent); err != nil {
				return err
			}
		}
		buf := make([]byte, 64)
		check := func(src, tag, wantSrc, wantTag int) error {
			st, err := w.Recv(buf, src, tag)
			if err != nil {
				return err
			}
			if (wantSrc >= 0 && st.Source != wantSrc) || (wantTag >= 0 && st.Tag != wantTag) {
				return fmt.Errorf("Recv(%d, %d): source %d tag %d, want %d %d", src, tag, st.Source, st.Tag, wantSrc, wantTag)
			}
			if got, want := buf[:st.Count], msg(st.Source, st.Tag); !bytes.Equal(got, want) {
				return fmt.Errorf("Recv(%d, %d): status says source %d tag %d but the data is %q", src, tag, st.Source, st.Tag, got)
			}
			return nil
		}
		// A specific tag from any source; any tag from a specific source
		// (the earliest: non-overtaking); then all the rest.
		if err := check(mpi.AnySource, 22, 2, 22); err != nil {
			return err
		}
		if err := check(3, mpi.AnyTag, 3, 13); err != nil {
			return err
		}
		for range 3*(n-1) - 2 {
			if err := check(mpi.AnySource, mpi.AnyTag, -1, -1); err != nil {
				return err
			}
		}
		if _, ok, err := w.Iprobe(mpi.AnySource, mpi.AnyTag); err != nil || ok {
			return fmt.Errorf("messages left over (ok=%v, err=%v)", ok, err)
		}
		return nil
	})
}

// A ring exchange with Sendrecv does not deadlock, at any size, and a
// ProcNull partner makes a chain.
func TestSendrecvRing(t *testing.T) {
	const n = 5
	for _, size := range []int{16, 5000, 300000} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			t.Parallel()
			mustRun(t, n, func(w *mpi.Comm) error {
				me := w.Rank()
				right, left := (me+1)%n, (me+n-1)%n
				got := make([]byte, size)
				st, err := w.Sendrecv(pattern(size, uint64(me)), right, 7, got, left, 7)
				if err != nil {
					return err
				}
				if st.Source != left || st.Tag != 7 || st.Count != size {
					return fmt.Errorf("ring: status %+v", st)
				}
				if err := checkBytes("ring", got, expected(size, uint64(left))); err != nil {
					return err
				}
				// Chain: the ends talk to ProcNull.
				right, left = me+1, me-1
				if right == n {
					right = mpi.ProcNull
				}
				if left < 0 {
					left = mpi.ProcNull
				}
				clear(got)
				st, err = w.Sendrecv(pattern(size, uint64(100+me)), right, 8, got, left, 8)
				if err != nil {
					return err
				}
				if left == mpi.ProcNull {
					if st.Source != mpi.ProcNull || st.Count != 0 || !bytes.Equal(got, make([]byte, size)) {
						return fmt.Errorf("chain end: status %+v or buffer changed", st)
					}
					return nil
				}
				return checkBytes("chain", got, expected(size, uint64(100+left)))
			})
		})
	}
}

// SendrecvReplace passes a ring's values on in place, eager and
// rendezvous, in a plain slice and in a strided datatype (the elements
// between the strides stay as they were), and a ProcNull partner sends or
// receives nothing.
func TestSendrecvReplaceRing(t *testing.T) {
	const n = 4
	vec, err := convertor.Vector(1, 1, 2, convertor.Float64)
	require.NoError(t, err)
	vec, err = convertor.Resized(vec, 0, 16)
	require.NoError(t, err)
	vec, err = vec.Commit()
	require.NoError(t, err)
	for _, count := range []int{2, 700, 40000} {
		t.Run(fmt.Sprintf("count=%d", count), func(t *testing.T) {
			t.Parallel()
			mustRun(t, n, func(w *mpi.Comm) error {
				me := w.Rank()
				right, left := (me+1)%n, (me+n-1)%n
				val := func(rank, i int) float64 { return float64(rank*1000000 + i) }
				buf := make([]float64, count)
				for i := range buf {
					buf[i] = val(me, i)
				}
				st, err := w.SendrecvReplace(buf, right, 3, left, 3)
				if err != nil {
					return err
				}
				if st.Source != left || st.Count != 8*count {
					return fmt.Errorf("plain: status %+v", st)
				}
				for i, v := range buf {
					if v != val(left, i) {
						return fmt.Errorf("plain: buf[%d] = %v, want %v", i, v, val(left, i))
					}
				}
				// Every other element: the even ones travel, the odd stay.
				strided := make([]float64, 2*count)
				for i := range strided {
					strided[i] = val(me, i)
				}
				st, err = w.SendrecvReplace(mpi.Typed(strided, count, vec), right, 4, left, 4)
				if err != nil {
					return err
				}
				if st.Count != 8*count {
					return fmt.Errorf("strided: status %+v", st)
				}
				for i, v := range strided {
					want := val(me, i)
					if i%2 == 0 {
						want = val(left, i)
					}
					if v != want {
						return fmt.Errorf("strided: element %d = %v, want %v", i, v, want)
					}
				}
				// A chain: rank 0 receives nothing, the last rank sends nothing.
				right, left = me+1, me-1
				if right == n {
					right = mpi.ProcNull
				}
				if left < 0 {
					left = mpi.ProcNull
				}
				for i := range buf {
					buf[i] = val(me, i)
				}
				st, err = w.SendrecvReplace(buf, right, 5, left, 5)
				if err != nil {
					return err
				}
				from := me
				if left != mpi.ProcNull {
					from = left
				} else if st.Source != mpi.ProcNull || st.Count != 0 {
					return fmt.Errorf("chain end: status %+v", st)
				}
				for i, v := range buf {
					if v != val(from, i) {
						return fmt.Errorf("chain: buf[%d] = %v, want %v", i, v, val(from, i))
					}
				}
				return nil
			})
		})
	}
}

// Sendrecv refuses contiguous send and receive buffers that share memory
// (ErrBuffer, and nothing is sent), and takes disjoint parts of one slice,
// contiguous or strided, as a halo exchange passes them.
func TestSendrecvOverlap(t *testing.T) {
	col := func(n int) convertor.Datatype {
		v, err := convertor.Vector(n, 1, n, convertor.Float64)
		require.NoError(t, err)
		v, err = v.Commit()
		require.NoError(t, err)
		return v
	}
	mustRun(t, 2, func(w *mpi.Comm) error {
		peer := 1 - w.Rank()
		x := make([]float64, 8)
		for _, c := range []struct {
			name       string
			send, recv any
		}{
			{"same slice", x, x},
			{"overlapping parts", x[:5], x[4:]},
			{"typed over the same bytes", mpi.Typed(x, 4, convertor.Float64), x[3:4]},
		} {
			_, err := w.Sendrecv(c.send, peer, 1, c.recv, peer, 1)
			if !errors.Is(err, mpi.ErrBuffer) {
				return fmt.Errorf("%s: err = %v, want ErrBuffer", c.name, err)
			}
		}
		if err := w.Barrier(); err != nil {
			return err
		}
		if _, ok, err := w.Iprobe(mpi.AnySource, 1); err != nil || ok {
			return fmt.Errorf("a refused Sendrecv sent a message (ok=%v, err=%v)", ok, err)
		}
		// Disjoint halves, then the first and last columns of a 4x4 matrix.
		for i := range x {
			x[i] = float64(10*w.Rank() + i)
		}
		if _, err := w.Sendrecv(x[:4], peer, 2, x[4:], peer, 2); err != nil {
			return err
		}
		for i := 4; i < 8; i++ {
			if want := float64(10*peer + i - 4); x[i] != want {
				return fmt.Errorf("halves: x[%d] = %v, want %v", i, x[i], want)
			}
		}
		m := make([]float64, 16)
		for i := range m {
			m[i] = float64(100*w.Rank() + i)
		}
		if _, err := w.Sendrecv(mpi.Typed(m, 1, col(4)), peer, 3, mpi.Typed(m[3:], 1, col(4)), peer, 3); err != nil {
			return err
		}
		for r := range 4 {
			if got, want := m[4*r+3], float64(100*peer+4*r); got != want {
				return fmt.Errorf("column: m[%d] = %v, want %v", 4*r+3, got, want)
			}
		}
		return nil
	})
}

// Probe and Iprobe describe a message and leave it to be received.
func TestProbeLeavesMessage(t *testing.T) {
	for _, size := range []int{100, 300000} {
		t.Run(fmt.Sprintf("size=%d", size), func(t *testing.T) {
			t.Parallel()
			j := newJob()
			maySend := make(chan struct{})
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					if err := j.wait(maySend); err != nil {
						return err
					}
					return w.Send(pattern(size, 9), 1, 3)
				}
				if _, ok, err := w.Iprobe(0, 3); err != nil || ok {
					return fmt.Errorf("Iprobe before any send: ok=%v err=%v", ok, err)
				}
				close(maySend)
				want := mpi.Status{Source: 0, Tag: 3, Count: size}
				st, err := w.Probe(0, 3)
				if err != nil || st != want {
					return fmt.Errorf("Probe: %+v, %v; want %+v", st, err, want)
				}
				for _, p := range [][2]int{{0, 3}, {mpi.AnySource, 3}, {0, mpi.AnyTag}, {mpi.AnySource, mpi.AnyTag}} {
					st, ok, err := w.Iprobe(p[0], p[1])
					if err != nil || !ok || st != want {
						return fmt.Errorf("Iprobe(%d, %d) after Probe: %+v, %v, %v; want %+v", p[0], p[1], st, ok, err, want)
					}
				}
				if _, ok, _ := w.Iprobe(0, 4); ok {
					return errors.New("Iprobe(0, 4) matched a tag-3 message")
				}
				st, err = w.Probe(mpi.AnySource, mpi.AnyTag)
				if err != nil || st != want {
					return fmt.Errorf("second Probe: %+v, %v", st, err)
				}
				got := make([]byte, size)
				if st, err = w.Recv(got, 0, 3); err != nil || st != want {
					return fmt.Errorf("Recv after probes: %+v, %v", st, err)
				}
				if _, ok, err := w.Iprobe(mpi.AnySource, mpi.AnyTag); err != nil || ok {
					return fmt.Errorf("Iprobe after the receive: ok=%v err=%v", ok, err)
				}
				return checkBytes("probed message", got, expected(size, 9))
			})
		})
	}
}

// Mprobe and Improbe take the message out of matching: only the Message
// can receive it.
func TestMatchedProbe(t *testing.T) {
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		for _, sizes := range [][3]int{{10, 20, 30}, {5000, 300000, 70000}} {
			j := newJob()
			maySend, sent := make(chan struct{}), make(chan struct{})
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					if err := j.wait(maySend); err != nil {
						return err
					}
					var reqs []*mpi.Request
					for i, n := range sizes {
						r, err := w.Isend(pattern(n, uint64(i)), 1, 1)
						if err != nil {
							return err
						}
						reqs = append(reqs, r)
					}
					close(sent)
					_, err := mpi.Waitall(reqs)
					return err
				}
				if m, _, ok, err := w.Improbe(0, 1); err != nil || ok || m != nil {
					return fmt.Errorf("Improbe before any send: %v %v %v", m, ok, err)
				}
				close(maySend)
				if err := j.wait(sent); err != nil {
					return err
				}
				mA, st, err := w.Mprobe(0, mpi.AnyTag)
				if err != nil {
					return err
				}
				if st.Source != 0 || st.Tag != 1 || st.Count != sizes[0] {
					return fmt.Errorf("Mprobe status %+v, want count %d", st, sizes[0])
				}
				// The first message is gone from matching: probes and
				// receives see the second.
				if st, ok, err := w.Iprobe(0, 1); err != nil || !ok || st.Count != sizes[1] {
					return fmt.Errorf("Iprobe after Mprobe: %+v %v %v, want count %d", st, ok, err, sizes[1])
				}
				mB, st, ok, err := w.Improbe(mpi.AnySource, mpi.AnyTag)
				if err != nil || !ok || st.Count != sizes[1] {
					return fmt.Errorf("Improbe: %+v %v %v, want count %d", st, ok, err, sizes[1])
				}
				gotC := make([]byte, sizes[2])
				if st, err := w.Recv(gotC, 0, 1); err != nil || st.Count != sizes[2] {
					return fmt.Errorf("Recv after two matched probes: %+v %v, want the third message", st, err)
				}
				if err := checkBytes("third message", gotC, expected(sizes[2], 2)); err != nil {
					return err
				}
				gotB := make([]byte, sizes[1])
				rB, err := mB.Irecv(gotB)
				if err != nil {
					return err
				}
				gotA := make([]byte, sizes[0])
				if st, err := mA.Recv(gotA); err != nil || st.Count != sizes[0] || st.Source != 0 || st.Tag != 1 {
					return fmt.Errorf("Message.Recv: %+v %v", st, err)
				}
				if st, err := rB.Wait(); err != nil || st.Count != sizes[1] {
					return fmt.Errorf("Message.Irecv: %+v %v", st, err)
				}
				if err := checkBytes("Mprobe'd message", gotA, expected(sizes[0], 0)); err != nil {
					return err
				}
				if err := checkBytes("Improbe'd message", gotB, expected(sizes[1], 1)); err != nil {
					return err
				}
				// A Message is received exactly once.
				if _, err := mA.Recv(gotA); err == nil {
					return errors.New("a second Message.Recv succeeded")
				}
				return nil
			}, opts...)
		}
	})
}

// A matched probe's message can be truncated like any receive.
func TestMatchedProbeTruncate(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			return w.Send(pattern(5000, 4), 1, 0)
		}
		m, _, err := w.Mprobe(0, 0)
		if err != nil {
			return err
		}
		got := make([]byte, 1000)
		st, err := m.Recv(got)
		if !errors.Is(err, mpi.ErrTruncate) || st.Count != 1000 {
			return fmt.Errorf("Message.Recv into 1000 of 5000 bytes: %+v, %v", st, err)
		}
		return checkBytes("truncated prefix", got, expected(5000, 4)[:1000])
	})
}

// Messages between a pair with the same tag arrive in the order sent, at
// any mix of eager and rendezvous sizes, with and without receives posted
// first.
func TestNonOvertaking(t *testing.T) {
	sizes := []int{0, 7, 900, 1100, 5000, 70000, 200000, 16, 300}
	const count = 90
	size := func(i int) int { return sizes[i%len(sizes)] }
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		// The receive: Recv after the message was sent, Irecv and Wait
		// after Probe found it queued, or Irecv posted before the send.
		for _, recv := range []string{"recv", "probed", "preposted"} {
			preposted := recv == "preposted"
			j := newJob()
			ready := make(chan struct{})
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					if preposted {
						if err := j.wait(ready); err != nil {
							return err
						}
					}
					var reqs []*mpi.Request
					for i := range count {
						buf := pattern(size(i), uint64(i))
						var r *mpi.Request
						var err error
						switch i % 3 {
						case 0:
							r, err = w.Isend(buf, 1, 5)
						case 1:
							r, err = w.Issend(buf, 1, 5)
						default:
							if preposted {
								err = w.Send(buf, 1, 5)
							} else {
								r, err = w.Isend(buf, 1, 5)
							}
						}
						if err != nil {
							return err
						}
						reqs = append(reqs, r)
					}
					if !preposted {
						close(ready)
					}
					_, err := mpi.Waitall(reqs)
					return err
				}
				bufs := make([][]byte, count)
				for i := range bufs {
					bufs[i] = make([]byte, 200000)
				}
				check := func(i int, st mpi.Status) error {
					n := size(i)
					if st.Count != n || st.Tag != 5 || st.Source != 0 {
						return fmt.Errorf("receive %d: status %+v, want count %d: order broken", i, st, n)
					}
					return checkBytes(fmt.Sprintf("receive %d", i), bufs[i][:n], expected(n, uint64(i)))
				}
				if preposted {
					reqs := make([]*mpi.Request, count)
					for i := range reqs {
						var err error
						if reqs[i], err = w.Irecv(bufs[i], mpi.AnySource, mpi.AnyTag); err != nil {
							return err
						}
					}
					close(ready)
					sts, err := mpi.Waitall(reqs)
					if err != nil {
						return err
					}
					for i, st := range sts {
						if err := check(i, st); err != nil {
							return err
						}
					}
					return nil
				}
				if err := j.wait(ready); err != nil {
					return err
				}
				for i := range count {
					st, err := w.Recv(bufs[i], 0, mpi.AnyTag)
					if err != nil {
						return err
					}
					if err := check(i, st); err != nil {
						return err
					}
				}
				return nil
			}, opts...)
		}
	})
}

// ProcNull as destination or source completes at once and moves nothing.
func TestProcNull(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		buf := []byte{1, 2, 3}
		nullStatus := func(what string, st mpi.Status) error {
			if st.Source != mpi.ProcNull || st.Count != 0 || st.Cancelled {
				return fmt.Errorf("%s: status %+v, want source ProcNull and count 0", what, st)
			}
			return nil
		}
		for name, send := range map[string]func() error{
			"Send":  func() error { return w.Send(buf, mpi.ProcNull, 0) },
			"Ssend": func() error { return w.Ssend(buf, mpi.ProcNull, 0) },
			"Rsend": func() error { return w.Rsend(buf, mpi.ProcNull, 0) },
			"Bsend": func() error { return w.Bsend(buf, mpi.ProcNull, 0) },
		} {
			if err := send(); err != nil {
				return fmt.Errorf("%s to ProcNull: %v", name, err)
			}
		}
		for name, isend := range map[string]func(any, int, int) (*mpi.Request, error){
			"Isend": w.Isend, "Issend": w.Issend, "Irsend": w.Irsend, "Ibsend": w.Ibsend,
		} {
			r, err := isend(buf, mpi.ProcNull, 0)
			if err != nil {
				return fmt.Errorf("%s to ProcNull: %v", name, err)
			}
			if _, done, err := r.Test(); !done || err != nil {
				return fmt.Errorf("%s to ProcNull: not complete at once (err %v)", name, err)
			}
		}
		st, err := w.Recv(buf, mpi.ProcNull, 5)
		if err != nil {
			return err
		}
		if err := nullStatus("Recv", st); err != nil {
			return err
		}
		if !bytes.Equal(buf, []byte{1, 2, 3}) {
			return fmt.Errorf("Recv from ProcNull changed the buffer: %v", buf)
		}
		r, err := w.Irecv(buf, mpi.ProcNull, mpi.AnyTag)
		if err != nil {
			return err
		}
		st, done, err := r.Test()
		if !done || err != nil {
			return fmt.Errorf("Irecv from ProcNull: not complete at once (err %v)", err)
		}
		if err := nullStatus("Irecv", st); err != nil {
			return err
		}
		if st, err = w.Probe(mpi.ProcNull, 0); err != nil {
			return err
		}
		if err := nullStatus("Probe", st); err != nil {
			return err
		}
		st, ok, err := w.Iprobe(mpi.ProcNull, 0)
		if err != nil || !ok {
			return fmt.Errorf("Iprobe(ProcNull): ok=%v err=%v", ok, err)
		}
		if err := nullStatus("Iprobe", st); err != nil {
			return err
		}
		m, st, err := w.Mprobe(mpi.ProcNull, 0)
		if err != nil {
			return err
		}
		if err := nullStatus("Mprobe", st); err != nil {
			return err
		}
		if st, err = m.Recv(buf); err != nil {
			return err
		}
		if err := nullStatus("Message.Recv", st); err != nil {
			return err
		}
		m, _, ok, err = w.Improbe(mpi.ProcNull, 0)
		if err != nil || !ok {
			return fmt.Errorf("Improbe(ProcNull): ok=%v err=%v", ok, err)
		}
		if r, err = m.Irecv(buf); err != nil {
			return err
		}
		if st, err = r.Wait(); err != nil {
			return err
		}
		return nullStatus("Message.Irecv", st)
	})
}

// Bad arguments fail with the right error class and send nothing.
func TestBadArguments(t *testing.T) {
	notCommitted, err := convertor.Vector(2, 1, 2, convertor.Int32)
	if err != nil {
		t.Fatal(err)
	}
	mem := make([]byte, 64)
	badBufs := []struct {
		name  string
		buf   any
		class error
	}{
		{"[]string", []string{"a"}, mpi.ErrBuffer},
		{"struct", struct{ A int }{1}, mpi.ErrBuffer},
		{"*struct", &struct{ A int }{1}, mpi.ErrBuffer},
		{"string", "abc", mpi.ErrBuffer},
		{"int", 5, mpi.ErrBuffer},
		{"[4]byte", [4]byte{}, mpi.ErrBuffer},
		{"*[]byte", &mem, mpi.ErrBuffer},
		{"[]bool", []bool{true}, mpi.ErrBuffer},
		{"[]any", []any{1}, mpi.ErrBuffer},
		{"map", map[int]int{}, mpi.ErrBuffer},
		{"Typed over []string", mpi.Typed([]string{"a", "b"}, 1, convertor.Byte), mpi.ErrBuffer},
		{"Typed over a struct", mpi.Typed(struct{ A [8]byte }{}, 1, convertor.Byte), mpi.ErrBuffer},
		{"Typed over nil", mpi.Typed(nil, 1, convertor.Byte), mpi.ErrBuffer},
		{"Typed uncommitted", mpi.Typed(mem, 1, notCommitted), mpi.ErrType},
		{"Typed zero Datatype", mpi.Typed(mem, 1, convertor.Datatype{}), mpi.ErrType},
		{"Typed count too large", mpi.Typed(make([]int32, 3), 4, convertor.Int32), mpi.ErrCount},
		{"Typed vector past the end", mpi.Typed(make([]int32, 3), 1, mustType(convertor.Vector(2, 1, 3, convertor.Int32))), mpi.ErrCount},
		{"Typed negative count", mpi.Typed(mem, -1, convertor.Byte), mpi.ErrCount},
	}
	badArgs := []struct {
		name      string
		peer, tag int
		class     error
		sendOnly  bool // valid for receives and probes
	}{
		{"dest/source = size", 2, 0, mpi.ErrRank, false},
		{"dest/source = -3", -3, 0, mpi.ErrRank, false},
		{"dest/source = 1<<40", 1 << 40, 0, mpi.ErrRank, false},
		{"dest = AnySource", mpi.AnySource, 0, mpi.ErrRank, true},
		{"tag = -2", 0, -2, mpi.ErrTag, false},
		{"tag = TagUB+1", 0, mpi.TagUB + 1, mpi.ErrTag, false},
		{"tag = 1<<40", 0, 1 << 40, mpi.ErrTag, false},
		{"send tag = AnyTag", 0, mpi.AnyTag, mpi.ErrTag, true},
	}
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() != 0 {
			return nil
		}
		var errs []error
		check := func(what string, err, class error) {
			if err := wantErr(what, err, class); err != nil {
				errs = append(errs, err)
			}
		}
		sends := map[string]func(buf any, dest, tag int) error{
			"Send":   w.Send,
			"Ssend":  w.Ssend,
			"Rsend":  w.Rsend,
			"Isend":  func(b any, d, t int) error { _, err := w.Isend(b, d, t); return err },
			"Issend": func(b any, d, t int) error { _, err := w.Issend(b, d, t); return err },
			"Irsend": func(b any, d, t int) error { _, err := w.Irsend(b, d, t); return err },
			"Sendrecv(send side)": func(b any, d, t int) error {
				_, err := w.Sendrecv(b, d, t, nil, mpi.ProcNull, 0)
				return err
			},
		}
		recvs := map[string]func(buf any, src, tag int) error{
			"Recv":  func(b any, s, t int) error { _, err := w.Recv(b, s, t); return err },
			"Irecv": func(b any, s, t int) error { _, err := w.Irecv(b, s, t); return err },
			"Sendrecv(receive side)": func(b any, s, t int) error {
				_, err := w.Sendrecv(nil, mpi.ProcNull, 0, b, s, t)
				return err
			},
		}
		probes := map[string]func(src, tag int) error{
			"Probe":   func(s, t int) error { _, err := w.Probe(s, t); return err },
			"Iprobe":  func(s, t int) error { _, _, err := w.Iprobe(s, t); return err },
			"Mprobe":  func(s, t int) error { _, _, err := w.Mprobe(s, t); return err },
			"Improbe": func(s, t int) error { _, _, _, err := w.Improbe(s, t); return err },
		}
		for name, send := range sends {
			for _, b := range badBufs {
				check(name+" with "+b.name, send(b.buf, 1, 0), b.class)
			}
			for _, a := range badArgs {
				check(name+" with "+a.name, send([]byte{1}, a.peer, a.tag), a.class)
			}
		}
		// Bsend and Ibsend check their arguments before the attached
		// buffer (none is attached here: a good buffer gets ErrBuffer).
		for name, send := range map[string]func(buf any, dest, tag int) error{
			"Bsend":  w.Bsend,
			"Ibsend": func(b any, d, t int) error { _, err := w.Ibsend(b, d, t); return err },
		} {
			for _, b := range badBufs {
				check(name+" with "+b.name, send(b.buf, 1, 0), b.class)
			}
			for _, a := range badArgs {
				check(name+" with "+a.name, send([]byte{1}, a.peer, a.tag), a.class)
			}
		}
		for name, recv := range recvs {
			for _, b := range badBufs {
				check(name+" with "+b.name, recv(b.buf, 1, 0), b.class)
			}
			for _, a := range badArgs {
				if !a.sendOnly {
					check(name+" with "+a.name, recv(make([]byte, 1), a.peer, a.tag), a.class)
				}
			}
		}
		for name, probe := range probes {
			for _, a := range badArgs {
				if !a.sendOnly {
					check(name+" with "+a.name, probe(a.peer, a.tag), a.class)
				}
			}
		}
		return errors.Join(errs...)
	})
}

// A call that fails its argument checks sends nothing.
func TestBadArgumentsSendNothing(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			_ = w.Send([]string{"x"}, 1, 0)
			_ = w.Send([]byte{1}, 1, -5)
			_, _ = w.Isend(struct{}{}, 1, 0)
			return w.Send([]byte("end"), 1, 99)
		}
		got := make([]byte, 8)
		st, err := w.Recv(got, mpi.AnySource, mpi.AnyTag)
		if err != nil {
			return err
		}
		if st.Tag != 99 || string(got[:st.Count]) != "end" {
			return fmt.Errorf("a failed call sent a message: %+v %q", st, got[:st.Count])
		}
		return nil
	})
}

// Message.Recv rejects bad buffers too, and a nil Message.
func TestMessageBadArguments(t *testing.T) {
	mustRun(t, 2, func(w *mpi.Comm) error {
		if w.Rank() == 0 {
			return w.Send([]byte("hi"), 1, 0)
		}
		m, _, err := w.Mprobe(0, 0)
		if err != nil {
			return err
		}
		if _, err := m.Recv([]string{"x"}); !errors.Is(err, mpi.ErrBuffer) {
			return fmt.Errorf("Message.Recv([]string) = %v, want ErrBuffer", err)
		}
		got := make([]byte, 2)
		if _, err := m.Recv(got); err != nil || string(got) != "hi" {
			return fmt.Errorf("Message.Recv after a rejected buffer: %q %v", got, err)
		}
		var nilMsg *mpi.Message
		if _, err := nilMsg.Recv(got); err == nil {
			return errors.New("Recv on a nil Message succeeded")
		}
		return nil
	})
}

// A receive buffer that is too small keeps the message's prefix, reports
// ErrTruncate with the stored count, and the next message on the pair
// arrives intact.
func TestTruncate(t *testing.T) {
	cases := []struct{ msg, buf int }{
		{100, 40},       // eager
		{1000, 999},     // eager, one byte short
		{5000, 1000},    // rendezvous, buffer below the first chunk
		{5000, 4999},    // rendezvous, one byte short
		{300000, 70000}, // rendezvous over several fragments
		{2 << 20, 1<<20 + 3},
		{300000, 0},
	}
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		for _, preposted := range []bool{false, true} {
			j := newJob()
			ready := make(chan struct{})
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				for i, c := range cases {
					if w.Rank() == 0 {
						if !preposted {
							r1, err := w.Isend(pattern(c.msg, uint64(i)), 1, i)
							if err != nil {
								return err
							}
							r2, err := w.Isend(pattern(c.buf, uint64(i+1000)), 1, i)
							if err != nil {
								return err
							}
							if err := j.signal(ready); err != nil {
								return err
							}
							if _, err := mpi.Waitall([]*mpi.Request{r1, r2}); err != nil {
								return fmt.Errorf("sender of a truncated message: %v", err)
							}
							continue
						}
						if _, err := recvFrom(j, ready); err != nil {
							return err
						}
						if err := w.Send(pattern(c.msg, uint64(i)), 1, i); err != nil {
							return fmt.Errorf("sender of a truncated message: %v", err)
						}
						if err := w.Send(pattern(c.buf, uint64(i+1000)), 1, i); err != nil {
							return err
						}
						continue
					}
					got := bytes.Repeat([]byte{0xA5}, c.buf+8)
					var st mpi.Status
					var err error
					if preposted {
						var r *mpi.Request
						if r, err = w.Irecv(got[:c.buf], 0, i); err != nil {
							return err
						}
						if err := j.signal(ready); err != nil {
							return err
						}
						st, err = r.Wait()
					} else {
						if _, err := recvFrom(j, ready); err != nil {
							return err
						}
						st, err = w.Recv(got[:c.buf], 0, i)
					}
					if !errors.Is(err, mpi.ErrTruncate) {
						return fmt.Errorf("%d bytes into %d: error %v, want ErrTruncate", c.msg, c.buf, err)
					}
					if st.Count != c.buf || st.Source != 0 || st.Tag != i {
						return fmt.Errorf("%d bytes into %d: status %+v, want count %d", c.msg, c.buf, st, c.buf)
					}
					if err := checkBytes(fmt.Sprintf("%d bytes into %d: prefix", c.msg, c.buf), got[:c.buf], expected(c.msg, uint64(i))[:c.buf]); err != nil {
						return err
					}
					if err := checkBytes("bytes past the buffer", got[c.buf:], bytes.Repeat([]byte{0xA5}, 8)); err != nil {
						return err
					}
					next := make([]byte, c.buf)
					if st, err = w.Recv(next, 0, i); err != nil || st.Count != c.buf {
						return fmt.Errorf("message after a truncated one: %+v, %v", st, err)
					}
					if err := checkBytes("message after a truncated one", next, expected(c.buf, uint64(i+1000))); err != nil {
						return err
					}
				}
				return nil
			}, opts...)
		}
	})
}
