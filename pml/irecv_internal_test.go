package pml

// irecv posts a receive whose PML request the test holds itself, with no
// Handle around it, for tests of the engine's matching and completion
// (mpi posts through IrecvHandle).
func (c *Comm) irecv(buf Buffer, src, tag int) (*Request, error) {
	return c.irecvSink(buf, src, tag, nil)
}

// irecvSink is irecv whose result goes into s when s is not nil (see
// sink), as a Handle's does; s.State must hold sinkMode and nothing else.
// The request returned must not be used once s is gone: it may be back in
// the free list. It posts by postPlain when it can, else by postRecv, as
// IrecvHandle does.
func (c *Comm) irecvSink(buf Buffer, src, tag int, s *sink) (*Request, error) {
	if buf.Conv == nil {
		if r, _ := c.postPlain(nil, buf.Bytes, src, tag, s, false); r != nil {
			return r, nil
		}
	}
	return c.postRecv(nil, buf.Bytes, buf.Conv, src, tag, kindRecv, s)
}
