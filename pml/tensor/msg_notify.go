package tensor

import (
	"encoding/binary"
	"sync"
)

// NOTIFY (sender -> receiver) says that the content of a request is in
// place: the notification of a put, where RDMA's WRITE_WITH_IMM would
// carry the request index in its immediate value. One message notifies
// several requests of a batch:
//
//	u count
//	count x entry:
//	  u   request index
//	  b   how the content came: 0 none (dead or empty tensor), 1 put into
//	      the registered destination, 2 inline (the bytes follow here),
//	      3 a separate MPI message of tag dataTag(index), 4 get: the
//	      receiver reads it from the sender's registered memory (it
//	      asked to pull)
//	  b   1 when a CRC-32C of the content follows (WithChecksum), else 0
//	  [u32 CRC-32C]
//	  [str content]   (via = 2)
//	  [str handle]    (via = 4: the content's registration)
type notifyMsg struct {
	entries []notifyEntry
	one     *notifyOne // the allocation of a single-entry message, for recycle
}

// notifyOne is a single-entry NOTIFY in one allocation, from notifyOnes.
type notifyOne struct {
	m      notifyMsg
	e      [1]notifyEntry
	handle [32]byte // room for the entry's handle (transports' are 16-32 bytes)
}

var notifyOnes = sync.Pool{New: func() any { return new(notifyOne) }}

type via uint8

const (
	viaNone    via = 0
	viaPut     via = 1
	viaInline  via = 2
	viaMessage via = 3
	viaGet     via = 4
)

type notifyEntry struct {
	index  uint32
	via    via
	hasSum bool
	sum    uint32
	inline []byte
	handle []byte // viaGet
}

// newNotifyMsg returns a message with room for n entries; a single one
// (the answer to one request, the steady state) shares the message's
// allocation, which recycle gives back once the message is sent or
// handled.
func newNotifyMsg(n int) *notifyMsg {
	if n == 1 {
		one := notifyOnes.Get().(*notifyOne)
		one.m.entries, one.m.one = one.e[:0:1], one
		return &one.m
	}
	return &notifyMsg{entries: make([]notifyEntry, 0, n)}
}

func (m *notifyMsg) kind() kind { return kindNotify }

func (m *notifyMsg) appendBody(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(m.entries)))
	for _, e := range m.entries {
		b = binary.AppendUvarint(b, uint64(e.index))
		b = append(b, byte(e.via), boolByte(e.hasSum))
		if e.hasSum {
			b = binary.LittleEndian.AppendUint32(b, e.sum)
		}
		switch e.via {
		case viaInline:
			b = appendBytes(b, e.inline)
		case viaGet:
			b = appendBytes(b, e.handle)
		}
	}
	return b
}

func decodeNotify(r *reader) *notifyMsg {
	n := r.count(3)
	m := newNotifyMsg(n)
	for i := 0; i < n && r.err == nil; i++ {
		var e notifyEntry
		e.index = r.index()
		e.via = via(r.u8())
		if e.via > viaGet {
			r.fail("content path %d", e.via)
		}
		switch r.u8() {
		case 0:
		case 1:
			e.hasSum = true
			e.sum = r.u32()
		default:
			r.fail("checksum flag is neither 0 nor 1")
		}
		// Both alias the message: a NOTIFY is handled within the call
		// that delivered it, which keeps neither.
		switch e.via {
		case viaInline:
			e.inline = r.bytes(maxMessage)
		case viaGet:
			e.handle = r.bytes(maxHandle)
		}
		m.entries = append(m.entries, e)
	}
	return m
}
