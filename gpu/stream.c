/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream ordering (stream.h): gates on user streams, flags on internal streams, release from
 * the host, the fork and join of a group's streams, and the marks teardown waits for.
 */
#include "stream.h"

#include <stdlib.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "driver.h"

ncclResult_t
gpu_stream_ctx(cudaStream_t stream, int fallback_device, CUcontext *ctx_out)
{
    CUstream s = (CUstream)stream;

    if (s != NULL && s != CU_STREAM_LEGACY && s != CU_STREAM_PER_THREAD) {
        GPU_CU_CHECK(cuStreamGetCtx(s, ctx_out));
        return ncclSuccess;
    }
    const struct gpu_device *device;
    ncclResult_t res = gpu_device_get(fallback_device >= 0 ? fallback_device : 0, &device);
    if (res == ncclSuccess) {
        *ctx_out = device->ctx;
    }
    return res;
}

ncclResult_t
gpu_stream_capturing(cudaStream_t stream, CUcontext ctx, bool *capturing_out)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    ncclResult_t res = gpu_ctx_push(ctx);

    if (res != ncclSuccess) {
        return res;
    }
    CUresult cu = gpu_cu.cuStreamIsCapturing((CUstream)stream, &status);
    gpu_ctx_pop();
    if (cu != CUDA_SUCCESS) {
        return gpu_cu_fail(cu, "cuStreamIsCapturing(stream)", __FILE__, __LINE__);
    }
    /* An invalidated capture counts: work enqueued now would be lost with it all the same. */
    *capturing_out = status != CU_STREAM_CAPTURE_STATUS_NONE;
    return ncclSuccess;
}

ncclResult_t
gpu_stream_post_flag(CUstream stream, const struct gpu_flag *flag, uint32_t seq)
{
    /* The default write has a memory barrier before it: whatever the stream did before is
     * visible to whoever sees the flag. */
    GPU_CU_CHECK(cuStreamWriteValue32(stream, flag->dev, seq, CU_STREAM_WRITE_VALUE_DEFAULT));
    return ncclSuccess;
}

/* Every stream wait of ncclshim is made here. What a flag publishes is often another GPU's
 * writes: a leader's kernel on GPU k writes into memory of GPU j (a peer mapping over NVLink
 * or PCIe), its stream then posts a word in pinned host memory (gpu_stream_post_flag, or
 * kr_dev_signal's stores after __threadfence_system()), and a stream of GPU j waits here before
 * later work of GPU j reads what k wrote.
 *
 * cuda.h on the writer: cuStreamWriteValue32 without NO_MEMORY_BARRIER "will provide a memory
 * fence before the write, which has similar semantics to __threadfence_system() but is scoped
 * to the stream": k's earlier writes, into j's memory too, are observed by every thread of the
 * system, peer devices' included, as happening before the word.
 *
 * cuda.h on the reader: CU_STREAM_WAIT_VALUE_FLUSH makes "a remote write ... guaranteed to have
 * reached the device before the wait can be satisfied ... visible to downstream device work";
 * without it "the device is permitted to reorder remote writes internally". Where the device
 * supports it (CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, asked once per device) every wait
 * flushes, so that guarantee holds whatever the platform counts as a remote write. Elsewhere
 * (x86 hosts, as far as is known) the flag cannot be given (the driver refuses it with
 * CUDA_ERROR_NOT_SUPPORTED), and the fence above is what orders: the flush, like the
 * GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS it is one of, is GPUDirect RDMA's, for writes of agents
 * outside the CUDA memory model (a NIC's); GPU_DIRECT_RDMA_WRITES_ORDERING (OWNER on
 * such devices, as far as is known) says even those need no flush for the owning device's own
 * work. Our remote
 * writes are CUDA stores of a peer GPU, ordered by that peer's system-scope fence. What
 * cuda.h leaves unsaid either way: that work after a satisfied wait observes what was visible
 * when the wait saw its word. */
ncclResult_t
gpu_stream_wait_flag(CUstream stream, const struct gpu_flag *flag, uint32_t seq)
{
    const struct gpu_device *device;
    CUcontext ctx;

    GPU_CU_CHECK(cuStreamGetCtx(stream, &ctx));
    SHIM_CHECK(gpu_device_of_ctx(ctx, &device));
    unsigned int flags = CU_STREAM_WAIT_VALUE_GEQ;
    flags |= device->can_flush ? (unsigned int)CU_STREAM_WAIT_VALUE_FLUSH : 0u;
    GPU_CU_CHECK(cuStreamWaitValue32(stream, flag->dev, seq, flags));
    return ncclSuccess;
}

