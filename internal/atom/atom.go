// Package atom has the release store and the prefetch hints that
// sync/atomic lacks, for btl/sm's fast boxes.
//
// sync/atomic's Store is sequentially consistent: on amd64 it is an XCHG,
// a locked instruction that cannot finish before every store ahead of it
// has reached the cache: one into a line another core holds makes it wait
// for that line. A publication needs less: that the stores before it are
// visible first. On amd64 every store has that order already (x86-TSO:
// stores are not reordered with other stores, loads not with older
// loads), so StoreRel64 is a plain MOV there, in assembly: the Go compiler
// does not move memory operations across a call it cannot see into. The
// reader pairs it with an atomic Load (a plain MOV on amd64, acquire by
// the same rules).
//
// What StoreRel64 does not give is StoreLoad order: a load after it may
// be satisfied before the store is visible to other processors. Code that
// stores a flag and then reads another party's flag (Dekker's pattern, a
// sleeper's announcement) needs the sequentially consistent Store, or a
// bound on what the race can cost: sm's Block sleeps briefly right after
// it announces itself.
//
// Elsewhere, and in race-detector builds (which only see sync/atomic's
// operations), StoreRel64 is sync/atomic's Store and the prefetches do
// nothing.
//
// What each piece buys: bench/atom-proof.sh ROUNDS builds gompi-bench
// four ways (the commit; StoreRel64 an XCHG; no prefetches; both, which is
// sync/atomic alone) and alternates them over sm, 2 ranks, round by round
// (bench/ab.sh). The table gives each variant's figure over the commit's
// in the same round, the median over the rounds (below 1: a lower rate,
// a shorter latency):
//
//	variant               AMD EPYC guest, QUIET_NS=60, 24 rounds: 8 B rate; 0/8/64 B latency
//	StoreRel64 an XCHG    0.982; 0.984/0.984/0.995
//	no prefetches         0.994; 0.992/1.000/0.993
//	both                  0.984; 0.984/0.992/0.993
//
// On the AMD guest, then, the pieces are within the noise: every median
// within 2% of 1, single rounds from 0.55 to 1.6 (gompi d53bbec). They were written for the
// Intel guest, where a locked instruction after a store into a line still
// in the receiver's cache waited for that line: there the release store
// and PREFETCHW took sm's 8 B rate from 6.63 to 7.85 M/s (vader's 7.85) and its 8 B
// latency from 0.374 to 0.286 us, and the reader's prefetch the rate from
// 10.1 to 10.7 M/s, each in alternated runs of the code of its day. The
// Intel column of this table, measured on the current code with the same
// command (QUIET_NS=0 there), decides whether they stay.
package atom
