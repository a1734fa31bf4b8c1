package soft

import (
	"net"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
)

// forgerConn is the socket a fuzz target's forged peer sends from: one
// per process, on a loopback address of its own at the devices' port.
var forgerConn = sync.OnceValues(func() (*net.UDPConn, error) {
	pid := os.Getpid()
	addr := netip.AddrFrom4([4]byte{127, 99, byte(pid >> 8), byte(pid)})
	return net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, DefaultPort)))
})

// FuzzForgedPeer: a QP connected to a peer that follows no rule of the
// transport. The peer's packets carry a correct ICRC and come from the
// connected address, so that each reaches the QP: any opcode, PSNs near
// the expected ones, RETHs naming the QP's registration (or not), AETHs
// of any syndrome, payloads of any length. Meanwhile the QP has receives
// posted and a SEND, an RDMA WRITE and an RDMA READ of its own
// outstanding. The device must not panic, must write nothing outside the
// registered bytes, must report only well-formed completions, and must
// close without hanging.
func FuzzForgedPeer(f *testing.F) {
	f.Add([]byte{opSendOnly, 0, 1, 8, 'h', 'e', 'l', 'l', 'o', '!', '!', '!'})
	f.Add([]byte{opWriteOnly, 0, 1, 16, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	f.Add([]byte{opReadRequest, 0, 1, 32})
	f.Add([]byte{opAck, 0, 0, 0, opReadRespOnly, 1, 0, 4, 'a', 'b', 'c', 'd'})
	f.Add([]byte{opSendFirst, 0, 1, 8, 1, 2, 3, 4, 5, 6, 7, 8, opSendLast, 1, 1, 3, 9, 9, 9})
	f.Fuzz(func(t *testing.T, in []byte) {
		conn, err := forgerConn()
		if err != nil {
			t.Skipf("no address for the forged peer: %v", err)
		}
		from := conn.LocalAddr().(*net.UDPAddr).AddrPort()
		const fakeQPN = 0x42
		o := defaultOpts()
		o.timeout = 8 // 1 ms floor: the QP's own requests give up within the input
		o.retryCnt = 1
		b := openEnd(t, New(Config{}), o)
		closed := false
		t.Cleanup(func() {
			if !closed {
				b.close()
			}
		})
		dev := b.ctx.(*devContext).dev
		require.NoError(t, b.qp.Modify(&ibv.QPAttr{State: ibv.QPSInit, Port: 1, AccessFlags: o.access}, ibv.MaskResetToInit))
		require.NoError(t, b.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTR, PathMTU: ibv.MTU1024, DestQPN: fakeQPN, RQPSN: 100,
			MaxDestRdAtomic: 4, MinRNRTimer: 1, AH: ibv.AH{IsGlobal: true, DGID: ibv.GIDFromAddr(from.Addr()), Port: 1}}, ibv.MaskInitToRTR))
		require.NoError(t, b.qp.Modify(&ibv.QPAttr{State: ibv.QPSRTS, SQPSN: 100, Timeout: o.timeout,
			RetryCnt: o.retryCnt, RNRRetry: 1, MaxRdAtomic: 4}, ibv.MaskRTRToRTS))
		// A registration with guard bytes on both sides, and work of the
		// QP's own: receives, a SEND, a WRITE and a READ to the peer.
		const guard, size = 64, 4096
		mem := make([]byte, size+2*guard)
		for i := range mem {
			mem[i] = 0xA5
		}
		mr, err := b.pd.RegMR(mem[guard:guard+size:guard+size], o.mrAccess)
		require.NoError(t, err)
		for i := range 4 {
			_, err := b.qp.PostRecv([]ibv.RecvWR{{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(mr, i*1024, 1024)}}})
			require.NoError(t, err)
		}
		_, err = b.qp.PostSend([]ibv.SendWR{
			{ID: 10, Opcode: ibv.WRSend, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 100)}},
			{ID: 11, Opcode: ibv.WRRDMAWrite, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 2000)}, RemoteAddr: 0x1000, RKey: 7},
			{ID: 12, Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(mr, 0, 512)}, RemoteAddr: 0x2000, RKey: 7},
		})
		require.NoError(t, err)
		// The forged packets: per packet an opcode, a PSN offset, a
		// choice of keys, a payload length and the payload, then the
		// header fields, from the input.
		fl := flow{src: from.Addr(), dst: dev.addr, sport: from.Port(), dport: dev.port}
		to := net.UDPAddrFromAddrPort(netip.AddrPortFrom(dev.addr, dev.port))
		before := b.ctx.(*devContext).Counters().PacketsReceived
		r := &forgeIn{in}
		sent := 0
		for sent < 16 && r.more() {
			op := r.u8() % numOpcodes
			psn := uint32(100+int(int8(r.u8()))) & psnMask
			keys := r.u8()
			n := int(r.u8())
			if f, _ := opInfo(op); f&fPayload == 0 {
				n = 0
			}
			payload := r.bytes(n)
			p := packet{bth: bth{opcode: op, pkey: defaultPKey, destQP: b.qp.QPN(), psn: psn, ackReq: keys&0x80 != 0}}
			p.reth = reth{va: r.u64(), rkey: r.u32(), dmaLen: uint32(r.u16())}
			if keys&1 != 0 {
				p.reth.va = mr.Addr() + uint64(r.u16()%(size+64))
				p.reth.rkey = mr.RKey()
			}
			p.aeth = aeth{syndrome: r.u8(), msn: r.u32() & psnMask}
			p.atomic = atomicETH{va: p.reth.va &^ 7, rkey: p.reth.rkey, swapAdd: r.u64(), compare: r.u64()}
			p.imm = r.u32()
			_, err := conn.WriteToUDP(buildPacket(p, payload, &fl), to)
			require.NoError(t, err)
			sent++
		}
		// Every forged packet taken in by the device, then its completions.
		ctr := b.ctx.(*devContext)
		for dl := time.Now().Add(5 * time.Second); ctr.Counters().PacketsReceived-before < uint64(sent); {
			if time.Now().After(dl) {
				t.Fatalf("the device took %d of %d packets", ctr.Counters().PacketsReceived-before, sent)
			}
			time.Sleep(100 * time.Microsecond)
		}
		wcs := make([]ibv.WC, 16)
		for _, cq := range []ibv.CQ{b.scq, b.rcq} {
			k, err := cq.Poll(wcs)
			if err != nil {
				continue // an overrun CQ reports it; nothing else to check
			}
			for _, wc := range wcs[:k] {
				require.LessOrEqual(t, wc.Status, ibv.WCGeneralErr, "completion %+v", wc)
				require.LessOrEqual(t, wc.ByteLen, uint32(1024), "completion %+v", wc)
			}
		}
		_ = mr.Dereg()
		b.close()
		closed = true
		for i := range guard {
			require.Equal(t, byte(0xA5), mem[i], "byte %d before the registration written", i)
			require.Equal(t, byte(0xA5), mem[guard+size+i], "byte %d after the registration written", i)
		}
	})
}

// forgeIn reads a fuzzer's input as a stream of numbers and bytes; past
// its end every read is zero.
type forgeIn struct{ b []byte }

func (r *forgeIn) more() bool { return len(r.b) > 0 }

func (r *forgeIn) next(n int) uint64 {
	var v uint64
	for i := 0; i < n && len(r.b) > 0; i++ {
		v = v<<8 | uint64(r.b[0])
		r.b = r.b[1:]
	}
	return v
}

func (r *forgeIn) u8() uint8   { return uint8(r.next(1)) }
func (r *forgeIn) u16() uint16 { return uint16(r.next(2)) }
func (r *forgeIn) u32() uint32 { return uint32(r.next(4)) }
func (r *forgeIn) u64() uint64 { return r.next(8) }

// bytes returns up to n bytes of the input.
func (r *forgeIn) bytes(n int) []byte {
	n = min(n, len(r.b))
	b := r.b[:n:n]
	r.b = r.b[n:]
	return b
}
