package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

// Tags: data messages use 0..dataTags-1, ready-mode messages tagReady (so
// the receives posted for them before the round's barrier match only
// them), cancelled receives tagCancel (never sent).
const (
	dataTags  = 8
	tagReady  = 100
	tagCancel = 1000
	tagCtl    = 2000
)

// Send modes of a message.
const (
	modeStandard = iota
	modeSync
	modeBuffered
	modeReady
	numModes
)

var modeNames = [numModes]string{"standard", "synchronous", "buffered", "ready"}

// Receive styles, one per destination and round (a destination never mixes
// wildcard-source receives with specific ones in a round, so every message
// has exactly one receive that must take it).
const (
	styleSpecific  = iota // Irecv(src, tag) per message, all posted, then Waitall
	styleAnyTag           // Irecv(src, AnyTag) per message
	styleAnySource        // Recv(AnySource, AnyTag)
	styleProbe            // Probe(AnySource, AnyTag), then Recv(source, tag)
	styleMprobe           // Mprobe(AnySource, AnyTag), then Message.Recv
	numStyles
)

var styleNames = [numStyles]string{"specific", "anytag", "anysource", "probe", "mprobe"}

// msg is one scheduled message: seq numbers the messages of one
// (round, src, dst) in send order.
type msg struct {
	src, dst, seq, tag, size, mode int
}

// config of a soak run.
type config struct {
	seed     uint64
	count    int64         // stop after this many messages (0: use duration)
	duration time.Duration // stop after this long (rank 0 decides at a round's end)
	maxSize  int
	perPair  int           // at most this many messages per pair and round
	deadline time.Duration // a round that has not finished by then is a failure (lost messages)
	bsendMax int           // largest buffered-mode message
}

// report is what one rank saw; rank 0 sums them.
type report struct {
	Messages, Bytes                                 int64
	Lost, Duplicates, Corrupted, Reordered, Unknown int64
	Other                                           int64 // other misbehaviour, e.g. a cancel that did not report Cancelled
	Cancels, Rounds                                 int64
	Errors                                          []string // the first few failures, described
}

func (r *report) failures() int64 {
	return r.Lost + r.Duplicates + r.Corrupted + r.Reordered + r.Unknown + r.Other
}

func (r *report) add(o report) {
	r.Messages += o.Messages
	r.Bytes += o.Bytes
	r.Lost += o.Lost
	r.Duplicates += o.Duplicates
	r.Corrupted += o.Corrupted
	r.Reordered += o.Reordered
	r.Unknown += o.Unknown
	r.Other += o.Other
	r.Cancels += o.Cancels
	r.Errors = append(r.Errors, o.Errors...)
}

func (r *report) errorf(format string, a ...any) {
	if len(r.Errors) < 20 {
		r.Errors = append(r.Errors, fmt.Sprintf(format, a...))
	}
}

// round is one round's schedule, the same on every rank.
type round struct {
	n      int
	msgs   [][][]msg // [src][dst] in send order
	styles []int     // receive style per destination
	cancel []bool    // the destination posts and cancels a receive
}

// schedule computes round n from the seed alone, so every rank knows what
// every other rank sends.
func schedule(cfg *config, size, n int) *round {
	rng := rand.New(rand.NewPCG(cfg.seed, uint64(n)))
	rd := &round{n: n, msgs: make([][][]msg, size), styles: make([]int, size), cancel: make([]bool, size)}
	for d := range size {
		rd.styles[d] = rng.IntN(numStyles)
		rd.cancel[d] = rng.IntN(4) == 0
	}
	for s := range size {
		rd.msgs[s] = make([][]msg, size)
		for d := range size {
			k := rng.IntN(cfg.perPair + 1)
			if s == d {
				k /= 2
			}
			for i := range k {
				m := msg{src: s, dst: d, seq: i, tag: rng.IntN(dataTags), size: pickSize(rng, cfg.maxSize)}
				switch p := rng.IntN(20); {
				case p < 3:
					m.mode = modeSync
				case p < 5 && m.size <= cfg.bsendMax:
					m.mode = modeBuffered
				case p < 7 && rd.styles[d] != styleAnySource && rd.styles[d] != styleProbe && rd.styles[d] != styleMprobe:
					// Ready mode needs its receive posted before the send
					// starts: only destinations receiving by source.
					m.mode, m.tag = modeReady, tagReady
				}
				rd.msgs[s][d] = append(rd.msgs[s][d], m)
			}
		}
	}
	return rd
}

