/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The algorithm table and the choice among its rows. Adding an algorithm is one builder file
 * and one row here; tests iterate the table. For now each collective has one algorithm; the
 * cost model and NCCL_ALGO / NCCLSHIM_ALGO overrides arrive with the second.
 */
#include "alg.h"

#include <stddef.h>

static const struct alg_algorithm alg_algorithms[] = {
    {"ring", ALG_COLL_ALLREDUCE, alg_ring_allreduce},
    {"dissemination", ALG_COLL_BARRIER, alg_dissemination_barrier},
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
