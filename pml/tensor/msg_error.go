package tensor

import "encoding/binary"

// ERROR_STATUS (sender -> receiver): the request failed on the sender;
// the receiver's Recv fails with the sender's message.
//
//	u   request index
//	str message (at most maxErrorText bytes)
type errorMsg struct {
	index uint32
	text  string
}

func (m *errorMsg) kind() kind { return kindError }

func (m *errorMsg) appendBody(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(m.index))
	return appendStr(b, cut(m.text))
}

func decodeError(r *reader) *errorMsg {
	m := &errorMsg{}
	m.index = r.index()
	m.text = r.str(maxErrorText)
	return m
}