// pickSize draws a size: mostly small, sometimes up to maxSize.
func pickSize(rng *rand.Rand, maxSize int) int {
	var lo, hi int
	switch p := rng.IntN(100); {
	case p < 40:
		lo, hi = 0, 64
	case p < 70:
		lo, hi = 65, 4<<10
	case p < 90:
		lo, hi = 4<<10+1, 256<<10
	case p < 99:
		lo, hi = 256<<10+1, 4<<20
	default:
		lo, hi = 4<<20+1, 16<<20
	}
	hi = min(hi, maxSize)
	if lo > hi {
		lo = 0
	}
	return lo + rng.IntN(hi-lo+1)
}

// fill writes message m's content: a pseudo-random stream keyed by the
// seed, round and the message's identity, so the receiver can regenerate
// it and compare every byte.
func fill(b []byte, seed uint64, rd int, m msg) {
	h := fnv.New64a()
	fmt.Fprintf(h, "%d/%d/%d/%d/%d", seed, rd, m.src, m.dst, m.seq)
	x := h.Sum64() | 1
	i := 0
	for ; i+8 <= len(b); i += 8 {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i], b[i+1], b[i+2], b[i+3] = byte(x), byte(x>>8), byte(x>>16), byte(x>>24)
		b[i+4], b[i+5], b[i+6], b[i+7] = byte(x>>32), byte(x>>40), byte(x>>48), byte(x>>56)
	}
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	for j := 0; i < len(b); i, j = i+1, j+8 {
		b[i] = byte(x >> j)
	}
}

// checker verifies arrivals at one destination against the schedule.
type checker struct {
	cfg     *config
	rd      *round
	me      int
	rep     *report
	next    []int         // per source: seq of the next message expected (wildcard-source and per-source styles)
	nextTag []map[int]int // per source and tag: index into byTag of the next one (specific style)
	byTag   []map[int][]msg
	seen    []map[int]bool // per source: seqs received
	scratch []byte
}

func newChecker(cfg *config, rd *round, me int, rep *report) *checker {
	n := len(rd.msgs)
	c := &checker{cfg: cfg, rd: rd, me: me, rep: rep, next: make([]int, n), nextTag: make([]map[int]int, n),
		byTag: make([]map[int][]msg, n), seen: make([]map[int]bool, n)}
	for s := range n {
		c.nextTag[s], c.byTag[s], c.seen[s] = map[int]int{}, map[int][]msg{}, map[int]bool{}
		for _, m := range rd.msgs[s][me] {
			c.byTag[s][m.tag] = append(c.byTag[s][m.tag], m)
		}
	}
	return c
}

// matches reports whether data is message m.
func (c *checker) matches(data []byte, m msg) bool {
	if len(data) != m.size {
		return false
	}
	if cap(c.scratch) < m.size {
		c.scratch = make([]byte, m.size)
	}
	want := c.scratch[:m.size]
	fill(want, c.cfg.seed, c.rd.n, m)
	return slices.Equal(data, want)
}

// arrived checks a message from src with tag whose expected identity is
// want (ok false: none was expected any more).
func (c *checker) arrived(src, tag int, data []byte, want msg, ok bool) {
	c.rep.Messages++
	c.rep.Bytes += int64(len(data))
	if ok && c.matches(data, want) {
		c.seen[src][want.seq] = true
		return
	}
	// Which message is it, if any?
	for _, m := range c.rd.msgs[src][c.me] {
		if m.tag == tag && c.matches(data, m) {
			switch {
			case c.seen[src][m.seq]:
				c.rep.Duplicates++
				c.rep.errorf("round %d: message %d from rank %d (tag %d, %d B) arrived twice", c.rd.n, m.seq, src, tag, m.size)
			default:
				c.rep.Reordered++
				c.rep.errorf("round %d: message %d from rank %d (tag %d) arrived where message %d was due", c.rd.n, m.seq, src, tag, want.seq)
				c.seen[src][m.seq] = true
			}
			return
		}
	}
	if !ok {
		c.rep.Unknown++
		c.rep.errorf("round %d: unexpected message from rank %d (tag %d, %d B)", c.rd.n, src, tag, len(data))
		return
	}
	c.rep.Corrupted++
	c.rep.errorf("round %d: message %d from rank %d (tag %d): %d B arrived, %d expected, content differs", c.rd.n, want.seq, src, tag, len(data), want.size)
}

// nextFrom returns the next message expected from src in send order.
func (c *checker) nextFrom(src int) (msg, bool) {
	l := c.rd.msgs[src][c.me]
	if c.next[src] >= len(l) {
		return msg{}, false
	}
	m := l[c.next[src]]
	c.next[src]++
	return m, true
}

