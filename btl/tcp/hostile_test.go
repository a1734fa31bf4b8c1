package tcp

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/btl/btltest"
	"github.com/gompi-org/gompi/internal/mpierr"
)

const waitFor = 20 * time.Second

// watcher records what one rank's Dispatcher sees.
type watcher struct {
	fails chan failureReport
	got   chan []byte
}

type failureReport struct {
	peer int
	err  error
}

func watch(r *rank) *watcher {
	w := &watcher{fails: make(chan failureReport, 16), got: make(chan []byte, 1024)}
	r.env.Dispatch.OnPeerFailed(func(peer int, err error) { w.fails <- failureReport{peer, err} })
	r.env.Dispatch.Register(0x41, func(ep btl.Endpoint, hdr, data []byte) {
		w.got <- append(append([]byte{byte(ep.Peer())}, hdr...), data...)
	})
	return w
}

func (w *watcher) failure(t *testing.T) failureReport {
	t.Helper()
	select {
	case f := <-w.fails:
		return f
	case <-time.After(waitFor):
		t.Fatal("no PeerFailed report")
	}
	return failureReport{}
}

func (w *watcher) noFailure(t *testing.T) {
	t.Helper()
	select {
	case f := <-w.fails:
		t.Fatalf("unexpected PeerFailed(%d, %v)", f.peer, f.err)
	default:
	}
}

func (w *watcher) recv(t *testing.T) []byte {
	t.Helper()
	select {
	case b := <-w.got:
		return b
	case <-time.After(waitFor):
		t.Fatal("nothing received")
	}
	return nil
}

// roundTrip checks that ranks a and b still talk in both directions.
func roundTrip(t *testing.T, a, b *rank, wa, wb *watcher) {
	t.Helper()
	send := func(from, to *rank, msg string) {
		ep, err := from.mods[0].AddProc(to.env.Rank)
		require.NoError(t, err)
		_, err = ep.Send(0x41, []byte(msg), nil, func(err error) { require.NoError(t, err) })
		require.NoError(t, err)
	}
	send(a, b, "ping")
	require.Equal(t, append([]byte{byte(a.env.Rank)}, "ping"...), wb.recv(t))
	send(b, a, "pong")
	require.Equal(t, append([]byte{byte(b.env.Rank)}, "pong"...), wa.recv(t))
}

func addrOf(t *testing.T, store btl.Store, r int) string {
	t.Helper()
	b, err := store.Get(context.Background(), storeKey(r))
	require.NoError(t, err)
	_, addrs, err := decodeBlob(b)
	require.NoError(t, err)
	return addrs[0]
}

// fakePeer dials rank 0 of a 3-rank job as rank 1 and completes the
// handshake with secret.
func fakePeer(t *testing.T, store btl.Store, secret []byte) (net.Conn, verdict, error) {
	t.Helper()
	nc, err := net.Dial("tcp", addrOf(t, store, 0))
	require.NoError(t, err)
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(waitFor))
	hs := hsConfig{secret: secret, jobID: "test-job", rank: 1, size: 3, links: 1, rand: rand.Reader}
	v, err := initiate(nc, &hs, 0, 0)
	return nc, v, err
}

func encodeFrame(h frameHeader, payload []byte) []byte {
	b := make([]byte, maxFrameHeader)
	n := h.encode(b)
	return append(b[:n], payload...)
}

// hostileJob opens ranks 0 and 2 of a 3-rank job (rank 1 is played by the
// test) and registers 64 bytes at rank 0.
func hostileJob(t *testing.T) (store *btltest.Store, r0, r2 *rank, w0, w2 *watcher, reg btl.Registration, mem []byte) {
	store = btltest.NewStore()
	r0 = openRank(t, store, 0, 3)
	r2 = openRank(t, store, 2, 3)
	w0, w2 = watch(r0), watch(r2)
	mem = make([]byte, 64)
	reg, err := r0.mods[0].Register(mem, btl.AccessRemoteWrite)
	require.NoError(t, err)
	return
}

