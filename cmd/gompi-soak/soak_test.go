package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// testRound is a schedule with three messages from rank 1 to rank 0.
func testRound() (*config, *round) {
	cfg := &config{seed: 7, maxSize: 1 << 10}
	rd := &round{n: 3, msgs: [][][]msg{{nil, nil}, {{
		{src: 1, dst: 0, seq: 0, tag: 2, size: 10},
		{src: 1, dst: 0, seq: 1, tag: 2, size: 0},
		{src: 1, dst: 0, seq: 2, tag: 5, size: 33},
	}, nil}}, styles: []int{styleAnySource, styleAnySource}, cancel: []bool{false, false}}
	return cfg, rd
}

func content(cfg *config, rd *round, m msg) []byte {
	b := make([]byte, m.size)
	newPattern(cfg.seed).fill(b, rd.n, m)
	return b
}

// The checker names what went wrong: each kind of fault is counted as
// itself, and a clean stream counts nothing.
func TestCheckerClassifies(t *testing.T) {
	cases := []struct {
		name  string
		feed  func(c *checker, cfg *config, rd *round)
		field func(r *report) int64
	}{
		{"clean", func(c *checker, cfg *config, rd *round) {
			for _, m := range rd.msgs[1][0] {
				w, ok := c.nextFrom(1)
				c.arrived(1, m.tag, content(cfg, rd, m), w, ok)
			}
		}, func(r *report) int64 { return r.failures() }},
		{"corrupted", func(c *checker, cfg *config, rd *round) {
			m := rd.msgs[1][0][0]
			b := content(cfg, rd, m)
			b[3] ^= 0x40
			w, ok := c.nextFrom(1)
			c.arrived(1, m.tag, b, w, ok)
		}, func(r *report) int64 { return r.Corrupted }},
		{"duplicated", func(c *checker, cfg *config, rd *round) {
			m := rd.msgs[1][0][0]
			for range 2 {
				w, ok := c.nextFrom(1)
				c.arrived(1, m.tag, content(cfg, rd, m), w, ok)
			}
		}, func(r *report) int64 { return r.Duplicates }},
		{"reordered", func(c *checker, cfg *config, rd *round) {
			m := rd.msgs[1][0][2]
			w, ok := c.nextFrom(1)
			c.arrived(1, m.tag, content(cfg, rd, m), w, ok)
		}, func(r *report) int64 { return r.Reordered }},
		{"unexpected", func(c *checker, cfg *config, rd *round) {
			for _, m := range rd.msgs[1][0] {
				w, ok := c.nextFrom(1)
				c.arrived(1, m.tag, content(cfg, rd, m), w, ok)
			}
			w, ok := c.nextFrom(1)
			c.arrived(1, 9, []byte("stray"), w, ok)
		}, func(r *report) int64 { return r.Unknown }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, rd := testRound()
			c := newChecker(newPattern(cfg.seed), rd, 0)
			tc.feed(c, cfg, rd)
			rep := c.rep
			want := int64(1)
			if tc.name == "clean" {
				want = 0
			}
			require.Equal(t, want, tc.field(&rep), "report %+v", rep)
			require.Equal(t, want, rep.failures(), "only this fault is counted: %+v", rep)
		})
	}
}

// The schedule is a function of the seed and round alone: every rank
// computes the same one.
func TestScheduleDeterministic(t *testing.T) {
	cfg := &config{seed: 42, maxSize: 16 << 20, perPair: 8, bsendMax: 64 << 10}
	a, b := schedule(cfg, 4, 5), schedule(cfg, 4, 5)
	require.Equal(t, a, b)
	c := schedule(cfg, 4, 6)
	require.NotEqual(t, a.msgs, c.msgs)
	for s := range a.msgs {
		for d := range a.msgs[s] {
			for _, m := range a.msgs[s][d] {
				require.LessOrEqual(t, m.size, cfg.maxSize)
				if m.mode == modeReady {
					require.Equal(t, tagReady, m.tag)
					require.Contains(t, []int{styleSpecific, styleAnyTag}, a.styles[d])
				}
				if m.mode == modeBuffered {
					require.LessOrEqual(t, m.size, cfg.bsendMax)
				}
			}
		}
	}
}

