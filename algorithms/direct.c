/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Direct patterns: every message goes straight between the two ranks that own the data, no
 * forwarding. The selector's table (select.c) calls these builders.
 *   send, recv   (ncclSend / ncclRecv) one message of count elements to / from the peer
 *                args->root, from SEND or into RECV. A zero count still exchanges one empty
 *                message, so the pair stays matched; a peer equal to our own rank is legal
 *                (a send to self inside a group) and the transport loops it back. The sender
 *                sends count elements, the receiver nothing.
 *   scatter      the root sends block i of SEND to each rank i != root, in rank order starting
 *                after the root, all at once; every other rank receives one message into RECV.
 *                The root's own block is a copy, skipped in place (RECV == SEND + root*count).
 *                The root sends (n-1)*count elements, the others nothing.
 *   gather       the mirror image: every rank i != root sends its count elements, the root
 *                receives them into block i of RECV and copies its own (skipped in place).
 * Blocks are count elements each, so uneven splits cannot arise; any root, any n works, and a
 * zero count (scatter, gather) is an empty schedule. Buffers a rank does not use (SEND at a
 * scatter's non-root, RECV at a gather's non-root) are never addressed.
 */
#include "alg.h"
#include "hosts.h"

ncclResult_t
alg_direct_send(const struct alg_args *args, struct alg_sched *sched)
{
    alg_send(sched, args->root, alg_range_make(ALG_BUF_SEND, 0, alg_bytes(args, args->count)),
             -1, -1);
    return alg_sched_finish(sched);
}

size_t
alg_direct_send_bytes(const struct alg_args *args)
{
    return alg_bytes(args, args->count);
}

void
alg_direct_send_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    *cost_out = (struct alg_cost){.steps = 1, .bytes = (double)alg_bytes(args, args->count)};
}

ncclResult_t
alg_direct_recv(const struct alg_args *args, struct alg_sched *sched)
{
    alg_recv(sched, args->root, alg_range_make(ALG_BUF_RECV, 0, alg_bytes(args, args->count)),
             -1, -1);
    return alg_sched_finish(sched);
}

size_t
alg_direct_recv_bytes(const struct alg_args *args)
{
    (void)args;
    return 0;
}

void
alg_direct_recv_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    /* The receive is on the critical path: the bytes arrive here. */
    *cost_out = (struct alg_cost){.steps = 1, .bytes = (double)alg_bytes(args, args->count)};
}

ncclResult_t
alg_direct_scatter(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank, root = args->root;
    const size_t block = alg_bytes(args, args->count);

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (rank != root) {
        alg_recv(sched, root, alg_range_make(ALG_BUF_RECV, 0, block), -1, -1);
        return alg_sched_finish(sched);
    }
    for (int s = 1; s < n; s++) {
        const int peer = alg_mod(root + s, n);
        alg_send(sched, peer, alg_range_make(ALG_BUF_SEND, (size_t)peer * block, block), -1,
                 -1);
    }
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, block),
             alg_range_make(ALG_BUF_SEND, (size_t)root * block, block), 0, -1, -1);
    return alg_sched_finish(sched);
}

size_t
alg_direct_scatter_bytes(const struct alg_args *args)
{
    if (args->rank != args->root) {
        return 0;
    }
    return alg_bytes(args, args->count) * (size_t)(args->nranks - 1);
}

/* The root's link carries every block in sequence: that is the critical path. Across hosts,
 * the blocks to other hosts: the sends to the root's own host go out beside them, through
 * shared memory, and end sooner. Alike on every rank. */
void
alg_direct_scatter_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double block = (double)alg_bytes(args, args->count);
    const double home = alg_host_ranks_with(args, args->root), away = args->nranks - home;

    if (away > 0) {
        *cost_out = (struct alg_cost){.net_steps = away, .net_bytes = away * block};
    } else {
        *cost_out = (struct alg_cost){.steps = home - 1, .bytes = (home - 1) * block};
    }
}

ncclResult_t
alg_direct_gather(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank, root = args->root;
    const size_t block = alg_bytes(args, args->count);

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (rank != root) {
        alg_send(sched, root, alg_range_make(ALG_BUF_SEND, 0, block), -1, -1);
        return alg_sched_finish(sched);
    }
    for (int s = 1; s < n; s++) {
        const int peer = alg_mod(root + s, n);
        alg_recv(sched, peer, alg_range_make(ALG_BUF_RECV, (size_t)peer * block, block), -1,
                 -1);
    }
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)root * block, block),
             alg_range_make(ALG_BUF_SEND, 0, block), 0, -1, -1);
    return alg_sched_finish(sched);
}

size_t
alg_direct_gather_bytes(const struct alg_args *args)
{
    return args->rank == args->root ? 0 : alg_bytes(args, args->count);
}

/* The scatter's, backwards. */
void
alg_direct_gather_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    alg_direct_scatter_cost(args, cost_out);
}

void
alg_exchange_all(struct alg_sched *sched, const int *members, int nmembers, int me,
                 size_t bytes)
{
    for (int i = 0; i < nmembers; i++) {
        if (i != me) {
            int peer = members != NULL ? members[i] : i;
            alg_send(sched, peer, alg_range_make(ALG_BUF_SEND, 0, bytes), -1, -1);
            alg_recv(sched, peer, alg_range_make(ALG_BUF_RECV, (size_t)i * bytes, bytes), -1,
                     -1);
        }
    }
}
