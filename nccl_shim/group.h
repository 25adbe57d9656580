/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Groups: ncclGroupStart/End, per thread, nestable. Outside a group every call is a group of
 * one. Inside, collectives are queued in call order (which fixes their sequence numbers) and
 * the outermost ncclGroupEnd runs them all together, so one thread can drive several
 * communicators, and communicator inits started inside a group are joined there.
 */
#ifndef SHIM_GROUP_H
#define SHIM_GROUP_H

#include <nccl.h>
#include <stdbool.h>

#include "engine/op.h"

ncclResult_t shim_group_start(void);
ncclResult_t shim_group_end(void);
bool shim_group_active(void);

/* Runs op now, or queues it until the outermost ncclGroupEnd. */
ncclResult_t shim_group_enqueue(const struct shim_op *op);
/* Inside a group: runs fn(arg) on a thread of its own at once, and ncclGroupEnd joins it and
 * returns its error (a collective call that must not wait for the other ranks of a clique
 * this thread drives too). */
ncclResult_t shim_group_spawn(ncclResult_t (*fn)(void *), void *arg);
/* A communicator whose non-blocking init ncclGroupEnd must wait for. */
ncclResult_t shim_group_add_init(struct ncclComm *comm);
/* Remembers a failed call inside a group: ncclGroupEnd then returns it and runs nothing. */
void shim_group_fail(ncclResult_t res);

#endif
