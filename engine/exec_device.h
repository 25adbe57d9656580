/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Operations on device memory (exec_device.c): stream ordered, as NCCL's are. A call returns
 * once its operation is enqueued; the operation runs after the work queued before it on the
 * call's stream and before the work queued after it, and the operations of one communicator
 * complete in the order they were issued.
 *
 * Who carries them out: the communicator's row of the back-end table (backend.h): one rank
 * alone, the device team of ranks sharing a host, or the network path.
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
struct shim_backend;

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

/* The communicator's device state, its back-end's: the first failure, and teardown. */
ncclResult_t shim_devexec_comm_error(const struct ncclComm *comm);
void shim_devexec_comm_free(struct ncclComm *comm, bool abort);
/* The communicator's back-end (comm->backend, or for one that never connected, the row it
 * would have had: all it can do is go). */
const struct shim_backend *shim_devexec_backend(const struct ncclComm *comm);

#endif
