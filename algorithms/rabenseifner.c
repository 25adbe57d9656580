/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Rabenseifner's all-reduce (recursive halving, then recursive doubling); the selector's table
 * (select.c) calls the builder. p2 is the largest power of two <= n, L = log2 p2, rem = n - p2.
 *
 * Fix-up for n not a power of two, as in recdbl.c: among the first 2*rem ranks each odd rank
 * sends its input, scaled by its own PreMulSum scalar, to its even neighbour, which reduces
 * it with its own scaled input and stands for both; the p2 ranks left are renumbered
 * (new rank i is real rank 2i for i < rem, else i + rem). At the end each even fix-up rank
 * sends the finished vector to its odd neighbour.
 *
 * The vector is cut into p2 blocks (alg_block: the first count % p2 hold one extra element,
 * so blocks may be empty when count < p2).
 *   reduce-scatter by halving, rounds d = p2/2, p2/4, ..., 1: new rank i holds a window of
 *       2d blocks; it keeps the half that contains block i, sends the other half to new rank
 *       i ^ d, receives that rank's values for its kept half into scratch and reduces them
 *       into RECV. After the d = 1 round (the reduction that applies the post-divide) rank i
 *       holds block i final.
 *   all-gather by doubling, rounds d = 1, 2, ..., p2/2: rank i swaps its window of d blocks
 *       with new rank i ^ d, receiving straight into RECV. The receive overwrites the half
 *       this rank sent in the halving round of the same d, so it waits for that send.
 * A rank that takes part sends, per piece, its vector less its own block in the halving and
 * the sum of its windows in the doubling (2(p2-1)/p2 of the vector when blocks are even);
 * an even fix-up rank sends count more, an odd one sends count only. In the first halving
 * round raw input is sent only after scaling, into the RECV half it gives away.
 *
 * For bounded scratch the vector is cut into pieces of p2 * args->chunk_bytes (0: one piece),
 * so the smallest message is about a chunk, and the whole schedule runs once per piece,
 * piece-major; received halves land in `slots` scratch pieces.
 */
#include "alg.h"
#include "fold.h"

/* First element of block `b` of a piece of `len` elements cut into p2 blocks; b may be p2. */
static size_t
rab_first(size_t len, int p2, int b)
{
    size_t first, blen;
    alg_block(len, p2, b, &first, &blen);
    return first;
}

/* Blocks [lo, hi) of the piece at element `base` of length `len`, as a byte range. */
static struct alg_range
rab_blocks(const struct alg_args *args, enum alg_buf buf, size_t base, size_t len, int p2,
           int lo, int hi)
{
    const size_t a = rab_first(len, p2, lo), b = rab_first(len, p2, hi);
    return alg_range_make(buf, (base + a) * args->elem_size, (b - a) * args->elem_size);
}

/* Elements a taking-part new rank sends for one piece of `len` elements. */
static size_t
rab_piece_elems(size_t len, int p2, int levels, int i)
{
    size_t elems = len - (rab_first(len, p2, i + 1) - rab_first(len, p2, i));
    for (int k = 0; k < levels; k++) {
        const int lo = i >> k << k;
        elems += rab_first(len, p2, lo + (1 << k)) - rab_first(len, p2, lo);
    }
    return elems;
}

/* Elements per piece: p2 chunks (0: the whole vector), at least one element per block. */
static size_t
rab_piece_size(const struct alg_args *args, int p2)
{
    size_t elems = args->chunk_bytes ? args->chunk_bytes / args->elem_size * (size_t)p2
                                     : args->count;
    return elems > 0 ? elems : (size_t)p2;
}

