package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
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
	styleSpecific  = iota // Irecv(src, tag) per message, all posted, then waited for
	styleAnyTag           // Irecv(src, AnyTag) per message
	styleAnySource        // Irecv(AnySource, AnyTag) then Wait, one at a time
	styleProbe            // Probe(AnySource, AnyTag), then Recv(source, tag)
	styleMprobe           // Mprobe(AnySource, AnyTag), then Message.Recv
	numStyles
)

var styleNames = [numStyles]string{"specific", "anytag", "anysource", "probe", "mprobe"}

// Size classes. Their bounds follow the protocol switches of the
// transports (eager_immediate up to 256 B; eager up to 12 KiB on verbs,
// 16 KiB on sm, 64 KiB on tcp; rendezvous beyond), so that every run
// covers every protocol. Each message draws its class with the weights
// below (per mille); the large class is not drawn: every largeEvery-th
// round carries exactly one large message instead, so a run of any length
// has them at a fixed rate and its first round has one.
const (
	classTiny = iota
	classSmall
	classMedium
	classBig
	classLarge
	numClasses
)

type sizeClass struct {
	name   string
	lo, hi int
	weight int  // per mille of the drawn messages
	log    bool // log-uniform between lo and hi (else uniform)
}

var sizeClasses = [numClasses]sizeClass{
	{"0-256 B", 0, 256, 620, false},
	{"257 B-16 KiB", 257, 16 << 10, 300, true},
	{"16-64 KiB", 16<<10 + 1, 64 << 10, 70, true},
	{"64 KiB-1 MiB", 64<<10 + 1, 1 << 20, 10, true},
	{"1-16 MiB", 1<<20 + 1, 16 << 20, 0, true},
}

// largeEvery: rounds 0, largeEvery, 2*largeEvery, ... carry one message of
// classLarge.
const largeEvery = 4

// classOf returns the size class of a message of size bytes.
func classOf(size int) int {
	for c := range numClasses - 1 {
		if size <= sizeClasses[c].hi {
			return c
		}
	}
	return classLarge
}

// msg is one scheduled message: seq numbers the messages of one
// (round, src, dst) in send order.
type msg struct {
	src, dst, seq, tag, size, mode int
}

// config of a soak run.
type config struct {
	seed     uint64
	first    int           // the first round
	count    int64         // stop after this many messages (0: use duration)
	duration time.Duration // stop after this long (rank 0 decides at a round's end)
	maxSize  int
	perPair  int           // at most this many messages per pair and round
	deadline time.Duration // a round that has not finished by then is a failure (lost messages)
	bsendMax int           // largest buffered-mode message
	progress time.Duration // rank 0 prints a progress line this often (0: never)
	logf     func(format string, a ...any)
}

// report is what one rank saw; rank 0 sums them.
type report struct {
	Messages, Bytes                                 int64
	Lost, Duplicates, Corrupted, Reordered, Unknown int64
	Other                                           int64 // other misbehaviour, e.g. a cancel that did not report Cancelled
	Cancels, Rounds                                 int64
	Largest                                         int64             // largest message checked
	ByClass                                         [numClasses]int64 // messages checked per size class
	ByMode                                          [numModes]int64   // per send mode
	ByStyle                                         [numStyles]int64  // per receive style of the destination
	Errors                                          []string          // the first few failures, described
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
	r.Largest = max(r.Largest, o.Largest)
	for i := range r.ByClass {
		r.ByClass[i] += o.ByClass[i]
	}
	for i := range r.ByMode {
		r.ByMode[i] += o.ByMode[i]
	}
	for i := range r.ByStyle {
		r.ByStyle[i] += o.ByStyle[i]
	}
	for _, e := range o.Errors {
		r.errorf("%s", e)
	}
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

// count returns the number of messages and bytes of the round.
func (rd *round) count() (msgs, bytes int64) {
	for _, row := range rd.msgs {
		for _, l := range row {
			msgs += int64(len(l))
			for _, m := range l {
				bytes += int64(m.size)
			}
		}
	}
	return msgs, bytes
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
				rd.msgs[s][d] = append(rd.msgs[s][d], newMsg(rng, cfg, rd, s, d, i, pickClass(rng)))
			}
		}
	}
	if n%largeEvery == 0 {
		s, d := rng.IntN(size), rng.IntN(size)
		l := rd.msgs[s][d]
		at := rng.IntN(len(l) + 1)
		l = append(l[:at], append([]msg{newMsg(rng, cfg, rd, s, d, at, classLarge)}, l[at:]...)...)
		for i := range l {
			l[i].seq = i
		}
		rd.msgs[s][d] = l
	}
	return rd
}

