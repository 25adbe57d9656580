/* SPDX-License-Identifier: Apache-2.0 */
/*
 * recdbl.c in the simulator: all-reduce (sum, PreMulSum with a different scalar per rank,
 * integer average) and all-gather for every n 1..17, so the non-power-of-two fix-up runs with
 * every remainder, every count class, in and out of place, against a reference
 * (coll_check.h); bytes match the textbook figure; small chunks and one slot still progress.
 */
#include "coll_check.h"

Test(recdbl, allreduce_every_rank_count_and_op)
{
    int runs = cc_sweep(alg_recdbl_allreduce, alg_recdbl_allreduce_bytes,
                        alg_recdbl_allreduce_cost, ALG_COLL_ALLREDUCE, false, true);
    cr_assert_gt(runs, 0);
}

Test(recdbl, allgather_every_rank_count_and_count)
{
    int runs = cc_sweep(alg_recdbl_allgather, alg_recdbl_allgather_bytes,
                        alg_recdbl_allgather_cost, ALG_COLL_ALLGATHER, false, false);
    cr_assert_gt(runs, 0);
}

Test(recdbl, one_slot_tiny_chunks_and_no_chunking)
{
    cc_allreduce_chunk_sweep(alg_recdbl_allreduce, alg_recdbl_allreduce_bytes,
                             alg_recdbl_allreduce_cost);
}

Test(recdbl, many_interleavings)
{
    cc_interleavings(alg_recdbl_allreduce, alg_recdbl_allreduce_bytes, alg_recdbl_allreduce_cost,
                     ALG_COLL_ALLREDUCE, 40, 7);
    cc_interleavings(alg_recdbl_allgather, alg_recdbl_allgather_bytes, alg_recdbl_allgather_cost,
                     ALG_COLL_ALLGATHER, 1, 5);
}

/* Scratch is `slots` pieces of chunk_bytes, whatever the count; all-gather needs none. */
Test(recdbl, scratch_is_bounded_by_chunks)
{
    for (int n = 2; n <= 17; n++) {
        for (int r = 0; r < n; r++) {
            struct alg_args args = {.coll = ALG_COLL_ALLREDUCE, .count = 1000000, .elem_size = 4,
                                    .rank = r, .nranks = n, .chunk_bytes = 4096, .slots = 3};
            struct alg_sched sched;
            alg_sched_init(&sched);
            cr_assert_eq(alg_recdbl_allreduce(&args, &sched), ncclSuccess);
            cr_assert_leq(sched.scratch_bytes, 3 * 4096, "n=%d rank %d: %zu", n, r,
                          sched.scratch_bytes);
            alg_sched_free(&sched);
            args.coll = ALG_COLL_ALLGATHER;
            args.count = 1000;
            cr_assert_eq(alg_recdbl_allgather(&args, &sched), ncclSuccess);
            cr_assert_eq(sched.scratch_bytes, 0);
            alg_sched_free(&sched);
        }
    }
}