void
gpu_flag_release(const struct gpu_flag *flag, uint32_t seq)
{
    /* Only forward: a stream's own later write must not be undone, nor a wait reopened (a
     * compare-and-swap, since a stream may write the word meanwhile). */
    uint32_t now = __atomic_load_n(flag->host, __ATOMIC_ACQUIRE);
    while ((int32_t)(seq - now) > 0 &&
           !__atomic_compare_exchange_n(flag->host, &now, seq, false, __ATOMIC_RELEASE,
                                        __ATOMIC_ACQUIRE)) {
    }
}

bool
gpu_flag_reached(const struct gpu_flag *flag, uint32_t seq)
{
    return (int32_t)(__atomic_load_n(flag->host, __ATOMIC_ACQUIRE) - seq) >= 0;
}

ncclResult_t
gpu_stream_set_add(struct gpu_stream_set *set, cudaStream_t stream)
{
    for (int i = 0; i < set->n; i++) {
        if (set->streams[i] == stream) {
            return ncclSuccess;
        }
    }
    if (set->n == GPU_GROUP_MAX_STREAMS) {
        WARN("a group uses more than %d streams on one device", GPU_GROUP_MAX_STREAMS);
        return ncclInvalidUsage;
    }
    set->streams[set->n++] = stream;
    return ncclSuccess;
}

/* `waiter` waits for everything enqueued so far on `signaler`. */
static ncclResult_t
gpu_stream_wait_stream(cudaStream_t waiter, cudaStream_t signaler)
{
    CUevent event;
    ncclResult_t res = ncclSuccess;

    GPU_CU_CHECK(cuEventCreate(&event, CU_EVENT_DISABLE_TIMING));
    GPU_CU_CHECK_GOTO(cuEventRecord(event, (CUstream)signaler), res, out);
    GPU_CU_CHECK_GOTO(cuStreamWaitEvent((CUstream)waiter, event, 0), res, out);
out:
    /* The wait took the event's state as it was: the event may go now. */
    gpu_cu.cuEventDestroy(event);
    return res;
}

ncclResult_t
gpu_streams_fork(const struct gpu_stream_set *set)
{
    ncclResult_t res = ncclSuccess;

    SHIM_CHECK(gpu_ctx_push(set->ctx));
    for (int i = 1; i < set->n && res == ncclSuccess; i++) {
        res = gpu_stream_wait_stream(set->streams[0], set->streams[i]);
    }
    gpu_ctx_pop();
    return res;
}

ncclResult_t
gpu_streams_join(const struct gpu_stream_set *set)
{
    ncclResult_t res = ncclSuccess;

    SHIM_CHECK(gpu_ctx_push(set->ctx));
    for (int i = 1; i < set->n && res == ncclSuccess; i++) {
        res = gpu_stream_wait_stream(set->streams[i], set->streams[0]);
    }
    gpu_ctx_pop();
    return res;
}

/* --- marks -------------------------------------------------------------------------------- */

/* More than this many streams: the ones whose mark has passed are forgotten. */
#define GPU_MARKS_KEEP 16

ncclResult_t
gpu_stream_mark(struct gpu_stream_marks *m, CUstream stream)
{
    int i = 0;

    while (i < m->n && m->marks[i].stream != stream) {
        i++;
    }
    if (i == m->n && m->n >= GPU_MARKS_KEEP) {
        for (int j = m->n - 1; j >= 0; j--) {
            if (gpu_cu.cuEventQuery(m->marks[j].event) == CUDA_SUCCESS) {
                gpu_cu.cuEventDestroy(m->marks[j].event);
                m->marks[j] = m->marks[--m->n];
            }
        }
        i = m->n;
    }
    if (i == m->n) {
        SHIM_CHECK(shim_grow(&m->marks, m->n, &m->cap, 4));
        GPU_CU_CHECK(cuEventCreate(&m->marks[i].event, CU_EVENT_DISABLE_TIMING));
        m->marks[i].stream = stream;
        m->n++;
    }
    GPU_CU_CHECK(cuEventRecord(m->marks[i].event, stream));
    return ncclSuccess;
}

bool
gpu_stream_marks_wait(const struct gpu_stream_marks *m, int64_t budget_ms)
{
    int64_t until = shim_clock_ms() + budget_ms;
    bool passed = true;

    for (int i = 0; i < m->n; i++) {
        if (budget_ms == 0) {
            passed &= gpu_cu.cuEventSynchronize(m->marks[i].event) == CUDA_SUCCESS;
            continue;
        }
        CUresult cu;
        while ((cu = gpu_cu.cuEventQuery(m->marks[i].event)) == CUDA_ERROR_NOT_READY &&
               shim_clock_ms() < until) {
            usleep(100);
        }
        passed &= cu == CUDA_SUCCESS;
    }
    return passed;
}

void
gpu_stream_marks_free(struct gpu_stream_marks *m)
{
    for (int i = 0; i < m->n; i++) {
        gpu_cu.cuEventDestroy(m->marks[i].event);
    }
    free(m->marks);
    *m = (struct gpu_stream_marks){0};
}
