package mpi

import (
	"slices"

	"github.com/gompi-org/gompi/internal/mpierr"
	"github.com/gompi-org/gompi/pml"
)

// Internal tags: negative, so AnyTag never matches them and user tags
// (0..TagUB) never collide.
const (
	tagBarrier = -2
	tagColl    = -3
)

// Barrier returns once every rank of c called it (dissemination algorithm:
// ceil(log2 n) rounds of zero-byte messages).
func (c *Comm) Barrier() error {
	if err := c.valid(); err != nil {
		return err
	}
	n, me := c.Size(), c.Rank()
	for k := 1; k < n; k *= 2 {
		if _, err := c.pc.Sendrecv(pml.Buffer{}, (me+k)%n, tagBarrier, pml.Buffer{}, (me-k+n)%n, tagBarrier); err != nil {
			return err
		}
	}
	return nil
}

// allgather exchanges a vector of k int64 per rank; it returns the n*k table.
func (c *Comm) allgather(v []int64) ([]int64, error) {
	n, me, k := c.Size(), c.Rank(), len(v)
	table := make([]int64, n*k)
	copy(table[me*k:], v)
	if me != 0 {
		if err := c.pc.Send(pml.Buffer{Bytes: int64Bytes(v)}, 0, tagColl, pml.Standard); err != nil {
			return nil, err
		}
		if _, err := c.pc.Recv(pml.Buffer{Bytes: int64Bytes(table)}, 0, tagColl); err != nil {
			return nil, err
		}
		return table, nil
	}
	for r := 1; r < n; r++ {
		if _, err := c.pc.Recv(pml.Buffer{Bytes: int64Bytes(table[r*k : (r+1)*k])}, r, tagColl); err != nil {
			return nil, err
		}
	}
	for r := 1; r < n; r++ {
		if err := c.pc.Send(pml.Buffer{Bytes: int64Bytes(table)}, r, tagColl, pml.Standard); err != nil {
			return nil, err
		}
	}
	return table, nil
}

// newContext agrees with the other ranks of c on a context id that is free
// on all of them, in rounds: each rank proposes (and reserves) its lowest
// free id, all take the maximum, each reserves that one if it can; if one
// cannot (another creation on another communicator took it meanwhile),
// all release and go again above it. extra values are gathered along in
// the first round (Split's color and key); the returned table holds them
// as rows of 1+len(extra) values.
func (c *Comm) newContext(extra ...int64) (uint32, []int64, error) {
	e := c.in.engine
	from := uint32(0)
	var first []int64
	for {
		prop := e.ProposeContext(from)
		v := append([]int64{int64(prop)}, extra...)
		table, err := c.allgather(v)
		if err != nil {
			e.ReleaseContext(prop)
			return 0, nil, err
		}
		if first == nil {
			first = table
		}
		var best int64
		for r := 0; r < c.Size(); r++ {
			best = max(best, table[r*len(v)])
		}
		if best >= 1<<32-1 {
			e.ReleaseContext(prop)
			return 0, nil, mpierr.Errorf(mpierr.ErrComm, "out of communicator context ids")
		}
		ctx := uint32(best)
		if ctx != prop {
			e.ReleaseContext(prop)
		}
		ok := int64(0)
		if e.ReserveContext(ctx, ctx == prop) {
			ok = 1
		}
		oks, err := c.allgather([]int64{ok})
		if err != nil {
			if ok == 1 {
				e.ReleaseContext(ctx)
			}
			return 0, nil, err
		}
		if !slices.Contains(oks, 0) {
			return ctx, first, nil
		}
		if ok == 1 {
			e.ReleaseContext(ctx)
		}
		from = ctx + 1
	}
}

// Dup returns a new communicator with the same group and a separate
// matching context. Collective: every rank of c must call it.
func (c *Comm) Dup() (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	c.coll.Lock()
	defer c.coll.Unlock()
	ctx, _, err := c.newContext()
	if err != nil {
		return nil, err
	}
	group := make([]int, c.Size())
	for i := range group {
		group[i] = c.pc.World(i)
	}
	pc, err := c.in.engine.NewComm(ctx, c.Rank(), group)
	if err != nil {
		return nil, err
	}
	return newComm(c.in, pc), nil
}

// Split partitions c: ranks that pass the same color form a new
// communicator, ordered by key (then by rank in c). A negative color
// (Undefined) takes part but returns (nil, nil). Collective.
func (c *Comm) Split(color, key int) (*Comm, error) {
	if err := c.valid(); err != nil {
		return nil, err
	}
	if color < 0 {
		color = -1
	}
	c.coll.Lock()
	defer c.coll.Unlock()
	ctx, table, err := c.newContext(int64(color), int64(key))
	if err != nil {
		return nil, err
	}
	if color < 0 {
		return nil, nil
	}
	type member struct{ key, rank int }
	var ms []member
	for r := 0; r < c.Size(); r++ {
		if table[r*3+1] == int64(color) {
			ms = append(ms, member{int(table[r*3+2]), r})
		}
	}
	slices.SortStableFunc(ms, func(a, b member) int {
		if a.key != b.key {
			return a.key - b.key
		}
		return a.rank - b.rank
	})
	group := make([]int, len(ms))
	me := -1
	for i, m := range ms {
		group[i] = c.pc.World(m.rank)
		if m.rank == c.Rank() {
			me = i
		}
	}
	pc, err := c.in.engine.NewComm(ctx, me, group)
	if err != nil {
		return nil, err
	}
	return newComm(c.in, pc), nil
}

// Free releases a communicator made by Dup or Split. Later calls on it
// return ErrComm. Freeing the world communicator is an error.
func (c *Comm) Free() error {
	if err := c.valid(); err != nil {
		return err
	}
	if c.pc.Context() == 0 {
		return mpierr.Errorf(mpierr.ErrComm, "the world communicator cannot be freed")
	}
	c.pc.Free()
	return nil
}