/* Halving, then doubling, on one piece. */
static int
rab_allreduce_core(const struct alg_args *args, struct alg_sched *sched,
                   const struct alg_fold *sh, struct alg_slots *slots,
                   const struct alg_fold_piece *piece)
{
    const int p2 = sh->p2, me = sh->newrank;
    const size_t base = piece->base, len = piece->len;
    int halving[32]; /* each halving round's send; levels <= 30, p2 being an int */
    bool raw = piece->raw; /* RECV does not hold our values yet: they are SEND, unscaled */
    int last = piece->last;
    int lo = 0, hi = p2;

    for (int k = 0; k < sh->levels; k++) {
        const int d = p2 >> (k + 1), mid = lo + d;
        const int peer = alg_fold_real(sh, me ^ d);
        const bool upper = (me & d) != 0;
        const int klo = upper ? mid : lo, khi = upper ? hi : mid;
        const int glo = upper ? lo : mid, ghi = upper ? mid : hi;
        const enum alg_buf cur = raw ? ALG_BUF_SEND : ALG_BUF_RECV;
        struct alg_range give = rab_blocks(args, cur, base, len, p2, glo, ghi);
        struct alg_range keep = rab_blocks(args, ALG_BUF_RECV, base, len, p2, klo, khi);
        struct alg_range keep_cur = rab_blocks(args, cur, base, len, p2, klo, khi);
        int dep = last;

        if (raw && args->prescale) {
            struct alg_range scaled = rab_blocks(args, ALG_BUF_RECV, base, len, p2, glo, ghi);
            dep = alg_copy(sched, scaled, give, ALG_PRE_A, -1, -1);
            give = scaled;
        }
        halving[k] = alg_send(sched, peer, give, dep, -1);
        last = alg_recv_reduce(sched, slots, peer, keep, keep_cur,
                               (raw ? ALG_PRE_A : 0) | (k == sh->levels - 1 ? ALG_POST : 0),
                               last, -1);
        raw = false;
        lo = klo;
        hi = khi;
    }
    for (int k = sh->levels - 1; k >= 0; k--) {
        const int d = p2 >> (k + 1), plo = lo ^ d;
        const int peer = alg_fold_real(sh, me ^ d);
        alg_send(sched, peer, rab_blocks(args, ALG_BUF_RECV, base, len, p2, lo, lo + d), last,
                 -1);
        last = alg_recv(sched, peer, rab_blocks(args, ALG_BUF_RECV, base, len, p2, plo, plo + d),
                        halving[k], last);
        lo = lo < plo ? lo : plo;
    }
    return last;
}

ncclResult_t
alg_rabenseifner_allreduce(const struct alg_args *args, struct alg_sched *sched)
{
    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (args->nranks == 1) {
        return alg_reduce_alone(args, sched);
    }
    const struct alg_fold sh = alg_fold_make(args->rank, args->nranks);
    return alg_fold_allreduce(args, sched, rab_piece_size(args, sh.p2), rab_allreduce_core);
}

size_t
alg_rabenseifner_allreduce_bytes(const struct alg_args *args)
{
    const struct alg_fold sh = alg_fold_make(args->rank, args->nranks);
    const size_t count = args->count;

    if (args->nranks == 1 || count == 0) {
        return 0;
    }
    if (sh.newrank < 0) {
        return alg_bytes(args, count);
    }
    const size_t piece_elems = rab_piece_size(args, sh.p2);
    const size_t npieces = (count + piece_elems - 1) / piece_elems;
    const size_t small = count / npieces, big_pieces = count % npieces;
    size_t elems = big_pieces * rab_piece_elems(small + 1, sh.p2, sh.levels, sh.newrank) +
                   (npieces - big_pieces) * rab_piece_elems(small, sh.p2, sh.levels, sh.newrank);
    if (args->rank < 2 * sh.rem) {
        elems += count;
    }
    return alg_bytes(args, elems);
}

void
alg_rabenseifner_allreduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const struct alg_fold sh = alg_fold_make(0, args->nranks);
    const double vec = (double)alg_bytes(args, args->count);
    const double fix = sh.rem > 0 ? 1 : 0, share = (double)(sh.p2 - 1) / sh.p2;

    cost_out->steps = 2 * sh.levels + 2 * fix;
    cost_out->bytes = (2 * share + 2 * fix) * vec;
    cost_out->reduce_bytes = (share + fix) * vec;
}
