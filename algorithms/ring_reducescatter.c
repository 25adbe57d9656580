/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ring reduce-scatter, pipelined in chunks with bounded scratch. select.c's "ring" row for
 * ncclReduceScatter.
 *
 * Rank r sends to r+1 and receives from r-1. Block i of sendbuff (count elements at i*count)
 * is this rank's contribution to rank i's result.
 *   steps s = 0..n-2: send block r-s-1 (at s = 0 our own input, afterwards the partial sum
 *       reduced at step s-1), receive the partial sum of block r-s-2 into a scratch slot and
 *       add our own input of that block to it. At s = n-2 that block is r itself, and the sum,
 *       now over all n ranks, goes into recvbuff with the op's post-divide.
 * Each block thus picks up one rank's input per link it crosses; each rank sends (n-1)*count
 * elements, the bandwidth optimum. Every block holds count elements, so uneven splits arise
 * only within a block; count 0 is an empty schedule; any n works and there is no root.
 *
 * Every block is cut into the same nchunks chunks of at most chunk_bytes and the ring runs
 * once per chunk, chunk-major, so chunks overlap on the wire. Partial sums live in `slots`
 * scratch chunks used round robin; a slot is busy from its receive until the send that
 * forwards it (or the final reduction) is done, and its next receive waits for that. At least
 * two slots are used: with one, each rank's receive would wait for its own send, which waits
 * for the next rank's receive, all the way round the ring (a deadlock under rendezvous).
 * With two, a receive waits only for an earlier message, so the ring always drains.
 *
 * A PreMulSum scalar belongs to its rank, so when the op pre-multiplies, the block sent at
 * s = 0 is first scaled into a slot and sent from there; raw input never leaves the rank.
 * Every other use of our own input is an operand flagged ALG_PRE_A. In place recvbuff is
 * block r of sendbuff, which only the final reduction reads, element for element in place.
 */
#include "alg.h"

#include <stdlib.h>

/* Chunk `chunk` of block `block` of sendbuff, or of recvbuff when block < 0. */
static struct alg_range
ring_rs_chunk(const struct alg_args *args, int block, int chunk, int nchunks)
{
    size_t first, len;

    alg_block(args->count, nchunks, chunk, &first, &len);
    if (block < 0) {
        return alg_range_make(ALG_BUF_RECV, alg_bytes(args, first), alg_bytes(args, len));
    }
    return alg_range_make(ALG_BUF_SEND, alg_bytes(args, (size_t)block * args->count + first),
                          alg_bytes(args, len));
}

ncclResult_t
alg_ring_reducescatter(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank;
    const int next = alg_mod(rank + 1, n), prev = alg_mod(rank - 1, n);

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (n == 1) {
        return alg_reduce_alone(args, sched);
    }

    const int nchunks = alg_nchunks(args, args->count);
    const size_t slot_bytes =
        alg_bytes(args, (args->count + (size_t)nchunks - 1) / (size_t)nchunks);
    const int slots = args->slots > 2 ? args->slots : 2;
    sched->scratch_bytes = slot_bytes * (size_t)slots;

    /* slot_free[i]: the step after which slot i may be overwritten. */
    int *slot_free = malloc((size_t)slots * sizeof(int));
    if (slot_free == NULL) {
        sched->out_of_memory = true;
        return alg_sched_finish(sched);
    }
    for (int i = 0; i < slots; i++) {
        slot_free[i] = -1;
    }
    unsigned long nuse = 0;

    for (int c = 0; c < nchunks; c++) {
        struct alg_range out = ring_rs_chunk(args, alg_mod(rank - 1, n), c, nchunks);
        int last = -1, out_slot = -1; /* what the next send carries, and its slot if any */

        if (args->prescale) {
            out_slot = (int)(nuse++ % (unsigned long)slots);
            struct alg_range scaled =
                alg_range_make(ALG_BUF_SCRATCH, (size_t)out_slot * slot_bytes, out.len);
            last = alg_copy(sched, scaled, out, ALG_PRE_A, slot_free[out_slot], -1);
            out = scaled;
        }
        for (int s = 0; s < n - 1; s++) {
            const int block = alg_mod(rank - s - 2, n);
            int tx = alg_send(sched, next, out, last, -1);
            if (out_slot >= 0) {
                slot_free[out_slot] = tx;
            }

            const int slot = (int)(nuse++ % (unsigned long)slots);
            struct alg_range own = ring_rs_chunk(args, block, c, nchunks);
            struct alg_range partial =
                alg_range_make(ALG_BUF_SCRATCH, (size_t)slot * slot_bytes, own.len);
            int rx = alg_recv(sched, prev, partial, slot_free[slot], -1);
            if (s < n - 2) {
                last = alg_reduce(sched, partial, own, partial, ALG_PRE_A, rx, -1, -1);
                out = partial;
                out_slot = slot;
            } else {
                slot_free[slot] = alg_reduce(sched, ring_rs_chunk(args, -1, c, nchunks), own,
                                             partial, ALG_PRE_A | ALG_POST, rx, -1, -1);
            }
        }
    }
    free(slot_free);
    return alg_sched_finish(sched);
}

size_t
alg_ring_reducescatter_bytes(const struct alg_args *args)
{
    return alg_bytes(args, (size_t)(args->nranks - 1) * args->count);
}

/* As ring.c counts it: n-1 messages in sequence (chunking overlaps them). */
void
alg_ring_reducescatter_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double n = args->nranks, bytes = (double)alg_bytes(args, args->count);

    cost_out->steps = n - 1;
    cost_out->bytes = (n - 1) * bytes;
    cost_out->reduce_bytes = (n - 1) * bytes;
}
