/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Communicators made from a parent's ranks: ncclCommSplit and ncclCommShrink, collective over
 * the ranks that take part, which talk only over the parent's transport; and ncclCommGrow,
 * where the parent's ranks and new ones meet at a bootstrap root one parent rank started.
 */
#ifndef SHIM_SPLIT_H
#define SHIM_SPLIT_H

#include <nccl.h>
#include <stdbool.h>

struct ncclComm;

/* Ranks passing the same color (>= 0) form a communicator, ordered by key, then by parent
 * rank; NCCL_SPLIT_NOCOLOR takes part and gets NULL. Every parent rank must call it. */
ncclResult_t shim_comm_split(struct ncclComm *parent, int color, int key, bool blocking,
                             struct ncclComm **newcomm_out);
/* The parent's ranks less the excluded ones, in parent order. Only the ranks that remain
 * call it (an excluded rank may be gone). */
ncclResult_t shim_comm_shrink(struct ncclComm *parent, const int *exclude, int nexclude,
                              bool blocking, struct ncclComm **newcomm_out);
/* ncclCommGetUniqueId: an id for growing parent, with a root in this process; one at a time,
 * each for one grow. */
ncclResult_t shim_comm_grow_id(struct ncclComm *parent, ncclUniqueId *id_out);
/* ncclCommGrow on a parent rank: the parent's ranks keep theirs in a communicator of nranks,
 * whose other ranks join with the id (ncclCommInitRank's way). Exactly one parent rank passes
 * the id ncclCommGetUniqueId gave it; the others pass NULL and learn it from that one. Every
 * parent rank must call it. */
ncclResult_t shim_comm_grow(struct ncclComm *parent, int nranks, const ncclUniqueId *id,
                            bool blocking, struct ncclComm **newcomm_out);

#endif