func TestHostileFrames(t *testing.T) {
	valid := func(reg btl.Registration) uint64 { return decodeID(reg.Handle()) }
	cases := []struct {
		name     string
		frames   func(reg uint64) []byte
		protocol bool // a protocol violation (else a plain failure)
		log      string
	}{
		{"unknown kind", func(uint64) []byte { return []byte{9, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0} }, true, "unknown frame kind 9"},
		{"reserved bits", func(uint64) []byte {
			b := encodeFrame(frameHeader{kind: frameSend, tag: 0x41}, nil)
			b[2] = 1
			return b
		}, true, "reserved bits"},
		{"unknown registration", func(uint64) []byte {
			return encodeFrame(frameHeader{kind: framePut, length: 8, reg: 999}, make([]byte, 8))
		}, true, "unknown registration 999"},
		{"put beyond registration", func(id uint64) []byte {
			return encodeFrame(frameHeader{kind: framePut, length: 8, reg: id, off: 60}, make([]byte, 8))
		}, true, "outside registration"},
		{"put offset overflow", func(id uint64) []byte {
			return encodeFrame(frameHeader{kind: framePut, length: 16, reg: id, off: ^uint64(0) - 7}, make([]byte, 16))
		}, true, "outside registration"},
		{"get from write-only registration", func(id uint64) []byte {
			return encodeFrame(frameHeader{kind: frameGetReq, length: 8, reg: id, req: 1}, nil)
		}, true, "does not allow remote read"},
		{"oversize send", func(uint64) []byte {
			return encodeFrame(frameHeader{kind: frameSend, tag: 0x41, length: 1 << 40}, nil)
		}, true, "exceeds"},
		{"oversize header", func(uint64) []byte {
			return encodeFrame(frameHeader{kind: frameSend, tag: 0x41, hdrLen: ^uint32(0)}, nil)
		}, true, "exceeds"},
		{"unexpected get reply", func(uint64) []byte {
			return encodeFrame(frameHeader{kind: frameGetReply, length: 4, req: 77}, make([]byte, 4))
		}, true, "unknown request 77"},
		{"close with length", func(uint64) []byte {
			b := encodeFrame(frameHeader{kind: frameClose}, nil)
			b[8] = 1
			return b
		}, true, "CLOSE frame with length"},
		{"truncated frame", func(uint64) []byte {
			return encodeFrame(frameHeader{kind: frameSend, tag: 0x41, length: 100}, make([]byte, 40))
		}, false, "without a close frame"},
		{"truncated header", func(uint64) []byte {
			return encodeFrame(frameHeader{kind: framePut, length: 8, reg: 1}, nil)[:20]
		}, false, "without a close frame"},
	}
	for _, k := range cases {
		for _, polled := range []bool{false, true} {
			name := k.name
			if polled {
				name += "/polled"
			}
			t.Run(name, func(t *testing.T) { hostileFrameCase(t, k.frames, k.protocol, k.log, valid, polled) })
		}
	}
}

// hostileFrameCase sends one good fragment and then frames to rank 0 from
// a fake rank 1; with polled, a goroutine calls rank 0's Progress all the
// while (as a PML waiting by spinning does), so the poller rather than
// the reader goroutine may be the one that meets the bad frame.
func hostileFrameCase(t *testing.T, frames func(uint64) []byte, protocol bool, log string, valid func(btl.Registration) uint64, polled bool) {
	store, r0, r2, w0, w2, reg, mem := hostileJob(t)
	if polled {
		pollAllTheWhile(t, r0)
	}
	nc, v, err := fakePeer(t, store, testSecret)
	require.NoError(t, err)
	require.Equal(t, verdictAccept, v)
	// One good fragment first: the connection works.
	_, err = nc.Write(encodeFrame(frameHeader{kind: frameSend, tag: 0x41, hdrLen: 2, length: 3}, []byte("hiabc")))
	require.NoError(t, err)
	require.Equal(t, []byte("\x01hiabc"), w0.recv(t))
	_, err = nc.Write(frames(valid(reg)))
	require.NoError(t, err)
	nc.(*net.TCPConn).CloseWrite()

	f := w0.failure(t)
	require.Equal(t, 1, f.peer)
	require.ErrorIs(t, f.err, mpierr.ErrProcFailed)
	if protocol {
		require.ErrorIs(t, f.err, mpierr.ErrProtocol)
	} else {
		require.False(t, errors.Is(f.err, mpierr.ErrProtocol), "%v", f.err)
	}
	require.ErrorContains(t, f.err, log)
	require.True(t, r0.log.Contains(log), "logged")
	// The connection was dropped.
	dropped(t, nc)
	require.Equal(t, make([]byte, 64), mem, "hostile frames wrote into registered memory")
	// Operations towards the failed rank fail; other ranks are unaffected.
	ep, err := r0.mods[0].AddProc(1)
	require.NoError(t, err)
	_, err = ep.Send(0x41, nil, []byte("x"), nil)
	require.ErrorIs(t, err, mpierr.ErrProcFailed)
	roundTrip(t, r0, r2, w0, w2)
	w0.noFailure(t)
	w2.noFailure(t)
}

