/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Operations on device memory (exec_device.h): the checks, and carrying a group of them out
 * per device: the streams forked, each communicator's operations handed to its team (or, for
 * one rank, enqueued on the stream), the streams joined.
 */
#include "exec_device.h"
#include "exec_staged.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "comm.h"
#include "cudaipc/cudaipc.h"
#include "cudaipc/tasks.h"
#include "gpu/driver.h"
#include "gpu/stream.h"
#include "kernels/device.h"

/* A one-rank communicator's operations run on the call's stream; this keeps them in issue
 * order when calls use several streams. Captured into a CUDA graph they are the graph's
 * kernels and copies, replayed as often as it is launched: nothing of ours takes part then. */
struct shim_dev_solo {
    CUevent last;          /* recorded after the last operation */
    cudaStream_t stream;   /* on this stream */
    bool recorded;
};

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

static bool
shim_coll_reduces_dev(enum shim_coll coll)
{
    return coll == SHIM_COLL_ALLREDUCE || coll == SHIM_COLL_REDUCE ||
           coll == SHIM_COLL_REDUCESCATTER;
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
    if (shim_coll_reduces_dev(op->coll) &&
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
    if (op->capturing && comm->nranks > 1 && comm->dev == NULL) {
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

/* --- one rank --------------------------------------------------------------------------- */

static bool
shim_devexec_is_copy(const struct shim_op *op)
{
    return !shim_coll_reduces_dev(op->coll) ||
           (op->redop.kind != KR_PREMULSUM && op->redop.kind != KR_SUMPOSTDIV);
}

static ncclResult_t
shim_devexec_copy(const void *src, void *dst, size_t bytes, CUstream stream)
{
    if (bytes == 0 || src == dst) {
        return ncclSuccess;
    }
    GPU_CU_CHECK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes,
                               stream));
    return ncclSuccess;
}

/* One rank's collective: a copy of its input, scaled where the op scales. */
static ncclResult_t
shim_devexec_solo_coll(const struct shim_op *op, const struct gpu_device *gpu, CUstream stream)
{
    size_t bytes = op->count * kr_type_size(op->datatype);

    if (op->coll == SHIM_COLL_BARRIER) {
        return ncclSuccess;
    }
    if (shim_devexec_is_copy(op)) {
        return shim_devexec_copy(op->sendbuff, op->recvbuff, bytes, stream);
    }
    struct cipc_work *w;
    SHIM_CHECK(shim_calloc(&w, 1));
    w->coll = ALG_COLL_ALLREDUCE;
    w->nranks = 1;
    w->count = op->count;
    w->redop = op->redop;
    w->send[0] = (uintptr_t)op->sendbuff;
    w->recv[0] = (uintptr_t)op->recvbuff;
    w->pre[0] = op->redop.kind == KR_PREMULSUM;
    memcpy(&w->scalar[0], op->redop.scalar, sizeof(w->scalar[0]));
    w->scalar_ptr[0] = (uintptr_t)op->scalar_dev;
    ncclResult_t res = cipc_tasks_launch(w, stream, gpu);
    free(w);
    return res;
}

/* Sends to self pair with receives from self in order, within the group. */
static ncclResult_t
shim_devexec_solo_p2p(const struct shim_op *ops, int nops, CUstream stream)
{
    int r = 0;

    for (int s = 0; s < nops; s++) {
        if (ops[s].coll != SHIM_COLL_SEND) {
            continue;
        }
        while (r < nops && ops[r].coll != SHIM_COLL_RECV) {
            r++;
        }
        if (r == nops) {
            WARN("ncclSend to self without its ncclRecv in the same group");
            return ncclInvalidUsage;
        }
        size_t sent = ops[s].count * kr_type_size(ops[s].datatype);
        size_t room = ops[r].count * kr_type_size(ops[r].datatype);
        if (sent != room) {
            WARN("ncclSend to self of %zu bytes, its ncclRecv takes %zu", sent, room);
            return ncclInvalidUsage;
        }
        SHIM_CHECK(shim_devexec_copy(ops[s].sendbuff, ops[r].recvbuff, sent, stream));
        r++;
    }
    while (r < nops && ops[r].coll != SHIM_COLL_RECV) {
        r++;
    }
    if (r < nops) {
        WARN("ncclRecv from self without its ncclSend in the same group");
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* A one-rank communicator's ops (all on comm, in order), on stream (being captured or not). */
static ncclResult_t
shim_devexec_solo(struct ncclComm *comm, const struct shim_op *ops, int nops,
                  const struct gpu_device *gpu, cudaStream_t stream, bool capturing)
{
    struct shim_dev_solo *solo = comm->solo;

    if (solo == NULL) {
        SHIM_CHECK(shim_calloc(&solo, 1));
        CUresult cu = gpu_cu.cuEventCreate(&solo->last, CU_EVENT_DISABLE_TIMING);
        if (cu != CUDA_SUCCESS) {
            free(solo);
            return gpu_cu_fail(cu, "cuEventCreate", __FILE__, __LINE__);
        }
        comm->solo = solo;
    }
    /* A capture is ordered by where its graph is launched; an event of ours recorded outside
     * it may not be awaited in it, nor one recorded in it outside. */
    if (solo->recorded && solo->stream != stream && !capturing) {
        GPU_CU_CHECK(cuStreamWaitEvent((CUstream)stream, solo->last, 0));
    }
    for (int i = 0; i < nops; i++) {
        if (ops[i].coll != SHIM_COLL_SEND && ops[i].coll != SHIM_COLL_RECV) {
            SHIM_CHECK(shim_devexec_solo_coll(&ops[i], gpu, (CUstream)stream));
        }
    }
    SHIM_CHECK(shim_devexec_solo_p2p(ops, nops, (CUstream)stream));
    if (capturing) {
        return ncclSuccess;
    }
    GPU_CU_CHECK(cuEventRecord(solo->last, (CUstream)stream));
    solo->stream = stream;
    solo->recorded = true;
    return ncclSuccess;
}

/* --- a team ----------------------------------------------------------------------------- */

static struct cipc_op
shim_devexec_cipc_op(const struct shim_op *op)
{
    return (struct cipc_op){
        .coll = shim_op_alg_coll(op->coll),
        .send = op->sendbuff,
        .recv = op->recvbuff,
        .send_mem = op->send_mem,
        .recv_mem = op->recv_mem,
        .count = op->count,
        .redop = op->redop,
        .scalar_dev = op->scalar_dev,
        .root = op->root,
        .match = op->seq,
    };
}

/* --- groups ----------------------------------------------------------------------------- */

/* One device's part of a group: its ops (`on`, a mask over the group's) share its streams.
 * Every part arrives before any part waits: a wait may block the caller until the other
 * ranks of its communicator posted, and those may be ranks of one clique driven by this
 * very thread on other devices. */
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

/* Forks the part's streams and hands each communicator's ops to its team, its network path,
 * or (one rank) the stream itself. */
static ncclResult_t
shim_devexec_part_arrive(const struct shim_op *ops, int nops, struct shim_dev_part *part,
                         struct cipc_op *scratch)
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
    cudaStream_t stream = part->set.streams[0];
    /* The check asked the driver whether each call's stream was being captured; the group's
     * work goes on the first one's. */
    bool capturing = ops[first].capturing;
    SHIM_CHECK(gpu_streams_fork(&part->set));
    SHIM_CHECK(gpu_ctx_push(part->gpu->ctx));
    for (int i = first; i < nops; i++) {
        if (!shim_devexec_first_of_comm(ops, on, i)) {
            continue;
        }
        struct ncclComm *comm = ops[i].comm;
        int n = 0;
        for (int j = i; j < nops; j++) {
            if (on[j] && ops[j].comm == comm) {
                scratch[n++] = shim_devexec_cipc_op(&ops[j]);
            }
        }
        if (comm->dev != NULL) {
            res = cipc_post_arrive(comm->dev, scratch, n, (CUstream)stream, capturing);
        } else {
            /* One rank, or ranks without a device team (staged over the network). */
            struct shim_op *mine;
            SHIM_CHECK_GOTO(shim_calloc(&mine, (size_t)n), res, out);
            for (int j = i, k = 0; j < nops; j++) {
                if (on[j] && ops[j].comm == comm) {
                    mine[k++] = ops[j];
                }
            }
            res = comm->nranks == 1
                      ? shim_devexec_solo(comm, mine, n, part->gpu, stream, capturing)
                      : shim_staged_arrive(comm, mine, n, part->gpu, (CUstream)stream);
            free(mine);
        }
        if (res != ncclSuccess) {
            goto out;
        }
    }
    part->arrived = true;
    res = ncclSuccess;
out:
    gpu_ctx_pop();
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
        if (ops[i].comm->dev != NULL) {
            res = cipc_post_wait(ops[i].comm->dev, stream);
        } else if (ops[i].comm->nranks > 1) {
            res = shim_staged_wait(ops[i].comm, stream);
        }
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
    struct cipc_op *scratch = NULL;
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
    /* Parts that arrived get their waits even after a later one failed: their teams expect
     * them. */
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

bool
shim_devexec_pending(const struct ncclComm *comm)
{
    if (comm->dev != NULL) {
        return cipc_team_busy(comm->dev);
    }
    if (comm->staged != NULL) {
        return shim_staged_busy(comm->staged);
    }
    return comm->solo != NULL && comm->solo->recorded &&
           gpu_cu.cuEventQuery(comm->solo->last) == CUDA_ERROR_NOT_READY;
}

ncclResult_t
shim_devexec_drain(struct ncclComm *comm)
{
    if (comm->dev != NULL) {
        return cipc_team_drain(comm->dev);
    }
    if (comm->staged != NULL) {
        return shim_staged_drain(comm->staged);
    }
    if (comm->solo != NULL && comm->solo->recorded) {
        GPU_CU_CHECK(cuEventSynchronize(comm->solo->last));
    }
    return ncclSuccess;
}

ncclResult_t
shim_devexec_comm_error(const struct ncclComm *comm)
{
    return comm->dev != NULL ? cipc_team_error(comm->dev) : shim_staged_error(comm->staged);
}

void
shim_devexec_comm_free(struct ncclComm *comm, bool abort)
{
    cipc_team_destroy(comm->dev, abort);
    comm->dev = NULL;
    shim_staged_destroy(comm->staged, abort);
    comm->staged = NULL;
    if (comm->solo != NULL) {
        if (!abort && comm->solo->recorded) {
            gpu_cu.cuEventSynchronize(comm->solo->last);
        }
        gpu_cu.cuEventDestroy(comm->solo->last);
        free(comm->solo);
        comm->solo = NULL;
    }
}
