/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pipelined chain broadcast and reduce: a ring without its closing link, rooted anywhere.
 * select.c's "chain" rows (NCCL_ALGO family "ring") for ncclBroadcast and ncclReduce.
 *
 * The chain is the ranks in host order from the root (hosts.h): the root, the other ranks of
 * its host, then each other host's ranks, so it crosses between H hosts H - 1 times wherever
 * the root is; on one host, the ranks from the root round. Broadcast flows from the root
 * down that order; reduce flows up it, so the root is last and partial sums flow towards
 * it. n = 5 on one host, root 2:
 *
 *   broadcast   2 -> 3 -> 4 -> 0 -> 1          reduce   1 -> 0 -> 4 -> 3 -> 2
 *
 * The buffer is cut into nchunks chunks of at most chunk_bytes (the first ones an element
 * longer when they do not divide evenly; count 0 is an empty schedule), and chunk c+1 enters
 * the chain right behind chunk c, so once the first chunk reaches the far end every link is
 * busy; the last chunk arrives after nchunks + n - 2 chunk times. Nothing depends on n
 * being a power of two, and any rank may be the root.
 *   broadcast: the root copies sendbuff to its recvbuff (skipped in place) and sends every
 *       chunk from sendbuff; every other rank receives a chunk into recvbuff and, unless it
 *       is last, forwards it from there. All ranks but the last send count elements.
 *   reduce: the first rank sends its input; each further rank receives the partial sum of a
 *       chunk into a scratch slot and adds its own input to it (flagged ALG_PRE_A); the
 *       others forward the slot, the root writes the sum into recvbuff with ALG_POST. All
 *       ranks but the root send count elements. Non-root ranks have no recvbuff, so partial
 *       sums live only in `slots` scratch chunks used round robin; a slot's next receive waits
 *       until its previous chunk was forwarded (one slot is enough: that send waits only for
 *       the next rank's receive of an earlier chunk). When the op pre-multiplies, the first
 *       rank scales its chunk into a slot and sends from there: raw input never leaves a rank.
 *       In place the root's recvbuff is its sendbuff, read and written element for element.
 */
#include "alg.h"
#include "hosts.h"

#include <stdlib.h>

/* Our place in the chain (0 sends first) and our neighbours. */
struct chain_links {
    int pos, prev, next;
};

/* `toward_root` for reduce, whose data flows up the host order to the root. False (sched, if
 * any, marked out of memory) if the host map cannot be made. */
static bool
chain_links(const struct alg_args *args, struct alg_sched *sched, bool toward_root,
            struct chain_links *links)
{
    struct alg_host_map map;
    const int n = args->nranks;

    if (!alg_host_map_init(&map, args, sched)) {
        return false;
    }
    const int at = alg_host_position(&map, args->root, args->rank);
    const int up = toward_root ? -1 : 1;
    links->pos = toward_root ? n - 1 - at : at;
    links->next = alg_host_order(&map, args->root, alg_mod(at + up, n));
    links->prev = alg_host_order(&map, args->root, alg_mod(at - up, n));
    alg_host_map_free(&map);
    return true;
}

static struct alg_range
chain_chunk(const struct alg_args *args, enum alg_buf buf, int chunk, int nchunks)
{
    size_t first, len;

    alg_block(args->count, nchunks, chunk, &first, &len);
    return alg_range_make(buf, alg_bytes(args, first), alg_bytes(args, len));
}

ncclResult_t
alg_chain_broadcast(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks;
    struct chain_links links;

    if (args->count == 0 || !chain_links(args, sched, false, &links)) {
        return alg_sched_finish(sched);
    }
    const int pos = links.pos, next = links.next, prev = links.prev;
    const int nchunks = alg_nchunks(args, args->count);
    if (pos == 0) {
        const size_t bytes = alg_bytes(args, args->count);
        alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, bytes),
                 alg_range_make(ALG_BUF_SEND, 0, bytes), 0, -1, -1);
        for (int c = 0; c < nchunks && n > 1; c++) {
            alg_send(sched, next, chain_chunk(args, ALG_BUF_SEND, c, nchunks), -1, -1);
        }
        return alg_sched_finish(sched);
    }
    for (int c = 0; c < nchunks; c++) {
        struct alg_range chunk = chain_chunk(args, ALG_BUF_RECV, c, nchunks);
        int rx = alg_recv(sched, prev, chunk, -1, -1);
        if (pos < n - 1) {
            alg_send(sched, next, chunk, rx, -1);
        }
    }
    return alg_sched_finish(sched);
}

