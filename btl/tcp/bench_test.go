package tcp

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/params"
)

// sendNow sends with SendImmediate, falling back to Send.
func sendNow(ep btl.Endpoint, tag btl.Tag, hdr, data []byte) error {
	err := ep.SendImmediate(tag, hdr, data)
	if errors.Is(err, btl.ErrWouldBlock) {
		_, err = ep.Send(tag, hdr, data, nil)
	}
	return err
}

// BenchmarkPingPong measures the round trip of an 8-byte fragment over
// loopback. procs=2 runs rank 1 in a child process (the test binary
// re-executed), as a real job does; procs=1 runs both modules in this
// process, where the Go scheduler's own idle spinning polls the netpoller.
// driver=handler answers and re-sends from the receive handlers (the
// transport alone); driver=goroutine has the benchmark goroutine send each
// ping and wait on a channel for the pong (adds a goroutine wake-up per
// round trip, as a blocking receive would). Reported: ns per round trip
// and us one-way.
func BenchmarkPingPong(b *testing.B) {
	for _, procs := range []int{2, 1} {
		for _, spin := range []string{"0s", "5us", "20us", "50us"} {
			for _, driver := range []string{"handler", "goroutine"} {
				b.Run(fmt.Sprintf("size=8B/procs=%d/busy_poll=%s/driver=%s", procs, spin, driver), func(b *testing.B) {
					r0, ep := pingPongPair(b, procs, spin)
					benchPingPong(b, r0, ep, driver == "handler")
				})
			}
		}
	}
}

// pingPongPair returns rank 0 and its endpoints (one per link) to rank 1,
// whose handlers are serveRank1's. spin "" keeps the default busy poll.
func pingPongPair(b *testing.B, procs int, spin string, extra ...[2]string) (*rank, []btl.Endpoint) {
	overrides := extra
	if spin != "" {
		overrides = append([][2]string{{paramBusyPoll, spin}}, extra...)
	}
	store := btltest.NewStore()
	var r0 *rank
	if procs == 2 {
		r0 = startChild(b, store, overrides)
	} else {
		ranks := openJob(b, store, 2, overrides...)
		serveRank1(ranks[1].env.Dispatch, nil)
		r0 = ranks[0]
	}
	var eps []btl.Endpoint
	for _, m := range r0.mods {
		ep, err := m.AddProc(1)
		require.NoError(b, err)
		eps = append(eps, ep)
	}
	return r0, eps
}

// serveRank1 installs rank 1's handlers: 0x41 echoes the header back,
// 0x42 echoes a marker, 0x43 copies data into dst at the offset in hdr.
func serveRank1(d *btl.Dispatcher, dst []byte) {
	d.Register(0x41, func(ep btl.Endpoint, hdr, _ []byte) {
		if err := sendNow(ep, 0x41, hdr, nil); err != nil {
			panic(err)
		}
	})
	d.Register(0x42, func(ep btl.Endpoint, _, _ []byte) {
		if err := sendNow(ep, 0x42, nil, nil); err != nil {
			panic(err)
		}
	})
	d.Register(0x43, func(_ btl.Endpoint, hdr, data []byte) {
		copy(dst[binary.LittleEndian.Uint32(hdr):], data)
	})
}

const childEnv = "GOMPI_TCP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

// runChild is rank 1 of a two-process benchmark: it prints its address blob
// and the handle of a 4 MiB registration, reads rank 0's blob, serves until
// stdin closes. Parameters come through GOMPI_* variables.
func runChild() int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	store := btltest.NewStore()
	set, err := params.NewSet(nil)
	if err != nil {
		return fail(err)
	}
	d := &btl.Dispatcher{}
	env := &btl.Env{Rank: 1, Size: 2, LocalRank: 1, LocalSize: 2, JobID: "test-job", Secret: testSecret,
		Params: set, Store: store, Dispatch: d, Logf: func(string, ...any) {}}
	mods, err := component{}.Open(env)
	if err != nil {
		return fail(err)
	}
	dst := make([]byte, 4<<20)
	reg, err := mods[0].Register(dst, btl.AccessRemoteWrite)
	if err != nil {
		return fail(err)
	}
	serveRank1(d, dst)
	blob, _ := store.Get(context.Background(), storeKey(1))
	fmt.Printf("%s\n%x\n", blob, reg.Handle())
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadString('\n')
	if err != nil {
		return fail(err)
	}
	store.Set(storeKey(0), []byte(strings.TrimSpace(line)))
	io.Copy(io.Discard, in)
	for _, m := range mods {
		m.Close()
	}
	return 0
}

var childHandle = map[*rank][]byte{}

