package soft

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCRCBytesMatchesUpdate checks the byte-wise header CRC against
// crc32.Update, and crcBTH against crc32.Update over a copy of the BTH
// with byte 4 set to ones, from random starting states.
func TestCRCBytesMatchesUpdate(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 80; n++ {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		c := rng.Uint32()
		require.Equal(t, crc32.Update(c, crc32.IEEETable, b), crcBytes(c, b), "%d bytes", n)
		if n >= bthLen {
			m := append([]byte(nil), b[:bthLen]...)
			m[4] = 0xff
			orig := append([]byte(nil), b...)
			require.Equal(t, crc32.Update(c, crc32.IEEETable, m), crcBTH(c, b), "BTH of %x", b[:bthLen])
			require.Equal(t, orig, b, "crcBTH wrote to its input")
		}
	}
}

// TestICRCKnownAnswer pins the ICRC of one packet: a READ response
// middle packet of 4096 bytes i*7 on testFlow, as computed with
// crc32.Update alone (the value Wireshark's dissector accepts in
// TestWiresharkDissects).
func TestICRCKnownAnswer(t *testing.T) {
	payload := make([]byte, 4096)
	for i := range payload {
		payload[i] = byte(i * 7)
	}
	b := buildPacket(packet{bth: bth{opcode: opReadRespMiddle, pkey: defaultPKey, destQP: 0x123456, psn: 0xabcdef}}, payload, &testFlow)
	require.Equal(t, uint32(0x278e7d3d), binary.LittleEndian.Uint32(b[len(b)-icrcLen:]))
	require.NoError(t, checkICRC(&testFlow, b))
}
