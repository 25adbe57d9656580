/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The piece loop of an all-reduce over the fold of fold.h, which recursive doubling
 * (recdbl.c) and Rabenseifner (rabenseifner.c) share: the ranks that fold away and their even
 * neighbours, around each builder's power-of-two core.
 */
#include "fold.h"

/* A folded-away rank's whole part for one piece: hand the piece to the even neighbour (scaled
 * first when the op pre-multiplies) and take the finished piece back into recv once the send
 * is done. */
static void
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

ncclResult_t
alg_fold_allreduce(const struct alg_args *args, struct alg_sched *sched, size_t piece_elems,
                   alg_fold_core_fn core)
{
    const int n = args->nranks, rank = args->rank;
    const struct alg_fold fold = alg_fold_make(rank, n);
    const bool odd = fold.newrank < 0, even = !odd && rank < 2 * fold.rem;
    const size_t E = args->elem_size;
    struct alg_slots slots;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    const size_t npieces = (args->count + piece_elems - 1) / piece_elems;
    if (!alg_slots_init(&slots, sched, args->slots,
                        (args->count + npieces - 1) / npieces * E)) {
        return alg_sched_finish(sched);
    }
    if (!odd && n > 1) {
        sched->scratch_bytes = slots.bytes * (size_t)slots.count;
    }
    for (size_t c = 0; c < npieces; c++) {
        struct alg_fold_piece piece = {.raw = true, .last = -1};
        alg_block(args->count, (int)npieces, (int)c, &piece.base, &piece.len);
        piece.send = alg_range_make(ALG_BUF_SEND, piece.base * E, piece.len * E);
        piece.recv = alg_range_make(ALG_BUF_RECV, piece.base * E, piece.len * E);

        if (odd) {
            alg_fold_hand_off(sched, args, piece.send, piece.recv);
            continue;
        }
        if (even) {
            piece.last = alg_recv_reduce(sched, &slots, rank + 1, piece.recv, piece.send,
                                         ALG_PRE_A, -1, -1);
            piece.raw = false;
        }
        int last = core(args, sched, &fold, &slots, &piece);
        if (even) {
            alg_send(sched, rank + 1, piece.recv, last, -1);
        }
    }
    alg_slots_free(&slots);
    return alg_sched_finish(sched);
}
