/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The standard fold of n ranks onto the largest power of two p2 <= n, shared by recursive
 * doubling and Rabenseifner. With rem = n - p2, the first 2*rem ranks pair up: each odd one
 * hands its data to its even neighbour and drops out (new rank -1), each even one becomes new
 * rank r/2; the remaining ranks are new ranks r - rem. After the power-of-two phase the even
 * ranks hand the result back to their odd neighbours.
 *
 *   n = 6, p2 = 4, rem = 2:   real  0  1  2  3  4  5
 *                             new   0  -  1  -  2  3
 */
#ifndef ALG_FOLD_H
#define ALG_FOLD_H

#include "alg.h"

struct alg_fold {
    int p2;      /* largest power of two <= n */
    int levels;  /* log2(p2) */
    int rem;     /* n - p2: ranks that fold away */
    int newrank; /* ours in the power-of-two phase, -1 if we fold away */
};

static inline struct alg_fold
alg_fold_make(int rank, int n)
{
    struct alg_fold f = {1, 0, 0, 0};

    while (f.p2 * 2 <= n) {
        f.p2 *= 2;
        f.levels++;
    }
    f.rem = n - f.p2;
    if (rank < 2 * f.rem) {
        f.newrank = rank % 2 ? -1 : rank / 2;
    } else {
        f.newrank = rank - f.rem;
    }
    return f;
}

/* The real rank of new rank i; also the first of the real ranks it stands for. */
static inline int
alg_fold_real(const struct alg_fold *f, int i)
{
    return i < f->rem ? 2 * i : i + f->rem;
}

/* Where a fold's messages run, for cost functions (alike on every rank): how many of the
 * power-of-two levels, from the first, pair ranks of one host, and whether the fold and
 * unfold steps do. Known where hosts hold equal runs of consecutive ranks (alg_hosts.block):
 * level k pairs ranks inside runs of 2^(k+1), and the fold pairs 2i with 2i + 1; elsewhere
 * every message counts as crossing. On one host none crosses. */
struct alg_fold_hosts {
    int inner_levels;
    bool inner_fold;
};

static inline struct alg_fold_hosts
alg_fold_hosts(const struct alg_fold *f, const struct alg_args *args)
{
    if (!alg_hosts_span(args)) {
        return (struct alg_fold_hosts){f->levels, true};
    }
    const int block = args->hosts->block;
    struct alg_fold_hosts h = {0, block > 0 && block % 2 == 0};

    /* With ranks folded away the new ranks no longer follow the runs: counted as crossing. */
    while (f->rem == 0 && block > 0 && h.inner_levels < f->levels &&
           block % (2 << h.inner_levels) == 0) {
        h.inner_levels++;
    }
    return h;
}

/* One piece of an all-reduce's vector, as alg_fold_allreduce hands it to the core. */
struct alg_fold_piece {
    size_t base, len;            /* elements */
    struct alg_range send, recv; /* the piece in SEND and in RECV */
    bool raw;                    /* RECV does not hold our values yet: they are SEND, unscaled */
    int last;                    /* if !raw, the step after which RECV holds them */
};

/* The power-of-two part of an all-reduce on one piece, on a rank that takes part in it
 * (fold->newrank >= 0), its receives in `slots`: returns the step after which the piece is
 * final in RECV. */
typedef int (*alg_fold_core_fn)(const struct alg_args *args, struct alg_sched *sched,
                                const struct alg_fold *fold, struct alg_slots *slots,
                                const struct alg_fold_piece *piece);

/*
 * An all-reduce over the fold, for recursive doubling and Rabenseifner: the vector is cut
 * into pieces of at most piece_elems elements (> 0), and the whole schedule runs once per
 * piece, piece-major. Per piece, an odd fold rank hands its piece to its even neighbour
 * (scaled first when the op pre-multiplies: raw input never leaves a rank) and takes the
 * result back; the even one receives it into a slot and reduces it with its own scaled input,
 * runs `core` and sends the result back; the others run `core` alone. Scratch: args->slots
 * slots of a piece each, on every rank that takes part.
 */
ncclResult_t alg_fold_allreduce(const struct alg_args *args, struct alg_sched *sched,
                                size_t piece_elems, alg_fold_core_fn core);

#endif