// newMsg draws the tag, size and send mode of message seq from s to d.
func newMsg(rng *rand.Rand, cfg *config, rd *round, s, d, seq, class int) msg {
	m := msg{src: s, dst: d, seq: seq, tag: rng.IntN(dataTags), size: pickSize(rng, class, cfg.maxSize)}
	switch p := rng.IntN(20); {
	case p < 3:
		m.mode = modeSync
	case p < 5 && m.size <= cfg.bsendMax:
		m.mode = modeBuffered
	case p < 7 && rd.styles[d] != styleAnySource && rd.styles[d] != styleProbe && rd.styles[d] != styleMprobe:
		// Ready mode needs its receive posted before the send starts:
		// only destinations receiving by source.
		m.mode, m.tag = modeReady, tagReady
	}
	return m
}

// pickClass draws a size class other than classLarge by the weights.
func pickClass(rng *rand.Rand) int {
	p := rng.IntN(1000)
	for c := range numClasses {
		if p < sizeClasses[c].weight {
			return c
		}
		p -= sizeClasses[c].weight
	}
	panic("gompi-soak: size class weights do not add up to 1000")
}

// pickSize draws a size of class c, at most maxSize (a class wholly above
// maxSize gives a size uniform in 0..maxSize).
func pickSize(rng *rand.Rand, c, maxSize int) int {
	sc := sizeClasses[c]
	lo, hi := sc.lo, min(sc.hi, maxSize)
	if lo > hi {
		return rng.IntN(maxSize + 1)
	}
	if !sc.log || lo == 0 {
		return lo + rng.IntN(hi-lo+1)
	}
	a, b := math.Log(float64(lo)), math.Log(float64(hi)+1)
	return min(max(int(math.Exp(a+rng.Float64()*(b-a))), lo), hi)
}

// checker verifies arrivals at one destination against the schedule. Its
// fields are guarded by mu: the round's watchdog reads them when the round
// overruns its deadline.
type checker struct {
	pat  *pattern
	rd   *round
	me   int
	mu   sync.Mutex
	rep  report
	next []int    // per source: index of the next message expected in send order
	seen [][]bool // per source and seq: received
}

func newChecker(pat *pattern, rd *round, me int) *checker {
	n := len(rd.msgs)
	c := &checker{pat: pat, rd: rd, me: me, next: make([]int, n), seen: make([][]bool, n)}
	for s := range n {
		c.seen[s] = make([]bool, len(rd.msgs[s][me]))
	}
	return c
}

// arrived checks a message from src with tag whose expected identity is
// want (ok false: none was expected any more).
func (c *checker) arrived(src, tag int, data []byte, want msg, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rep := &c.rep
	rep.Messages++
	rep.Bytes += int64(len(data))
	if ok && c.pat.check(data, c.rd.n, want) < 0 {
		c.seen[src][want.seq] = true
		rep.ByClass[classOf(want.size)]++
		rep.ByMode[want.mode]++
		rep.ByStyle[c.rd.styles[c.me]]++
		rep.Largest = max(rep.Largest, int64(want.size))
		return
	}
	// Which message is it, if any?
	for _, m := range c.rd.msgs[src][c.me] {
		if m.tag == tag && c.pat.check(data, c.rd.n, m) < 0 {
			switch {
			case c.seen[src][m.seq]:
				rep.Duplicates++
				rep.errorf("round %d: message %d from rank %d to rank %d (tag %d, %d B, %s) arrived twice",
					c.rd.n, m.seq, src, c.me, tag, m.size, modeNames[m.mode])
			default:
				rep.Reordered++
				rep.errorf("round %d: message %d from rank %d to rank %d (tag %d, %s receive) arrived where message %d was due",
					c.rd.n, m.seq, src, c.me, tag, styleNames[c.rd.styles[c.me]], want.seq)
				c.seen[src][m.seq] = true
			}
			return
		}
	}
	if !ok {
		rep.Unknown++
		rep.errorf("round %d: unexpected message from rank %d to rank %d (tag %d, %d B)", c.rd.n, src, c.me, tag, len(data))
		return
	}
	rep.Corrupted++
	if len(data) != want.size {
		rep.errorf("round %d: message %d from rank %d to rank %d (tag %d, %s, %s receive): %d B arrived, %d expected",
			c.rd.n, want.seq, src, c.me, tag, modeNames[want.mode], styleNames[c.rd.styles[c.me]], len(data), want.size)
		return
	}
	at := c.pat.check(data, c.rd.n, want)
	rep.errorf("round %d: message %d from rank %d to rank %d (tag %d, %d B, %s, %s receive): content differs from byte %d on",
		c.rd.n, want.seq, src, c.me, tag, want.size, modeNames[want.mode], styleNames[c.rd.styles[c.me]], at)
}

