/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Recursive doubling, for all-reduce and all-gather; the selector's table (select.c) calls
 * these builders. p2 is the largest power of two <= n, L = log2 p2 and rem = n - p2.
 *
 * Non-power-of-two fix-up (both collectives): among the first 2*rem ranks, each odd rank
 * hands its data to its even neighbour and drops out; the even rank stands for both. The p2
 * ranks left are renumbered 0..p2-1 (new rank i is real rank 2i for i < rem, else i + rem),
 * run the power-of-two algorithm, and each even fix-up rank finally sends the result to its
 * odd neighbour. n = 6 (p2 = 4, rem = 2):
 *
 *     real   0   1   2   3   4   5
 *            |<--'   |<--'   |   |      fix-up in: 1 -> 0, 3 -> 2
 *     new    0       1       2   3      L rounds among new ranks, partner = new ^ 2^k
 *            '-->    '-->                fix-up out: 0 -> 1, 2 -> 3
 *
 * All-reduce: in round k rank i swaps its whole current vector with new rank i ^ 2^k and
 * reduces what it receives into RECV. The fix-up odd rank sends its input scaled by its own
 * PreMulSum scalar (never raw data), the even rank reduces it with its own scaled input, and
 * the last round's reduction applies the post-divide, exactly once per element on each of the
 * p2 ranks; the odd ranks receive the finished values. Bytes: L*count elements on a rank that
 * takes part, plus count for an even fix-up rank; count for an odd one. The vector is cut into
 * pieces of args->chunk_bytes (0: one piece) and the whole schedule runs once per piece,
 * piece-major, so received vectors land in `slots` scratch pieces (bounded scratch) and
 * pieces overlap.
 *
 * All-gather: rank blocks stay at their place in RECV throughout (no scratch). New rank i
 * holds the blocks of the real ranks it stands for, which are contiguous: [start(i),
 * start(i+1)) with start(i) = 2i for i < rem, else i + rem. In round k the aligned group of
 * 2^k new ranks containing i holds a contiguous run of blocks, which i swaps with the
 * partner group's run. The even fix-up rank finally sends the odd rank every block but the
 * odd rank's own, in two messages (before and after it). Bytes: count (odd fix-up rank);
 * the sum of its group runs over the L rounds, plus (n-1)*count for an even fix-up rank.
 *
 * Uneven counts are no issue in either: whole vectors or whole rank blocks move.
 */
#include "alg.h"
#include "fold.h"

/* The rounds of one piece: swap the whole current vector with new rank i ^ 2^k, reduce. */
static int
recdbl_allreduce_core(const struct alg_args *args, struct alg_sched *sched,
                      const struct alg_fold *sh, struct alg_slots *slots,
                      const struct alg_fold_piece *piece)
{
    bool raw = piece->raw; /* our current value is still SEND, unscaled */
    int last = piece->last;

    if (raw && (args->prescale || sh->levels == 0)) {
        last = alg_copy(sched, piece->recv, piece->send,
                        ALG_PRE_A | (sh->levels == 0 ? ALG_POST : 0), -1, -1);
        raw = false;
    }
    for (int k = 0; k < sh->levels; k++) {
        const int peer = alg_fold_real(sh, sh->newrank ^ (1 << k));
        const struct alg_range cur = raw ? piece->send : piece->recv;
        unsigned flags = (raw ? ALG_PRE_A : 0) | (k == sh->levels - 1 ? ALG_POST : 0);

        int sd = alg_send(sched, peer, cur, last, -1);
        /* The reduction overwrites what the send reads (always in RECV, or SEND in place):
         * it waits for the send. */
        last = alg_recv_reduce(sched, slots, peer, piece->recv, cur, flags, sd, -1);
        raw = false;
    }
    return last;
}

ncclResult_t
alg_recdbl_allreduce(const struct alg_args *args, struct alg_sched *sched)
{
    const size_t chunk_elems = args->chunk_bytes ? args->chunk_bytes / args->elem_size
                                                 : args->count;

    return alg_fold_allreduce(args, sched, chunk_elems > 0 ? chunk_elems : 1,
                              recdbl_allreduce_core);
}

size_t
alg_recdbl_allreduce_bytes(const struct alg_args *args)
{
    const struct alg_fold sh = alg_fold_make(args->rank, args->nranks);
    const size_t vec = alg_bytes(args, args->count);

    if (sh.newrank < 0) {
        return vec;
    }
    return vec * (size_t)sh.levels + (args->rank < 2 * sh.rem ? vec : 0);
}

/* Every step moves the whole vector; the levels that pair ranks of one host (and the fold, if
 * it does) are the host's, the rest the network's. */
void
alg_recdbl_allreduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const struct alg_fold sh = alg_fold_make(0, args->nranks);
    const struct alg_fold_hosts where = alg_fold_hosts(&sh, args);
    const double vec = (double)alg_bytes(args, args->count);
    const double fold = sh.rem > 0 ? 2 : 0; /* the fold and unfold steps */
    const double inner = where.inner_levels + (where.inner_fold ? fold : 0);

    cost_out->steps = inner;
    cost_out->bytes = inner * vec;
    cost_out->net_steps = sh.levels + fold - inner;
    cost_out->net_bytes = cost_out->net_steps * vec;
    cost_out->reduce_bytes = (sh.levels + fold / 2) * vec;
}

