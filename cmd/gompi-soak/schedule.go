// What the soak sends: tags, send modes, receive styles, size classes, and
// the schedule of a round, computed from the seed alone.

package main

import (
	"math"
	"math/rand/v2"
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
