package mpi_test

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"testing"

	"github.com/gompi-org/gompi/mpi"
)

// In-process ranks get small messages handed over through a ring, while
// larger ones (and those sent to a parked rank) go directly, so the two
// kinds overtake each other underneath. Every rank sends to every other
// rank a stream of messages of sizes on both sides of the ring's slot,
// blocking and nonblocking; each receiver takes them with AnySource/AnyTag
// (or probes them and receives the probed message) and checks, per
// source, that they come in the order sent (MPI's non-overtaking rule)
// with their bytes intact. GOMAXPROCS is raised so that four ranks hand
// off (a world larger than GOMAXPROCS does not), and the run is repeated
// with spinning off.
func TestInProcessSpinningKeepsOrder(t *testing.T) {
	const n, perPeer = 4, 1500
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(max(n, runtime.GOMAXPROCS(0))))
	for _, spin := range []string{"50us", "0"} {
		t.Run("spin="+spin, func(t *testing.T) {
			mustRun(t, n, func(w *mpi.Comm) error {
				me := w.Rank()
				// Flow control on a communicator of its own: a sender
				// waits for a credit from every peer each `batch`
				// rounds, so receivers run dry and wait (spinning) while
				// the next batch comes.
				credits, err := w.Dup()
				if err != nil {
					return err
				}
				const batch = 16
				errc := make(chan error, 1)
				go func() {
					// Sends in a goroutine of their own: every rank
					// receives meanwhile, so no send waits on a peer
					// that is itself stuck sending.
					buf := make([]byte, 400)
					var reqs []*mpi.Request
					credit := make([]byte, 1)
					for k := range perPeer {
						if k > 0 && k%batch == 0 {
							for range n - 1 {
								if _, err := credits.Recv(credit, mpi.AnySource, 0); err != nil {
									errc <- err
									return
								}
							}
						}
						for d := 1; d < n; d++ {
							to := (me + d) % n
							size := 4 + (k*37+to*11)%(len(buf)-4)
							binary.LittleEndian.PutUint32(buf, uint32(k))
							streamBytes(buf[4:size], me, k)
							msg := append([]byte(nil), buf[:size]...)
							if k%3 == 0 {
								r, err := w.Isend(msg, to, k%7)
								if err != nil {
									errc <- err
									return
								}
								reqs = append(reqs, r)
								continue
							}
							if err := w.Send(msg, to, k%7); err != nil {
								errc <- err
								return
							}
						}
					}
					_, err := mpi.Waitall(reqs)
					errc <- err
				}()
				next := make([]int, n)
				buf := make([]byte, 400)
				for i := range perPeer * (n - 1) {
					// Ranks spin only for receives of up to a slot
					// (btl/self): every other message is received into a
					// buffer of its own size, after a Probe (which spins).
					var st mpi.Status
					var err error
					if i%2 == 0 {
						st, err = w.Recv(buf, mpi.AnySource, mpi.AnyTag)
					} else if st, err = w.Probe(mpi.AnySource, mpi.AnyTag); err == nil {
						st, err = w.Recv(buf[:st.Count], st.Source, st.Tag)
					}
					if err != nil {
						return err
					}
					src, k := st.Source, int(binary.LittleEndian.Uint32(buf))
					if k != next[src] {
						return fmt.Errorf("rank %d: from %d message %d arrived when %d was due", me, src, k, next[src])
					}
					next[src]++
					if next[src]%batch == 0 && next[src] < perPeer {
						if err := credits.Send([]byte{1}, src, 0); err != nil {
							return err
						}
					}
					if st.Tag != k%7 {
						return fmt.Errorf("rank %d: from %d message %d has tag %d", me, src, k, st.Tag)
					}
					size := 4 + (k*37+me*11)%(len(buf)-4)
					want := make([]byte, size)
					streamBytes(want[4:size], src, k)
					if n := st.Count; n != len(want) {
						return fmt.Errorf("rank %d: from %d message %d of %d bytes, want %d", me, src, k, n, len(want))
					}
					for i := 4; i < len(want); i++ {
						if buf[i] != want[i] {
							return fmt.Errorf("rank %d: from %d message %d byte %d is %d, want %d", me, src, k, i, buf[i], want[i])
						}
					}
				}
				return <-errc
			}, mpi.WithParam("pml_wait_spin", spin))
		})
	}
}

func streamBytes(b []byte, from, k int) {
	for i := range b {
		b[i] = byte(from*31 + k*7 + i)
	}
}
