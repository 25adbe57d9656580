/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Operations on device memory (exec_device.h): the checks, and carrying a group of them out
 * per device: the streams forked, each communicator's operations handed to its back-end
 * (backend.h), the streams joined.
 */
#include "exec_device.h"

#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "base/check.h"
#include "comm.h"
#include "gpu/driver.h"
#include "gpu/stream.h"
#include "kernels/device.h"

/* A communicator made without a current device works on device 0, as the runtime's. */
static int
shim_devexec_ordinal(const struct ncclComm *comm)
{
    return comm->cuda_dev >= 0 ? comm->cuda_dev : 0;
}

static const struct gpu_device *
shim_devexec_device(const struct ncclComm *comm)
{
    const struct gpu_device *gpu = NULL;
    if (gpu_device_get(shim_devexec_ordinal(comm), &gpu) != ncclSuccess) {
        return NULL;
    }
    return gpu;
}

ncclResult_t
shim_devexec_check(struct shim_op *op, const char *api)
{
    const struct ncclComm *comm = op->comm;

    SHIM_CHECK(kr_dev_check_available(api));
    ncclResult_t failed = shim_devexec_comm_error(comm);
    if (failed != ncclSuccess) {
        WARN("%s: an earlier device operation of communicator %p failed; only destroy or "
             "abort remain", api, (const void *)comm);
        return failed;
    }
    int ordinal = shim_devexec_ordinal(comm);
    if (ordinal >= gpu_device_count()) {
        /* Such a communicator is ncclshim's, for host memory (NCCL refuses it at init). */
        WARN("%s: communicator %p is on CUDA device %d, which this process does not have "
             "(%d visible): it serves host memory only", api, (const void *)comm, ordinal,
             gpu_device_count());
        return ncclInvalidArgument;
    }
    const struct gpu_device *gpu = shim_devexec_device(comm);
    if (gpu == NULL) {
        return ncclUnhandledCudaError;
    }
    SHIM_CHECK(kr_dev_check_device(api, gpu));
    if (shim_coll_reduces(op->coll) &&
        (op->datatype == ncclFloat8e4m3 || op->datatype == ncclFloat8e5m2) &&
        gpu->cc_major < 9) {
        WARN("%s: fp8 reductions need compute capability 9.0 or newer, as NCCL's; device %d "
             "has %d.%d", api, gpu->ordinal, gpu->cc_major, gpu->cc_minor);
        return ncclInvalidArgument;
    }
    CUcontext ctx;
    SHIM_CHECK(gpu_stream_ctx(op->stream, gpu->ordinal, &ctx));
    if (ctx != gpu->ctx) {
        WARN("%s: stream %p is not a stream of the communicator's device %d (its primary "
             "context)", api, (void *)op->stream, gpu->ordinal);
        return ncclInvalidArgument;
    }
    SHIM_CHECK(gpu_stream_capturing(op->stream, ctx, &op->capturing));
    if (op->capturing && !shim_devexec_backend(comm)->captures) {
        /* The network path's thread runs batches the call hands it: nothing for a graph to
         * replay. One host's device team posts from the stream instead (cudaipc/hostpost.c). */
        WARN("%s: stream %p is being captured into a CUDA graph; ncclshim captures device "
             "operations of one rank, or of ranks sharing a host, not yet those across hosts "
             "(this communicator has no device team): run the call outside the capture", api,
             (void *)op->stream);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* --- groups ----------------------------------------------------------------------------- */

/* One device's part of a group: its ops (`on`, a mask over the group's) share its streams.
 * Every part arrives before any part launches or waits: a wait may block the caller until
 * the other ranks of its communicator posted, and those may be ranks of one clique driven by
 * this very thread on other devices; a launch enqueues what waits for the other ranks'
 * arrival, which ranks of one process sharing a GPU enqueue on streams of one context. */
struct shim_dev_part {
    bool *on;
    const struct gpu_device *gpu;
    struct gpu_stream_set set;
    bool arrived;
};

/* Whether ops[i] is in the part and the first op of its communicator there. */
static bool
shim_devexec_first_of_comm(const struct shim_op *ops, const bool *on, int i)
{
    for (int j = 0; j < i; j++) {
        if (on[j] && ops[j].comm == ops[i].comm) {
            return false;
        }
    }
    return on[i];
}

/* Forks the part's streams and hands each communicator's ops to its back-end. */
static ncclResult_t
shim_devexec_part_arrive(const struct shim_op *ops, int nops, struct shim_dev_part *part,
                         struct shim_op *mine)
{
    const bool *on = part->on;
    ncclResult_t res;
    int first = 0;

    while (!on[first]) {
        first++;
    }
    part->gpu = shim_devexec_device(ops[first].comm);
    if (part->gpu == NULL) {
        return ncclUnhandledCudaError;
    }
    part->set.ctx = part->gpu->ctx;
    for (int i = first; i < nops; i++) {
        if (on[i]) {
            SHIM_CHECK(gpu_stream_set_add(&part->set, ops[i].stream));
        }
    }
    CUstream stream = (CUstream)part->set.streams[0];
    /* The check asked the driver whether each call's stream was being captured; the group's
     * work goes on the first one's. */
    bool capturing = ops[first].capturing;
    SHIM_CHECK(gpu_streams_fork(&part->set));
    SHIM_CHECK(gpu_ctx_push(part->gpu->ctx));
    res = ncclSuccess;
    for (int i = first; i < nops && res == ncclSuccess; i++) {
        if (!shim_devexec_first_of_comm(ops, on, i)) {
            continue;
        }
        struct ncclComm *comm = ops[i].comm;
        int n = 0;
        for (int j = i; j < nops; j++) {
            if (on[j] && ops[j].comm == comm) {
                mine[n++] = ops[j];
            }
        }
        res = shim_devexec_backend(comm)->arrive(comm, mine, n, part->gpu, stream, capturing);
    }
    part->arrived = res == ncclSuccess;
    gpu_ctx_pop();
    return res;
}

/* Each communicator's launch on the part's first stream, once every part arrived. */
static ncclResult_t
shim_devexec_part_launch(const struct shim_op *ops, int nops, struct shim_dev_part *part)
{
    CUstream stream = (CUstream)part->set.streams[0];
    ncclResult_t res = ncclSuccess;

    /* Every one: each team's group is posted, and its leaders expect its share. */
    for (int i = 0; i < nops; i++) {
        const struct shim_backend *backend = shim_devexec_backend(ops[i].comm);
        if (shim_devexec_first_of_comm(ops, part->on, i) && backend->launch != NULL) {
            ncclResult_t launched = backend->launch(ops[i].comm, stream);
            res = res != ncclSuccess ? res : launched;
        }
    }
    return res;
}

/* Each communicator's wait on the part's first stream, then the join. */
static ncclResult_t
shim_devexec_part_wait(const struct shim_op *ops, int nops, struct shim_dev_part *part)
{
    CUstream stream = (CUstream)part->set.streams[0];
    ncclResult_t res = ncclSuccess;

    SHIM_CHECK(gpu_ctx_push(part->gpu->ctx));
    for (int i = 0; i < nops && res == ncclSuccess; i++) {
        if (!shim_devexec_first_of_comm(ops, part->on, i)) {
            continue;
        }
        res = shim_devexec_backend(ops[i].comm)->wait(ops[i].comm, stream);
    }
    gpu_ctx_pop();
    if (res == ncclSuccess) {
        res = gpu_streams_join(&part->set);
    }
    return res;
}

ncclResult_t
shim_devexec_run(const struct shim_op *ops, int nops)
{
    struct shim_dev_part *parts = NULL;
    struct shim_op *scratch = NULL;
    int *part_of = NULL, nparts = 0;
    bool *masks = NULL;
    ncclResult_t res;

    /* A part per device the group's communicators are on, in order of first appearance. */
    SHIM_CHECK_GOTO(shim_calloc(&part_of, (size_t)nops), res, out);
    for (int i = 0; i < nops; i++) {
        part_of[i] = nparts;
        for (int j = 0; j < i; j++) {
            if (ops[j].comm->cuda_dev == ops[i].comm->cuda_dev) {
                part_of[i] = part_of[j];
                break;
            }
        }
        nparts += part_of[i] == nparts;
    }
    SHIM_CHECK_GOTO(shim_calloc(&scratch, (size_t)nops), res, out);
    SHIM_CHECK_GOTO(shim_calloc(&parts, (size_t)nparts), res, out);
    SHIM_CHECK_GOTO(shim_calloc(&masks, (size_t)nparts * (size_t)nops), res, out);
    for (int i = 0; i < nops; i++) {
        parts[part_of[i]].on = masks + (size_t)part_of[i] * (size_t)nops;
        parts[part_of[i]].on[i] = true;
    }
    /* The caller may be capturing (these calls or others) in global mode: what we set up on
     * the way (registrations, mappings, streams) must neither fail nor break the capture. */
    CUstreamCaptureMode mode = gpu_capture_relax();
    for (int p = 0; p < nparts && res == ncclSuccess; p++) {
        res = shim_devexec_part_arrive(ops, nops, &parts[p], scratch);
    }
    /* Parts that arrived get their launches and waits even after a later one failed: their
     * teams expect them. Every part's launches come before any wait, which may wait on the
     * host for the other ranks. */
    for (int p = 0; p < nparts; p++) {
        if (parts[p].arrived) {
            ncclResult_t launched = shim_devexec_part_launch(ops, nops, &parts[p]);
            res = res != ncclSuccess ? res : launched;
        }
    }
    for (int p = 0; p < nparts; p++) {
        if (parts[p].arrived) {
            ncclResult_t waited = shim_devexec_part_wait(ops, nops, &parts[p]);
            res = res != ncclSuccess ? res : waited;
        }
    }
    gpu_capture_restore(mode);
out:
    free(masks);
    free(parts);
    free(scratch);
    free(part_of);
    return res;
}

/* --- the communicator's state ------------------------------------------------------------ */

const struct shim_backend *
shim_devexec_backend(const struct ncclComm *comm)
{
    /* Chosen when the communicator connected; one that never did can only be torn down. */
    return comm->backend != NULL ? comm->backend : shim_backend_choose(comm);
}

bool
shim_devexec_pending(const struct ncclComm *comm)
{
    return shim_devexec_backend(comm)->busy(comm);
}

ncclResult_t
shim_devexec_drain(struct ncclComm *comm)
{
    return shim_devexec_backend(comm)->drain(comm);
}

ncclResult_t
shim_devexec_comm_error(const struct ncclComm *comm)
{
    return shim_devexec_backend(comm)->error(comm);
}

void
shim_devexec_comm_free(struct ncclComm *comm, bool abort)
{
    shim_devexec_backend(comm)->destroy(comm, abort);
}
