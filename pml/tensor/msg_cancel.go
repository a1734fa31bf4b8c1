package tensor

import "encoding/binary"

// CANCEL (receiver -> sender): the receiver gave these requests up (its
// Recv's context ended). The sender drops those it has not started to
// write and answers CANCELLED for them; one it is writing ends with its
// NOTIFY as usual. Until one of the two arrives the receiver keeps the
// destination registered, so a late write lands in memory nobody uses.
// CANCELLED (sender -> receiver) has the same layout:
//
//	u count
//	count x u request index
type cancelMsg struct {
	cancelled bool // CANCELLED rather than CANCEL
	indices   []uint32
}

func (m *cancelMsg) kind() kind {
	if m.cancelled {
		return kindCancelled
	}
	return kindCancel
}

func (m *cancelMsg) appendBody(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(m.indices)))
	for _, i := range m.indices {
		b = binary.AppendUvarint(b, uint64(i))
	}
	return b
}

func decodeCancel(r *reader, cancelled bool) *cancelMsg {
	n := r.count(1)
	m := &cancelMsg{cancelled: cancelled, indices: make([]uint32, 0, n)}
	for i := 0; i < n && r.err == nil; i++ {
		m.indices = append(m.indices, r.index())
	}
	return m
}
