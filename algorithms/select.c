/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The algorithm table and the choice among its rows. Adding an algorithm is one builder file
 * and one row here; tests iterate the table. The choice: among the rows the user's policy
 * allows (policy.c), the one whose cost (alg_cost: critical-path messages, bytes, reduced
 * bytes) weighs least under the machine's alpha, beta and gamma.
 */
#include "alg.h"

#include <math.h>
#include <stddef.h>

/* One row per (algorithm, collective): name for NCCLSHIM_ALGO, NCCL_ALGO family, builder,
 * textbook traffic, cost. */
#define ALG_ROW(algo, family, coll, fn)                                                      \
    {algo, family, coll, alg_##fn, alg_##fn##_bytes, alg_##fn##_cost}

static const struct alg_algorithm alg_algorithms[] = {
    ALG_ROW("ring", "ring", ALG_COLL_ALLREDUCE, ring_allreduce),
    ALG_ROW("dissemination", "ring", ALG_COLL_BARRIER, dissemination_barrier),
    ALG_ROW("ring", "ring", ALG_COLL_ALLGATHER, ring_allgather),
    ALG_ROW("ring", "ring", ALG_COLL_REDUCESCATTER, ring_reducescatter),
    ALG_ROW("chain", "ring", ALG_COLL_BROADCAST, chain_broadcast),
    ALG_ROW("chain", "ring", ALG_COLL_REDUCE, chain_reduce),
    ALG_ROW("direct", "ring", ALG_COLL_SEND, direct_send),
    ALG_ROW("direct", "ring", ALG_COLL_RECV, direct_recv),
    ALG_ROW("direct", "ring", ALG_COLL_SCATTER, direct_scatter),
    ALG_ROW("direct", "ring", ALG_COLL_GATHER, direct_gather),
    ALG_ROW("tree", "tree", ALG_COLL_BROADCAST, tree_broadcast),
    ALG_ROW("tree", "tree", ALG_COLL_REDUCE, tree_reduce),
    ALG_ROW("tree", "tree", ALG_COLL_SCATTER, tree_scatter),
    ALG_ROW("tree", "tree", ALG_COLL_GATHER, tree_gather),
    ALG_ROW("dbtree", "tree", ALG_COLL_ALLREDUCE, dbtree_allreduce),
    ALG_ROW("pairwise", "ring", ALG_COLL_ALLTOALL, pairwise_alltoall),
    ALG_ROW("recdbl", "tree", ALG_COLL_ALLREDUCE, recdbl_allreduce),
    ALG_ROW("recdbl", "tree", ALG_COLL_ALLGATHER, recdbl_allgather),
    ALG_ROW("rabenseifner", "tree", ALG_COLL_ALLREDUCE, rabenseifner_allreduce),
    ALG_ROW("bruck", "ring", ALG_COLL_ALLGATHER, bruck_allgather),
};

#define ALG_NALGORITHMS ((int)(sizeof(alg_algorithms) / sizeof(alg_algorithms[0])))

const struct alg_algorithm *
alg_table(int *count_out)
{
    *count_out = ALG_NALGORITHMS;
    return alg_algorithms;
}

static double
alg_estimate(const struct alg_algorithm *alg, const struct alg_args *args,
             const struct alg_cost_params *params)
{
    struct alg_cost cost;

    alg->cost(args, &cost);
    return cost.steps * params->alpha + cost.bytes * params->beta +
           cost.reduce_bytes * params->gamma;
}

const struct alg_algorithm *
alg_select(const struct alg_args *args, const struct alg_policy *policy,
           const struct alg_cost_params *params, double *estimate_out)
{
    const struct alg_algorithm *best = NULL;
    double best_time = INFINITY;

    for (int i = 0; i < ALG_NALGORITHMS; i++) {
        const struct alg_algorithm *alg = &alg_algorithms[i];
        if (alg->coll != args->coll || !(policy->allowed[args->coll] & (1ull << i))) {
            continue;
        }
        double time = alg_estimate(alg, args, params);
        if (best == NULL || time < best_time) {
            best = alg;
            best_time = time;
        }
    }
    if (estimate_out != NULL) {
        *estimate_out = best_time;
    }
    return best;
}

size_t
alg_select_chunk(const struct alg_algorithm *alg, const struct alg_args *args,
                 const struct alg_cost_params *params)
{
    const size_t min_chunk = 4096, max_chunk = args->chunk_bytes;
    struct alg_cost cost;

    alg->cost(args, &cost);
    if (cost.steps <= 1 || cost.bytes <= 0 || params->alpha <= 0) {
        return max_chunk;
    }
    double chunks = sqrt((cost.steps - 1) * params->beta * cost.bytes / params->alpha);
    double chunk = chunks > 1 ? cost.bytes / chunks : cost.bytes;
    if (chunk < (double)min_chunk) {
        return min_chunk < max_chunk ? min_chunk : max_chunk;
    }
    return chunk > (double)max_chunk ? max_chunk : (size_t)chunk;
}