// pollAllTheWhile has a goroutine call r's Progress until the test ends,
// as a PML spinning in a wait does.
func pollAllTheWhile(t *testing.T, r *rank) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if r.mods[0].Progress() == 0 {
				runtime.Gosched()
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}

func decodeID(h []byte) uint64 {
	id, err := decodeHandle(h, 0, 0)
	if err != nil {
		panic(err)
	}
	return id
}

// A peer that fails or skips authentication, or speaks garbage, is dropped
// before it can send a frame; nobody is reported failed.
func TestHostileHandshakes(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, store btl.Store)
		log  string
	}{
		{"garbage", func(t *testing.T, store btl.Store) {
			nc, err := net.Dial("tcp", addrOf(t, store, 0))
			require.NoError(t, err)
			defer nc.Close()
			junk := make([]byte, 4096)
			rand.Read(junk)
			nc.Write(junk)
			dropped(t, nc)
		}, "not a gompi tcp peer"},
		{"wrong secret", func(t *testing.T, store btl.Store) {
			nc, _, err := fakePeer(t, store, []byte("not the secret"))
			require.ErrorIs(t, err, errAuth)
			nc.Close()
		}, "reading initiator proof"},
		{"forged proof", func(t *testing.T, store btl.Store) {
			nc, err := net.Dial("tcp", addrOf(t, store, 0))
			require.NoError(t, err)
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(waitFor))
			hs := hsConfig{secret: []byte("guess"), jobID: "test-job", rank: 1, size: 3, links: 1, rand: rand.Reader}
			hi, err := hs.newHello(roleInitiator, 0, 0)
			require.NoError(t, err)
			nc.Write(hi.raw)
			_, err = readHello(nc)
			require.NoError(t, err)
			io.ReadFull(nc, make([]byte, macLen))
			nc.Write(make([]byte, macLen))
			// Then frames, which must be ignored.
			nc.Write(encodeFrame(frameHeader{kind: frameSend, tag: 0x41, length: 4}, []byte("evil")))
			dropped(t, nc)
		}, "failed authentication"},
		{"wrong job", func(t *testing.T, store btl.Store) {
			nc, err := net.Dial("tcp", addrOf(t, store, 0))
			require.NoError(t, err)
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(waitFor))
			hs := hsConfig{secret: testSecret, jobID: "other-job", rank: 1, size: 3, links: 1, rand: rand.Reader}
			_, err = initiate(nc, &hs, 0, 0)
			require.Error(t, err)
		}, "belongs to job"},
		{"bad rank", func(t *testing.T, store btl.Store) {
			nc, err := net.Dial("tcp", addrOf(t, store, 0))
			require.NoError(t, err)
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(waitFor))
			hs := hsConfig{secret: testSecret, jobID: "test-job", rank: 7, size: 3, links: 1, rand: rand.Reader}
			_, err = initiate(nc, &hs, 0, 0)
			require.Error(t, err)
		}, "claims rank 7"},
		{"bad link", func(t *testing.T, store btl.Store) {
			nc, err := net.Dial("tcp", addrOf(t, store, 0))
			require.NoError(t, err)
			defer nc.Close()
			nc.SetDeadline(time.Now().Add(waitFor))
			hs := hsConfig{secret: testSecret, jobID: "test-job", rank: 1, size: 3, links: 1, rand: rand.Reader}
			_, err = initiate(nc, &hs, 0, 5)
			require.Error(t, err)
		}, "asks for link 5"},
		{"truncated hello", func(t *testing.T, store btl.Store) {
			nc, err := net.Dial("tcp", addrOf(t, store, 0))
			require.NoError(t, err)
			hs := hsConfig{secret: testSecret, jobID: "test-job", rank: 1, size: 3, links: 1, rand: rand.Reader}
			hi, err := hs.newHello(roleInitiator, 0, 0)
			require.NoError(t, err)
			nc.Write(hi.raw[:30])
			nc.Close()
		}, "reading hello"},
	}
	for _, k := range cases {
		t.Run(k.name, func(t *testing.T) {
			store, r0, r2, w0, w2, _, _ := hostileJob(t)
			k.run(t, store)
			waitLog(t, r0.log, k.log)
			require.Empty(t, w0.got, "a frame from an unauthenticated peer was delivered")
			roundTrip(t, r0, r2, w0, w2)
			w0.noFailure(t)
			w2.noFailure(t)
		})
	}
}

