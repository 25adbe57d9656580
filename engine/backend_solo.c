/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The row of the back-end table (backend.h) for a communicator of one rank: its operations
 * are kernels or copies on the call's stream itself. A collective of one rank is a copy of its
 * input, or, where the op scales (PreMulSum's multiply, an average's divide by one), one
 * reduction task of one operand (kernels/device.h), as a kernel of the device team would
 * compute it.
 */
#include "backend.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "comm.h"
#include "kernels/device.h"

/* A one-rank communicator's operations run on the call's stream; this keeps them in issue
 * order when calls use several streams. Captured into a CUDA graph they are the graph's
 * kernels and copies, replayed as often as it is launched: nothing of ours takes part then. */
struct shim_dev_solo {
    CUevent last;          /* recorded after the last operation */
    CUstream stream;       /* on this stream */
    bool recorded;
};

static bool
shim_solo_serves(const struct ncclComm *comm, const struct shim_backend_peers *peers)
{
    (void)peers; /* alone, it has no team */
    return comm->nranks == 1;
}

static bool
shim_solo_is_copy(const struct shim_op *op)
{
    return !shim_coll_reduces(op->coll) ||
           (op->redop.kind != KR_PREMULSUM && op->redop.kind != KR_SUMPOSTDIV);
}

static ncclResult_t
shim_solo_copy(const void *src, void *dst, size_t bytes, CUstream stream)
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
shim_solo_coll(const struct shim_op *op, const struct gpu_device *gpu, CUstream stream)
{
    size_t bytes = op->count * kr_type_size(op->datatype);

    if (op->coll == SHIM_COLL_BARRIER) {
        return ncclSuccess;
    }
    if (shim_solo_is_copy(op)) {
        return shim_solo_copy(op->sendbuff, op->recvbuff, bytes, stream);
    }
    struct kr_dev_src src = {.ptr = (uintptr_t)op->sendbuff,
                             .scalar_ptr = (uintptr_t)op->scalar_dev,
                             .pre = op->redop.kind == KR_PREMULSUM};
    uint64_t dst = (uintptr_t)op->recvbuff;
    struct kr_dev_launch l;
    memcpy(&src.scalar, op->redop.scalar, sizeof(src.scalar));
    kr_dev_begin(&l, stream, gpu, &op->redop);
    SHIM_CHECK(kr_dev_add(&l, &src, 1, &dst, 1, op->count));
    return kr_dev_end(&l);
}

/* Sends to self pair with receives from self in order, within the group. */
static ncclResult_t
shim_solo_p2p(const struct shim_op *ops, int nops, CUstream stream)
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
        SHIM_CHECK(shim_solo_copy(ops[s].sendbuff, ops[r].recvbuff, sent, stream));
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
shim_solo_arrive(struct ncclComm *comm, const struct shim_op *ops, int nops,
                 const struct gpu_device *gpu, CUstream stream, bool capturing)
{
    struct shim_dev_solo *solo = comm->backend_state;

    if (solo == NULL) {
        SHIM_CHECK(shim_calloc(&solo, 1));
        CUresult cu = gpu_cu.cuEventCreate(&solo->last, CU_EVENT_DISABLE_TIMING);
        if (cu != CUDA_SUCCESS) {
            free(solo);
            return gpu_cu_fail(cu, "cuEventCreate", __FILE__, __LINE__);
        }
        comm->backend_state = solo;
    }
    /* A capture is ordered by where its graph is launched; an event of ours recorded outside
     * it may not be awaited in it, nor one recorded in it outside. */
    if (solo->recorded && solo->stream != stream && !capturing) {
        GPU_CU_CHECK(cuStreamWaitEvent(stream, solo->last, 0));
    }
    for (int i = 0; i < nops; i++) {
        if (ops[i].coll != SHIM_COLL_SEND && ops[i].coll != SHIM_COLL_RECV) {
            SHIM_CHECK(shim_solo_coll(&ops[i], gpu, stream));
        }
    }
    SHIM_CHECK(shim_solo_p2p(ops, nops, stream));
    if (capturing) {
        return ncclSuccess;
    }
    GPU_CU_CHECK(cuEventRecord(solo->last, stream));
    solo->stream = stream;
    solo->recorded = true;
    return ncclSuccess;
}

static ncclResult_t
shim_solo_wait(struct ncclComm *comm, CUstream stream)
{
    (void)comm, (void)stream; /* the ops are on the stream itself */
    return ncclSuccess;
}

static ncclResult_t
shim_solo_drain(struct ncclComm *comm)
{
    const struct shim_dev_solo *solo = comm->backend_state;
    ncclResult_t res = ncclSuccess;

    if (solo != NULL && solo->recorded) {
        /* On the caller's thread (a host call drains first), which any thread's global-mode
         * capture forbids a synchronization: relaxed. */
        CUstreamCaptureMode mode = gpu_capture_relax();
        GPU_CU_CHECK_GOTO(cuEventSynchronize(solo->last), res, out);
    out:
        gpu_capture_restore(mode);
    }
    return res;
}

static bool
shim_solo_busy(const struct ncclComm *comm)
{
    const struct shim_dev_solo *solo = comm->backend_state;

    return solo != NULL && solo->recorded &&
           gpu_cu.cuEventQuery(solo->last) == CUDA_ERROR_NOT_READY;
}

static ncclResult_t
shim_solo_error(const struct ncclComm *comm)
{
    (void)comm; /* a CUDA error is the stream's, and the call's */
    return ncclSuccess;
}

static void
shim_solo_nothing(struct ncclComm *comm)
{
    (void)comm; /* nothing of ours waits */
}

static ncclResult_t
shim_solo_release_memory(struct ncclComm *comm)
{
    (void)comm; /* it holds no device memory */
    return ncclSuccess;
}

static void
shim_solo_device_bytes(const struct ncclComm *comm, uint64_t *releasable, uint64_t *persistent)
{
    (void)comm;
    *releasable = *persistent = 0;
}

static void
shim_solo_destroy(struct ncclComm *comm, bool abort)
{
    struct shim_dev_solo *solo = comm->backend_state;

    if (solo == NULL) {
        return;
    }
    if (!abort && solo->recorded) {
        gpu_cu.cuEventSynchronize(solo->last);
    }
    gpu_cu.cuEventDestroy(solo->last);
    free(solo);
    comm->backend_state = NULL;
}

const struct shim_backend shim_backend_solo = {
    .name = "one rank",
    .serves = shim_solo_serves,
    .captures = true,
    .drives_worker = false,
    .arrive = shim_solo_arrive,
    .wait = shim_solo_wait,
    .drain = shim_solo_drain,
    .busy = shim_solo_busy,
    .error = shim_solo_error,
    .release = shim_solo_nothing,
    .interrupt = shim_solo_nothing,
    .release_memory = shim_solo_release_memory,
    .device_bytes = shim_solo_device_bytes,
    .destroy = shim_solo_destroy,
};
