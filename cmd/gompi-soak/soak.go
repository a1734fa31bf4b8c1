package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/gompi-org/gompi/mpi"
)

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
	if rd.n%2 == 1 {
		// A wildcard receive given up at a deadline, posted among the
		// round's receives: it must end with the context's error.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Microsecond)
		_, err := c.RecvContext(ctx, make([]byte, 8), mpi.AnySource, tagCancel)
		cancel()
		chk.mu.Lock()
		defer chk.mu.Unlock()
		if !errors.Is(err, context.DeadlineExceeded) {
			chk.rep.Other++
			chk.rep.errorf("round %d: rank %d: a receive with no matching send past its deadline returned %v", rd.n, me, err)
		}
		chk.rep.Cancels++
		return nil
	}
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
