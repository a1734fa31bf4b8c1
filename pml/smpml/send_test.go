package smpml

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/pml"
)

// Every eager standard send from a contiguous buffer goes to sm at once,
// without a request, not only those up to pml.ImmediateMax; a forced
// protocol still goes its own way. The receiver gets the bytes either way.
func TestEagerSendWithoutRequest(t *testing.T) {
	for _, force := range []string{"", "eager"} {
		var over [][2]string
		if force != "" {
			over = append(over, [2]string{"pml_force_protocol", force})
		}
		c0, c1 := pmlPair(t, over...)
		for i, size := range []int{0, 8, pml.ImmediateMax, pml.ImmediateMax + 1, 512, 4096, 8192} {
			msg := bytes.Repeat([]byte{byte(i + 1)}, size)
			h, err := c0.IsendHandle(pml.Buffer{Bytes: msg}, 1, i, pml.Standard, nil)
			require.NoError(t, err)
			_, atOnce := h.Ready() // done within the call: no PML request behind h
			if force == "" || size <= pml.ImmediateMax {
				require.True(t, atOnce, "size %d, force %q: sent with a request", size, force)
			} else {
				require.False(t, atOnce, "size %d, forced %q: sent without a request", size, force)
				_, err := h.Wait(nil)
				require.NoError(t, err)
			}
			got := make([]byte, size+1)
			st, err := c1.Recv(pml.Buffer{Bytes: got}, 0, i)
			require.NoError(t, err)
			require.Equal(t, size, st.Count)
			require.Equal(t, msg, got[:size], "size %d", size)
		}
	}
}

// When the fast box and the fragments are full, an offered eager send is
// refused and goes the prepared way, queued behind the others: a stream
// of 4 KiB sends with nobody receiving arrives complete and in order.
func TestEagerSendRefusedKeepsOrder(t *testing.T) {
	c0, c1 := pmlPair(t)
	const n, size = 200, 4 << 10
	var pending []*pml.Handle
	for i := range n {
		msg := bytes.Repeat([]byte{byte(i)}, size)
		h, err := c0.IsendHandle(pml.Buffer{Bytes: msg}, 1, 7, pml.Standard, nil)
		require.NoError(t, err)
		if _, atOnce := h.Ready(); !atOnce {
			pending = append(pending, h)
		}
	}
	require.NotEmpty(t, pending, "every send was taken at once: the test did not fill the transport")
	// The sender's queue moves when its side polls: waiting on its
	// requests does (pmlPair starts no background pollers).
	sent := make(chan error, 1)
	go func() {
		for _, h := range pending {
			if _, err := h.Wait(nil); err != nil {
				sent <- err
				return
			}
		}
		sent <- nil
	}()
	got := make([]byte, size)
	for i := range n {
		st, err := c1.Recv(pml.Buffer{Bytes: got}, 0, 7)
		require.NoError(t, err)
		require.Equal(t, size, st.Count)
		require.Equal(t, bytes.Repeat([]byte{byte(i)}, size), got, "message %d", i)
	}
	require.NoError(t, <-sent)
}
