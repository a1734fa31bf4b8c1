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
	fill(b, cfg.seed, rd.n, m)
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
			var rep report
			c := newChecker(cfg, rd, 0, &rep)
			tc.feed(c, cfg, rd)
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
	} {
		var out, errb bytes.Buffer
		require.Equal(t, 2, run(args, &out, &errb), "%v", args)
		require.True(t, strings.Contains(errb.String(), "gompi-soak"), "%v: %s", args, errb.String())
	}
}
