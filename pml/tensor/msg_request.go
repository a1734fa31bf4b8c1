package tensor

import (
	"encoding/binary"
	"sync"
)

// TENSOR_REQUEST and TENSOR_RE_REQUEST (receiver -> sender) carry one or
// more requests, so that the receiver can batch the requests of a step:
//
//	u count
//	count x entry:
//	  u   request index (the receiver's; every answer names it)
//	  s   step
//	  str name
//	  b   flags: 1 = meta-data follows (the receiver's cached copy),
//	             2 = a destination handle follows,
//	             4 = pull: the receiver reads the content from the
//	                 sender's memory (answer NOTIFY via get with a
//	                 handle); never with 2
//	  [meta-data]                       (msg.go)
//	  [str handle, str transport name]  the registered destination and the
//	                                    transport that registered it
//	u count
//	count x u request index   released: contents the receiver finished
//	                          reading (pull); the sender releases their
//	                          registrations
//
// A request without meta-data is a cache miss: the sender answers with
// META_DATA_RESPONSE. A TENSOR_RE_REQUEST always has both.
type requestMsg struct {
	re       bool
	entries  []reqEntry
	released []uint32
	one      *requestOne // the allocation of a single-entry request to send, for recycle
}

type reqEntry struct {
	index     uint32
	step      int64
	name      string
	hasMeta   bool
	meta      meta
	handle    []byte // nil: no destination
	transport string
	pull      bool // the receiver reads the content (reqPull)
}

const (
	reqHasMeta   = 1
	reqHasHandle = 2
	reqPull      = 4
)

// requestOne is a single-entry request in one allocation: a Recv's
// request, the steady state. A decoder puts a short shape and a few
// releases in it too.
type requestOne struct {
	m     requestMsg
	e     [1]reqEntry
	shape [4]int64
	rel   [4]uint32
}

// newRequestMsg returns a message with room for n entries; a single one
// shares the message's allocation, which recycle gives back once the
// message is sent or handled. A handler that keeps an entry past its call
// (a request waiting for its tensor) copies the entry's shape, which is
// in the allocation.
func newRequestMsg(re bool, n int) *requestMsg {
	m, _ := newRequestMsgOne(re, n)
	return m
}

var requestOnes = sync.Pool{New: func() any { return new(requestOne) }}

// newRequestMsgOne is newRequestMsg that also returns, for a single entry,
// the allocation's room for a shape and releases (nil otherwise).
func newRequestMsgOne(re bool, n int) (*requestMsg, *requestOne) {
	if n == 1 {
		one := requestOnes.Get().(*requestOne)
		one.m.re, one.m.entries, one.m.one = re, one.e[:0:1], one
		return &one.m, one
	}
	return &requestMsg{re: re, entries: make([]reqEntry, 0, n)}, nil
}

func (m *requestMsg) kind() kind {
	if m.re {
		return kindReRequest
	}
	return kindRequest
}

func (m *requestMsg) appendBody(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(m.entries)))
	for _, e := range m.entries {
		b = e.append(b)
	}
	return appendIndices(b, m.released)
}

func (e *reqEntry) append(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(e.index))
	b = binary.AppendVarint(b, e.step)
	b = appendStr(b, e.name)
	var flags byte
	if e.hasMeta {
		flags |= reqHasMeta
	}
	if e.handle != nil {
		flags |= reqHasHandle
	}
	if e.pull {
		flags |= reqPull
	}
	b = append(b, flags)
	if e.hasMeta {
		b = appendMeta(b, e.meta)
	}
	if e.handle != nil {
		b = appendBytes(b, e.handle)
		b = appendStr(b, e.transport)
	}
	return b
}

// size is an upper bound of e's encoded length (for splitting batches).
func (e *reqEntry) size() int {
	return 40 + len(e.name) + len(e.handle) + len(e.transport) + binary.MaxVarintLen64*len(e.meta.shape)
}

func decodeRequest(r *reader, re bool) *requestMsg {
	n := r.count(5)
	m, one := newRequestMsgOne(re, n)
	var shapeBuf []int64
	var relBuf []uint32
	if one != nil {
		shapeBuf, relBuf = one.shape[:0], one.rel[:0]
	}
	for i := 0; i < n && r.err == nil; i++ {
		var e reqEntry
		e.index = r.index()
		e.step = r.varint()
		e.name = r.str(MaxName)
		flags := r.u8()
		if flags&^(reqHasMeta|reqHasHandle|reqPull) != 0 || flags&reqHasHandle != 0 && flags&reqPull != 0 {
			r.fail("request flags %#x", flags)
		}
		e.pull = flags&reqPull != 0
		if flags&reqHasMeta != 0 {
			e.hasMeta = true
			e.meta = r.metaInto(shapeBuf)
		}
		if flags&reqHasHandle != 0 {
			e.handle = append([]byte{}, r.bytes(maxHandle)...)
			e.transport = r.str(64)
		}
		if r.err == nil {
			if err := checkName(e.name); err != nil {
				r.fail("%v", err)
			}
			if re && !e.hasMeta {
				r.fail("TENSOR_RE_REQUEST %d without meta-data", e.index)
			}
		}
		m.entries = append(m.entries, e)
	}
	if r.err == nil {
		m.released = r.indicesInto(relBuf)
	}
	return m
}
