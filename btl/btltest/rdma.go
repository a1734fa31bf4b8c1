package btltest

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl"
	"github.com/stretchr/testify/require"
)

// Subtests of RDMA: Put and Get at sizes and offsets, bad handles, and a
// Put's data visible to the fragment that follows its completion.

const guard = 4096

func testPutGet(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	caps := j.peers[0].Module.Caps()
	if caps&btl.CapRDMA == 0 {
		t.Skipf("module has neither put nor get (caps %v)", caps)
	}
	const max = 16 << 20
	const fill = 0x5A
	fillBuf := bytes.Repeat([]byte{fill}, max+2*guard)
	target := bytes.Clone(fillBuf)
	reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	require.NoError(t, err)
	defer reg.Release()
	handle := bytes.Clone(reg.Handle())
	ep := j.ep(0, 1)
	type tc struct{ size, off int }
	cases := []tc{{0, 0}, {1, 0}, {1, guard - 1}, {7, 13}, {4096, guard}, {65537, 1000}, {1 << 20, 12345}, {max, guard}, {1, max + 2*guard - 1}}

	if caps&btl.CapPut != 0 {
		for i, k := range cases {
			local := payload(0, i, k.size)
			var c completions
			cb, finish := c.cb()
			done, err := retry(ep, func() (bool, error) { return ep.Put(local, handle, k.off, cb) })
			require.NoError(t, err, "Put %d bytes at %d", k.size, k.off)
			if done {
				finish()
			}
			c.wait(t)
			j.marker(0, 1) // the Put's data is in place when the marker arrives
			end := k.off + k.size
			require.True(t, bytes.Equal(target[k.off:end], local), "Put %d bytes at %d: data", k.size, k.off)
			require.True(t, bytes.Equal(target[:k.off], fillBuf[:k.off]), "Put %d bytes at %d: bytes before the range changed", k.size, k.off)
			require.True(t, bytes.Equal(target[end:], fillBuf[end:]), "Put %d bytes at %d: bytes after the range changed", k.size, k.off)
			copy(target[k.off:end], fillBuf)
		}
	}
	if caps&btl.CapGet != 0 {
		copy(target, pattern)
		for _, k := range cases {
			buf := make([]byte, k.size+2*guard)
			for i := range buf {
				buf[i] = 0xA5
			}
			local := buf[guard : guard+k.size]
			var c completions
			cb, finish := c.cb()
			done, err := retry(ep, func() (bool, error) { return ep.Get(local, handle, k.off, cb) })
			require.NoError(t, err, "Get %d bytes at %d", k.size, k.off)
			if done {
				finish()
			}
			c.wait(t)
			require.True(t, bytes.Equal(local, target[k.off:k.off+k.size]), "Get %d bytes at %d: data", k.size, k.off)
			for x, b := range append(bytes.Clone(buf[:guard]), buf[guard+k.size:]...) {
				require.Equal(t, byte(0xA5), b, "Get %d bytes at %d: local byte %d outside the range changed", k.size, k.off, x)
			}
		}
	}
}

