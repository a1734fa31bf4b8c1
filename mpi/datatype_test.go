package mpi_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"

	"github.com/gompi-org/gompi/convertor"
	"github.com/gompi-org/gompi/mpi"
)

// exchange runs one message from rank 0 to rank 1 in both orders: with
// the send started first (the message arrives unexpected), and with the
// receive posted first. send and recv build the buffers; check inspects
// the receive.
func exchange(t *testing.T, opts []mpi.Option, send func(order int) any, recv func(order int) (any, func(mpi.Status) error)) {
	t.Helper()
	j := newJob()
	ready := make(chan struct{})
	mustRunJob(t, j, 2, func(w *mpi.Comm) error {
		for order, postedFirst := range []bool{false, true} {
			if w.Rank() == 0 {
				if postedFirst {
					if err := j.wait(ready); err != nil {
						return err
					}
				}
				r, err := w.Isend(send(order), 1, order)
				if err != nil {
					return err
				}
				if !postedFirst {
					if err := j.signal(ready); err != nil {
						return err
					}
				}
				if _, err := r.Wait(); err != nil {
					return fmt.Errorf("sender, receive posted first=%v: %v", postedFirst, err)
				}
				continue
			}
			buf, check := recv(order)
			if !postedFirst {
				if err := j.wait(ready); err != nil {
					return err
				}
			}
			r, err := w.Irecv(buf, 0, order)
			if err != nil {
				return err
			}
			if postedFirst {
				if err := j.signal(ready); err != nil {
					return err
				}
			}
			st, err := r.Wait()
			if err != nil {
				return fmt.Errorf("receiver, receive posted first=%v: %v", postedFirst, err)
			}
			if err := check(st); err != nil {
				return fmt.Errorf("receive posted first=%v: %v", postedFirst, err)
			}
		}
		return nil
	}, opts...)
}

// A matrix column (Vector) is sent into a contiguous slice and a
// contiguous slice into a column; a Resized column type sends several
// adjacent columns.
func TestDatatypeMatrixColumn(t *testing.T) {
	shapes := []struct{ rows, cols int }{{8, 5}, {3000, 7}, {20000, 3}}
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		for _, sh := range shapes {
			rows, cols := sh.rows, sh.cols
			col := mustType(convertor.Vector(rows, 1, cols, convertor.Float64))
			colRes := mustType(convertor.Resized(col, 0, 8))
			value := func(seed, i int) float64 { return float64(seed*1e7 + i) }
			matrix := func(seed int) []float64 {
				m := make([]float64, rows*cols)
				for i := range m {
					m[i] = value(seed, i)
				}
				return m
			}
			const jcol = 1
			name := fmt.Sprintf("%dx%d", rows, cols)

			// Column -> contiguous.
			exchange(t, opts,
				func(order int) any { return mpi.Typed(matrix(order)[jcol:], 1, col) },
				func(order int) (any, func(mpi.Status) error) {
					got := make([]float64, rows)
					return got, func(st mpi.Status) error {
						if st.Count != rows*8 || st.Elements(convertor.Float64) != rows || st.Elements(col) != 1 {
							return fmt.Errorf("%s column: status %+v", name, st)
						}
						for r, v := range got {
							if want := value(order, r*cols+jcol); v != want {
								return fmt.Errorf("%s column -> contiguous: element %d = %v, want %v", name, r, v, want)
							}
						}
						return nil
					}
				})

			// Contiguous -> column; the other columns stay untouched.
			exchange(t, opts,
				func(order int) any { return matrix(order)[:rows] },
				func(order int) (any, func(mpi.Status) error) {
					m := make([]float64, rows*cols)
					for i := range m {
						m[i] = -1
					}
					return mpi.Typed(m[jcol:], 1, col), func(st mpi.Status) error {
						if st.Count != rows*8 {
							return fmt.Errorf("%s contiguous -> column: status %+v", name, st)
						}
						for i, v := range m {
							want := -1.0
							if i%cols == jcol {
								want = value(order, i/cols)
							}
							if v != want {
								return fmt.Errorf("%s contiguous -> column: matrix[%d][%d] = %v, want %v", name, i/cols, i%cols, v, want)
							}
						}
						return nil
					}
				})

			// Two adjacent columns through the resized type, into
			// columns of another matrix.
			exchange(t, opts,
				func(order int) any { return mpi.Typed(matrix(order), 2, colRes) },
				func(order int) (any, func(mpi.Status) error) {
					m := make([]float64, rows*cols)
					return mpi.Typed(m[1:], 2, colRes), func(st mpi.Status) error {
						if st.Count != 2*rows*8 || st.Elements(colRes) != 2 {
							return fmt.Errorf("%s two columns: status %+v", name, st)
						}
						for i, v := range m {
							want := 0.0
							if c := i % cols; c == 1 || c == 2 {
								want = value(order, i-1)
							}
							if v != want {
								return fmt.Errorf("%s two columns: matrix[%d][%d] = %v, want %v", name, i/cols, i%cols, v, want)
							}
						}
						return nil
					}
				})
		}
	})
}

