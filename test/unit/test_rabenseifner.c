/* SPDX-License-Identifier: Apache-2.0 */
/*
 * rabenseifner.c in the simulator: all-reduce (sum, PreMulSum with a different scalar per
 * rank, integer average) for every n 1..17, so the non-power-of-two fix-up runs with every
 * remainder, every count class (empty blocks included), in and out of place, against a
 * reference (coll_check.h); bytes match the textbook figure; small chunks and one slot still
 * progress.
 */
#include "coll_check.h"

Test(rabenseifner, allreduce_every_rank_count_and_op)
{
    int runs = cc_sweep(alg_rabenseifner_allreduce, alg_rabenseifner_allreduce_bytes,
                        alg_rabenseifner_allreduce_cost, ALG_COLL_ALLREDUCE, false, true);
    cr_assert_gt(runs, 0);
}

Test(rabenseifner, one_slot_tiny_chunks_and_no_chunking)
{
    cc_allreduce_chunk_sweep(alg_rabenseifner_allreduce, alg_rabenseifner_allreduce_bytes,
                             alg_rabenseifner_allreduce_cost);
}

Test(rabenseifner, many_interleavings)
{
    cc_interleavings(alg_rabenseifner_allreduce, alg_rabenseifner_allreduce_bytes,
                     alg_rabenseifner_allreduce_cost, ALG_COLL_ALLREDUCE, 40, 7);
}

/* Scratch is `slots` pieces of p2 chunks (p2 the largest power of two <= n), whatever the
 * count. */
Test(rabenseifner, scratch_is_bounded_by_chunks)
{
    for (int n = 2; n <= 17; n++) {
        int p2 = 1;
        while (p2 * 2 <= n) {
            p2 *= 2;
        }
        for (int r = 0; r < n; r++) {
            struct alg_args args = {.coll = ALG_COLL_ALLREDUCE, .count = 1000000, .elem_size = 4,
                                    .rank = r, .nranks = n, .chunk_bytes = 4096, .slots = 3};
            struct alg_sched sched;
            alg_sched_init(&sched);
            cr_assert_eq(alg_rabenseifner_allreduce(&args, &sched), ncclSuccess);
            cr_assert_leq(sched.scratch_bytes, (size_t)3 * 4096 * (size_t)p2,
                          "n=%d rank %d: %zu", n, r, sched.scratch_bytes);
            alg_sched_free(&sched);
        }
    }
}
