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
    static const size_t chunks[] = {0, 1, 4, 8, 4096};
    for (int n = 1; n <= 12; n++) {
        for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
            for (int k = 0; k < 3; k++) {
                struct cc_case c = {.build = alg_recdbl_allreduce,
                                    .bytes = alg_recdbl_allreduce_bytes,
                                    .cost = alg_recdbl_allreduce_cost,
                                    .coll = ALG_COLL_ALLREDUCE, .n = n, .count = 29,
                                    .in_place = (n + k) & 1,
                                    .kind = (enum kr_op_kind[]){KR_SUM, KR_PREMULSUM,
                                                                KR_SUMPOSTDIV}[k],
                                    .chunk_bytes = chunks[i], .slots = 1 + (int)i % 2,
                                    .seed = (unsigned)(n * 31 + (int)i * 7 + k)};
                cc_check(&c);
            }
        }
    }
}

Test(recdbl, many_interleavings)
{
    for (unsigned seed = 1; seed <= 150; seed++) {
        struct cc_case c = {.build = alg_recdbl_allreduce, .bytes = alg_recdbl_allreduce_bytes,
                            .cost = alg_recdbl_allreduce_cost, .coll = ALG_COLL_ALLREDUCE,
                            .n = 2 + (int)seed % 12, .count = 40 + seed % 7,
                            .in_place = seed & 1,
                            .kind = seed % 3 == 0 ? KR_PREMULSUM : KR_SUMPOSTDIV,
                            .chunk_bytes = 32, .slots = 2, .seed = seed};
        cc_check(&c);
        c.build = alg_recdbl_allgather;
        c.bytes = alg_recdbl_allgather_bytes;
        c.cost = alg_recdbl_allgather_cost;
        c.coll = ALG_COLL_ALLGATHER;
        c.count = 1 + seed % 5;
        cc_check(&c);
    }
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
