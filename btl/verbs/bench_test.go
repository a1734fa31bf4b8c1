package verbs

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/gompi-org/gompi/btl/verbs/ibv/soft"
)

// BenchmarkPingPong: one fragment each way per iteration between two
// modules of this process, both polled by the benchmark goroutine.
func BenchmarkPingPong(b *testing.B) {
	for _, prov := range []struct {
		name string
		mk   func() func(int) ibv.Provider
	}{{"soft", softProviders(soft.Config{})}, {"loopib", loopProviders}} {
		for _, size := range []int{8, 4 << 10, 60 << 10} {
			b.Run(fmt.Sprintf("provider=%s/size=%s", prov.name, sizeName(size)), func(b *testing.B) {
				ranks := openJob(b, 2, prov.mk())
				var got [2]int
				for i, r := range ranks {
					r.env.Dispatch.Register(0x41, func(btl.Endpoint, []byte, []byte) { got[i]++ })
				}
				ep01, _ := ranks[0].m.AddProc(1)
				ep10, _ := ranks[1].m.AddProc(0)
				hdr, data := make([]byte, 16), make([]byte, size)
				send := func(ep btl.Endpoint) {
					for {
						_, err := ep.Send(0x41, hdr, data, func(error) {})
						require.NoError(b, err)
						return
					}
				}
				wait := func(i, n int) {
					for got[i] < n {
						ranks[0].m.Progress()
						ranks[1].m.Progress()
					}
				}
				send(ep01)
				wait(1, 1)
				send(ep10)
				wait(0, 1)
				b.ReportAllocs()
				b.SetBytes(int64(2 * size))
				n := 1
				for b.Loop() {
					n++
					send(ep01)
					wait(1, n)
					send(ep10)
					wait(0, n)
				}
			})
		}
	}
}

// BenchmarkPut: RDMA WRITEs of size into a registered target, completion
// awaited each time.
func BenchmarkPut(b *testing.B) {
	for _, size := range []int{64 << 10, 4 << 20} {
		b.Run("provider=soft/size="+sizeName(size), func(b *testing.B) {
			ranks := openJob(b, 2, softProviders(soft.Config{})())
			target := make([]byte, size)
			reg, err := ranks[1].m.Register(target, btl.AccessRemoteWrite)
			require.NoError(b, err)
			defer reg.Release()
			ep, _ := ranks[0].m.AddProc(1)
			local := make([]byte, size)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				done := false
				fin, err := ep.Put(local, reg.Handle(), 0, func(error) { done = true })
				require.NoError(b, err)
				for !fin && !done {
					ranks[0].m.Progress()
					ranks[1].m.Progress()
				}
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprintf("%dB", n)
}