// A record with holes, as a Go program would lay out
//
//	struct { A int32; _ [4]byte; B float64; C [3]int16; _ [2]byte }
//
// described by Struct and Resized to its 24-byte extent.
const (
	recExtent = 24
	recSize   = 4 + 8 + 6
)

var recFields = [][2]int{{0, 4}, {8, 16}, {16, 22}} // data byte ranges of one record

func recordType() convertor.Datatype {
	st := mustType(convertor.Struct([]int{1, 1, 3}, []int{0, 8, 16},
		[]convertor.Datatype{convertor.Int32, convertor.Float64, convertor.Int16}))
	return mustType(convertor.Resized(st, 0, recExtent))
}

// records returns n records with a pattern in their fields and 0xEE in
// their holes.
func records(n int, seed uint64) []byte {
	mem := bytes.Repeat([]byte{0xEE}, n*recExtent)
	for i := range n {
		base := i * recExtent
		binary.NativeEndian.PutUint32(mem[base:], uint32(seed)<<20|uint32(i))
		binary.NativeEndian.PutUint64(mem[base+8:], math.Float64bits(float64(seed)+float64(i)/8))
		for k := range 3 {
			binary.NativeEndian.PutUint16(mem[base+16+2*k:], uint16(int(seed)*31+i*3+k))
		}
	}
	return mem
}

// packed returns the data of records without the holes.
func packed(mem []byte) []byte {
	var out []byte
	for base := 0; base < len(mem); base += recExtent {
		for _, f := range recFields {
			out = append(out, mem[base+f[0]:base+f[1]]...)
		}
	}
	return out
}

