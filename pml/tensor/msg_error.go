package tensor

import (
	"encoding/binary"
	"fmt"
)

// ERROR_STATUS (sender -> receiver): the request failed on the sender;
// the receiver's Recv fails with the sender's message, and with the
// class's error when the failure is the sender's whole rendezvous
// (aborted, closed), so that the receiver sees the same error class
// whichever of the sender's ERROR_STATUS and the aborting rank's own ABORT
// reaches it first.
//
//	u   request index
//	str message (at most maxErrorText bytes)
//	b   class: 0 this request failed, 1 the sender's rendezvous is
//	    aborted, 2 it is closed
type errorMsg struct {
	index uint32
	text  string
	class errClass
}

// errClass is why an ERROR_STATUS was sent.
type errClass uint8

const (
	classRequest errClass = iota // the request (the tensor, its meta-data)
	classAborted                 // the sender's rendezvous is aborted (mpi.ErrAborted)
	classClosed                  // the sender's rendezvous is closed (ErrClosed)
	classCount
)

func (m *errorMsg) kind() kind { return kindError }

func (m *errorMsg) appendBody(b []byte) []byte {
	b = binary.AppendUvarint(b, uint64(m.index))
	b = appendStr(b, cut(m.text))
	return append(b, byte(m.class))
}

func decodeError(r *reader) *errorMsg {
	m := &errorMsg{}
	m.index = r.index()
	m.text = r.str(maxErrorText)
	m.class = errClass(r.u8())
	if r.err == nil && m.class >= classCount {
		r.fail("%s", fmt.Sprintf("error class %d", m.class))
	}
	return m
}
