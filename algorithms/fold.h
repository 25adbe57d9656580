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

/* A folded-away rank's whole part for one piece: hand the piece to the even neighbour (scaled
 * first when the op pre-multiplies: raw input never leaves a rank) and take the finished piece
 * back into recv once the send is done. */
static inline void
alg_fold_hand_off(struct alg_sched *sched, const struct alg_args *args, struct alg_range send,
                  struct alg_range recv)
{
    int sent;

    if (args->prescale) {
        int scaled = alg_copy(sched, recv, send, ALG_PRE_A, -1, -1);
        sent = alg_send(sched, args->rank - 1, recv, scaled, -1);
    } else {
        sent = alg_send(sched, args->rank - 1, send, -1, -1);
    }
    alg_recv(sched, args->rank - 1, recv, sent, -1);
}

#endif
