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
// What each piece buys: bench/atom-proof.sh 8 (QUIET_NS=60 on the AMD
// guest) builds gompi-bench four ways, each differing from the commit in
// one piece, and alternates them over sm, 2 ranks, round by round
// (bench/ab.sh; medians of 8 rounds, gompi 502d42b):
//
//	build                                AMD EPYC guest: 8 B rate; 0/8/64 B latency
//	the commit                           16.04 M/s; 0.126/0.128/0.149 us
//	StoreRel64 an XCHG, not a MOV        15.65 M/s; equal within 0.002 us
//	PrefetchW and Prefetch no-ops        15.83 M/s; equal within 0.002 us
//	atom.Mutex instead of sync.Mutex     15.77 M/s; 64 B 0.152 us, others equal
//
// atom.Mutex (its Unlock a release store instead of sync.Mutex's locked
// add, its waiters parked with timed parks to cover a missed wake-up)
// lived here for the Intel guest, where a locked instruction after a store
// into a line still in the receiver's cache waited for that line; on the
// AMD guest sync.Mutex is as fast or faster, so sm's endpoints and the
// PML's engine use sync.Mutex, and the script brings atom.Mutex back
// (reverting 8fc252f) only to measure it. The Intel guest's column of this
// table is still to be measured, with the same command.
package atom
