package btltest

import (
	"bytes"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/stretchr/testify/require"
)

// Subtests of completion: Flush, and operations refused with
// ErrWouldBlock.

// testFlushIdle: Flush on an endpoint where nothing was posted completes
// during the call.
func testFlushIdle(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	never := func(err error) { t.Errorf("Flush with nothing posted called its completion (%v)", err) }
	done, err := ep.Flush(never)
	require.NoError(t, err)
	require.True(t, done, "Flush with nothing posted must complete at once")
}

// testFlush posts bursts of Sends (of the largest size: they queue in a
// socket or a ring), Puts and Gets, then a Flush: when the Flush
// completes, every operation before it has completed (the Gets' bytes
// are in local memory), and the Flush completes once.
func testFlush(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	ep := j.ep(0, 1)
	caps := j.peers[0].Module.Caps()
	const chunk, puts = 16 << 10, 4 // per round: Puts into the first half, Gets from the second
	var target []byte
	var handle []byte
	if caps&btl.CapRDMA != 0 {
		target = make([]byte, 2*puts*chunk)
		copy(target[puts*chunk:], pattern)
		reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		defer reg.Release()
		handle = bytes.Clone(reg.Handle())
	}
	j.marker(0, 1)
	max := j.limit() - 16
	const rounds, count = 4, 48
	for round := range rounds {
		var c completions
		var gets [][]byte
		for seq := range count {
			size := max
			if seq%3 == 1 {
				size = seq
			}
			require.NoError(t, c.send(ep, TagData, dataHdr(0, round, seq, size), payload(0, round<<20|seq, size)))
			if k := seq / (count / puts); seq%(count/puts) == 0 {
				if caps&btl.CapPut != 0 {
					local := payload(1, round<<8|k, chunk)
					require.NoError(t, c.post(ep, func(cb btl.Completion) (bool, error) { return ep.Put(local, handle, k*chunk, cb) }))
				}
				if caps&btl.CapGet != 0 {
					local := make([]byte, chunk)
					gets = append(gets, local)
					require.NoError(t, c.post(ep, func(cb btl.Completion) (bool, error) {
						return ep.Get(local, handle, (puts+k)*chunk, cb)
					}))
				}
			}
		}
		var calls atomic.Int32
		left := make(chan int64, 2)
		done, err := ep.Flush(func(err error) {
			calls.Add(1)
			if err != nil {
				c.record(fmt.Errorf("Flush completed with %w", err))
			}
			left <- c.n.Load()
		})
		require.NoError(t, err, "Flush")
		if done {
			left <- c.n.Load()
		}
		select {
		case n := <-left:
			require.Zero(t, n, "round %d: Flush completed while operations before it had not", round)
		case <-time.After(Timeout):
			t.Fatalf("round %d: Flush did not complete within %v (%d operations outstanding)", round, Timeout, c.n.Load())
		}
		for k, local := range gets {
			require.True(t, bytes.Equal(local, target[(puts+k)*chunk:][:chunk]), "round %d: Get %d: bytes not in place when Flush completed", round, k)
		}
		c.wait(t)
		j.marker(0, 1)
		if !done {
			require.Equal(t, int32(1), calls.Load(), "round %d: Flush completions", round)
		}
		if caps&btl.CapPut != 0 {
			for k := range puts {
				require.True(t, bytes.Equal(target[k*chunk:][:chunk], payload(1, round<<8|k, chunk)), "round %d: Put %d: data", round, k)
			}
		}
	}
	fs := j.in[1].wait(t, "all fragments", countData(0, rounds*count))
	counts := map[int]int{}
	for round := range rounds {
		counts[round] = count
	}
	checkStream(t, dataFrom(fs, 0), 0, counts)
}

// testWouldBlock: an operation refused with ErrWouldBlock (Peer.WouldBlock)
// delivers nothing, writes and reads nothing, calls no completion, and
// leaves a SendAlloc's buffer with the caller; the operations accepted
// around it arrive in order.
func testWouldBlock(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	block := j.peers[0].WouldBlock
	if block == nil {
		t.Skip("Peer.WouldBlock not provided")
	}
	defer block(0)
	ep := j.ep(0, 1)
	j.marker(0, 1)
	never := func(err error) { t.Errorf("completion called for an operation refused with ErrWouldBlock (%v)", err) }
	var c completions
	sent := 0
	max := j.limit() - 16
	for k := range 40 {
		size := (k * 997) % (max + 1)
		h, data := dataHdr(0, 0, sent, size), payload(0, sent, size)
		if k%2 == 0 {
			block(1)
			_, err := ep.Send(TagData, h, data, never)
			require.ErrorIs(t, err, btl.ErrWouldBlock, "Send %d after WouldBlock(1)", k)
			continue
		}
		require.NoError(t, c.send(ep, TagData, h, data), "Send %d", k)
		sent++
	}
	buf, err := ep.Alloc(64)
	if err == nil {
		copy(buf, dataHdr(0, 0, sent, 48))
		copy(buf[16:], payload(0, sent, 48))
		block(1)
		_, err = ep.SendAlloc(TagData, buf, 16, never)
		require.ErrorIs(t, err, btl.ErrWouldBlock, "SendAlloc after WouldBlock(1)")
		ep.Free(buf) // still ours after the refusal
	} else {
		require.ErrorIs(t, err, btl.ErrWouldBlock, "Alloc")
	}
	caps := j.peers[0].Module.Caps()
	const size = 4096
	target := bytes.Repeat([]byte{0x5A}, size)
	if caps&btl.CapRDMA != 0 {
		reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
		require.NoError(t, err)
		defer reg.Release()
		h := bytes.Clone(reg.Handle())
		local := bytes.Repeat([]byte{0xA5}, size)
		if caps&btl.CapPut != 0 {
			block(1)
			_, err := ep.Put(local, h, 0, never)
			require.ErrorIs(t, err, btl.ErrWouldBlock, "Put after WouldBlock(1)")
		}
		if caps&btl.CapGet != 0 {
			block(1)
			_, err := ep.Get(local, h, 0, never)
			require.ErrorIs(t, err, btl.ErrWouldBlock, "Get after WouldBlock(1)")
			require.Equal(t, bytes.Repeat([]byte{0xA5}, size), local, "a refused Get wrote local memory")
		}
	}
	block(0)
	c.wait(t)
	j.marker(0, 1)
	fs := j.in[1].wait(t, "marker", func(fs []frag) bool { return markers(fs, 0) >= 2 })
	checkStream(t, dataFrom(fs, 0), 0, map[int]int{0: sent})
	require.Equal(t, bytes.Repeat([]byte{0x5A}, size), target, "a refused Put wrote the peer's memory")
}
