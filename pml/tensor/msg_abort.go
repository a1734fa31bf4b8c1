package tensor

// ABORT (any rank -> every other rank): the rendezvous is aborted; every
// pending and later Send and Recv of the receiving rank fails with an
// error carrying the text. CLOSED (same layout, empty text): the sending
// rank closed its rendezvous; receives from it fail and requests to it are
// not made.
//
//	str message (at most maxErrorText bytes)
type abortMsg struct {
	closed bool
	text   string
}

func (m *abortMsg) kind() kind {
	if m.closed {
		return kindClosed
	}
	return kindAbort
}

func (m *abortMsg) appendBody(b []byte) []byte { return appendStr(b, cut(m.text)) }

func decodeAbort(r *reader, closed bool) *abortMsg {
	return &abortMsg{closed: closed, text: r.str(maxErrorText)}
}
