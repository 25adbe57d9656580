/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Two ranks that poll shared memory never sleep, and Linux keeps two such threads where they
 * are: once a wakeup put them on one CPU (the wakee goes to the waker's CPU, and with the
 * last-level cache busy the scheduler skips its search for an idle CPU), the load balancer
 * leaves them there, as both are cache-hot. Each then waits out the other's time slice; a
 * 2-rank run of 8 B all-gathers took 11 us a call instead of 0.45, with about 900
 * preemptions a rank (1 run in 16). Sleeping on the flag did not part them either.
 *
 * So the waiting rank moves itself: it narrows its allowed CPUs to the others, which makes
 * the kernel migrate it at once, and restores the set it had, which leaves it where it now
 * is. A thread allowed on one CPU only stays put. Threads pinned by the user keep their
 * pinning: the set is restored exactly.
 */
#include "cpu_move.h"

#include <sched.h>

#include "base/debug.h"

/* Rate limit: a move the scheduler undoes at once is not retried in a loop. */
#define SHIM_CPU_MOVE_INTERVAL_NS 10000000u

bool
shim_cpu_move_away(uint64_t now_ns)
{
    static __thread uint64_t last_move_ns;
    static __thread bool moved_before;
    cpu_set_t allowed, others;
    int cpu = sched_getcpu();

    if (moved_before && now_ns - last_move_ns < SHIM_CPU_MOVE_INTERVAL_NS) {
        return false;
    }
    moved_before = true;
    last_move_ns = now_ns;
    if (cpu < 0 || cpu >= CPU_SETSIZE || sched_getaffinity(0, sizeof(allowed), &allowed) != 0) {
        return false;
    }
    others = allowed;
    CPU_CLR(cpu, &others);
    if (CPU_COUNT(&others) == 0 || sched_setaffinity(0, sizeof(others), &others) != 0) {
        return false;
    }
    if (sched_setaffinity(0, sizeof(allowed), &allowed) != 0) {
        WARN("could not restore this thread's CPU affinity after moving it off CPU %d", cpu);
    }
    INFO(SHIM_SHM, "moved off CPU %d, shared with the rank it waited for, to CPU %d", cpu,
         sched_getcpu());
    return true;
}
