package tcp

import (
	"bytes"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
)

// FuzzHostileStream: after one good fragment, a peer that passed the
// handshake (rank 1 of a 3-rank job) sends rank 0 any bytes, then shuts
// its side. Seeds give a frame of every kind, among them a PUT into and a
// GET from rank 0's registration (id 1) and a CLOSE. Whatever the bytes,
// rank 0 does not panic, drops the connection, writes nothing outside the
// registered bytes, and still talks with rank 2. With polled, a goroutine
// calls rank 0's Progress all the while, as a PML spinning in a wait does.
func FuzzHostileStream(f *testing.F) {
	seeds := [][]byte{
		encodeFrame(frameHeader{kind: frameSend, tag: 0x41, hdrLen: 1, length: 2}, []byte("ab")),
		encodeFrame(frameHeader{kind: framePut, length: 8, reg: 1, off: 8}, []byte("12345678")),
		encodeFrame(frameHeader{kind: frameGetReq, length: 16, reg: 1, off: 4, req: 3}, nil),
		encodeFrame(frameHeader{kind: frameGetReply, length: 4, req: 3}, []byte("wxyz")),
		encodeFrame(frameHeader{kind: frameClose}, nil),
	}
	for i, s := range seeds {
		f.Add(i%2 == 0, s)
	}
	f.Add(true, bytes.Join(seeds, nil))
	f.Fuzz(func(t *testing.T, polled bool, in []byte) {
		if len(in) > 8192 { // the watcher keeps up to 1024 fragments
			in = in[:8192]
		}
		store := btltest.NewStore()
		r0 := openRank(t, store, 0, 3)
		r2 := openRank(t, store, 2, 3)
		w0, w2 := watch(r0), watch(r2)
		const guard = 32
		all := make([]byte, 64+2*guard)
		for i := range all {
			all[i] = 0xA5
		}
		_, err := r0.mods[0].Register(all[guard:guard+64:guard+64], btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		if polled {
			pollAllTheWhile(t, r0)
		}
		nc, v, err := fakePeer(t, store, testSecret)
		require.NoError(t, err)
		require.Equal(t, verdictAccept, v)
		_, err = nc.Write(encodeFrame(frameHeader{kind: frameSend, tag: 0x41, hdrLen: 2, length: 3}, []byte("hiabc")))
		require.NoError(t, err)
		require.Equal(t, []byte("\x01hiabc"), w0.recv(t))
		nc.Write(in) // rank 0 may have dropped the connection already
		nc.(*net.TCPConn).CloseWrite()
		dropped(t, nc)
		for i := range guard {
			require.Equal(t, byte(0xA5), all[i], "byte %d before the registration written", i)
			require.Equal(t, byte(0xA5), all[guard+64+i], "byte %d after the registration written", i)
		}
		// Rank 0 and rank 2 still talk (what rank 1's valid SEND frames
		// delivered is skipped).
		ep, err := r2.mods[0].AddProc(0)
		require.NoError(t, err)
		_, err = ep.Send(0x41, []byte("pong"), nil, func(err error) { require.NoError(t, err) })
		require.NoError(t, err)
		for {
			if b := w0.recv(t); b[0] == 2 {
				require.Equal(t, []byte("\x02pong"), b)
				break
			}
		}
		ep, err = r0.mods[0].AddProc(2)
		require.NoError(t, err)
		_, err = ep.Send(0x41, []byte("ping"), nil, func(err error) { require.NoError(t, err) })
		require.NoError(t, err)
		require.Equal(t, []byte("\x00ping"), w2.recv(t))
		w2.noFailure(t)
	})
}
