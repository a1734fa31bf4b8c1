// Package atom has the release store that sync/atomic lacks.
//
// sync/atomic's Store is sequentially consistent: on amd64 it is an XCHG,
// a locked instruction (6-7 ns in a loop on the development host) that
// cannot finish before every store ahead of it has reached the cache: one
// into a line another core holds makes it wait for that line. A
// publication needs less: that the stores before it are visible first. On amd64 every store has that order already
// (x86-TSO: stores are not reordered with other stores, loads not with
// older loads), so StoreRel is a plain MOV there, in assembly: the Go
// compiler does not move memory operations across a call it cannot see
// into. The reader pairs it with an atomic Load (a plain MOV on amd64,
// acquire by the same rules).
//
// What StoreRel does not give is StoreLoad order: a load after it may be
// satisfied before the store is visible to other processors. Code that
// stores a flag and then reads another party's flag (Dekker's pattern, a
// sleeper's announcement) needs the sequentially consistent Store, or a
// bound on what the race can cost: Mutex's waiters park with timeouts, and
// sm's Block sleeps briefly right after it announces itself.
//
// Elsewhere, and in race-detector builds (which only see sync/atomic's
// operations), StoreRel is sync/atomic's Store.
package atom
