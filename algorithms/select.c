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
    {algo, family, coll, alg_##fn, alg_##fn##_bytes, alg_##fn##_cost, false}
/* A row whose cost tells messages between hosts apart. */
#define ALG_HOST_ROW(algo, family, coll, fn)                                                 \
    {algo, family, coll, alg_##fn, alg_##fn##_bytes, alg_##fn##_cost, true}

static const struct alg_algorithm alg_algorithms[] = {
    ALG_ROW("ring", "ring", ALG_COLL_ALLREDUCE, ring_allreduce),
    ALG_ROW("dissemination", "ring", ALG_COLL_BARRIER, dissemination_barrier),
    ALG_ROW("ring", "ring", ALG_COLL_ALLGATHER, ring_allgather),
    ALG_ROW("ring", "ring", ALG_COLL_REDUCESCATTER, ring_reducescatter),
    ALG_ROW("chain", "ring", ALG_COLL_BROADCAST, chain_broadcast),
    ALG_ROW("chain", "ring", ALG_COLL_REDUCE, chain_reduce),
    ALG_ROW("direct", "ring", ALG_COLL_SEND, direct_send),
    ALG_ROW("direct", "ring", ALG_COLL_RECV, direct_recv),
    ALG_HOST_ROW("direct", "ring", ALG_COLL_SCATTER, direct_scatter),
    ALG_HOST_ROW("direct", "ring", ALG_COLL_GATHER, direct_gather),
    ALG_ROW("tree", "tree", ALG_COLL_BROADCAST, tree_broadcast),
    ALG_ROW("tree", "tree", ALG_COLL_REDUCE, tree_reduce),
    ALG_ROW("tree", "tree", ALG_COLL_SCATTER, tree_scatter),
    ALG_ROW("tree", "tree", ALG_COLL_GATHER, tree_gather),
    ALG_ROW("dbtree", "tree", ALG_COLL_ALLREDUCE, dbtree_allreduce),
    ALG_HOST_ROW("pairwise", "ring", ALG_COLL_ALLTOALL, pairwise_alltoall),
    ALG_HOST_ROW("recdbl", "tree", ALG_COLL_ALLREDUCE, recdbl_allreduce),
    ALG_HOST_ROW("recdbl", "tree", ALG_COLL_ALLGATHER, recdbl_allgather),
    ALG_ROW("rabenseifner", "tree", ALG_COLL_ALLREDUCE, rabenseifner_allreduce),
    ALG_ROW("bruck", "ring", ALG_COLL_ALLGATHER, bruck_allgather),
    ALG_HOST_ROW("hier", "ring", ALG_COLL_ALLREDUCE, hier_allreduce),
    ALG_HOST_ROW("hier", "ring", ALG_COLL_ALLGATHER, hier_allgather),
    ALG_HOST_ROW("hier", "ring", ALG_COLL_REDUCESCATTER, hier_reducescatter),
    ALG_HOST_ROW("hier", "tree", ALG_COLL_BROADCAST, hier_broadcast),
    ALG_HOST_ROW("hier", "tree", ALG_COLL_REDUCE, hier_reduce),
    ALG_HOST_ROW("hier", "tree", ALG_COLL_SCATTER, hier_scatter),
    ALG_HOST_ROW("hier", "tree", ALG_COLL_GATHER, hier_gather),
    ALG_HOST_ROW("hier", "ring", ALG_COLL_ALLTOALL, hier_alltoall),
};

#define ALG_NALGORITHMS ((int)(sizeof(alg_algorithms) / sizeof(alg_algorithms[0])))

const struct alg_algorithm *
alg_table(int *count_out)
{
    *count_out = ALG_NALGORITHMS;
    return alg_algorithms;
}

/* alg's cost on args. A schedule blind to hosts, run across hosts, goes at the pace of its
 * links between hosts: all its messages are charged as the network's. */
static struct alg_cost
alg_cost_of(const struct alg_algorithm *alg, const struct alg_args *args)
{
    struct alg_cost cost = {0};

    alg->cost(args, &cost);
    if (!alg->host_aware && alg_hosts_span(args)) {
        cost.net_steps = cost.steps;
        cost.net_bytes = cost.bytes;
        cost.steps = cost.bytes = 0;
    }
    return cost;
}

static double
alg_time(const struct alg_cost *cost, const struct alg_cost_params *params)
{
    return cost->steps * params->alpha + cost->bytes * params->beta +
           cost->net_steps * params->alpha_net + cost->net_bytes * params->beta_net +
           cost->reduce_bytes * params->gamma;
}

static double
alg_estimate(const struct alg_algorithm *alg, const struct alg_args *args,
             const struct alg_cost_params *params)
{
    struct alg_cost cost = alg_cost_of(alg, args);

    return alg_time(&cost, params);
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

/* A row whose cost counts its chunk times (its steps grow with the chunks, so the classic
 * formula would take them for pipeline stages): the chunk, halving from the largest (whose
 * time is max_time) down to min_chunk, that the model weighs least. Sizes that hold the whole
 * message all cost what the largest does, so only those that cut it are weighed: a small
 * call weighs none. */
static size_t
alg_select_chunk_by_cost(const struct alg_algorithm *alg, const struct alg_args *args,
                         const struct alg_cost_params *params, size_t min_chunk,
                         size_t max_chunk, double max_time)
{
    const size_t bytes = alg_bytes(args, args->count);
    struct alg_args at = *args;
    size_t best = max_chunk;
    double best_time = max_time;

    for (size_t chunk = max_chunk / 2; chunk >= min_chunk; chunk /= 2) {
        if (chunk >= bytes) {
            continue;
        }
        at.chunk_bytes = chunk;
        double time = alg_estimate(alg, &at, params);
        if (time < best_time) {
            best = chunk;
            best_time = time;
        }
    }
    return best;
}

size_t
alg_select_chunk(const struct alg_algorithm *alg, const struct alg_args *args,
                 const struct alg_cost_params *params)
{
    const size_t max_chunk = args->chunk_bytes;
    const size_t floor = args->chunk_min_bytes > 0 ? args->chunk_min_bytes : 4096;
    const size_t min_chunk = floor < max_chunk ? floor : max_chunk;
    const struct alg_cost cost = alg_cost_of(alg, args);
    if (cost.chunked) {
        return alg_select_chunk_by_cost(alg, args, params, min_chunk, max_chunk,
                                        alg_time(&cost, params));
    }
    /* The pipeline runs at the pace of its slowest links: the network's, where it crosses. */
    const bool net = cost.net_bytes > 0;
    const double steps = cost.steps + cost.net_steps, bytes = net ? cost.net_bytes : cost.bytes;
    const double alpha = net ? params->alpha_net : params->alpha;
    const double beta = net ? params->beta_net : params->beta;

    if (steps <= 1 || bytes <= 0 || alpha <= 0) {
        return max_chunk;
    }
    double chunks = sqrt((steps - 1) * beta * bytes / alpha);
    double chunk = chunks > 1 ? bytes / chunks : bytes;
    if (chunk < (double)min_chunk) {
        return min_chunk < max_chunk ? min_chunk : max_chunk;
    }
    return chunk > (double)max_chunk ? max_chunk : (size_t)chunk;
}
