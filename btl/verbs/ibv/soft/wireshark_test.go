package soft

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gompi-org/gompi/btl/verbs/ibv"
	"github.com/stretchr/testify/require"
)

// TestWiresharkDissects captures the device's traffic on lo with dumpcap
// and reads it back with tshark: every packet is dissected as InfiniBand
// (RRoCE) without a malformed packet or expert warning, and the ICRC of
// every packet, recomputed over the IP and UDP headers as captured, is
// right. Wireshark's heuristic dissectors of InfiniBand payloads (RPC over
// RDMA, iSER, NVMe over RDMA, ...) are switched off: they parse the bytes
// a SEND carries as their own protocol and report those as malformed. By
// hand: run a workload with verbs_soft_gso=false while
// `dumpcap -i lo -f 'udp port 4791' -w f.pcap` captures, then
// `tshark -r f.pcap --disable-protocol rpcordma -Y '_ws.malformed'`
// prints nothing.
//
// It runs when tshark and dumpcap are installed (apt-get install tshark)
// and capturing on lo is permitted, and skips saying which is missing.
func TestWiresharkDissects(t *testing.T) {
	if testing.Short() {
		t.Skip("the capture test is skipped under -short")
	}
	if raceEnabled {
		// The test checks the wire format, which the race detector does
		// not change; slowed down by it, the device's packets outrun the
		// capture, which then misses some of the packets it must see.
		t.Skip("the capture test is skipped under the race detector")
	}
	tshark, err1 := exec.LookPath("tshark")
	dumpcap, err2 := exec.LookPath("dumpcap")
	if err1 != nil || err2 != nil {
		t.Skip("tshark and dumpcap are needed (apt-get install tshark)")
	}
	// A port of its own, so that other traffic on 4791 stays out.
	port := 20000 + os.Getpid()%20000
	pcap := filepath.Join(t.TempDir(), "soft.pcap")
	cap := exec.Command(dumpcap, "-i", "lo", "-B", "64", "-f", fmt.Sprintf("udp port %d", port), "-w", pcap)
	stderr, err := cap.StderrPipe()
	require.NoError(t, err)
	if err := cap.Start(); err != nil {
		t.Skipf("dumpcap does not start: %v", err)
	}
	defer cap.Process.Kill()
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		var all []string
		for sc.Scan() {
			all = append(all, sc.Text())
			if strings.HasPrefix(sc.Text(), "Capturing on") {
				ready <- ""
			}
		}
		ready <- strings.Join(all, "\n")
	}()
	select {
	case msg := <-ready:
		if msg != "" {
			t.Skipf("dumpcap cannot capture on lo: %s", msg)
		}
	case <-time.After(20 * time.Second):
		t.Skip("dumpcap did not start capturing within 20 s")
	}

	// Traffic: every request opcode, READ responses, atomic ACKs, ACKs,
	// RNR NAKs, sequence NAKs (receive-side drops), a remote access NAK.
	cfg := Config{Port: port, NoGSO: true}
	lossy := Config{Port: port, NoGSO: true, Drop: 0.05, Seed: 3}
	o := defaultOpts()
	o.timeout = 10
	o.minRNR = 1
	a, b := newPair(t, cfg, lossy, o)
	// dumpcap says it captures a little before it does: zero-length
	// WRITEs go out until the file holds one, so that what follows is
	// captured whole.
	sentBy := func() int {
		return int(a.ctx.(*devContext).Counters().PacketsSent + b.ctx.(*devContext).Counters().PacketsSent)
	}
	dl := deadline(t, 20*time.Second)
	for captured(tshark, pcap) == 0 {
		require.False(t, time.Now().After(dl), "dumpcap wrote no packet in 20 s")
		_, err = a.qp.PostSend([]ibv.SendWR{writeWR(9, a.mr, 0, b.mr, 0)})
		require.NoError(t, err)
		pollOne(t, a.scq, ibv.WCSuccess)
	}
	// From here on the capture is live: every packet sent from now is
	// in the file once dumpcap has written it (with one of the warm-up).
	sentBefore := sentBy()
	rwrs := make([]ibv.RecvWR, 30)
	for i := range rwrs {
		rwrs[i] = ibv.RecvWR{ID: uint64(i), SGList: []ibv.SGEntry{ibv.SGE(b.mr, 0, 20000)}}
	}
	_, err = b.qp.PostRecv(rwrs)
	require.NoError(t, err)
	for i := 0; i < 10; i++ {
		n := 1 + i*1700
		wrs := []ibv.SendWR{
			sendWR(10, a.mr, n),
			{ID: 11, Opcode: ibv.WRSendWithImm, Imm: uint32(i), Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, n)}},
			writeWR(12, a.mr, n, b.mr, 0),
			{ID: 13, Opcode: ibv.WRRDMAWriteWithImm, Imm: 5, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, n)},
				RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			{ID: 14, Opcode: ibv.WRRDMARead, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, n)},
				RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			{ID: 15, Opcode: ibv.WRAtomicCmpAndSwp, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, 8)},
				RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
			{ID: 16, Opcode: ibv.WRAtomicFetchAndAdd, Flags: ibv.FlagSignaled, SGList: []ibv.SGEntry{ibv.SGE(a.mr, 0, 8)},
				RemoteAddr: b.mr.Addr(), RKey: b.mr.RKey()},
		}
		_, err = a.qp.PostSend(wrs)
		require.NoError(t, err)
		for range wrs {
			pollOne(t, a.scq, ibv.WCSuccess)
		}
	}
	// The receives are used up: an RNR NAK, then a receive and success;
	// five times, as the capture may drop a packet on a busy host.
	for range 5 {
		before := b.ctx.(*devContext).Counters().RNRNAKsSent
		_, err = a.qp.PostSend([]ibv.SendWR{sendWR(1, a.mr, 100)})
		require.NoError(t, err)
		dl := deadline(t, 10*time.Second)
		for b.ctx.(*devContext).Counters().RNRNAKsSent == before {
			require.False(t, time.Now().After(dl), "no RNR NAK sent: %+v", b.ctx.(*devContext).Counters())
			time.Sleep(time.Millisecond)
		}
		_, err = b.qp.PostRecv(rwrs[:1])
		require.NoError(t, err)
		pollOne(t, a.scq, ibv.WCSuccess)
	}
	bad := writeWR(20, a.mr, 10, b.mr, 0)
	bad.RKey++
	_, err = a.qp.PostSend([]ibv.SendWR{bad})
	require.NoError(t, err)
	pollOne(t, a.scq, ibv.WCRemAccessErr)
	// Stop the capture once the file holds every packet the two devices
	// sent (or after 20 s: what is missing then fails the checks below).
	want := sentBy() - sentBefore + 1
	dl = deadline(t, 20*time.Second)
	for captured(tshark, pcap) < want && time.Now().Before(dl) {
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, cap.Process.Signal(syscall.SIGINT))
	_ = cap.Wait()

	// Heuristic payload dissectors off (see above).
	args := []string{"-r", pcap, "-d", fmt.Sprintf("udp.port==%d,infiniband", port)}
	if out, err := exec.Command(tshark, "-G", "heuristic-decodes").Output(); err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) >= 2 && f[0] == "infiniband.payload" && f[1] != "ethertype" && !strings.HasPrefix(f[1], "infiniband") {
				args = append(args, "--disable-protocol", f[1])
			}
		}
	}
	out, err := exec.Command(tshark, append(args, "-Y", `!infiniband || _ws.malformed || _ws.expert.severity >= "Warning"`)...).Output()
	require.NoError(t, err)
	require.Empty(t, strings.TrimSpace(string(out)), "packets Wireshark does not take as InfiniBand, malformed, or with warnings")

	out, err = exec.Command(tshark, append(args, "-T", "fields", "-E", "separator=,", "-e", "ip.src", "-e", "ip.dst",
		"-e", "udp.srcport", "-e", "udp.dstport", "-e", "infiniband.bth.opcode", "-e", "infiniband.aeth.syndrome", "-e", "udp.payload")...).Output()
	require.NoError(t, err)
	ops := map[uint64]int{}
	naks := map[uint64]int{}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, ",")
		require.Len(t, f, 7, line)
		sp, _ := strconv.Atoi(f[2])
		dp, _ := strconv.Atoi(f[3])
		fl := flow{src: netip.MustParseAddr(f[0]), dst: netip.MustParseAddr(f[1]), sport: uint16(sp), dport: uint16(dp)}
		payload, err := hex.DecodeString(strings.ReplaceAll(f[6], ":", ""))
		require.NoError(t, err)
		require.NoError(t, checkICRC(&fl, payload), "ICRC of %s", line[:min(len(line), 80)])
		op, _ := strconv.ParseUint(f[4], 0, 8)
		ops[op]++
		if f[5] != "" {
			s, _ := strconv.ParseUint(f[5], 0, 8)
			naks[s&0xe0]++
		}
		n++
	}
	t.Logf("%d packets; opcodes %v; AETH kinds %v", n, ops, naks)
	for op := uint8(0); op < numOpcodes; op++ {
		require.NotZero(t, ops[uint64(op)], "no %s packet captured", opName(op))
	}
	require.NotZero(t, naks[uint64(synRNR)], "no RNR NAK captured")
	require.NotZero(t, naks[uint64(synNAK)], "no NAK captured")
	_ = bytes.Equal
}

// captured counts the packets in the capture file dumpcap is writing
// (tshark reads the complete blocks of a file still being written).
func captured(tshark, pcap string) int {
	out, _ := exec.Command(tshark, "-r", pcap, "-T", "fields", "-e", "frame.number").Output()
	return strings.Count(string(out), "\n")
}
