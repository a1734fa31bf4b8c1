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
// What each piece buys, measured with bench/ab.sh (sm, 2 ranks, gompi-bench
// builds differing only in that piece, alternated round by round, gated on
// the anchor's cache-line probe with QUIET_NS=60; medians):
//
//	piece      build without it             AMD EPYC guest: 8 B rate, 0/8 B latency
//	StoreRel64 XCHG instead of MOV          15.06 against 15.70 M/s; latency equal (0.130 us)
//	PrefetchW  and Prefetch: no-ops         15.42 against 15.70 M/s; latency equal
//
// A Mutex whose Unlock was a release store (instead of sync.Mutex's
// locked add) lived here too, for the same wait on the Intel guest; on
// the AMD guest sync.Mutex measured faster in the same runs (latency 0 B
// 0.123 against 0.127 us, 8 B 0.122 against 0.126, 64 B 0.155 against
// 0.165, every round; rate 8 B 15.98 against 15.24 M/s), so sm's
// endpoints and the PML's engine use sync.Mutex. The Intel guest's half
// of this table is still to be measured.
package atom