/* Elements new rank i's group of 2^k sends in round k of the all-gather. */
static size_t
recdbl_group_elems(const struct alg_fold *sh, int i, int k, size_t count)
{
    const int lo = i >> k << k, hi = lo + (1 << k);
    return (size_t)(alg_fold_real(sh, hi) - alg_fold_real(sh, lo)) * count;
}

ncclResult_t
alg_recdbl_allgather(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, rank = args->rank;
    const struct alg_fold sh = alg_fold_make(rank, n);
    const bool odd = sh.newrank < 0, even = !odd && rank < 2 * sh.rem;
    const size_t block = alg_bytes(args, args->count);

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    const struct alg_range own = alg_range_make(ALG_BUF_SEND, 0, block);
    /* have: the step after which every block received so far (and our own) is in place. */
    int have = alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)rank * block, block), own,
                        0, -1, -1);
    if (odd) {
        int sd = alg_send(sched, rank - 1, own, -1, -1);
        /* The receives leave our own block alone, so it may alias SEND (in place). */
        alg_recv(sched, rank - 1, alg_range_make(ALG_BUF_RECV, 0, (size_t)rank * block), sd,
                 -1);
        alg_recv(sched, rank - 1,
                 alg_range_make(ALG_BUF_RECV, (size_t)(rank + 1) * block,
                                (size_t)(n - rank - 1) * block),
                 sd, -1);
        return alg_sched_finish(sched);
    }
    if (even) {
        have = alg_recv(sched, rank + 1,
                        alg_range_make(ALG_BUF_RECV, (size_t)(rank + 1) * block, block), have,
                        -1);
    }
    for (int k = 0; k < sh.levels; k++) {
        const int partner = sh.newrank ^ (1 << k);
        const int mine = sh.newrank >> k << k, theirs = partner >> k << k;
        const int peer = alg_fold_real(&sh, partner);
        const size_t my_first = (size_t)alg_fold_real(&sh, mine) * block;
        const size_t their_first = (size_t)alg_fold_real(&sh, theirs) * block;

        alg_send(sched, peer,
                 alg_range_make(ALG_BUF_RECV, my_first,
                                recdbl_group_elems(&sh, sh.newrank, k, args->count) *
                                    args->elem_size),
                 have, -1);
        have = alg_recv(sched, peer,
                        alg_range_make(ALG_BUF_RECV, their_first,
                                       recdbl_group_elems(&sh, partner, k, args->count) *
                                           args->elem_size),
                        have, -1);
    }
    if (even) {
        alg_send(sched, rank + 1, alg_range_make(ALG_BUF_RECV, 0, (size_t)(rank + 1) * block),
                 have, -1);
        alg_send(sched, rank + 1,
                 alg_range_make(ALG_BUF_RECV, (size_t)(rank + 2) * block,
                                (size_t)(n - rank - 2) * block),
                 have, -1);
    }
    return alg_sched_finish(sched);
}

size_t
alg_recdbl_allgather_bytes(const struct alg_args *args)
{
    const struct alg_fold sh = alg_fold_make(args->rank, args->nranks);
    size_t elems = 0;

    if (sh.newrank < 0) {
        return alg_bytes(args, args->count);
    }
    for (int k = 0; k < sh.levels; k++) {
        elems += recdbl_group_elems(&sh, sh.newrank, k, args->count);
    }
    if (args->rank < 2 * sh.rem) {
        elems += (size_t)(args->nranks - 1) * args->count;
    }
    return alg_bytes(args, elems);
}

/* The levels carry n - 1 blocks in all, level k 2^k of them (the first levels, inside a host
 * where they pair its ranks, carry the fewest); with a fold, its unfold carries n more. */
void
alg_recdbl_allgather_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const struct alg_fold sh = alg_fold_make(0, args->nranks);
    const struct alg_fold_hosts where = alg_fold_hosts(&sh, args);
    const double block = (double)alg_bytes(args, args->count);
    const double fold = sh.rem > 0 ? 2 : 0; /* the fold and unfold steps */
    const double fold_bytes = sh.rem > 0 ? args->nranks * block : 0;
    const double level_bytes = (args->nranks - 1) * block;
    const double inner_level_bytes = where.inner_levels == sh.levels
                                         ? level_bytes
                                         : ((1 << where.inner_levels) - 1) * block;

    cost_out->steps = where.inner_levels + (where.inner_fold ? fold : 0);
    cost_out->bytes = inner_level_bytes + (where.inner_fold ? fold_bytes : 0);
    cost_out->net_steps = sh.levels + fold - cost_out->steps;
    cost_out->net_bytes = level_bytes + fold_bytes - cost_out->bytes;
    cost_out->reduce_bytes = 0;
}
