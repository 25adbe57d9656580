/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A communicator's device back-end: who carries out its operations on device memory, one row
 * of this table per way (exec_device.c runs a group through it; the communicator's lifecycle
 * asks it to drain, release and go):
 *
 *   team    ranks sharing a host: the device team, a leader per GPU running its share
 *           (cudaipc/, through backend_team.c)
 *   solo    one rank alone: kernels and copies on the call's stream (backend_solo.c)
 *   staged  ranks without a team (several hosts, NCCL_SHM_DISABLE=1): the algorithms'
 *           schedules over UCX on the communicator's thread, staged through pinned memory
 *           (exec_staged.c)
 *
 * Once the communicator knows its ranks and its shared-memory team, each row in that order is
 * asked whether it serves it (as NCCL asks its transports whether they can connect two
 * ranks), and the first that does and makes its state is the communicator's (backend.c). A
 * row keeps its state in comm->backend_state (made then, or when it first needs it) and
 * nothing else touches that state.
 */
#ifndef SHIM_BACKEND_H
#define SHIM_BACKEND_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

#include "gpu/driver.h"
#include "gpu/pin.h"
#include "op.h"

struct ncclComm;
struct gpu_mem_info;

/* What the ranks told each other as the communicator formed its shared-memory team
 * (connect.c), which the device team needs to form: per rank (nranks of each). */
struct shim_backend_peers {
    const uint8_t *reach;         /* [a * nranks + b]: rank a's process maps b's device memory */
    const int *first_on_device;   /* the lowest rank on its GPU (itself where every rank leads
                                     its own share, NCCLSHIM_RANK_LEADERS=1); -1 without one */
    const int *device_here;       /* its GPU as this process numbers it; -1 where it lacks it */
};

struct shim_backend {
    const char *name;
    /* Whether it can carry out comm's operations, given what its ranks told each other (NULL:
     * they formed no shared-memory team). Asked of each row in order; a question only. */
    bool (*serves)(const struct ncclComm *comm, const struct shim_backend_peers *peers);
    /* Makes its state in comm->backend_state once chosen (NULL: on first need). Failing, the
     * row is passed over, and the next one that serves is asked. */
    ncclResult_t (*create)(struct ncclComm *comm, const struct shim_backend_peers *peers);
    /* May a stream being captured into a CUDA graph carry its operations? */
    bool captures;
    /* Does it drive the communicator's UCX worker from a thread of its own (one-sided calls,
     * which drive it from the caller's, drain it first)? */
    bool drives_worker;
    /* A group's first half: comm's ops (in call order) enqueued behind a gate on stream, of
     * gpu's context, which is current. */
    ncclResult_t (*arrive)(struct ncclComm *comm, const struct shim_op *ops, int nops,
                           const struct gpu_device *gpu, CUstream stream, bool capturing);
    /* Once every communicator of the group arrived, before any waits: what of comm's ops runs
     * on stream itself and waits for the other ranks' arrival (NULL: nothing). Ranks of one
     * process leading shares of one GPU have streams of one context, so every arrival of the
     * group goes first (cudaipc.h). */
    ncclResult_t (*launch)(struct ncclComm *comm, CUstream stream);
    /* The second half, once every communicator of the group arrived: stream waits for the
     * ops (the call may first wait on the host for the other ranks, as NCCL's may). */
    ncclResult_t (*wait)(struct ncclComm *comm, CUstream stream);
    /* Waits on the host until every op issued is done; their error, if any. */
    ncclResult_t (*drain)(struct ncclComm *comm);
    /* Whether ops were issued and are not known done. */
    bool (*busy)(const struct ncclComm *comm);
    /* The first failure of an op (ncclCommGetAsyncError), ncclSuccess if none. */
    ncclResult_t (*error)(const struct ncclComm *comm);
    /* Revoke: streams waiting on the communicator's ops stop waiting. */
    void (*release)(struct ncclComm *comm);
    /* Abort from another thread: a call waiting inside gives up soon. */
    void (*interrupt)(struct ncclComm *comm);
    /* Suspension: frees the device memory it holds (made again on need); how much that is,
     * and how much it holds that suspension keeps (ncclCommMemStats). */
    ncclResult_t (*release_memory)(struct ncclComm *comm);
    void (*device_bytes)(const struct ncclComm *comm, uint64_t *releasable,
                         uint64_t *persistent);
    /* ncclCommRegister / Deregister of device memory: NULL where registering changes nothing.
     * pin->pinned says whether unpin is owed. */
    ncclResult_t (*pin)(struct ncclComm *comm, void *buff, size_t size,
                        const struct gpu_mem_info *mem, struct gpu_pin *pin);
    ncclResult_t (*unpin)(struct ncclComm *comm, const struct gpu_pin *pin);
    /* Frees the state; without abort, after the ops are done. */
    void (*destroy)(struct ncclComm *comm, bool abort);
};

extern const struct shim_backend shim_backend_team;
extern const struct shim_backend shim_backend_solo;
extern const struct shim_backend shim_backend_staged;

/* Once comm connected: the first row that serves it and makes its state becomes
 * comm->backend. The staged and solo rows serve whatever the team row does not. */
void shim_backend_connect(struct ncclComm *comm, const struct shim_backend_peers *peers);
/* The first row that would serve comm, making nothing: a communicator that never connected
 * has no state, and all its row can do is let it go. */
const struct shim_backend *shim_backend_choose(const struct ncclComm *comm);

#endif
