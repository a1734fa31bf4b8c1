// What a rank saw (report), and the checker that verifies the messages
// arriving at a destination against the round's schedule.

package main

import (
	"fmt"
	"strings"
	"sync"
)

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
