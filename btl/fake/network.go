package fake

import (
	"fmt"
	"math/rand/v2"
	"strings"

	"github.com/gompi-org/gompi/btl"
	"github.com/gompi-org/gompi/internal/mpierr"
)

// What a test does with a Network: attach ranks, look at the pending
// operations and the trace, and deliver, drop, reorder, cut or inject them.

// Attach makes the module of world rank rank, delivering to d.
func (n *Network) Attach(rank int, d *btl.Dispatcher, cfg Config) *Module {
	if cfg.Name == "" {
		cfg.Name = Name
	}
	m := &Module{net: n, rank: rank, disp: d, cfg: cfg, eps: map[int]*endpoint{}}
	n.mu.Lock()
	defer n.mu.Unlock()
	if _, dup := n.mods[rank]; dup {
		panic(fmt.Sprintf("fake: rank %d attached twice", rank))
	}
	n.mods[rank] = m
	return m
}

// Module returns the module of rank (nil if none).
func (n *Network) Module(rank int) *Module {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mods[rank]
}

// Len is the number of pending operations.
func (n *Network) Len() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.queue)
}

// Pending returns a snapshot of the queue, oldest first.
func (n *Network) Pending() []Op {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]Op, len(n.queue))
	for i, op := range n.queue {
		out[i] = *op
	}
	return out
}

// Find returns the index of the first pending operation satisfying f, or -1.
func (n *Network) Find(f func(Op) bool) int {
	for i, op := range n.Pending() {
		if f(op) {
			return i
		}
	}
	return -1
}

// Trace returns every event so far, one line each.
func (n *Network) Trace() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.trace...)
}

// Note appends a line of the test's own to the trace.
func (n *Network) Note(format string, a ...any) {
	n.mu.Lock()
	n.trace = append(n.trace, fmt.Sprintf(format, a...))
	n.mu.Unlock()
}

// Violations lists the transport-contract breaches detected so far.
func (n *Network) Violations() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.viol...)
}

// LiveRegistrations is the number of registrations not yet released.
func (n *Network) LiveRegistrations() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.regs)
}

// OutstandingAllocs is the number of Alloc buffers neither sent nor freed.
func (n *Network) OutstandingAllocs() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.allocs
}

func (n *Network) logLocked(format string, a ...any) {
	n.trace = append(n.trace, fmt.Sprintf(format, a...))
}

func (n *Network) violateLocked(format string, a ...any) {
	s := fmt.Sprintf(format, a...)
	n.viol = append(n.viol, s)
	n.trace = append(n.trace, "VIOLATION: "+s)
}

// Step delivers the oldest pending operation; false if there is none.
func (n *Network) Step() bool {
	return n.Deliver(0) == nil
}

// Deliver performs pending operation i (0 is the oldest), whatever the
// ordering rules: the test is explicit.
func (n *Network) Deliver(i int) error {
	op, err := n.take(i)
	if err != nil {
		return err
	}
	n.perform(op)
	return nil
}

// DeliverAll delivers pending operations, oldest first, including those
// started meanwhile, until none is left; it returns how many it delivered.
// It stops (with a violation) after a million, as a livelock guard.
func (n *Network) DeliverAll() int {
	const limit = 1 << 20
	for k := 0; k < limit; k++ {
		if !n.Step() {
			return k
		}
	}
	n.mu.Lock()
	n.violateLocked("DeliverAll: still busy after %d deliveries", limit)
	n.mu.Unlock()
	return limit
}

// Drop removes pending operation i without performing it. A dropped send
// completes locally without error (the fragment was lost in flight); a
// dropped Put or Get completes with ErrDropped.
func (n *Network) Drop(i int) error {
	op, err := n.take(i)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.logLocked("#%d %d->%d dropped %s", op.ID, op.From, op.To, n.describeLocked(op))
	n.mu.Unlock()
	if op.Kind.IsSend() {
		n.complete(op, nil)
	} else {
		n.complete(op, ErrDropped)
	}
	return nil
}

func (n *Network) take(i int) (*Op, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if i < 0 || i >= len(n.queue) {
		return nil, fmt.Errorf("fake: no pending operation %d (%d pending)", i, len(n.queue))
	}
	op := n.queue[i]
	n.queue = append(n.queue[:i], n.queue[i+1:]...)
	return op, nil
}

