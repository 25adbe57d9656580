/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Dissemination barrier (Hensgen, Finkel and Manber): in round k = 0, 1, ... while 2^k < n,
 * rank r sends an empty message to r + 2^k and receives one from r - 2^k. After
 * ceil(log2 n) rounds every rank has heard, directly or through others, from every rank.
 * Works for any n; no root. ncclCommFinalize uses it so no rank tears down while a peer may
 * still need it.
 */
#include "alg.h"

ncclResult_t
alg_dissemination_barrier(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank;
    const struct alg_range empty = alg_range_make(ALG_BUF_SEND, 0, 0);
    int last = -1;

    for (int dist = 1; dist < n; dist *= 2) {
        alg_send(sched, alg_mod(rank + dist, n), empty, last, -1);
        last = alg_recv(sched, alg_mod(rank - dist, n), empty, last, -1);
    }
    return alg_sched_finish(sched);
}

size_t
alg_dissemination_barrier_bytes(const struct alg_args *args)
{
    (void)args;
    return 0;
}

void
alg_dissemination_barrier_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    int rounds = 0;
    while ((1 << rounds) < args->nranks) {
        rounds++;
    }
    *cost_out = (struct alg_cost){.steps = rounds};
}
