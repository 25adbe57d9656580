/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Communicators made from a parent's ranks: ncclCommSplit and ncclCommShrink. Both are
 * collective over the ranks that take part, and talk only over the parent's transport.
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

#endif
