/* SPDX-License-Identifier: Apache-2.0 */
/*
 * pairwise.c in the simulator: all-to-all for every n 1..17, every count class, in and out of
 * place, against a reference (coll_check.h); bytes match the textbook (n-1)*count; many seeds
 * for the windowed steps.
 */
#include "coll_check.h"

Test(pairwise, alltoall_every_rank_count_and_count)
{
    int runs = cc_sweep(alg_pairwise_alltoall, alg_pairwise_alltoall_bytes,
                        alg_pairwise_alltoall_cost, ALG_COLL_ALLTOALL, false, false);
    cr_assert_gt(runs, 0);
}

Test(pairwise, many_interleavings)
{
    for (unsigned seed = 1; seed <= 150; seed++) {
        struct cc_case c = {.build = alg_pairwise_alltoall, .bytes = alg_pairwise_alltoall_bytes,
                            .cost = alg_pairwise_alltoall_cost, .coll = ALG_COLL_ALLTOALL,
                            .n = 3 + (int)seed % 10, .count = 5 + seed % 4,
                            .in_place = seed & 1, .kind = KR_SUM, .seed = seed};
        cc_check(&c);
    }
}

/* Out of place needs no scratch, in place a window of blocks; at most a window of steps waits
 * on nothing. */
Test(pairwise, no_scratch_and_a_bounded_window)
{
    struct alg_args args = {.coll = ALG_COLL_ALLTOALL, .count = 1000, .elem_size = 4,
                            .rank = 5, .nranks = 17};
    struct alg_sched sched;
    alg_sched_init(&sched);
    cr_assert_eq(alg_pairwise_alltoall(&args, &sched), ncclSuccess);
    cr_assert_eq(sched.scratch_bytes, 0);
    int free_steps = 0;
    for (int i = 0; i < sched.nsteps; i++) {
        free_steps += sched.steps[i].kind == ALG_STEP_SEND && sched.steps[i].ndeps == 0;
    }
    cr_assert_leq(free_steps, 4, "%d sends wait on nothing", free_steps);
    alg_sched_free(&sched);
    /* In place, a window of scratch blocks, whatever n. */
    for (int n = 2; n <= 40; n++) {
        args.nranks = n;
        args.rank = n / 3;
        args.in_place = true;
        cr_assert_eq(alg_pairwise_alltoall(&args, &sched), ncclSuccess);
        cr_assert_leq(sched.scratch_bytes, 4 * 1000 * 4, "n=%d: %zu", n, sched.scratch_bytes);
        alg_sched_free(&sched);
    }
}
