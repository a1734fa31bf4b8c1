package soft

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// pattern fills b with bytes derived from i.
func pattern(b []byte, i int) {
	for k := range b {
		b[k] = byte(i*31 + k*7 + k>>9)
	}
}

// runOrdered posts n requests from a to b, alternating WRITE_WITH_IMM and
// SEND of 1..slot bytes, each with its own source and target slot, and
// checks that b sees every one once, in order, with its bytes, and that a
// sees every completion in order.
func runOrdered(t *testing.T, a, b *end, n, slot int) {
	recvs := 0
	postRecvs := func(k int) {
		wrs := make([]ibv.RecvWR, k)
		for j := range wrs {
			i := recvs + j
			wrs[j] = ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(b.mr, (i%n)*slot, slot)}}
		}
		_, err := b.qp.PostRecv(wrs)
		require.NoError(t, err)
		recvs += k
	}
	postRecvs(512)
	size := func(i int) int { return 1 + (i*2654435761)%slot }
	posted, sendDone, recvDone := 0, 0, 0
	wc := make([]ibv.WC, 64)
	dl := deadline(t, 120*time.Second)
	for recvDone < n || sendDone < n {
		for posted < n && posted-sendDone < 256 {
			i := posted
			sz := size(i)
			pattern(a.buf[i*slot:i*slot+sz], i)
			wr := ibv.SendWR{ID: uint64(i), Flags: ibv.FlagSignaled, Imm: uint32(i),
				SGList: []ibv.SGEntry{ibv.SGE(a.mr, i*slot, sz)}}
			if i%2 == 0 {
				wr.Opcode, wr.RemoteAddr, wr.RKey = ibv.WRRDMAWriteWithImm, b.mr.Addr()+uint64(i*slot), b.mr.RKey()
			} else {
				wr.Opcode = ibv.WRSendWithImm
			}
			_, err := a.qp.PostSend([]ibv.SendWR{wr})
			require.NoError(t, err)
			posted++
		}
		k, err := a.scq.Poll(wc)
		require.NoError(t, err)
		for _, c := range wc[:k] {
			require.Equal(t, ibv.WCSuccess, c.Status, "send %d: %v", c.ID, c.Status)
			require.Equal(t, uint64(sendDone), c.ID, "send completions out of order")
			sendDone++
		}
		k2, err := b.rcq.Poll(wc)
		require.NoError(t, err)
		for _, c := range wc[:k2] {
			i := recvDone
			require.Equal(t, ibv.WCSuccess, c.Status, "receive %d: %v", i, c.Status)
			require.Equal(t, uint32(i), c.Imm, "receive completions out of order")
			require.Equal(t, uint32(size(i)), c.ByteLen)
			want := make([]byte, size(i))
			pattern(want, i)
			if i%2 == 0 {
				require.Equal(t, ibv.WCRecvRDMAWithImm, c.Opcode)
			} else {
				require.Equal(t, ibv.WCRecv, c.Opcode)
			}
			got := b.buf[i*slot : i*slot+size(i)]
			if !bytes.Equal(want, got) {
				t.Fatalf("message %d: bytes differ", i)
			}
			recvDone++
		}
		if k2 > 0 && recvs-recvDone < 256 {
			postRecvs(256)
		}
		if k == 0 && k2 == 0 {
			if time.Now().After(dl) {
				t.Fatalf("stuck: posted %d, sent %d, received %d; counters %+v", posted, sendDone, recvDone, a.ctx.(*devContext).Counters())
			}
			time.Sleep(20 * time.Microsecond)
		}
	}
}

func TestOrderedUnderFaults(t *testing.T) {
	n := 10000
	if testing.Short() {
		n = 2000
	}
	const slot = 2048
	faults := Config{Drop: 0.02, Dup: 0.02, Reorder: 0.02, Corrupt: 0.02, Seed: 1}
	fb := faults
	fb.Seed = 2
	o := defaultOpts()
	o.bufSize = n * slot
	o.mtu = ibv.MTU512
	o.timeout = 10 // 4 ms: tail losses wait for it
	o.recvWR = 1024
	o.cqe = 2048
	a, b := newPair(t, faults, fb, o)
	start := time.Now()
	runOrdered(t, a, b, n, slot)
	ca, cb := a.ctx.(*devContext).Counters(), b.ctx.(*devContext).Counters()
	t.Logf("%d messages in %v\nsender %+v\nreceiver %+v", n, time.Since(start), ca, cb)
	require.NotZero(t, cb.DropsInjected+ca.DropsInjected)
	require.NotZero(t, cb.ICRCErrors+ca.ICRCErrors)
	require.NotZero(t, ca.Retransmits)
	_ = binary.LittleEndian
	_ = fmt.Sprint
}