// A struct with holes travels to a struct (holes untouched), to a packed
// byte slice, and from one. Larger counts run only when the smaller ones
// passed.
func TestDatatypeStructWithHoles(t *testing.T) {
	rec := recordType()
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		for _, n := range []int{3, 100, 10000} {
			seed := func(order int) uint64 { return uint64(n + order) }
			ok := true
			ok = t.Run(fmt.Sprintf("%d_records/struct_to_struct", n), func(t *testing.T) {
				exchange(t, opts,
					func(order int) any { return mpi.Typed(records(n, seed(order)), n, rec) },
					func(order int) (any, func(mpi.Status) error) {
						mem := bytes.Repeat([]byte{0x11}, n*recExtent)
						return mpi.Typed(mem, n, rec), func(st mpi.Status) error {
							if st.Count != n*recSize || st.Elements(rec) != n {
								return fmt.Errorf("status %+v, want count %d", st, n*recSize)
							}
							want := records(n, seed(order))
							for i := range mem {
								in := i % recExtent
								hole := (in >= 4 && in < 8) || in >= 22
								if hole && mem[i] != 0x11 {
									return fmt.Errorf("hole byte %d of record %d was written", in, i/recExtent)
								}
								if !hole && mem[i] != want[i] {
									return fmt.Errorf("byte %d of record %d is %#x, want %#x", in, i/recExtent, mem[i], want[i])
								}
							}
							return nil
						}
					})
			}) && ok
			ok = t.Run(fmt.Sprintf("%d_records/struct_to_packed", n), func(t *testing.T) {
				exchange(t, opts,
					func(order int) any { return mpi.Typed(records(n, seed(order)), n, rec) },
					func(order int) (any, func(mpi.Status) error) {
						got := make([]byte, n*recSize)
						return got, func(st mpi.Status) error {
							if st.Count != n*recSize {
								return fmt.Errorf("status %+v, want count %d", st, n*recSize)
							}
							return checkBytes("packed records", got, packed(records(n, seed(order))))
						}
					})
			}) && ok
			ok = t.Run(fmt.Sprintf("%d_records/packed_to_struct", n), func(t *testing.T) {
				exchange(t, opts,
					func(order int) any { return packed(records(n, seed(order))) },
					func(order int) (any, func(mpi.Status) error) {
						mem := bytes.Repeat([]byte{0xEE}, n*recExtent)
						return mpi.Typed(mem, n, rec), func(st mpi.Status) error {
							if st.Count != n*recSize {
								return fmt.Errorf("status %+v, want count %d", st, n*recSize)
							}
							return checkBytes("records", mem, records(n, seed(order)))
						}
					})
			}) && ok
			if !ok {
				break
			}
		}
	})
}

// A large non-contiguous send whose fragments end inside basic elements
// (18-byte records cut into 16352- and 4064-byte FRAGs), with the receive
// posted first.
func TestDatatypeFragmentsSplitElements(t *testing.T) {
	rec := recordType()
	const n = 10000
	for _, small := range []bool{false, true} {
		ok := t.Run(fmt.Sprintf("small_frags=%v", small), func(t *testing.T) {
			j := newJob()
			posted := make(chan struct{})
			mustRunJob(t, j, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					if err := j.wait(posted); err != nil {
						return err
					}
					return w.Send(mpi.Typed(records(n, 5), n, rec), 1, 0)
				}
				got := make([]byte, n*recSize)
				r, err := w.Irecv(got, 0, 0)
				if err != nil {
					return err
				}
				close(posted)
				if _, err := r.Wait(); err != nil {
					return err
				}
				return checkBytes("packed records", got, packed(records(n, 5)))
			}, protocolOpts("", small)...)
		})
		if !ok {
			break // a hang here leaves a spinning goroutine behind: do not add another
		}
	}
}

