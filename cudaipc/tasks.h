/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An operation of the whole team as the leader's kernels carry it out (tasks.c): every rank's
 * buffers, as the leader's device reaches them, turned into kernel tasks (kernels/device.h).
 * Each input is read once and each output written once:
 *
 *   all-reduce      one task: every rank's input reduced, in rank order, into every output
 *   reduce          the same, into the root's output
 *   reduce-scatter  a task per block j: block j of every input into rank j's output
 *   broadcast       one copy: the root's input into every output
 *   all-gather      a copy per rank j: j's input into block j of every output
 *   all-to-all      a copy per pair: block q of p's input into block p of q's output
 *   gather          a copy per rank p: p's input into block p of the root's output
 *   scatter         a copy per rank p: block p of the root's input into p's output
 *   send/receive    one copy, the sender's buffer into the receiver's
 */
#ifndef CIPC_TASKS_H
#define CIPC_TASKS_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "cudaipc.h"
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
};

/* Launches work's kernels on stream, on the leader's device. */
ncclResult_t cipc_tasks_launch(const struct cipc_work *work, CUstream stream,
                               const struct gpu_device *device);

#endif