// startChild runs rank 1 in a child process and opens rank 0 here.
func startChild(b *testing.B, store *btltest.Store, overrides [][2]string) *rank {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	for _, o := range overrides {
		cmd.Env = append(cmd.Env, params.EnvName(o[0])+"="+o[1])
	}
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(b, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	b.Cleanup(func() {
		stdin.Close()
		cmd.Wait()
	})
	out := bufio.NewReader(stdout)
	blob, err := out.ReadString('\n')
	require.NoError(b, err)
	hexHandle, err := out.ReadString('\n')
	require.NoError(b, err)
	handle, err := hex.DecodeString(strings.TrimSpace(hexHandle))
	require.NoError(b, err)
	store.Set(storeKey(1), []byte(strings.TrimSpace(blob)))
	r0 := openRank(b, store, 0, 2, overrides...)
	mine, err := store.Get(context.Background(), storeKey(0))
	require.NoError(b, err)
	_, err = fmt.Fprintf(stdin, "%s\n", mine)
	require.NoError(b, err)
	childHandle[r0] = handle
	return r0
}

func benchPingPong(b *testing.B, r0 *rank, eps []btl.Endpoint, inHandler bool) {
	ep := eps[0]
	msg := []byte("12345678")
	var left atomic.Int64
	done := make(chan struct{}, 1)
	r0.env.Dispatch.Register(0x41, func(_ btl.Endpoint, hdr, _ []byte) {
		if inHandler && left.Add(-1) > 0 {
			if err := sendNow(ep, 0x41, hdr, nil); err != nil {
				panic(err)
			}
			return
		}
		done <- struct{}{}
	})
	// Connect and warm up.
	left.Store(1)
	require.NoError(b, sendNow(ep, 0x41, msg, nil))
	<-done
	b.ReportAllocs()
	start := time.Now()
	if inHandler {
		b.ResetTimer()
		left.Store(int64(b.N))
		require.NoError(b, sendNow(ep, 0x41, msg, nil))
		<-done
	} else {
		for b.Loop() {
			if err := sendNow(ep, 0x41, msg, nil); err != nil {
				b.Fatal(err)
			}
			<-done
		}
	}
	el := time.Since(start)
	b.ReportMetric(float64(el.Nanoseconds())/float64(b.N)/2000, "us/one-way")
}

// BenchmarkStream measures unidirectional bandwidth of 4 MiB messages
// from this process to rank 1 in a child process, striped over
// btl_tcp_links links as the PML would stripe them. op=put Puts each stripe
// into rank 1's registered buffer (read straight into it); op=send sends it
// as max_send_size fragments that rank 1's handler copies into that buffer
// (the copy pipeline). Up to 64 operations per link are in flight; a
// marker round trip per link at the end waits until everything arrived.
func BenchmarkStream(b *testing.B) {
	for _, links := range []int{1, 2} {
		for _, op := range []string{"put", "send"} {
			b.Run(fmt.Sprintf("size=4MiB/links=%d/op=%s", links, op), func(b *testing.B) {
				r0, eps := pingPongPair(b, 2, "", [2]string{paramLinks, fmt.Sprint(links)})
				benchStream(b, r0, eps, op == "put")
			})
		}
	}
}

func benchStream(b *testing.B, r0 *rank, eps []btl.Endpoint, put bool) {
	const size = 4 << 20
	handle := childHandle[r0]
	src := make([]byte, size)
	for i := range src {
		src[i] = byte(i)
	}
	marks := make(chan struct{}, len(eps))
	r0.env.Dispatch.Register(0x42, func(btl.Endpoint, []byte, []byte) { marks <- struct{}{} })
	mark := func() {
		for _, ep := range eps {
			require.NoError(b, sendNow(ep, 0x42, nil, nil))
		}
		for range eps {
			<-marks
		}
	}
	mark() // connect every link
	window := make(chan struct{}, 64*len(eps))
	cb := func(err error) {
		if err != nil {
			panic(err)
		}
		<-window
	}
	frag := r0.mods[0].Limits().MaxSendSize - 4
	stripe := size / len(eps)
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		for l, ep := range eps {
			part := src[l*stripe : (l+1)*stripe]
			if put {
				window <- struct{}{}
				done, err := ep.Put(part, handle, l*stripe, cb)
				require.NoError(b, err)
				if done {
					<-window
				}
				continue
			}
			var hdr [4]byte
			for o := 0; o < len(part); o += frag {
				binary.LittleEndian.PutUint32(hdr[:], uint32(l*stripe+o))
				window <- struct{}{}
				done, err := ep.Send(0x43, hdr[:], part[o:min(o+frag, len(part))], cb)
				require.NoError(b, err)
				if done {
					<-window
				}
			}
		}
	}
	mark()
}