// dropped checks that the module closes nc (EOF or reset) in time.
func dropped(t *testing.T, nc net.Conn) {
	t.Helper()
	nc.SetReadDeadline(time.Now().Add(waitFor))
	_, err := io.Copy(io.Discard, nc)
	var ne net.Error
	require.False(t, errors.As(err, &ne) && ne.Timeout(), "connection not dropped")
}

// waitLog waits until l has logged a message containing s.
func waitLog(t *testing.T, l *btltest.Log, s string) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !l.Contains(s) {
		if time.Now().After(deadline) {
			t.Fatalf("no log message containing %q; log: %q", s, l.Messages())
		}
		time.Sleep(time.Millisecond)
	}
}

// A listener that cannot prove the secret is not trusted: the dialling
// rank reports the peer failed and sends nothing to it.
func TestImpostorAcceptor(t *testing.T) {
	store := btltest.NewStore()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	store.Set(storeKey(1), encodeBlob(1, []string{ln.Addr().String()}))
	var wg sync.WaitGroup
	wg.Add(1)
	leaked := make(chan []byte, 1)
	go func() {
		defer wg.Done()
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		nc.SetDeadline(time.Now().Add(waitFor))
		hs := hsConfig{secret: []byte("impostor"), jobID: "test-job", rank: 1, size: 2, links: 1, rand: rand.Reader}
		hi, err := readHello(nc)
		if err != nil {
			return
		}
		ha, _ := hs.newHello(roleAcceptor, 0, 0)
		nc.Write(append(ha.raw, hs.mac(labelAcceptor, hi, ha)...))
		rest, _ := io.ReadAll(nc)
		leaked <- rest
	}()
	r0 := openRank(t, store, 0, 2)
	w0 := watch(r0)
	ep, err := r0.mods[0].AddProc(1)
	require.NoError(t, err)
	var cbErr = make(chan error, 1)
	done, err := ep.Send(0x41, []byte("secret data"), nil, func(err error) { cbErr <- err })
	require.NoError(t, err)
	require.False(t, done)
	f := w0.failure(t)
	require.Equal(t, 1, f.peer)
	require.ErrorIs(t, f.err, mpierr.ErrProcFailed)
	require.ErrorContains(t, f.err, "authentication")
	require.ErrorIs(t, <-cbErr, mpierr.ErrProcFailed)
	wg.Wait()
	require.Empty(t, <-leaked, "the initiator sent bytes to an unauthenticated acceptor")
}

