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

func (m *cancelMsg) appendBody(b []byte) []byte { return appendIndices(b, m.indices) }

func decodeCancel(r *reader, cancelled bool) *cancelMsg {
	return &cancelMsg{cancelled: cancelled, indices: r.indices()}
}

// appendIndices appends a list of request indices: u count, count x u.
func appendIndices(b []byte, idx []uint32) []byte {
	b = binary.AppendUvarint(b, uint64(len(idx)))
	for _, i := range idx {
		b = binary.AppendUvarint(b, uint64(i))
	}
	return b
}

// indices reads a list of request indices (nil when empty).
func (r *reader) indices() []uint32 { return r.indicesInto(nil) }

// indicesInto is indices with the result in buf when it has room (its
// length is ignored).
func (r *reader) indicesInto(buf []uint32) []uint32 {
	n := r.count(1)
	if n == 0 {
		return nil
	}
	out := buf[:0]
	if n > cap(buf) {
		out = make([]uint32, 0, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		out = append(out, r.index())
	}
	return out
}

// RELEASE (receiver -> sender): the receiver finished reading these
// contents (pull); the sender releases their registrations. Releases
// usually ride in the next TENSOR_REQUEST to the sender; RELEASE carries
// them when many wait. Layout as CANCEL.
type releaseMsg struct {
	indices []uint32
}

func (m *releaseMsg) kind() kind                 { return kindRelease }
func (m *releaseMsg) appendBody(b []byte) []byte { return appendIndices(b, m.indices) }

func decodeRelease(r *reader) *releaseMsg { return &releaseMsg{indices: r.indices()} }
