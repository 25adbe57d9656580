/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ring all-gather, pipelined in chunks. select.c's "ring" row for ncclAllGather.
 *
 * Rank r sends to r+1 and receives from r-1. Block i of recvbuff (count elements at i*count)
 * is rank i's input.
 *   copy: our own input into block r of recvbuff (skipped in place, where it is already there).
 *   ring, steps s = 0..n-2: send block r-s (our own input at s = 0, then the block received at
 *       step s-1), receive block r-s-1 straight into its place in recvbuff.
 * After n-1 steps every block has travelled n-1 links, so every rank holds all of them. Each
 * rank sends (n-1)*count elements, the bandwidth optimum.
 *
 * Every block is cut into the same nchunks chunks of at most chunk_bytes (the first chunks one
 * element longer when they do not divide evenly), and the ring runs once per chunk,
 * chunk-major, so chunk c+1 travels while chunk c is still on its way round. Receives go to
 * distinct places and wait for nothing, so no scratch is needed and no rank ever blocks a
 * sender. Blocks all hold count elements, so uneven splits arise only within a block; count 0
 * is an empty schedule, any n works (nothing assumes a power of two) and there is no root.
 * Step s = 0 sends from sendbuff, which in place is block r of recvbuff itself.
 */
#include "alg.h"

/* Chunk `chunk` of block `block` of recvbuff (block -1: of sendbuff), as a byte range. */
static struct alg_range
ring_allgather_chunk(const struct alg_args *args, int block, int chunk, int nchunks)
{
    size_t first, len;

    alg_block(args->count, nchunks, chunk, &first, &len);
    if (block < 0) {
        return alg_range_make(ALG_BUF_SEND, alg_bytes(args, first), alg_bytes(args, len));
    }
    return alg_range_make(ALG_BUF_RECV, alg_bytes(args, (size_t)block * args->count + first),
                          alg_bytes(args, len));
}

ncclResult_t
alg_ring_allgather(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank;
    const int next = alg_mod(rank + 1, n), prev = alg_mod(rank - 1, n);

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    const size_t bytes = alg_bytes(args, args->count);
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)rank * bytes, bytes),
             alg_range_make(ALG_BUF_SEND, 0, bytes), 0, -1, -1);

    const int nchunks = alg_nchunks(args, args->count);
    for (int c = 0; c < nchunks && n > 1; c++) {
        int last = -1; /* the receive whose chunk the next send forwards */
        for (int s = 0; s < n - 1; s++) {
            const int send_block = s == 0 ? -1 : alg_mod(rank - s, n);
            alg_send(sched, next, ring_allgather_chunk(args, send_block, c, nchunks), last, -1);
            last = alg_recv(sched, prev,
                            ring_allgather_chunk(args, alg_mod(rank - s - 1, n), c, nchunks), -1,
                            -1);
        }
    }
    return alg_sched_finish(sched);
}

size_t
alg_ring_allgather_bytes(const struct alg_args *args)
{
    return alg_bytes(args, (size_t)(args->nranks - 1) * args->count);
}

/* As ring.c counts it: n-1 messages in sequence (chunking overlaps them), every byte sent. */
void
alg_ring_allgather_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double n = args->nranks, bytes = (double)alg_bytes(args, args->count);

    cost_out->steps = n - 1;
    cost_out->bytes = (n - 1) * bytes;
    cost_out->reduce_bytes = 0;
}
