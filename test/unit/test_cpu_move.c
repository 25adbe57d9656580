/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Moving a thread off a CPU it shares with the rank it waits for (engine/cpu_move.c): it
 * lands on another allowed CPU, its allowed set comes back unchanged, a thread allowed on one
 * CPU stays, and a second move within the rate limit does nothing.
 */
#include <criterion/criterion.h>
#include <sched.h>

#include "engine/cpu_move.h"

/* The first two CPUs this thread may run on; how many there are (0, 1 or 2). */
static int
two_allowed(const cpu_set_t *allowed, int cpus[2])
{
    int found = 0;
    for (int c = 0; c < CPU_SETSIZE && found < 2; c++) {
        if (CPU_ISSET(c, allowed)) {
            cpus[found++] = c;
        }
    }
    return found;
}

static void
allow_only(const int *cpus, int n)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int i = 0; i < n; i++) {
        CPU_SET(cpus[i], &set);
    }
    cr_assert_eq(sched_setaffinity(0, sizeof(set), &set), 0);
}

Test(cpu_move, moves_to_another_allowed_cpu_and_restores_the_set)
{
    cpu_set_t before, after;
    int cpus[2];

    cr_assert_eq(sched_getaffinity(0, sizeof(before), &before), 0);
    if (two_allowed(&before, cpus) < 2) {
        cr_skip_test("one CPU: nowhere to move");
    }
    allow_only(&cpus[0], 1); /* on cpus[0] now */
    allow_only(cpus, 2);
    cr_assert_eq(sched_getcpu(), cpus[0]);
    cr_assert(shim_cpu_move_away(1));
    cr_assert_eq(sched_getcpu(), cpus[1]);
    cr_assert_eq(sched_getaffinity(0, sizeof(after), &after), 0);
    cr_assert_eq(CPU_COUNT(&after), 2);
    cr_assert(CPU_ISSET(cpus[0], &after) && CPU_ISSET(cpus[1], &after));
    /* Within the rate limit: no second move, even when it would be possible. */
    cr_assert_not(shim_cpu_move_away(2));
    cr_assert_eq(sched_getcpu(), cpus[1]);
}

Test(cpu_move, a_thread_allowed_on_one_cpu_stays)
{
    cpu_set_t before, after;
    int cpus[2];

    cr_assert_eq(sched_getaffinity(0, sizeof(before), &before), 0);
    cr_assert_gt(two_allowed(&before, cpus), 0);
    allow_only(&cpus[0], 1);
    cr_assert_not(shim_cpu_move_away(1));
    cr_assert_eq(sched_getcpu(), cpus[0]);
    cr_assert_eq(sched_getaffinity(0, sizeof(after), &after), 0);
    cr_assert_eq(CPU_COUNT(&after), 1);
    cr_assert(CPU_ISSET(cpus[0], &after));
}
