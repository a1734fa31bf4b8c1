package tensor

import "encoding/binary"

// META_DATA_RESPONSE (sender -> receiver): the tensor's meta-data differs
// from the receiver's cached copy (or the receiver had none). The receiver
// updates its cache, allocates a destination of the new size and sends
// TENSOR_RE_REQUEST. One message answers several requests of a batch:
//
//	u count
//	count x (u request index, meta-data)
type metaMsg struct {
	entries []metaEntry
}

type metaEntry struct {
	index uint32
	meta  meta
}

func (m *metaMsg) kind() kind { return kindMeta }

func (m *metaMsg) appendBody(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(m.entries)))
	for _, e := range m.entries {
		b = binary.AppendUvarint(b, uint64(e.index))
		b = appendMeta(b, e.meta)
	}
	return b
}

func decodeMeta(r *reader) *metaMsg {
	n := r.count(5)
	m := &metaMsg{entries: make([]metaEntry, 0, n)}
	for i := 0; i < n && r.err == nil; i++ {
		var e metaEntry
		e.index = r.index()
		e.meta = r.meta()
		m.entries = append(m.entries, e)
	}
	return m
}