// Reorder shuffles the pending queue deterministically from seed. Unless
// SetUnordered(true), the sends of each link keep their order (the btl
// guarantee) and only different links and RDMA operations interleave.
func (n *Network) Reorder(seed uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	rng := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	if n.unordered {
		rng.Shuffle(len(n.queue), func(i, j int) { n.queue[i], n.queue[j] = n.queue[j], n.queue[i] })
	} else {
		// Lanes: one FIFO per link for sends, one lane per RDMA operation.
		// A random sequence of lane labels, one per operation, taken in
		// order, is a uniformly random interleaving that keeps lane order.
		type lane struct {
			l  link
			op int // 0 for a send lane, else the RDMA operation's ID
		}
		lanes := map[lane][]*Op{}
		labels := make([]lane, 0, len(n.queue))
		for _, op := range n.queue {
			k := lane{l: link{op.From, op.To}}
			if !op.Kind.IsSend() {
				k.op = op.ID
			}
			lanes[k] = append(lanes[k], op)
			labels = append(labels, k)
		}
		rng.Shuffle(len(labels), func(i, j int) { labels[i], labels[j] = labels[j], labels[i] })
		for i, k := range labels {
			n.queue[i] = lanes[k][0]
			lanes[k] = lanes[k][1:]
		}
	}
	ids := make([]string, len(n.queue))
	for i, op := range n.queue {
		ids[i] = fmt.Sprint("#", op.ID)
	}
	n.logLocked("reorder seed=%d -> [%s]", seed, strings.Join(ids, " "))
}

// Cut breaks the link between a and b in both directions: both
// dispatchers get PeerFailed for the other side, then every pending
// operation between them completes with an error wrapping btl.ErrClosed.
// Later operations on the link fail at once with such an error.
func (n *Network) Cut(a, b int) {
	n.cut(a, b, true, true, fmt.Errorf("fake: link %d-%d cut: %w", a, b, btl.ErrClosed))
}

// Kill makes rank r die: every link of r is cut and the survivors'
// dispatchers get PeerFailed(r), with an error wrapping
// mpierr.ErrProcFailed and btl.ErrClosed. r's own dispatcher is not told.
func (n *Network) Kill(r int) {
	n.mu.Lock()
	var peers []int
	for p := range n.mods {
		if p != r {
			peers = append(peers, p)
		}
	}
	n.mu.Unlock()
	sortInts(peers)
	for _, p := range peers {
		n.cut(r, p, false, true, fmt.Errorf("fake: rank %d killed: %w (%w)", r, mpierr.ErrProcFailed, btl.ErrClosed))
	}
}

func sortInts(a []int) {
	for i := 1; i < len(a); i++ {
		for j := i; j > 0 && a[j] < a[j-1]; j-- {
			a[j], a[j-1] = a[j-1], a[j]
		}
	}
}

func (n *Network) cut(a, b int, tellA, tellB bool, err error) {
	n.mu.Lock()
	n.dead[link{a, b}] = err
	n.dead[link{b, a}] = err
	var failed []*Op
	kept := n.queue[:0]
	for _, op := range n.queue {
		if (op.From == a && op.To == b) || (op.From == b && op.To == a) {
			failed = append(failed, op)
		} else {
			kept = append(kept, op)
		}
	}
	for i := len(kept); i < len(n.queue); i++ {
		n.queue[i] = nil
	}
	n.queue = kept
	n.logLocked("cut %d-%d: %d pending operations fail", a, b, len(failed))
	ma, mb := n.mods[a], n.mods[b]
	n.mu.Unlock()
	if tellA && ma != nil && ma.disp != nil {
		ma.disp.PeerFailed(b, err)
	}
	if tellB && mb != nil && mb.disp != nil {
		mb.disp.PeerFailed(a, err)
	}
	for _, op := range failed {
		n.complete(op, err)
	}
}

// Inject hands a fragment to rank to's dispatcher as if rank from had sent
// it, at once, bypassing the queue (for protocol-violation tests).
func (n *Network) Inject(from, to int, tag btl.Tag, hdr, data []byte) error {
	n.mu.Lock()
	m := n.mods[to]
	n.mu.Unlock()
	if m == nil {
		return fmt.Errorf("fake: rank %d not attached", to)
	}
	ep, err := m.AddProc(from)
	if err != nil {
		return err
	}
	n.mu.Lock()
	n.logLocked("inject %d->%d %s%s", from, to, n.format(tag, hdr), dataSuffix(data))
	n.mu.Unlock()
	m.disp.Dispatch(ep, tag, append([]byte(nil), hdr...), append([]byte(nil), data...))
	return nil
}
