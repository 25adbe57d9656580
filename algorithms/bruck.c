/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Bruck's all-gather for any number of ranks; the selector's table (select.c) calls the
 * builder. Rank r keeps the blocks in rotated order in scratch (n*count elements): scratch
 * block j holds rank (r+j) % n's block, so its own block is block 0.
 *   rounds k = 0 .. ceil(log2 n) - 1, with d = 2^k: send scratch blocks [0, m) to rank r - d
 *       and receive blocks [d, d + m) from rank r + d, where m = min(d, n - d). Before round
 *       k rank r holds blocks [0, d), so it has what it sends, and rank r + d's blocks
 *       [0, m) are our blocks [d, d + m).
 *   unrotate: two copies put scratch blocks [1, n - r) at RECV blocks [r + 1, n) and scratch
 *       blocks [n - r, n) at RECV blocks [0, r); our own block goes from SEND to RECV block r
 *       directly (skipped in place, where SEND == RECV + r*count).
 * Each rank sends (n-1)*count elements in ceil(log2 n) messages. Blocks are count elements
 * each, so nothing is uneven; n need not be a power of two (the last round is partial). No
 * root. Scratch is n*count elements: the rotated order is what makes every send contiguous.
 */
#include "alg.h"

ncclResult_t
alg_bruck_allgather(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank;
    const size_t block = alg_bytes(args, args->count);

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)rank * block, block),
             alg_range_make(ALG_BUF_SEND, 0, block), 0, -1, -1);
    if (n == 1) {
        return alg_sched_finish(sched);
    }
    sched->scratch_bytes = (size_t)n * block;
    int have = alg_copy(sched, alg_range_make(ALG_BUF_SCRATCH, 0, block),
                        alg_range_make(ALG_BUF_SEND, 0, block), 0, -1, -1);
    for (int d = 1; d < n; d *= 2) {
        const size_t m = (size_t)(d < n - d ? d : n - d);
        alg_send(sched, alg_mod(rank - d, n), alg_range_make(ALG_BUF_SCRATCH, 0, m * block),
                 have, -1);
        have = alg_recv(sched, alg_mod(rank + d, n),
                        alg_range_make(ALG_BUF_SCRATCH, (size_t)d * block, m * block), have, -1);
    }
    const size_t tail = (size_t)(n - rank); /* scratch blocks [1, tail) are ranks r+1 .. n-1 */
    if (tail > 1) {
        alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)(rank + 1) * block,
                                       (tail - 1) * block),
                 alg_range_make(ALG_BUF_SCRATCH, block, (tail - 1) * block), 0, have, -1);
    }
    if (rank > 0) {
        alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, (size_t)rank * block),
                 alg_range_make(ALG_BUF_SCRATCH, tail * block, (size_t)rank * block), 0, have,
                 -1);
    }
    return alg_sched_finish(sched);
}

size_t
alg_bruck_allgather_bytes(const struct alg_args *args)
{
    return alg_bytes(args, args->count) * (size_t)(args->nranks - 1);
}

void
alg_bruck_allgather_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    int rounds = 0;
    while ((1 << rounds) < args->nranks) {
        rounds++;
    }
    const double block = (double)alg_bytes(args, args->count);
    *cost_out = (struct alg_cost){.steps = rounds, .bytes = (args->nranks - 1) * block};
}
