/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The algorithm table and the choice among its rows. Adding an algorithm is one builder file
 * and one row here; tests iterate the table. For now each collective has one algorithm; the
 * cost model and NCCL_ALGO / NCCLSHIM_ALGO overrides arrive with the second.
 */
#include "alg.h"

#include <stddef.h>

/* One row per (algorithm, collective): name for NCCLSHIM_ALGO, NCCL_ALGO family, builder,
 * textbook traffic, cost. */
#define ALG_ROW(algo, family, coll, fn)                                                      \
    {algo, family, coll, alg_##fn, alg_##fn##_bytes, alg_##fn##_cost}

static const struct alg_algorithm alg_algorithms[] = {
    ALG_ROW("ring", "ring", ALG_COLL_ALLREDUCE, ring_allreduce),
    ALG_ROW("dissemination", "ring", ALG_COLL_BARRIER, dissemination_barrier),
};

#define ALG_NALGORITHMS ((int)(sizeof(alg_algorithms) / sizeof(alg_algorithms[0])))

const struct alg_algorithm *
alg_table(int *count_out)
{
    *count_out = ALG_NALGORITHMS;
    return alg_algorithms;
}

const struct alg_algorithm *
alg_select(const struct alg_args *args)
{
    for (int i = 0; i < ALG_NALGORITHMS; i++) {
        if (alg_algorithms[i].coll == args->coll) {
            return &alg_algorithms[i];
        }
    }
    return NULL;
}
