package sys

import "golang.org/x/sys/unix"

// OSYield gives the calling thread's CPU to another runnable thread, of
// any process, when the kernel has one for it (sched_yield(2)); it
// returns at once otherwise. A raw system call: it does not block, so the
// Go scheduler need not know.
func OSYield() { unix.RawSyscall(unix.SYS_SCHED_YIELD, 0, 0, 0) }
