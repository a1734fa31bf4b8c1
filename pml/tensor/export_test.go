package tensor

// WithForcedProxy makes every destination go through a registered proxy
// buffer, as one the transport cannot register would.
func WithForcedProxy() Option { return func(c *config) { c.forceProxy = true } }

// WithPullMin sets the smallest content a receiver reads itself (0: it
// never does).
func WithPullMin(n int) Option { return func(c *config) { c.pullMin = n } }

// Exposed reports the contents this rank keeps registered for their
// receivers to read.
func (r *Rendezvous) Exposed() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.exposed)
}

// SetContentHook installs a hook that sees (and may change) every received
// content before it is verified; nil removes it.
func SetContentHook(f func([]byte)) { testHookContent = f }

// Pending reports the receives this rank still tracks and the
// registrations they hold.
func (r *Rendezvous) Pending() (reqs, regs int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rq := range r.reqs {
		reqs++
		if rq.reg != nil {
			regs++
		}
	}
	return reqs, regs
}

// Inject hands b to the rendezvous as a control message from peer, as
// the transport would deliver it (tagPart: as a part with header hdr).
func (r *Rendezvous) Inject(peer int, part bool, hdr, b []byte) {
	if !part {
		r.handle(peer, b)
		return
	}
	h, _, err := decodePartHdr(hdr)
	if err != nil {
		r.reject(peer, err)
		return
	}
	if msg, err := r.assemble(peer, h, b); err != nil {
		r.reject(peer, err)
	} else if msg != nil {
		r.handle(peer, msg)
	}
}

// Ahead reports the tensors in this rank's table whose content Send
// registered ahead of their request.
func (r *Rendezvous) Ahead() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, s := range r.table {
		if s.pre != nil {
			n++
		}
	}
	return n
}

// Registered reports the contents this rank registered for remote read
// so far.
func (r *Rendezvous) Registered() int64 { return r.st.registered.Load() }

// SetNextIndex makes n the counter of this rank's next request index
// (tests of its wrap).
func (r *Rendezvous) SetNextIndex(n uint32) {
	r.mu.Lock()
	r.nextIdx = n & idxMask
	r.mu.Unlock()
}

// IndexCounterMax is the largest value of the request index counter.
const IndexCounterMax = idxMask

// SampleMessages returns an encoded control message of every kind, the
// seeds of fuzz targets that speak for a peer.
func SampleMessages() [][]byte {
	var out [][]byte
	for _, m := range samples() {
		out = append(out, encode(m))
	}
	return out
}

// PartHdrLen is the size of a part's header (Inject with part).
const PartHdrLen = partHdrLen
