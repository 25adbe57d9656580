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

struct shim_staged;

/* Its row of the back-end table is shim_backend_staged (backend.h): arrive is the first half
 * above (the first call makes comm's staging and thread), wait the second; drain waits until
 * the thread finished every batch queued so far; release lets a stream held by a failed batch
 * go (revoke, abort); destroy stops the thread, after the batches finished unless aborting. */

#endif