// A short in-process soak over the self transport checks out.
func TestInProcessSoak(t *testing.T) {
	var out, errb bytes.Buffer
	code := run([]string{"--inprocess", "4", "--count", "1500", "--max-size", "1m", "--round-deadline", "60s"}, &out, &errb)
	require.Equal(t, 0, code, "stdout:\n%s\nstderr:\n%s", out.String(), errb.String())
	require.Contains(t, out.String(), "lost 0, duplicated 0, corrupted 0, reordered 0, unexpected 0, other 0")
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--inprocess", "2"}, // neither --count nor --time
		{"--inprocess", "2", "--count", "5", "--time", "1s"},
		{"--inprocess", "2", "--count", "5", "--max-size", "lots"},
		{"--inprocess", "2", "--count", "5", "--per-pair", "0"},
		{"--inprocess", "2", "--count", "5", "--first-round", "-1"},
	} {
		var out, errb bytes.Buffer
		require.Equal(t, 2, run(args, &out, &errb), "%v", args)
		require.True(t, strings.Contains(errb.String(), "gompi-soak"), "%v: %s", args, errb.String())
	}
}

// The content check finds the first byte that differs, whatever went
// wrong: a flipped byte, a fragment copied from elsewhere in the message,
// a short or long message, another message's content.
func TestPatternCheck(t *testing.T) {
	p := newPattern(3)
	m := msg{src: 1, dst: 2, seq: 4, size: 3<<20 + 17} // longer than the table's period
	b := make([]byte, m.size)
	p.fill(b, 9, m)
	require.Equal(t, -1, p.check(b, 9, m))

	flipped := bytes.Clone(b)
	flipped[2<<20+5] ^= 1
	require.Equal(t, 2<<20+5, p.check(flipped, 9, m))

	moved := bytes.Clone(b)
	copy(moved[1<<20:], b[2<<20:2<<20+64<<10]) // a 64 KiB fragment at the wrong offset
	require.Equal(t, 1<<20, p.check(moved, 9, m))

	require.Equal(t, 1000, p.check(b[:1000], 9, m), "a prefix differs where it ends")
	require.Equal(t, m.size, p.check(append(bytes.Clone(b), 0), 9, m), "a longer message differs at its end")

	other := m
	other.seq = 5
	require.NotEqual(t, -1, p.check(b, 9, other), "another message has other content")
	require.NotEqual(t, -1, p.check(b, 10, m), "the same message of another round has other content")
	require.Equal(t, -1, p.check(nil, 9, msg{}), "empty messages are equal")
}

// Every round a multiple of largeEvery carries exactly one message of
// the large class, and the first rounds cover every size class and send
// mode, so even a short run exercises every protocol.
func TestScheduleCoversEveryClass(t *testing.T) {
	cfg := &config{seed: 1, maxSize: 16 << 20, perPair: 64, bsendMax: 1 << 20}
	var classes [numClasses]int
	var modes [numModes]int
	for n := range 2 * largeEvery {
		rd := schedule(cfg, 4, n)
		large := 0
		for s := range rd.msgs {
			for d := range rd.msgs[s] {
				for i, m := range rd.msgs[s][d] {
					require.Equal(t, i, m.seq)
					require.LessOrEqual(t, m.size, cfg.maxSize)
					classes[classOf(m.size)]++
					modes[m.mode]++
					if classOf(m.size) == classLarge {
						large++
					}
				}
			}
		}
		if n%largeEvery == 0 {
			require.Equal(t, 1, large, "round %d", n)
		} else {
			require.Zero(t, large, "round %d", n)
		}
	}
	for c, k := range classes {
		require.NotZero(t, k, "class %s", sizeClasses[c].name)
	}
	for m, k := range modes {
		require.NotZero(t, k, "mode %s", modeNames[m])
	}
}

// The arena hands out disjoint buffers within a round and reuses its
// memory in the next.
func TestArena(t *testing.T) {
	var a arena
	x, y := a.alloc(10), a.alloc(100) // the first round: from the heap
	require.Len(t, x, 10)
	require.Len(t, y, 100)
	a.reset()
	x, y = a.alloc(10), a.alloc(100)
	require.Equal(t, 10, cap(x), "a buffer cannot grow into the next")
	x[9], y[0] = 1, 2
	require.Equal(t, byte(1), x[9])
	first := &y[0]
	a.reset()
	a.alloc(10)
	require.Same(t, first, &a.alloc(100)[0], "the next round reuses the memory")
}

// A round that overruns its deadline names the messages that did not
// arrive.
func TestCheckerMissing(t *testing.T) {
	cfg, rd := testRound()
	c := newChecker(newPattern(cfg.seed), rd, 0)
	m := rd.msgs[1][0][0]
	w, ok := c.nextFrom(1)
	c.arrived(1, m.tag, content(cfg, rd, m), w, ok)
	var rep report
	require.Equal(t, int64(2), c.missing(&rep))
	require.Len(t, rep.Errors, 1)
	require.Contains(t, rep.Errors[0], "2 messages from rank 1 to rank 0")
	require.Contains(t, rep.Errors[0], "among them 1 (tag 2, 0 B, standard), 2 (tag 5, 33 B, standard)")
}