// soak runs the rounds on this rank and returns what it saw.
func soak(ctx context.Context, world *mpi.Comm, cfg *config) (report, error) {
	var rep report
	data, err := world.Dup()
	if err != nil {
		return rep, err
	}
	defer data.Free()
	me, size := world.Rank(), world.Size()
	start := time.Now()
	var total int64
	for n := 0; ; n++ {
		rd := schedule(cfg, size, n)
		if err := runRound(ctx, data, cfg, rd, &rep); err != nil {
			return rep, fmt.Errorf("round %d: %w", n, err)
		}
		rep.Rounds++
		for s := range size {
			for d := range size {
				total += int64(len(rd.msgs[s][d]))
			}
		}
		// Whether to go on: by count every rank knows; by time rank 0
		// decides and tells the others.
		var more bool
		if cfg.count > 0 {
			more = total < cfg.count
		} else {
			flag := []byte{0}
			if me == 0 {
				if time.Since(start) < cfg.duration {
					flag[0] = 1
				}
				for r := 1; r < size; r++ {
					if err := world.Send(flag, r, tagCtl); err != nil {
						return rep, err
					}
				}
			} else if _, err := world.Recv(flag, 0, tagCtl); err != nil {
				return rep, err
			}
			more = flag[0] == 1
		}
		if rep.failures() > 0 || !more {
			break
		}
	}
	// Nothing may be left: every message had its receive.
	if err := data.Barrier(); err != nil {
		return rep, err
	}
	if st, found, err := data.Iprobe(mpi.AnySource, mpi.AnyTag); err != nil {
		return rep, err
	} else if found {
		rep.Unknown++
		rep.errorf("after the last round: a message from rank %d (tag %d, %d B) is left over", st.Source, st.Tag, st.Count)
	}
	return rep, nil
}

// runRound sends and receives one round's messages on this rank.
func runRound(ctx context.Context, c *mpi.Comm, cfg *config, rd *round, rep *report) error {
	me, size := c.Rank(), c.Size()
	ctx, cancel := context.WithTimeout(ctx, cfg.deadline)
	defer cancel()
	chk := newChecker(cfg, rd, me, rep)
	style := rd.styles[me]

	// Receives for ready-mode messages are posted before the barrier that
	// lets the senders start (the ready-mode promise).
	type pending struct {
		req  *mpi.Request
		buf  []byte
		want msg
	}
	var readies []pending
	for s := range size {
		for _, m := range rd.msgs[s][me] {
			if m.mode == modeReady {
				b := make([]byte, m.size)
				r, err := c.Irecv(b, s, tagReady)
				if err != nil {
					return err
				}
				readies = append(readies, pending{r, b, m})
			}
		}
	}
	if err := c.Barrier(); err != nil {
		return err
	}

	// Sends, to the destinations in a shuffled order.
	var sends []*mpi.Request
	var sendErr error
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		order := rand.New(rand.NewPCG(cfg.seed^uint64(me), uint64(rd.n))).Perm(size)
		for _, d := range order {
			for _, m := range rd.msgs[me][d] {
				b := make([]byte, m.size)
				fill(b, cfg.seed, rd.n, m)
				var r *mpi.Request
				var err error
				switch m.mode {
				case modeSync:
					r, err = c.Issend(b, d, m.tag)
				case modeBuffered:
					r, err = c.Ibsend(b, d, m.tag)
				case modeReady:
					r, err = c.Irsend(b, d, m.tag)
				default:
					r, err = c.Isend(b, d, m.tag)
				}
				if err != nil {
					sendErr = fmt.Errorf("%s send of %d B to rank %d: %w", modeNames[m.mode], m.size, d, err)
					return
				}
				sends = append(sends, r)
			}
		}
	}()

	if rd.cancel[me] {
		// A receive nobody sends to, cancelled: it must report Cancelled.
		r, err := c.Irecv(make([]byte, 8), (me+1)%size, tagCancel)
		if err != nil {
			return err
		}
		if err := r.Cancel(); err != nil {
			return err
		}
		st, err := r.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("cancelled receive: %w", err)
		}
		if !st.Cancelled {
			rep.Other++
			rep.errorf("round %d: a cancelled receive with no matching send did not report Cancelled", rd.n)
		}
		rep.Cancels++
	}

	recvErr := receive(ctx, c, cfg, rd, chk, style)
	for _, p := range readies {
		st, err := p.req.WaitContext(ctx)
		if err != nil {
			recvErr = errors.Join(recvErr, fmt.Errorf("ready-mode receive from rank %d: %w", p.want.src, err))
			continue
		}
		chk.arrived(st.Source, st.Tag, p.buf[:st.Count], p.want, true)
	}
	wg.Wait()
	if sendErr != nil {
		return errors.Join(recvErr, sendErr)
	}
	for _, r := range sends {
		if _, err := r.WaitContext(ctx); err != nil && recvErr == nil {
			recvErr = fmt.Errorf("send: %w", err)
		}
	}
	if recvErr != nil {
		if errors.Is(recvErr, context.DeadlineExceeded) {
			rep.Lost++
			return fmt.Errorf("%s receives: not every message arrived within %v (lost): %w", styleNames[style], cfg.deadline, recvErr)
		}
		return recvErr
	}
	return c.Barrier()
}

