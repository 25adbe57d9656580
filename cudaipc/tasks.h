/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One GPU's share of an operation, as its leader's kernels carry it out (tasks.c): every
 * rank's buffers, as the leader's device reaches them, turned into kernel tasks
 * (kernels/device.h). Each byte of an input is read once per GPU that needs it and each
 * output byte written once, by one GPU, and no GPU moves more across its links than the
 * textbook algorithm would (for G GPUs, S bytes, one rank each):
 *
 *   all-reduce      part k of G: every rank's input reduced, in rank order, into every
 *                   output (2 (G-1)/G S in and out of each GPU, a ring's)
 *   reduce          the same into the root's output, in G-1 parts among the GPUs but the
 *                   root's (S in and out of each, a pipelined chain's)
 *   broadcast       the root's input into every output, in G-1 parts among the GPUs but the
 *                   root's, whose leader copies it whole to its own ranks' outputs (S out of
 *                   the root's GPU, S into each other)
 *   reduce-scatter  the outputs of this GPU's ranks: block j of every input into rank j's
 *   all-gather      the outputs of this GPU's ranks: j's input into block j, for every j
 *   all-to-all      the outputs of this GPU's ranks q: block q of p's input into block p
 *   gather          on the root's GPU: p's input into block p of the root's output
 *   scatter         the outputs of this GPU's ranks p: block p of the root's input
 *   send/receive    on the receiver's GPU: one copy, the sender's buffer into the receiver's
 * so results are bit-identical whichever GPU computes which part.
 */
#ifndef CIPC_TASKS_H
#define CIPC_TASKS_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "cudaipc.h"
#include "levels.h"
#include "kernels/device_abi.h"
#include "kernels/kernels.h"

struct gpu_device;

struct cipc_work {
    enum alg_coll coll;          /* SEND stands for a matched send/receive pair */
    int nranks;
    int root;                    /* rooted collectives */
    size_t count;                /* elements, as the call counts them */
    struct kr_redop redop;       /* kind, type, divisor; the reducing collectives */
    uint64_t send[CIPC_MAX_RANKS]; /* per rank (SEND: [0] the sender's buffer) */
    uint64_t recv[CIPC_MAX_RANKS]; /* per rank (SEND: [0] the receiver's buffer) */
    bool pre[CIPC_MAX_RANKS];    /* PreMulSum: this rank's input takes its scalar */
    uint64_t scalar[CIPC_MAX_RANKS];     /* ... held here */
    uint64_t scalar_ptr[CIPC_MAX_RANKS]; /* ... or read there by the kernel */
    /* This GPU's share. */
    uint8_t owns[CIPC_MAX_RANKS]; /* the ranks on this GPU, whose outputs it writes */
    uint8_t on_root_gpu[CIPC_MAX_RANKS]; /* rooted collectives: the ranks on the root's GPU */
    int part, nparts;            /* all-reduce, reduce, broadcast: this GPU's part of the
                                    elements (part < 0: none) */
    enum cipc_algo algo;         /* DIRECT: the parts above; RING, TREE: levels.h, one rank per
                                    GPU, this GPU's rank `level_rank` */
    int level_rank;
    uint32_t match;              /* the collective's number (the levels' waits name it) */
};

/* The GPU (its leader's index, leader_of as the team's) that carries out a send (coll SEND)
 * or receive of `rank` with `peer`: the receiver's; -1 where the receiver is no rank of the
 * nranks or has no device. */
int cipc_message_gpu(enum alg_coll coll, int rank, int peer, const int8_t *leader_of,
                     int nranks);
/* The part of an all-reduce, reduce or broadcast that GPU k of g computes (root_gpu: the
 * root's): reduce and broadcast leave the root's GPU out of the parts, unless it is the only
 * one (a broadcast's root GPU copies the whole input to its own ranks instead); *part < 0:
 * none. Leaders compute theirs with it, and ranks what their own GPU's leader alone touches. */
void cipc_share_part(enum alg_coll coll, int k, int g, int root_gpu, int *part, int *nparts);
/* Makes w's share the whole operation: one GPU serves every rank. */
void cipc_work_whole(struct cipc_work *w);

/* Launches this GPU's share of work on stream, on the leader's device (nothing if it has
 * none). */
ncclResult_t cipc_tasks_launch(const struct cipc_work *work, CUstream stream,
                               const struct gpu_device *device);

/* For a GPU whose one rank is its leader (ownstream.c), known from the call alone: the
 * largest task of its share of a collective (SEND and RECV too) of count elements of type,
 * in bytes, and how many tasks the share may have. */
void cipc_tasks_shape(enum alg_coll coll, size_t count, ncclDataType_t type, int nranks,
                      uint64_t *task_bytes_out, uint32_t *tasks_out);
/* This GPU's share of work as one batch, for kr_dev_from launches sized by cipc_tasks_shape
 * (at most max_tasks tasks each): an error where it does not fit. A ring or tree schedule
 * (work->algo) goes in as levels (its tasks carry their level, a launch each), and *levels
 * gets it (its waits); direct parts are level 0. */
ncclResult_t cipc_tasks_collect(const struct cipc_work *work, const struct gpu_device *device,
                                uint32_t max_tasks, struct kr_dev_batch *batch,
                                struct cipc_levels *levels);

#endif
