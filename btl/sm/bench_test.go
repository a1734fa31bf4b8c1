package sm

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
)

const (
	tagPing btl.Tag = 0x40
	tagPong btl.Tag = 0x41
)

// BenchmarkPingPong measures the round trip of a fragment between two
// modules (two goroutines polling, as two processes would; the modules map
// each other's segments through /proc like separate processes do). The
// reported us/one-way is half the round trip.
func BenchmarkPingPong(b *testing.B) {
	for _, size := range []int{8, 1024, 4096 - 16, 32 << 10} {
		b.Run(fmt.Sprintf("size=%s", sizeName(size)), func(b *testing.B) { pingPong(b, size) })
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}

func pingPong(b *testing.B, size int) {
	ranks := openJob(b, btltest.NewStore(), 2)
	a, z := ranks[0].m, ranks[1].m
	epAZ, err := a.AddProc(1)
	require.NoError(b, err)
	epZA, err := z.AddProc(0)
	require.NoError(b, err)
	hdr := make([]byte, 16)
	data := make([]byte, max(0, size-len(hdr)))
	if size < len(hdr) {
		hdr = hdr[:size]
	}
	var got int // rank 0's pongs; touched only by the benchmark goroutine
	ranks[0].env.Dispatch.Register(tagPong, func(btl.Endpoint, []byte, []byte) { got++ })
	ranks[1].env.Dispatch.Register(tagPing, func(ep btl.Endpoint, h, d []byte) {
		if _, err := epZA.Send(tagPong, h, d, nil); err != nil {
			panic(err)
		}
	})
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stop.Load(); i++ {
			if z.Progress() == 0 && i&1023 == 0 {
				runtime.Gosched()
			}
		}
	}()
	round := func() {
		want := got + 1
		if _, err := epAZ.Send(tagPing, hdr, data, nil); err != nil {
			b.Fatal(err)
		}
		for got < want {
			a.Progress()
		}
	}
	for range 100 { // past the fast-box threshold
		round()
	}
	b.ReportAllocs()
	b.SetBytes(int64(2 * size))
	b.ResetTimer()
	for b.Loop() {
		round()
	}
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/2/1000, "us/one-way")
	stop.Store(true)
	<-done
}

// BenchmarkPutGet measures single-copy Put and Get (process_vm_writev /
// readv) into memory registered by the other module.
func BenchmarkPutGet(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20, 4 << 20} {
		for _, op := range []string{"put", "get"} {
			b.Run(fmt.Sprintf("op=%s/size=%s", op, sizeName(size)), func(b *testing.B) { putGet(b, op, size) })
		}
	}
}

func putGet(b *testing.B, op string, size int) {
	ranks := openJob(b, btltest.NewStore(), 2)
	a, z := ranks[0].m, ranks[1].m
	if a.Caps()&btl.CapRDMA == 0 {
		b.Skipf("no single copy here: %s", Status())
	}
	target := make([]byte, size)
	reg, err := z.Register(target, btl.AccessRemoteWrite|btl.AccessRemoteRead)
	require.NoError(b, err)
	defer reg.Release()
	ep, err := a.AddProc(1)
	require.NoError(b, err)
	local := make([]byte, size)
	for i := range local {
		local[i] = byte(i)
	}
	f := ep.Put
	if op == "get" {
		f = ep.Get
	}
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for b.Loop() {
		if _, err := f(local, reg.Handle(), 0, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkStream measures one-way streaming of max_send_size fragments
// through shared memory (the copy-in/copy-out path used without single
// copy): the sender copies in, the receiver's handler copies out.
func BenchmarkStream(b *testing.B) {
	for _, size := range []int{4096 - 16, 32 << 10} {
		b.Run(fmt.Sprintf("size=%s", sizeName(size)), func(b *testing.B) { stream(b, size) })
	}
}

func stream(b *testing.B, size int) {
	ranks := openJob(b, btltest.NewStore(), 2)
	a, z := ranks[0].m, ranks[1].m
	ep, err := a.AddProc(1)
	require.NoError(b, err)
	sink := make([]byte, size)
	var recv atomic.Int64
	ranks[1].env.Dispatch.Register(tagPing, func(_ btl.Endpoint, h, d []byte) {
		copy(sink, d)
		recv.Add(1)
	})
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			z.Progress()
		}
	}()
	hdr := make([]byte, 16)
	data := make([]byte, size-16)
	sent := int64(0)
	b.ReportAllocs()
	b.SetBytes(int64(size))
	for b.Loop() {
		for {
			err := ep.SendImmediate(tagPing, hdr, data)
			if err == nil {
				break
			}
			if err != btl.ErrWouldBlock {
				b.Fatal(err)
			}
			a.Progress()
		}
		sent++
	}
	for recv.Load() < sent {
		runtime.Gosched()
	}
	b.StopTimer()
	stop.Store(true)
	<-done
}

// BenchmarkSendPoll is the software cost of one small fragment: Send on one
// module and Progress on the other, in one goroutine (no cache line
// crosses cores, so it shows the code path alone).
func BenchmarkSendPoll(b *testing.B) {
	ranks := openJob(b, btltest.NewStore(), 2)
	a, z := ranks[0].m, ranks[1].m
	ep, err := a.AddProc(1)
	require.NoError(b, err)
	n := 0
	ranks[1].env.Dispatch.Register(tagPing, func(btl.Endpoint, []byte, []byte) { n++ })
	hdr, data := make([]byte, 16), make([]byte, 8)
	one := func() {
		if _, err := ep.Send(tagPing, hdr, data, nil); err != nil {
			b.Fatal(err)
		}
		for z.Progress() == 0 {
		}
	}
	for range 100 {
		one()
	}
	b.ReportAllocs()
	for b.Loop() {
		one()
	}
}

// BenchmarkEmptyProgress is the cost of a Progress call that finds nothing
// (with one fast box to look at): the polling loop's period.
func BenchmarkEmptyProgress(b *testing.B) {
	ranks := openJob(b, btltest.NewStore(), 2)
	a, z := ranks[0].m, ranks[1].m
	ep, err := a.AddProc(1)
	require.NoError(b, err)
	ranks[1].env.Dispatch.Register(tagPing, func(btl.Endpoint, []byte, []byte) {})
	for range 100 {
		ep.Send(tagPing, nil, make([]byte, 8), nil)
		z.Progress()
	}
	require.Len(b, z.rx, 1)
	b.ReportAllocs()
	for b.Loop() {
		z.Progress()
	}
}