size_t
alg_chain_broadcast_bytes(const struct alg_args *args)
{
    struct chain_links links;

    if (!chain_links(args, NULL, false, &links)) {
        return 0;
    }
    return links.pos < args->nranks - 1 ? alg_bytes(args, args->count) : 0;
}

/* Pipeline fill plus drain: nchunks + n - 2 chunk times on the critical path. */
static void
chain_cost(const struct alg_args *args, struct alg_cost *cost_out, bool reduces)
{
    const double n = args->nranks, bytes = (double)alg_bytes(args, args->count);
    const double nchunks = args->count > 0 ? alg_nchunks(args, args->count) : 0;
    const double times = n > 1 && nchunks > 0 ? nchunks + n - 2 : 0;

    cost_out->steps = times;
    cost_out->bytes = times > 0 ? bytes / nchunks * times : 0;
    cost_out->reduce_bytes = reduces ? cost_out->bytes : 0;
    cost_out->chunked = true;
}

void
alg_chain_broadcast_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    chain_cost(args, cost_out, false);
}

ncclResult_t
alg_chain_reduce(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks;
    struct chain_links links;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (n == 1) {
        return alg_reduce_alone(args, sched);
    }
    if (!chain_links(args, sched, true, &links)) {
        return alg_sched_finish(sched);
    }
    const int pos = links.pos, next = links.next, prev = links.prev;

    const int nchunks = alg_nchunks(args, args->count);
    const size_t slot_bytes =
        alg_bytes(args, (args->count + (size_t)nchunks - 1) / (size_t)nchunks);
    const int slots = args->slots > 1 ? args->slots : 1;
    const bool scratch = pos > 0 || args->prescale;
    sched->scratch_bytes = scratch ? slot_bytes * (size_t)slots : 0;

    /* slot_free[i]: the step after which slot i may be overwritten. */
    int *slot_free = malloc((size_t)slots * sizeof(int));
    if (slot_free == NULL) {
        sched->out_of_memory = true;
        return alg_sched_finish(sched);
    }
    for (int i = 0; i < slots; i++) {
        slot_free[i] = -1;
    }

    for (int c = 0; c < nchunks; c++) {
        const int slot = c % slots;
        struct alg_range own = chain_chunk(args, ALG_BUF_SEND, c, nchunks);
        struct alg_range partial =
            alg_range_make(ALG_BUF_SCRATCH, (size_t)slot * slot_bytes, own.len);

        if (pos == 0 && !args->prescale) {
            alg_send(sched, next, own, -1, -1);
        } else if (pos == 0) {
            int scaled = alg_copy(sched, partial, own, ALG_PRE_A, slot_free[slot], -1);
            slot_free[slot] = alg_send(sched, next, partial, scaled, -1);
        } else if (pos < n - 1) {
            int rx = alg_recv(sched, prev, partial, slot_free[slot], -1);
            int sum = alg_reduce(sched, partial, own, partial, ALG_PRE_A, rx, -1, -1);
            slot_free[slot] = alg_send(sched, next, partial, sum, -1);
        } else {
            int rx = alg_recv(sched, prev, partial, slot_free[slot], -1);
            slot_free[slot] = alg_reduce(sched, chain_chunk(args, ALG_BUF_RECV, c, nchunks), own,
                                         partial, ALG_PRE_A | ALG_POST, rx, -1, -1);
        }
    }
    free(slot_free);
    return alg_sched_finish(sched);
}

size_t
alg_chain_reduce_bytes(const struct alg_args *args)
{
    return args->rank != args->root ? alg_bytes(args, args->count) : 0;
}

void
alg_chain_reduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    chain_cost(args, cost_out, true);
}
