package main

import (
	"bytes"
	"math/rand/v2"
)

// patternPeriod is the length of the pseudo-random table message contents
// are cut from. It is odd, so a fragment landing a power-of-two distance
// from its place (the shape of a chunking bug) never finds the same bytes
// there.
const patternPeriod = 1<<20 - 3

// pattern gives every message of a run its own content: the bytes of a
// pseudo-random table (from the seed), read cyclically from an offset
// keyed by the round and the message's source, destination and sequence
// number. Filling and checking are copies and comparisons of memory (no
// per-byte arithmetic), so a message of any size costs about what copying
// it twice costs, and the receiver compares every byte of every message.
type pattern struct {
	table []byte // 2*patternPeriod bytes: table[i+patternPeriod] == table[i]
}

func newPattern(seed uint64) *pattern {
	rng := rand.New(rand.NewPCG(seed, 0x736f616b)) // "soak"
	t := make([]byte, 2*patternPeriod)
	for i := 0; i < patternPeriod; i += 8 {
		x := rng.Uint64()
		for j := 0; j < 8 && i+j < patternPeriod; j++ {
			t[i+j] = byte(x >> (8 * j))
		}
	}
	copy(t[patternPeriod:], t[:patternPeriod])
	return &pattern{table: t}
}

// mix is splitmix64's finaliser: every bit of x moves every bit of the
// result.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

// offset is where message m of round rd starts in the table.
func (p *pattern) offset(rd int, m msg) int {
	k := mix(uint64(rd))
	k = mix(k ^ uint64(m.src)<<32 ^ uint64(m.dst))
	k = mix(k ^ uint64(m.seq))
	return int(k % patternPeriod)
}

// fill writes message m's content into b (len(b) == m.size).
func (p *pattern) fill(b []byte, rd int, m msg) {
	pos := p.offset(rd, m)
	for len(b) > 0 {
		n := copy(b, p.table[pos:pos+patternPeriod])
		b = b[n:]
		pos = (pos + n) % patternPeriod
	}
}

// check compares data with message m's content: -1 when they are the
// same, else the index of the first byte that differs (len(data) when
// data is a proper prefix of it, m.size when it is longer).
func (p *pattern) check(data []byte, rd int, m msg) int {
	pos := p.offset(rd, m)
	for i := 0; i < m.size; {
		want := p.table[pos : pos+min(m.size-i, patternPeriod)]
		got := data[i:min(len(data), i+len(want))]
		if !bytes.Equal(got, want) {
			for j := range got {
				if got[j] != want[j] {
					return i + j
				}
			}
			return i + len(got)
		}
		i += len(want)
		pos = (pos + len(want)) % patternPeriod
	}
	if len(data) != m.size {
		return m.size
	}
	return -1
}

// arena hands out the message buffers of one round from one block of
// memory that the next round reuses: after the first rounds no buffer
// costs an allocation, a page fault or zeroing. A round that needs more
// than the block gets the rest from the heap, and the next round's block
// is large enough for it.
type arena struct {
	block []byte
	off   int // first free byte of block
	need  int // bytes handed out this round, block or heap
}

// arenaAlign keeps every buffer 8-byte aligned, as a Go allocation is.
const arenaAlign = 8

// alloc returns n bytes that stay the caller's until the next reset.
func (a *arena) alloc(n int) []byte {
	r := (n + arenaAlign - 1) &^ (arenaAlign - 1)
	a.need += r
	if a.off+r > len(a.block) {
		return make([]byte, n)
	}
	b := a.block[a.off : a.off+n : a.off+n]
	a.off += r
	return b
}

// reset takes back every buffer handed out; none may be in use.
func (a *arena) reset() {
	if a.need > len(a.block) {
		a.block = make([]byte, a.need+a.need/4)
	}
	a.off, a.need = 0, 0
}