// overrun counts a receive that wrote past the end of its message.
func (c *checker) overrun(src int, m msg, at int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rep.Corrupted++
	c.rep.errorf("round %d: message %d from rank %d to rank %d (%d B): the receive buffer was written at byte %d, past the message's end",
		c.rd.n, m.seq, src, c.me, m.size, at)
}

// nextFrom returns the next message expected from src in send order.
func (c *checker) nextFrom(src int) (msg, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l := c.rd.msgs[src][c.me]
	if c.next[src] >= len(l) {
		return msg{}, false
	}
	m := l[c.next[src]]
	c.next[src]++
	return m, true
}

// missing describes the messages addressed to this rank that have not
// arrived, into rep (per source their number and the first few), and
// returns their number.
func (c *checker) missing(rep *report) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	for s, l := range c.rd.msgs {
		var k int
		var first []string
		for _, m := range l[c.me] {
			if !c.seen[s][m.seq] {
				k++
				if len(first) < 3 {
					first = append(first, fmt.Sprintf("%d (tag %d, %d B, %s)", m.seq, m.tag, m.size, modeNames[m.mode]))
				}
			}
		}
		if k > 0 {
			rep.errorf("round %d: %d messages from rank %d to rank %d (%s receive) did not arrive, among them %s",
				c.rd.n, k, s, c.me, styleNames[c.rd.styles[c.me]], strings.Join(first, ", "))
		}
		n += int64(k)
	}
	return n
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
	st := &rankState{pat: newPattern(cfg.seed), anyBuf: make([]byte, cfg.maxSize)}
	start := time.Now()
	lastProgress := start
	var total, totalBytes int64
	for n := cfg.first; ; n++ {
		rd := schedule(cfg, size, n)
		if err := runRound(ctx, data, cfg, st, rd, &rep); err != nil {
			return rep, fmt.Errorf("round %d: %w", n, err)
		}
		rep.Rounds++
		m, b := rd.count()
		total += m
		totalBytes += b
		if me == 0 && cfg.progress > 0 && time.Since(lastProgress) >= cfg.progress {
			lastProgress = time.Now()
			cfg.logf("gompi-soak: %v: round %d, %d messages, %d bytes", lastProgress.Sub(start).Round(time.Second), n, total, totalBytes)
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

// rankState is what one rank keeps from round to round: the content
// pattern and the memory of message buffers, reused so that a round costs
// no page faults or zeroing.
type rankState struct {
	pat          *pattern
	sendA, recvA arena
	anyBuf       []byte // the receive buffer of wildcard-source receives, --max-size bytes
}

// runRound sends and receives one round's messages on this rank. The
// round's work runs in a goroutine with blocking calls; the caller only
// watches the deadline, and when it passes, names the messages that have
// not arrived and returns (the job then ends: the goroutine stays blocked).
func runRound(ctx context.Context, c *mpi.Comm, cfg *config, st *rankState, rd *round, rep *report) error {
	chk := newChecker(st.pat, rd, c.Rank())
	done := make(chan error, 1)
	go func() { done <- roundWork(c, cfg, st, rd, chk) }()
	timer := time.NewTimer(cfg.deadline)
	defer timer.Stop()
	select {
	case err := <-done:
		chk.mu.Lock()
		rep.add(chk.rep)
		chk.mu.Unlock()
		if err != nil {
			chk.missing(rep) // what this rank was still waiting for
		}
		return err
	case <-timer.C:
		n := chk.missing(rep)
		rep.Lost += max(n, 1)
		return fmt.Errorf("%s receives: %d messages did not arrive within %v (lost)", styleNames[rd.styles[c.Rank()]], n, cfg.deadline)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// roundWork is one round of this rank: post the ready-mode receives, wait
// for every rank at the barrier, send in a second goroutine while
// receiving, and wait for every send. The next round's barrier separates
// the rounds: no rank starts sending round n+1 before every rank has
// received all of round n.
func roundWork(c *mpi.Comm, cfg *config, st *rankState, rd *round, chk *checker) error {
	me, size := c.Rank(), c.Size()
	st.sendA.reset()
	st.recvA.reset()

	// Receives for ready-mode messages are posted before the barrier that
	// lets the senders start (the ready-mode promise).
	var readies []pending
	for s := range size {
		for _, m := range rd.msgs[s][me] {
			if m.mode == modeReady {
				b := st.recvA.alloc(m.size)
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
				b := st.sendA.alloc(m.size)
				st.pat.fill(b, rd.n, m)
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

	var recvErr error
	if rd.cancel[me] {
		// A receive nobody sends to, cancelled: it must report Cancelled.
		recvErr = cancelled(c, rd, chk)
	}
	if recvErr == nil {
		recvErr = receive(c, cfg, st, rd, chk)
	}
	for _, p := range readies {
		if recvErr != nil {
			break
		}
		s, err := p.req.Wait()
		if err != nil {
			recvErr = fmt.Errorf("ready-mode receive of message %d from rank %d (%d B): %w", p.want.seq, p.want.src, p.want.size, err)
			break
		}
		chk.arrived(s.Source, s.Tag, p.buf[:s.Count], p.want, true)
	}
	wg.Wait()
	if sendErr != nil {
		return errors.Join(recvErr, sendErr)
	}
	if recvErr != nil {
		return recvErr
	}
	for _, r := range sends {
		if _, err := r.Wait(); err != nil {
			return fmt.Errorf("send: %w", err)
		}
	}
	return nil
}

// cancelled posts a receive no message matches, cancels it and checks
// that it reports Cancelled.
func cancelled(c *mpi.Comm, rd *round, chk *checker) error {
	me := c.Rank()
	r, err := c.Irecv(make([]byte, 8), (me+1)%c.Size(), tagCancel)
	if err != nil {
		return err
	}
	if err := r.Cancel(); err != nil {
		return err
	}
	st, err := r.Wait()
	if err != nil {
		return fmt.Errorf("cancelled receive: %w", err)
	}
	chk.mu.Lock()
	defer chk.mu.Unlock()
	if !st.Cancelled {
		chk.rep.Other++
		chk.rep.errorf("round %d: rank %d: a cancelled receive with no matching send did not report Cancelled", rd.n, me)
	}
	chk.rep.Cancels++
	return nil
}

// pending is a posted receive and the message it must take.
type pending struct {
	req  *mpi.Request
	buf  []byte
	want msg
}

// guard is the byte written after the end of a receive buffer's message
// room: a receive that writes past its message changes it.
const guard = 0xa5

// receive takes the round's non-ready messages addressed to this rank in
// the round's style.
func receive(c *mpi.Comm, cfg *config, st *rankState, rd *round, chk *checker) error {
	me, size := c.Rank(), c.Size()
	style := rd.styles[me]
	var expected int
	for s := range size {
		for _, m := range rd.msgs[s][me] {
			if m.mode != modeReady {
				expected++
			}
		}
	}
	// nextFrom skips ready-mode messages, which their own receives take.
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
				// Up to 15 bytes of room more than the message needs,
				// filled with guard bytes that must stay.
				b := st.recvA.alloc(m.size + (m.seq*7+rd.n)%16)
				for i := m.size; i < len(b); i++ {
					b[i] = guard
				}
				r, err := c.Irecv(b, s, tag)
				if err != nil {
					return err
				}
				ps = append(ps, pending{r, b, m})
			}
		}
		for _, p := range ps {
			s, err := p.req.Wait()
			if err != nil {
				return fmt.Errorf("%s receive of message %d from rank %d (%d B, tag %d, %s): %w",
					styleNames[style], p.want.seq, p.want.src, p.want.size, p.want.tag, modeNames[p.want.mode], err)
			}
			want := p.want
			if style == styleAnyTag {
				// Any tag: the source's messages arrive in send order.
				want, _ = nextFrom(s.Source)
			}
			chk.arrived(s.Source, s.Tag, p.buf[:s.Count], want, true)
			for i := max(s.Count, p.want.size); i < len(p.buf); i++ {
				if p.buf[i] != guard {
					chk.overrun(s.Source, p.want, i)
					break
				}
			}
		}
	default:
		for range expected {
			var s mpi.Status
			var data []byte
			var err error
			switch style {
			case styleAnySource:
				if s, err = c.Recv(st.anyBuf, mpi.AnySource, mpi.AnyTag); err == nil {
					data = st.anyBuf[:s.Count]
				}
			case styleProbe:
				if s, err = c.Probe(mpi.AnySource, mpi.AnyTag); err == nil {
					data = st.recvA.alloc(s.Count)
					probed := s
					if s, err = c.Recv(data, s.Source, s.Tag); err != nil {
						err = fmt.Errorf("%d B probed from rank %d (tag %d): %w", probed.Count, probed.Source, probed.Tag, err)
					}
				}
			case styleMprobe:
				var m *mpi.Message
				if m, s, err = c.Mprobe(mpi.AnySource, mpi.AnyTag); err == nil {
					data = st.recvA.alloc(s.Count)
					probed := s
					if s, err = m.Recv(data); err != nil {
						err = fmt.Errorf("%d B probed from rank %d (tag %d): %w", probed.Count, probed.Source, probed.Tag, err)
					}
				}
			}
			if err != nil {
				return fmt.Errorf("%s receive: %w", styleNames[style], err)
			}
			want, ok := nextFrom(s.Source)
			chk.arrived(s.Source, s.Tag, data[:s.Count], want, ok)
		}
	}
	return nil
}
