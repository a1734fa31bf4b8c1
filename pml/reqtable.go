package pml

// reqTable holds the requests that a peer names by id (rendezvous sends
// and receives: the RNDV's source request, the ACK's destination
// request). An id is a slot index with the slot's generation: finding a
// request is an index and a compare, and an id that outlived its request
// (a late or forged header) finds nothing, as ob1's request pointers in
// the header find their request without a search. A map keyed by a
// counter did the same for an insert and a delete per rendezvous message
// that cost 330 instructions of an 8 B Ssend round trip (bench/shapes
// -mode ssend under callgrind: mapassign, Delete and the new hash seed
// that the delete emptying a map draws). Guarded by Engine.mu.
type reqTable struct {
	slots []reqSlot
	free  []uint32 // indices of empty slots
	n     int      // requests held
}

type reqSlot struct {
	r   *Request
	gen uint32
}

// add enters r and returns its id, which is never 0.
func (t *reqTable) add(r *Request) uint64 {
	var i uint32
	if k := len(t.free); k > 0 {
		i = t.free[k-1]
		t.free = t.free[:k-1]
	} else {
		i = uint32(len(t.slots))
		t.slots = append(t.slots, reqSlot{})
	}
	s := &t.slots[i]
	s.r = r
	t.n++
	return uint64(s.gen)<<32 | uint64(i+1)
}

// get returns the request of id, or nil when id names none (any id a
// peer sends is safe to look up).
func (t *reqTable) get(id uint64) *Request {
	i := uint32(id) - 1
	if uint64(i) >= uint64(len(t.slots)) {
		return nil
	}
	if s := &t.slots[i]; s.gen == uint32(id>>32) {
		return s.r
	}
	return nil
}

// del removes the request of id, if it is there.
func (t *reqTable) del(id uint64) {
	i := uint32(id) - 1
	if uint64(i) >= uint64(len(t.slots)) {
		return
	}
	s := &t.slots[i]
	if s.gen != uint32(id>>32) || s.r == nil {
		return
	}
	s.r = nil
	s.gen++ // the id finds nothing from now on
	t.free = append(t.free, i)
	t.n--
}

// len returns how many requests the table holds.
func (t *reqTable) len() int { return t.n }

// each calls f with every request held and its id; f may del it.
func (t *reqTable) each(f func(id uint64, r *Request)) {
	for i := range t.slots {
		if s := &t.slots[i]; s.r != nil {
			f(uint64(s.gen)<<32|uint64(i+1), s.r)
		}
	}
}
