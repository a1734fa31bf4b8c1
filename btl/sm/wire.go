package sm

import (
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/gompi-org/gompi/internal/mpierr"
)

// hostID says which kernel and namespaces a process runs in: two processes
// can share a segment through /proc/<pid>/fd/<fd> only when all of it
// matches.
type hostID struct {
	host  string // the launcher's name for the host (GOMPI_NODE), else the hostname
	boot  string // /proc/sys/kernel/random/boot_id
	pidNS string // /proc/self/ns/pid link
	uid   int
}

// localHostID reads this process's hostID. The host part is the name
// gorun's host list gives the host, when the rank runs on one of several
// (GOMPI_NODE, set by gorun's daemons): two hosts of a job that are one
// machine under one hostname (network namespaces, containers) are then
// told apart, so that neither takes the other's ranks for its own.
func localHostID() hostID {
	h := os.Getenv("GOMPI_NODE")
	if h == "" {
		h, _ = os.Hostname()
	}
	boot, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	ns, _ := os.Readlink("/proc/self/ns/pid")
	return hostID{host: h, boot: strings.TrimSpace(string(boot)), pidNS: ns, uid: os.Getuid()}
}

func (h hostID) String() string {
	return fmt.Sprintf("host %q boot %s pid namespace %s uid %d", h.host, h.boot, h.pidNS, h.uid)
}

// wireEntry is what a rank publishes in the store (under "btl.sm.<rank>"
// and "btl.sm.local.<host>.<boot id>.<local rank>"): where its segment is.
type wireEntry struct {
	rank, local, localSize int
	pid, fd                int
	size                   int
	nonce                  uint64
	id                     hostID
}

const wireVersion = 1

func rankKey(rank int) string { return "btl.sm." + strconv.Itoa(rank) }

// localKey names the entry of local rank local of host id. The boot id
// keeps apart two machines that have one hostname: each has its own local
// ranks 0, 1, ...
func localKey(id hostID, local int) string {
	return "btl.sm.local." + id.host + "." + id.boot + "." + strconv.Itoa(local)
}

func (e *wireEntry) encode() []byte {
	le := binary.LittleEndian
	b := []byte{wireVersion}
	for _, v := range []int{e.rank, e.local, e.localSize, e.pid, e.fd, e.id.uid} {
		b = le.AppendUint32(b, uint32(v))
	}
	b = le.AppendUint64(b, uint64(e.size))
	b = le.AppendUint64(b, e.nonce)
	for _, s := range []string{e.id.host, e.id.boot, e.id.pidNS} {
		b = le.AppendUint16(b, uint16(len(s)))
		b = append(b, s...)
	}
	return b
}

// decodeWire parses a peer's store entry; malformed input is an error
// wrapping mpierr.ErrProtocol.
func decodeWire(b []byte) (wireEntry, error) {
	var e wireEntry
	bad := func(what string) (wireEntry, error) {
		return e, mpierr.Errorf(mpierr.ErrProtocol, "sm: store entry: %s", what)
	}
	le := binary.LittleEndian
	if len(b) < 1+6*4+16 || b[0] != wireVersion {
		return bad("short or wrong version")
	}
	b = b[1:]
	v := make([]int, 6)
	for i := range v {
		v[i] = int(le.Uint32(b))
		b = b[4:]
	}
	e.rank, e.local, e.localSize, e.pid, e.fd, e.id.uid = v[0], v[1], v[2], v[3], v[4], v[5]
	size := le.Uint64(b)
	e.nonce = le.Uint64(b[8:])
	b = b[16:]
	if size > maxSegment {
		return bad("segment size")
	}
	e.size = int(size)
	var strs [3]string
	for i := range strs {
		if len(b) < 2 {
			return bad("truncated")
		}
		n := int(le.Uint16(b))
		if len(b) < 2+n {
			return bad("truncated string")
		}
		strs[i] = string(b[2 : 2+n])
		b = b[2+n:]
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	e.id.host, e.id.boot, e.id.pidNS = strs[0], strs[1], strs[2]
	return e, nil
}