// Halo exchange of a 2-D grid with Subarray types: every rank of a ring
// sends the strips next to its left and right halos to its neighbours,
// which receive them into their halos.
func TestDatatypeSubarrayHalo(t *testing.T) {
	const ranks = 3
	cases := []struct {
		n, w  int // grid n×n, halo width w
		order convertor.Order
	}{
		{10, 1, convertor.RowMajor},
		{10, 2, convertor.ColMajor},
		{130, 3, convertor.RowMajor},  // ~3 KB strips: rendezvous
		{600, 40, convertor.RowMajor}, // ~166 KB strips: beyond the first chunk
		{300, 30, convertor.ColMajor},
	}
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		for _, c := range cases {
			n, hw := c.n, c.w
			// Index of (row, col) in memory, and a strip of columns
			// [col0, col0+hw) over the interior rows.
			at := func(r, col int) int {
				if c.order == convertor.RowMajor {
					return r*n + col
				}
				return col*n + r
			}
			strip := func(col0 int) convertor.Datatype {
				return mustType(convertor.Subarray([]int{n, n}, []int{n - 2*hw, hw}, []int{hw, col0}, c.order, convertor.Float64))
			}
			sendLeft, sendRight := strip(hw), strip(n-2*hw)
			recvLeft, recvRight := strip(0), strip(n-hw)
			value := func(rank, r, col int) float64 { return float64(rank*1e6 + r*1000 + col) }
			interior := func(r, col int) bool { return r >= hw && r < n-hw && col >= hw && col < n-hw }
			mustRun(t, ranks, func(w *mpi.Comm) error {
				me := w.Rank()
				left, right := (me+ranks-1)%ranks, (me+1)%ranks
				g := make([]float64, n*n)
				for r := range n {
					for col := range n {
						g[at(r, col)] = -1
						if interior(r, col) {
							g[at(r, col)] = value(me, r, col)
						}
					}
				}
				// To the right neighbour's left halo, and to the left
				// neighbour's right halo.
				if _, err := w.Sendrecv(mpi.Typed(g, 1, sendRight), right, 0, mpi.Typed(g, 1, recvLeft), left, 0); err != nil {
					return err
				}
				st, err := w.Sendrecv(mpi.Typed(g, 1, sendLeft), left, 1, mpi.Typed(g, 1, recvRight), right, 1)
				if err != nil {
					return err
				}
				if want := (n - 2*hw) * hw * 8; st.Count != want {
					return fmt.Errorf("halo strip: count %d, want %d", st.Count, want)
				}
				for r := range n {
					for col := range n {
						want := -1.0
						switch {
						case interior(r, col):
							want = value(me, r, col)
						case r < hw || r >= n-hw:
							// Corner and edge rows of the halo are not exchanged.
						case col < hw: // from the left neighbour's right strip
							want = value(left, r, col+n-2*hw)
						case col >= n-hw: // from the right neighbour's left strip
							want = value(right, r, col-n+2*hw)
						}
						if got := g[at(r, col)]; got != want {
							return fmt.Errorf("grid %d×%d halo %d (order %d), rank %d: cell (%d, %d) = %v, want %v", n, n, hw, c.order, me, r, col, got, want)
						}
					}
				}
				return nil
			}, opts...)
		}
	})
}

// A message longer than a non-contiguous receive buffer fills the buffer
// with its prefix, touches nothing else, and reports ErrTruncate with the
// bytes stored.
func TestDatatypeTruncate(t *testing.T) {
	protocolCases(t, func(t *testing.T, opts []mpi.Option) {
		for _, c := range []struct{ sent, rows int }{{100, 40}, {5000, 1000}, {40000, 30000}} {
			const cols = 3
			col := mustType(convertor.Vector(c.rows, 1, cols, convertor.Float64))
			mustRun(t, 2, func(w *mpi.Comm) error {
				if w.Rank() == 0 {
					v := make([]float64, c.sent)
					for i := range v {
						v[i] = float64(i + 1)
					}
					if err := w.Send(v, 1, 0); err != nil {
						return err
					}
					return w.Send([]float64{42}, 1, 0)
				}
				m := make([]float64, c.rows*cols)
				for i := range m {
					m[i] = -1
				}
				st, err := w.Recv(mpi.Typed(m[2:], 1, col), 0, 0)
				if !errors.Is(err, mpi.ErrTruncate) || st.Count != c.rows*8 {
					return fmt.Errorf("%d values into a %d-row column: status %+v, error %v", c.sent, c.rows, st, err)
				}
				for i, v := range m {
					want := -1.0
					if i%cols == 2 {
						want = float64(i/cols + 1)
					}
					if v != want {
						return fmt.Errorf("%d values into a %d-row column: m[%d][%d] = %v, want %v", c.sent, c.rows, i/cols, i%cols, v, want)
					}
				}
				next := make([]float64, 1)
				if _, err := w.Recv(next, 0, 0); err != nil || next[0] != 42 {
					return fmt.Errorf("message after a truncated one: %v, %v", next, err)
				}
				return nil
			}, opts...)
		}
	})
}
