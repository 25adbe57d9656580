/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bruck.c in the simulator: all-gather for every n 1..17 (powers of two or not), every count
 * class, in and out of place, against a reference (coll_check.h); bytes match (n-1)*count.
 */
#include "coll_check.h"

Test(bruck, allgather_every_rank_count_and_count)
{
    int runs = cc_sweep(alg_bruck_allgather, alg_bruck_allgather_bytes, alg_bruck_allgather_cost,
                        ALG_COLL_ALLGATHER, false, false);
    cr_assert_gt(runs, 0);
}

Test(bruck, many_interleavings)
{
    for (unsigned seed = 1; seed <= 150; seed++) {
        struct cc_case c = {.build = alg_bruck_allgather, .bytes = alg_bruck_allgather_bytes,
                            .cost = alg_bruck_allgather_cost, .coll = ALG_COLL_ALLGATHER,
                            .n = 2 + (int)seed % 15, .count = 1 + seed % 5,
                            .in_place = seed & 1, .kind = KR_SUM, .seed = seed};
        cc_check(&c);
    }
}
