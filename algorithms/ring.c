/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ring all-reduce: a reduce-scatter ring followed by an all-gather ring, pipelined in chunks.
 *
 * The buffer is cut into n blocks (the first count % n blocks hold one extra element, so any
 * count works, including count < n where some blocks are empty). Rank r sends to r+1 and
 * receives from r-1.
 *   reduce-scatter, steps s = 0..n-2: send block r-s, receive block r-s-1 into a scratch slot,
 *       reduce it with our own input into recvbuff. After step n-2 rank r holds the complete
 *       result of block r+1.
 *   all-gather, steps t = 0..n-2: send block r+1-t (the finished one, then each one just
 *       received), receive block r-t straight into recvbuff.
 * Each rank sends 2(n-1)/n of the buffer in all, the bandwidth optimum.
 *
 * Every block is further cut into the same number of chunks, and the whole sequence above runs
 * once per chunk, chunk-major, so chunk c+1 is on the wire while chunk c is being reduced.
 * Received partial sums land in one of `slots` scratch chunks; a receive waits for the
 * reduction that last used its slot, which bounds scratch memory to slots chunks.
 *
 * Reductions mark our own raw input for the op's pre-multiply and the last reduction of a
 * block for the op's post-divide. A PreMulSum scalar belongs to the rank that created it, so
 * when the op pre-multiplies, step s = 0 first scales our own block into its place in recvbuff
 * and sends it from there (that space is free until the all-gather fills it). In place
 * (sendbuff == recvbuff) the all-gather receive of a block must wait until our reduce-scatter
 * send of that block completed, since it overwrites it; the schedule always carries that
 * dependency.
 */
#include "alg.h"

#include <stdlib.h>

/* The part of block `block` that chunk `chunk` of `nchunks` covers, as a byte range. */
static struct alg_range
ring_chunk(const struct alg_args *args, enum alg_buf buf, int block, int chunk, int nchunks)
{
    size_t block_first, block_len, chunk_first, chunk_len;

    alg_block(args->count, args->nranks, block, &block_first, &block_len);
    alg_block(block_len, nchunks, chunk, &chunk_first, &chunk_len);
    return alg_range_make(buf, (block_first + chunk_first) * args->elem_size,
                          chunk_len * args->elem_size);
}

ncclResult_t
alg_ring_allreduce(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank;
    const int next = alg_mod(rank + 1, n), prev = alg_mod(rank - 1, n);

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (n == 1) {
        return alg_reduce_alone(args, sched);
    }

    /* Chunks: enough that the largest block's chunks fit chunk_bytes. */
    const size_t max_block = (args->count + (size_t)n - 1) / (size_t)n;
    const int nchunks = alg_nchunks(args, max_block);
    const size_t slot_bytes = ((max_block + (size_t)nchunks - 1) / (size_t)nchunks) *
                              args->elem_size;
    struct alg_slots slots;
    int *rs_send = malloc((size_t)n * sizeof(int)); /* this chunk's reduce-scatter sends */
    if (rs_send == NULL) {
        sched->out_of_memory = true;
        return alg_sched_finish(sched);
    }
    if (!alg_slots_init(&slots, sched, args->slots, slot_bytes)) {
        free(rs_send);
        return alg_sched_finish(sched);
    }
    sched->scratch_bytes = slot_bytes * (size_t)slots.count;

    for (int c = 0; c < nchunks; c++) {
        int last = -1; /* the step that produced what the next send carries */
        for (int s = 0; s < n - 1; s++) {
            const int send_block = alg_mod(rank - s, n), recv_block = alg_mod(rank - s - 1, n);
            struct alg_range own = ring_chunk(args, ALG_BUF_SEND, recv_block, c, nchunks);
            struct alg_range out = ring_chunk(args, ALG_BUF_RECV, recv_block, c, nchunks);
            unsigned flags = ALG_PRE_A | (s == n - 2 ? ALG_POST : 0);
            struct alg_range outgoing = ring_chunk(args, ALG_BUF_RECV, send_block, c, nchunks);

            if (s == 0 && args->prescale) {
                last = alg_copy(sched, outgoing,
                                ring_chunk(args, ALG_BUF_SEND, send_block, c, nchunks),
                                ALG_PRE_A, -1, -1);
            } else if (s == 0) {
                outgoing = ring_chunk(args, ALG_BUF_SEND, send_block, c, nchunks);
            }
            rs_send[s] = alg_send(sched, next, outgoing, last, -1);
            last = alg_recv_reduce(sched, &slots, prev, out, own, flags, -1, -1);
        }
        for (int t = 0; t < n - 1; t++) {
            const int send_block = alg_mod(rank + 1 - t, n), recv_block = alg_mod(rank - t, n);
            alg_send(sched, next, ring_chunk(args, ALG_BUF_RECV, send_block, c, nchunks), last,
                     -1);
            last = alg_recv(sched, prev, ring_chunk(args, ALG_BUF_RECV, recv_block, c, nchunks),
                            rs_send[t], -1);
        }
    }
    alg_slots_free(&slots);
    free(rs_send);
    return alg_sched_finish(sched);
}

/* Reduce-scatter sends every block but r+1, all-gather every block but r+2. */
size_t
alg_ring_allreduce_bytes(const struct alg_args *args)
{
    const int n = args->nranks;
    size_t first, skip_rs, skip_ag;

    if (n == 1) {
        return 0;
    }
    alg_block(args->count, n, alg_mod(args->rank + 1, n), &first, &skip_rs);
    alg_block(args->count, n, alg_mod(args->rank + 2, n), &first, &skip_ag);
    return alg_bytes(args, 2 * args->count - skip_rs - skip_ag);
}

void
alg_ring_allreduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double n = args->nranks, bytes = (double)alg_bytes(args, args->count);

    cost_out->steps = 2 * (n - 1);
    cost_out->bytes = 2 * (n - 1) / n * bytes;
    cost_out->reduce_bytes = (n - 1) / n * bytes;
}
