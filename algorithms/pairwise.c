/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Pairwise all-to-all by rotation, the schedule the selector's table (select.c) uses for
 * ncclAlltoAll. Rank r first copies its own block (SEND block r to RECV block r); then in
 * step s it sends SEND block (r+s)%n to rank r+s and receives RECV block (r-s)%n from rank
 * r-s, for s = 1..n-1. Both partners of a message meet at the same step s, so the rotation
 * works for any n (the XOR pairing would need a power of two). Steps run in the order
 * s = 1, n-1, 2, n-2, ... (each step and its mirror n-s together; for even n, s = n/2 once),
 * the same on every rank. Every block is count elements, so there are no uneven splits; each
 * rank sends (n-1)*count elements in n-1 messages. No root.
 *
 * At most ALG_PAIRWISE_WINDOW steps are in flight: the send and receive of position j wait
 * for both of position j - window. Every step depends only on earlier positions, and the
 * partner of a message posts it at the same position, so rendezvous sends cannot deadlock.
 *
 * In place (SEND == RECV, which NCCL's layout does not promise but costs little to allow) a
 * receive must not overwrite a block still to be sent. In step s <= n-s the block from r-s
 * arrives before we send block r-s (at the mirror step n-s), so it lands in a scratch slot
 * and is copied into place once that send completed; in step s > n-s the block from r-s goes
 * straight to RECV, since its old contents left in the mirror step. Slots are reused every
 * window pairs, so scratch is ALG_PAIRWISE_WINDOW blocks, whatever n.
 */
#include "alg.h"
#include "hosts.h"

#define ALG_PAIRWISE_WINDOW 4

ncclResult_t
alg_pairwise_alltoall(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank, W = ALG_PAIRWISE_WINDOW;
    const size_t block = alg_bytes(args, args->count);
    int sends[ALG_PAIRWISE_WINDOW], recvs[ALG_PAIRWISE_WINDOW];
    int copies[ALG_PAIRWISE_WINDOW] = {-1, -1, -1, -1}; /* the copy that last read each slot */
    int j = 0;                                           /* position in the step order */

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)rank * block, block),
             alg_range_make(ALG_BUF_SEND, (size_t)rank * block, block), 0, -1, -1);
    if (args->in_place && n > 1) {
        sched->scratch_bytes = block * (size_t)W;
    }
    for (int i = 1; 2 * i <= n; i++) {
        const int slot = i % W;
        const struct alg_range scratch =
            alg_range_make(ALG_BUF_SCRATCH, (size_t)slot * block, block);
        for (int half = 0; half < (2 * i == n ? 1 : 2); half++, j++) {
            const int s = half ? n - i : i;
            const int to = alg_mod(rank + s, n), from = alg_mod(rank - s, n);
            const struct alg_range dst =
                alg_range_make(ALG_BUF_RECV, (size_t)from * block, block);
            const int dep0 = j >= W ? sends[j % W] : -1, dep1 = j >= W ? recvs[j % W] : -1;
            const int prev_send = j > 0 ? sends[(j - 1) % W] : -1;
            const int prev_recv = j > 0 ? recvs[(j - 1) % W] : -1;

            sends[j % W] = alg_send(sched, to,
                                    alg_range_make(ALG_BUF_SEND, (size_t)to * block, block),
                                    dep0, dep1);
            if (!args->in_place) {
                recvs[j % W] = alg_recv(sched, from, dst, dep0, dep1);
            } else if (half == 0) {
                recvs[j % W] = alg_recv(sched, from, scratch, copies[slot], dep1);
                if (2 * i == n) { /* s = n/2: to == from, its own mirror */
                    copies[slot] = alg_copy(sched, dst, scratch, 0, sends[j % W],
                                            recvs[j % W]);
                }
            } else {
                /* Block r-s = r+i left in the mirror step; what arrived there is block r+s. */
                recvs[j % W] = alg_recv(sched, from, dst, prev_send, dep1);
                copies[slot] = alg_copy(sched,
                                        alg_range_make(ALG_BUF_RECV, (size_t)to * block, block),
                                        scratch, 0, sends[j % W], prev_recv);
            }
        }
    }
    return alg_sched_finish(sched);
}

size_t
alg_pairwise_alltoall_bytes(const struct alg_args *args)
{
    return alg_bytes(args, args->count) * (size_t)(args->nranks - 1);
}

/* A message out and one in a step. Across hosts, those of a rank of the emptiest host to and
 * from the others: its messages at home go beside them, through shared memory, and end
 * sooner. Alike on every rank. */
void
alg_pairwise_alltoall_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const struct alg_host_shape shape = alg_host_shape(args);
    const double block = (double)alg_bytes(args, args->count);
    const double away = args->nranks - shape.narrowest;

    if (away > 0) {
        *cost_out = (struct alg_cost){.net_steps = away, .net_bytes = away * block};
    } else {
        *cost_out = (struct alg_cost){.steps = args->nranks - 1,
                                      .bytes = (args->nranks - 1) * block};
    }
}