func testBadHandle(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	caps := j.peers[0].Module.Caps()
	if caps&btl.CapRDMA == 0 {
		t.Skipf("module has neither put nor get (caps %v)", caps)
	}
	const size = 4096
	target := bytes.Repeat([]byte{0x5A}, size)
	reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	require.NoError(t, err)
	defer reg.Release()
	h := bytes.Clone(reg.Handle())
	ep := j.ep(0, 1)
	j.marker(0, 1)
	local := bytes.Repeat([]byte{0xA5}, 16)
	cases := []struct {
		name   string
		handle []byte
		off    int
	}{
		{"nil handle", nil, 0},
		{"truncated handle", h[:len(h)-1], 0},
		{"negative offset", h, -1},
		{"one past the end", h, size - len(local) + 1},
		{"offset beyond", h, size + 1},
		{"huge offset", h, 1 << 60},
	}
	never := func(err error) { t.Errorf("completion called for a rejected operation (%v)", err) }
	for _, k := range cases {
		if caps&btl.CapPut != 0 {
			_, err := ep.Put(local, k.handle, k.off, never)
			require.ErrorIs(t, err, btl.ErrBadHandle, "Put: %s", k.name)
		}
		if caps&btl.CapGet != 0 {
			_, err := ep.Get(local, k.handle, k.off, never)
			require.ErrorIs(t, err, btl.ErrBadHandle, "Get: %s", k.name)
		}
	}
	j.marker(0, 1)
	require.Equal(t, bytes.Repeat([]byte{0x5A}, size), target, "target written by a rejected Put")
	require.Equal(t, bytes.Repeat([]byte{0xA5}, 16), local, "local written by a rejected Get")
	require.Empty(t, j.fails[0], "a rejected operation failed the peer")
	require.Empty(t, j.fails[1], "a rejected operation failed the peer")
}

// testPutVisible: a fragment sent after a Put completed finds the Put's
// bytes in the peer's memory when its handler runs, whether the sender
// learnt of the completion from the Put (done, or its callback, where the
// PML sends its FIN from) or from a Flush after it.
func testPutVisible(t *testing.T, mk func(*testing.T, int) []Peer) {
	j := start(t, mk, 2)
	if j.peers[0].Module.Caps()&btl.CapPut == 0 {
		t.Skip("module has no put")
	}
	sizes := []int{1, 4096, 65539, 1 << 20, 7, 300001, 2 << 20, 64}
	offs := make([]int, len(sizes))
	total := 0
	for i, n := range sizes {
		offs[i] = total
		total += n + 3
	}
	target := make([]byte, total)
	reg, err := j.peers[1].Module.Register(target, btl.AccessRemoteWrite)
	require.NoError(t, err)
	defer reg.Release()
	handle := bytes.Clone(reg.Handle())
	want := func(i int) []byte { return payload(2, i, sizes[i]) }
	seen := make(chan [2]int, len(sizes)) // case, 1 if the bytes were in place
	j.peers[1].Dispatch.Register(TagCheck, func(_ btl.Endpoint, hdr, _ []byte) {
		i := int(binary.LittleEndian.Uint32(hdr))
		ok := 0
		if i < len(sizes) && bytes.Equal(target[offs[i]:][:sizes[i]], want(i)) {
			ok = 1
		}
		seen <- [2]int{i, ok}
	})
	ep := j.ep(0, 1)
	j.marker(0, 1)
	var c completions
	check := func(i int) {
		h := binary.LittleEndian.AppendUint32(nil, uint32(i))
		if err := c.send(ep, TagCheck, h, nil); err != nil {
			c.record(fmt.Errorf("case %d: check fragment: %w", i, err))
		}
	}
	for i := range sizes {
		local := want(i)
		cb, finish := c.cb()
		byFlush := i%2 == 1
		done, err := retry(ep, func() (bool, error) {
			return ep.Put(local, handle, offs[i], func(err error) {
				if err == nil && !byFlush {
					check(i)
				}
				cb(err)
			})
		})
		require.NoError(t, err, "case %d: Put", i)
		if done {
			finish()
			if !byFlush {
				check(i)
			}
		}
		if byFlush {
			fcb, ffinish := c.cb()
			fdone, err := ep.Flush(func(err error) {
				if err == nil {
					check(i)
				}
				fcb(err)
			})
			require.NoError(t, err, "case %d: Flush", i)
			if fdone {
				check(i)
				ffinish()
			}
		}
		select {
		case got := <-seen:
			require.Equal(t, [2]int{i, 1}, got, "case %d (%d bytes, by %s): the Put's bytes were not in place when the fragment sent after it arrived", i, sizes[i], map[bool]string{true: "Flush", false: "completion"}[byFlush])
		case <-time.After(Timeout):
			t.Fatalf("case %d: no check fragment within %v", i, Timeout)
		}
	}
	c.wait(t)
}
