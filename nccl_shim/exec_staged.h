/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device operations of a communicator without a device team (ranks on several hosts, or on
 * one host with NCCL_SHM_DISABLE=1 or a different NCCL_HOSTID each). They run the algorithms'
 * schedules over UCX like host operations, staged through pinned host memory
 * (gpu/staging.h), on a thread of the communicator's own (a group's communicators, maybe a
 * clique driven by one thread, progress together):
 *
 *     caller (arrive): create the execs (the algorithm, the schedule: errors come back here),
 *                      record `arrived` on the user's stream, queue the batch g
 *     the thread:      lanes wait for arrived; run the batch's execs to completion (UCX,
 *                      copies, kernels); record `done` on the in lane; next batch
 *     caller (wait):   once the thread finished batch g, the user's stream waits for done
 *
 * The call returns only once its messages went and came: the lanes are streams of the
 * user's context, and a stream may only wait for work already enqueued there (gpu/
 * staging.h), so the user's stream waits for done only once the in lane has the batch's last
 * kernel. The copies and kernels still run after the call, in stream order. (Enqueueing the
 * whole batch's device work at the call, each step behind a flag the thread opens from the
 * host, would let the call return at once; not done yet.)
 *
 * Batches run in issue order, one at a time, and a communicator's host operations wait until
 * the thread finished its batches (shim_staged_drain), so one thread at a time drives the
 * communicator's UCX worker. A failure (a dead peer, NCCLSHIM_TIMEOUT) is kept for
 * ncclCommGetAsyncError, and later calls are refused; the stream waiting for the failed batch
 * stays blocked, as NCCL's do, rather than go on with wrong data, until ncclCommAbort (or
 * destroy, or revoke) opens its hold.
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
/* Waits on the host for the batch shim_staged_arrive queued last, then enqueues on stream
 * the wait half of its gate; the batch's error, if it failed. */
ncclResult_t shim_staged_wait(struct ncclComm *comm, CUstream stream);

/* Whether batches are queued or running. */
bool shim_staged_busy(const struct shim_staged *staged);
/* Waits until the thread finished every batch queued so far; their error, if any. */
ncclResult_t shim_staged_drain(struct shim_staged *staged);
/* The first failure of a batch, ncclSuccess if none. */
ncclResult_t shim_staged_error(const struct shim_staged *staged);
/* Lets a stream held by a failed batch go (revoke, abort). */
void shim_staged_release(struct shim_staged *staged);
/* Stops the thread and frees everything; without abort, after the batches finished. */
void shim_staged_destroy(struct shim_staged *staged, bool abort);

#endif
