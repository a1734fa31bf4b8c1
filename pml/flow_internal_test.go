package pml

import (
	"encoding/binary"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// heldFrom returns what rank src has in c's unexpected queue: messages
// with data and their bytes, and announcements without data.
func heldFrom(c *Comm, src int) (msgs, bytes, bare int, counted uint16) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	for f := c.m.uSrc[src].head; f != nil; f = f.srcNext {
		if f.holdsData() {
			msgs++
			bytes += len(f.data)
		} else {
			bare++
		}
	}
	return msgs, bytes, bare, c.seqs[src].held
}

// awaitCond polls cond until it holds, failing the test after 10 s.
func awaitCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// Three senders flood a receiver that posts nothing: each gets
// pml_unexpected_window messages with data into its unexpected queue,
// then its next blocking Send waits as a bare announcement (or, for
// Isends, every further message is one). Once the receiver receives,
// every message arrives, in order, and the queue never holds more than
// the window per sender.
func TestFlowWindowBoundsUnexpected(t *testing.T) {
	for _, nonblocking := range []bool{false, true} {
		t.Run("nonblocking="+strconv.FormatBool(nonblocking), func(t *testing.T) {
			const window, n, size = 64, 1000, 100
			cs := selfComms(t, 4, [2]string{"pml_unexpected_window", strconv.Itoa(window)})
			recv := cs[3]
			errs := make(chan error, 3)
			for s := range 3 {
				go func() {
					var reqs []*Request
					for i := range n {
						b := make([]byte, size)
						binary.LittleEndian.PutUint64(b, uint64(s<<32|i))
						if !nonblocking {
							if err := cs[s].Send(Buffer{Bytes: b}, 3, 1, Standard); err != nil {
								errs <- err
								return
							}
							continue
						}
						r, err := cs[s].isendNow(Buffer{Bytes: b}, 3, 1, Standard)
						if err != nil {
							errs <- err
							return
						}
						if r != nil {
							reqs = append(reqs, r)
						}
					}
					for _, r := range reqs {
						cs[s].e.Wait(nil, r)
						if err := r.err; err != nil {
							errs <- err
							return
						}
					}
					errs <- nil
				}()
			}
			bare := 1 // a blocking sender waits with one announcement
			if nonblocking {
				bare = n - window
			}
			for s := range 3 {
				awaitCond(t, fmt.Sprintf("sender %d's window full", s), func() bool {
					msgs, _, b, _ := heldFrom(recv, s)
					return msgs == window && b == bare
				})
				msgs, bytes, _, counted := heldFrom(recv, s)
				require.Equal(t, window, msgs, "sender %d", s)
				require.Equal(t, window*size, bytes, "sender %d", s)
				require.Equal(t, uint16(window), counted, "sender %d: held count", s)
			}
			next := [3]int{}
			b := make([]byte, size)
			for k := range 3 * n {
				st, err := recv.Recv(Buffer{Bytes: b}, AnySource, 1)
				require.NoError(t, err)
				v := binary.LittleEndian.Uint64(b)
				s, i := int(v>>32), int(uint32(v))
				require.Equal(t, st.Source, s, "message %d", k)
				require.Equal(t, next[s], i, "message %d from sender %d out of order", k, s)
				next[s]++
				if k%97 == 0 {
					for s := range 3 {
						msgs, _, _, _ := heldFrom(recv, s)
						require.LessOrEqual(t, msgs, window, "sender %d after %d receives", s, k)
					}
				}
			}
			for range 3 {
				require.NoError(t, <-errs)
			}
			for s := range 3 {
				msgs, _, bare, counted := heldFrom(recv, s)
				require.Zero(t, msgs+bare, "sender %d: left in the queue", s)
				require.Zero(t, counted, "sender %d: held count", s)
			}
		})
	}
}
