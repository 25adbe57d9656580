/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device operations of a communicator without a device team (ranks on several hosts, or on
 * one host with NCCL_SHM_DISABLE=1 or a different NCCL_HOSTID each). They run the algorithms'
 * schedules over UCX like host operations, staged through pinned host memory
 * (gpu/staging.h), on a thread of the communicator's own, since the call returns once
 * enqueued:
 *
 *     caller:          create the execs (the algorithm, the schedule: errors come back here)
 *                      user's stream: post arrive = g | wait done >= g     (a gate per group)
 *                      queue the batch g
 *     the thread:      lanes wait for arrive g; run the batch's execs to completion (UCX, copies,
 *                      kernels); in lane: post done = g; next batch
 *
 * Batches run in issue order, one at a time, and a communicator's host operations wait until
 * the thread finished its batches (shim_staged_drain), so one thread at a time drives the
 * communicator's UCX worker. A failure (a dead peer, NCCLSHIM_TIMEOUT) is kept for
 * ncclCommGetAsyncError; the streams stay blocked, as NCCL's do, rather than go on with
 * wrong data, until ncclCommAbort (or destroy, or revoke) releases every gate given out.
 */
#ifndef SHIM_EXEC_STAGED_H
#define SHIM_EXEC_STAGED_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>

#include "gpu/driver.h"
#include "op.h"

struct shim_staged;

/* Enqueues ops (all of comm, in issue order) behind a gate on stream: the arrive half. The
 * caller has gpu's context current; the first call makes comm's staging and thread. */
ncclResult_t shim_staged_arrive(struct ncclComm *comm, const struct shim_op *ops, int nops,
                                const struct gpu_device *gpu, CUstream stream);
/* The wait half of the gate that shim_staged_arrive put last on stream. */
ncclResult_t shim_staged_wait(struct ncclComm *comm, CUstream stream);

/* Whether batches are queued or running. */
bool shim_staged_busy(const struct shim_staged *staged);
/* Waits until the thread finished every batch queued so far; their error, if any. */
ncclResult_t shim_staged_drain(struct shim_staged *staged);
/* The first failure of a batch, ncclSuccess if none. */
ncclResult_t shim_staged_error(const struct shim_staged *staged);
/* Lets every stream waiting on the communicator go (revoke, abort). */
void shim_staged_release(struct shim_staged *staged);
/* Stops the thread and frees everything; without abort, after the batches finished. */
void shim_staged_destroy(struct shim_staged *staged, bool abort);

#endif