// Both ranks dial each other at once, on every link: exactly one connection
// per link survives and every fragment arrives once, in order.
func TestSimultaneousConnect(t *testing.T) {
	const rounds, count = 20, 50
	ties := 0
	for range rounds {
		store := btltest.NewStore()
		ranks := openJob(t, store, 2, [2]string{paramLinks, "2"})
		ws := []*watcher{watch(ranks[0]), watch(ranks[1])}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for from := range 2 {
			for link := range 2 {
				ep, err := ranks[from].mods[link].AddProc(1 - from)
				require.NoError(t, err)
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					for seq := range count {
						_, err := ep.Send(0x41, []byte{byte(link), byte(seq)}, nil, nil)
						if err != nil {
							t.Errorf("send: %v", err)
							return
						}
					}
				}()
			}
		}
		close(start)
		wg.Wait()
		for to := range 2 {
			next := [2]int{}
			for range 2 * count {
				b := ws[to].recv(t)
				require.Equal(t, byte(1-to), b[0])
				link, seq := b[1], int(b[2])
				require.Equal(t, next[link], seq, "link %d: lost, duplicated or reordered", link)
				next[link]++
			}
		}
		for link := range 2 {
			a := ranks[0].mods[link].eps[1].Load()
			b := ranks[1].mods[link].eps[0].Load()
			ca, cb := a.cur.Load(), b.cur.Load()
			require.NotNil(t, ca)
			require.NotNil(t, cb)
			require.Equal(t, ca.laddr, cb.raddr, "link %d: the two ranks kept different connections", link)
		}
		if ranks[0].log.Contains("simultaneous") || ranks[1].log.Contains("simultaneous") {
			ties++
		}
		ws[0].noFailure(t)
		ws[1].noFailure(t)
		for _, r := range ranks {
			r.close()
		}
	}
	t.Logf("%d of %d rounds resolved a simultaneous connect", ties, rounds)
}

// An orderly Close is not a failure: the peer reports nothing and its later
// sends fail with ErrClosed.
func TestOrderlyClose(t *testing.T) {
	store := btltest.NewStore()
	ranks := openJob(t, store, 2)
	w0, w1 := watch(ranks[0]), watch(ranks[1])
	roundTrip(t, ranks[0], ranks[1], w0, w1)
	ep, err := ranks[1].mods[0].AddProc(0)
	require.NoError(t, err)
	ranks[0].close()
	_, err = ep.Send(0x41, nil, []byte("late"), nil)
	require.ErrorIs(t, err, btl.ErrClosed)
	require.False(t, errors.Is(err, mpierr.ErrProcFailed))
	w1.noFailure(t)
	waitLog(t, ranks[1].log, "closed its tcp module")
}

// A Get whose target dies completes with an error.
func TestGetPeerDies(t *testing.T) {
	store := btltest.NewStore()
	ranks := openJob(t, store, 2, [2]string{"btl_tcp_flags", "send,put,get"})
	w0, w1 := watch(ranks[0]), watch(ranks[1])
	roundTrip(t, ranks[0], ranks[1], w0, w1)
	mem := make([]byte, 1<<20)
	reg, err := ranks[1].mods[0].Register(mem, btl.AccessRemoteRead)
	require.NoError(t, err)
	// Stall rank 1's reader so the Get cannot be answered, then kill it.
	block, stalled := make(chan struct{}), make(chan struct{})
	ranks[1].env.Dispatch.Register(0x42, func(btl.Endpoint, []byte, []byte) {
		close(stalled)
		<-block
	})
	ep, err := ranks[0].mods[0].AddProc(1)
	require.NoError(t, err)
	_, err = ep.Send(0x42, nil, nil, nil)
	require.NoError(t, err)
	// Only once the reader is stalled: a Get sent earlier could be
	// answered first (seen once in a full test run on a loaded machine).
	select {
	case <-stalled:
	case <-time.After(waitFor):
		t.Fatal("the stalling message never arrived")
	}
	got := make(chan error, 1)
	done, err := ep.Get(make([]byte, len(mem)), reg.Handle(), 0, func(err error) { got <- err })
	require.NoError(t, err)
	require.False(t, done)
	go func() { ranks[1].kill() }()
	f := w0.failure(t)
	require.Equal(t, 1, f.peer)
	select {
	case err := <-got:
		require.ErrorIs(t, err, mpierr.ErrProcFailed)
	case <-time.After(waitFor):
		t.Fatal("Get never completed")
	}
	close(block)
}

func TestBlob(t *testing.T) {
	links, addrs, err := decodeBlob(encodeBlob(2, []string{"127.0.0.1:5", "[::1]:6"}))
	require.NoError(t, err)
	require.Equal(t, 2, links)
	require.Equal(t, []string{"127.0.0.1:5", "[::1]:6"}, addrs)
	for _, bad := range []string{"", "gompi-tcp/2 1 a:1", "gompi-tcp/1 x a:1", "gompi-tcp/1 1 nohost", "gompi-tcp/1 0 a:1"} {
		_, _, err := decodeBlob([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
	require.True(t, bytes.HasPrefix(encodeBlob(1, []string{"a:1"}), []byte(blobPrefix)))
}
