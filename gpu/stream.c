/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream ordering (stream.h): gates on user streams, flags on internal streams, release from
 * the host, and the fork and join of a group's streams.
 */
#include "stream.h"

#include "base/check.h"
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

ncclResult_t
gpu_stream_wait_flag(CUstream stream, const struct gpu_flag *flag, uint32_t seq)
{
    GPU_CU_CHECK(cuStreamWaitValue32(stream, flag->dev, seq, CU_STREAM_WAIT_VALUE_GEQ));
    return ncclSuccess;
}

void
gpu_flag_release(const struct gpu_flag *flag, uint32_t seq)
{
    /* Only forward: a stream's own later write must not be undone, nor a wait reopened. */
    uint32_t now = __atomic_load_n(flag->host, __ATOMIC_ACQUIRE);
    if ((int32_t)(seq - now) > 0) {
        __atomic_store_n(flag->host, seq, __ATOMIC_RELEASE);
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