// receive takes the round's non-ready messages addressed to this rank in
// the round's style.
func receive(ctx context.Context, c *mpi.Comm, cfg *config, rd *round, chk *checker, style int) error {
	me, size := c.Rank(), c.Size()
	var expected int
	for s := range size {
		for _, m := range rd.msgs[s][me] {
			if m.mode != modeReady {
				expected++
			}
		}
	}
	// skipReady advances past ready-mode messages, which their own
	// receives take.
	nextFrom := func(src int) (msg, bool) {
		for {
			m, ok := chk.nextFrom(src)
			if !ok || m.mode != modeReady {
				return m, ok
			}
		}
	}
	switch style {
	case styleSpecific, styleAnyTag:
		type pending struct {
			req  *mpi.Request
			buf  []byte
			want msg
		}
		var ps []pending
		for s := range size {
			for _, m := range rd.msgs[s][me] {
				if m.mode == modeReady {
					continue
				}
				tag := m.tag
				if style == styleAnyTag {
					tag = mpi.AnyTag
				}
				b := make([]byte, m.size+rand.IntN(16))
				r, err := c.Irecv(b, s, tag)
				if err != nil {
					return err
				}
				ps = append(ps, pending{r, b, m})
			}
		}
		for _, p := range ps {
			st, err := p.req.WaitContext(ctx)
			if err != nil {
				return fmt.Errorf("receive from rank %d: %w", p.want.src, err)
			}
			want := p.want
			if style == styleAnyTag {
				// Any tag: the source's messages arrive in send order.
				want, _ = nextFrom(st.Source)
			}
			chk.arrived(st.Source, st.Tag, p.buf[:st.Count], want, true)
		}
	default:
		buf := make([]byte, cfg.maxSize)
		for range expected {
			var st mpi.Status
			var data []byte
			var err error
			switch style {
			case styleAnySource:
				var r *mpi.Request
				if r, err = c.Irecv(buf, mpi.AnySource, mpi.AnyTag); err == nil {
					st, err = r.WaitContext(ctx)
				}
				data = buf[:st.Count]
			case styleProbe:
				if st, err = probe(ctx, c); err == nil {
					data = make([]byte, st.Count)
					st, err = c.Recv(data, st.Source, st.Tag)
				}
			case styleMprobe:
				var m *mpi.Message
				if m, st, err = mprobe(ctx, c); err == nil {
					data = make([]byte, st.Count)
					st, err = m.Recv(data)
				}
			}
			if err != nil {
				return fmt.Errorf("%s receive: %w", styleNames[style], err)
			}
			want, ok := nextFrom(st.Source)
			chk.arrived(st.Source, st.Tag, data, want, ok)
		}
	}
	return nil
}

// probe is Probe(AnySource, AnyTag) that gives up when ctx ends.
func probe(ctx context.Context, c *mpi.Comm) (st mpi.Status, err error) {
	err = poll(ctx, func() (found bool, err error) {
		st, found, err = c.Iprobe(mpi.AnySource, mpi.AnyTag)
		return found, err
	})
	return st, err
}

// mprobe is Mprobe(AnySource, AnyTag) that gives up when ctx ends.
func mprobe(ctx context.Context, c *mpi.Comm) (m *mpi.Message, st mpi.Status, err error) {
	err = poll(ctx, func() (found bool, err error) {
		m, st, found, err = c.Improbe(mpi.AnySource, mpi.AnyTag)
		return found, err
	})
	return m, st, err
}

// poll calls try until it finds something or fails, or ctx ends.
func poll(ctx context.Context, try func() (bool, error)) error {
	for {
		found, err := try()
		if err != nil || found {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		time.Sleep(20 * time.Microsecond)
	}
}
