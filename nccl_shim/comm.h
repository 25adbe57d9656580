/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The communicator's lifecycle (comm.c): init, finalize, destroy, abort, revoke, suspension,
 * its checks, and the reduction operators created on it. The object itself, and what the
 * operations need of it, is engine/comm.h.
 */
#ifndef SHIM_COMM_H
#define SHIM_COMM_H

#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

#include "config.h"
#include "engine/comm.h"

struct shim_comm_args {
    int nranks;
    int rank;
    ncclUniqueId id;
    bool blocking;
    int cuda_dev;
    bool cuda_dev_chosen; /* current at init, or named: not device 0 for want of one */
    char name[SHIM_COMM_NAME_MAX]; /* ncclConfig_t commName, for the logs */
};

/* Creates a communicator. Blocking: returns once every rank joined. Non-blocking: returns
 * ncclInProgress with *comm_out set at once; ncclCommGetAsyncError reports completion. */
ncclResult_t shim_comm_init(const struct shim_comm_args *args, struct ncclComm **comm_out);
/* A barrier with every rank (queued if a group is open); afterwards only destroy remains. */
ncclResult_t shim_comm_finalize(struct ncclComm *comm);
/* Releases local resources without waiting for any peer. */
ncclResult_t shim_comm_destroy(struct ncclComm *comm);
/* Local teardown without any peer's help; always returns. */
ncclResult_t shim_comm_abort(struct ncclComm *comm);

/* ncclInvalidArgument with a WARN unless comm is live (not NULL, not destroyed). */
ncclResult_t shim_comm_check(const struct ncclComm *comm, const char *api);
/* As shim_comm_check, and also initialised, not failed, not revoked: usable for
 * collectives. */
ncclResult_t shim_comm_check_ready(struct ncclComm *comm, const char *api);
/* For split and shrink: a ready communicator, or a revoked one (NCCL lets management go on
 * after ncclCommRevoke), or with allow_failed (NCCL_SHRINK_ABORT) one that failed. */
ncclResult_t shim_comm_check_parent(struct ncclComm *comm, bool allow_failed, const char *api);
/* ncclCommRevoke: operations in flight on other threads stop within NCCLSHIM_WAIT_MS with an
 * error, later ones are refused; destroy, abort, split and shrink remain. */
ncclResult_t shim_comm_revoke(struct ncclComm *comm);
/* ncclCommSuspend(NCCL_SUSPEND_MEM): once its device work is done, frees the memory the
 * communicator makes again on demand (device staging, scratch); operations are refused until
 * shim_comm_resume. */
ncclResult_t shim_comm_suspend(struct ncclComm *comm);
ncclResult_t shim_comm_resume(struct ncclComm *comm);
/* GPU memory the communicator holds: what suspension frees, and what it keeps. */
void shim_comm_gpu_bytes(const struct ncclComm *comm, uint64_t *releasable_out,
                         uint64_t *persistent_out);
ncclResult_t shim_comm_async_error(struct ncclComm *comm);
/* Blocks until a non-blocking init finished; returns its result. */
ncclResult_t shim_comm_wait_init(struct ncclComm *comm);
/* A communicator made from a parent's ranks (split.c): created with its transport worker,
 * then given its identity (id_hash, equal on every member) and connected once the members'
 * addresses were exchanged over the parent. Discard frees one that never got connected. */
ncclResult_t shim_comm_child_create(const struct ncclComm *parent, int rank, int nranks,
                                    bool blocking, struct ncclComm **comm_out);
ncclResult_t shim_comm_child_connect(struct ncclComm *comm, uint64_t id_hash,
                                     const void *const *addrs, const size_t *lens);
void shim_comm_child_discard(struct ncclComm *comm);

/* Creates a fresh unique id for ncclCommInitAll (never from NCCL_COMM_ID). */
ncclResult_t shim_comm_init_all(struct ncclComm **comms, int ncomms, const int *devlist);

/* PreMulSum operators: ncclRedOpCreatePreMulSum and ncclRedOpDestroy. */
/* scalar_ptr: NULL when redop->scalar already holds the value (host-immediate residence),
 * else where to read it at each call (ncclScalarDevice): by the host, or, scalar_device, by
 * the kernel (device, managed or registered memory). */
ncclResult_t shim_comm_redop_create(struct ncclComm *comm, const struct kr_redop *redop,
                                    const void *scalar_ptr, bool scalar_device,
                                    ncclRedOp_t *op_out);
ncclResult_t shim_comm_redop_destroy(struct ncclComm *comm, ncclRedOp_t op);
/* Resolves a user's op for a call with `datatype` into a concrete kernel op. A scalar the
 * kernel reads comes back in *scalar_dev_out (NULL otherwise); only a call on device memory
 * (`device`) can use one: ncclInvalidUsage with a WARN for a host call. */
ncclResult_t shim_comm_redop_resolve(struct ncclComm *comm, ncclRedOp_t op,
                                     ncclDataType_t datatype, bool device,
                                     struct kr_redop *redop_out, const void **scalar_dev_out);

#endif
