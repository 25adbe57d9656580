/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Operations on device memory (exec_device.c): stream ordered, as NCCL's are. A call returns
 * once its operation is enqueued; the operation runs after the work queued before it on the
 * call's stream and before the work queued after it, and the operations of one communicator
 * complete in the order they were issued.
 *
 * Who carries them out: on a communicator of one rank, kernels (or a copy) on the call's
 * stream itself; on a communicator whose ranks share a host, its device team (cudaipc/). Ranks
 * on several hosts, or a host team turned off (NCCL_SHM_DISABLE=1), have no device path yet:
 * such calls are refused with a message.
 *
 * Groups: a group's device operations on the streams of one device synchronise those streams
 * as NCCL does (every stream's earlier work before any of the group, every stream's later
 * work after all of it); a group may drive communicators of several devices, each call on
 * its own communicator's device, without the caller setting the device.
 */
#ifndef SHIM_EXEC_DEVICE_H
#define SHIM_EXEC_DEVICE_H

#include <nccl.h>
#include <stdbool.h>

#include "op.h"

struct ncclComm;

/* Whether op's communicator can take it now, with a WARN naming `api` if not: the kernels are
 * built in, the communicator has a device path and no failure, fp8 reductions run on compute
 * capability 9.0 or newer, the stream belongs to the communicator's device and is not being
 * captured into a CUDA graph. */
ncclResult_t shim_devexec_check(struct shim_op *op, const char *api);
/* Enqueues device ops (a group's, in call order, or one) and returns. */
ncclResult_t shim_devexec_run(const struct shim_op *ops, int nops);
/* Waits on the host until every device operation issued on comm is done: host-memory
 * operations on the same communicator come after them. */
ncclResult_t shim_devexec_drain(struct ncclComm *comm);
/* Whether comm has device operations issued and not known done. */
bool shim_devexec_pending(const struct ncclComm *comm);

/* The communicator's device state: a one-rank communicator's ordering event, a team's. */
ncclResult_t shim_devexec_comm_error(const struct ncclComm *comm);
void shim_devexec_comm_free(struct ncclComm *comm, bool abort);

#endif
