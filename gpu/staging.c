/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging device memory through pinned host memory (staging.h): the lanes, their flags, the
 * buffers.
 */
#include "staging.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "base/check.h"

/* The flags' page: a flag per lane, then the hold, a cache line apart. */
enum { GPU_STAGING_FLAG_STRIDE = 16, GPU_STAGING_PAGE = 4096 };

/* Pinned host memory the device reaches: anonymous, populated, registered whole. */
static ncclResult_t
gpu_staging_pin(size_t bytes, void **host_out)
{
    void *host = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS |
                                                              MAP_POPULATE, -1, 0);
    if (host == MAP_FAILED) {
        WARN("cannot map %zu bytes of staging memory: %s", bytes, strerror(errno));
        return ncclSystemError;
    }
    CUresult cu = gpu_cu.cuMemHostRegister(host, bytes, CU_MEMHOSTREGISTER_PORTABLE |
                                                            CU_MEMHOSTREGISTER_DEVICEMAP);
    if (cu != CUDA_SUCCESS) {
        munmap(host, bytes);
        return gpu_cu_fail(cu, "cuMemHostRegister(staging)", __FILE__, __LINE__);
    }
    *host_out = host;
    return ncclSuccess;
}

static void
gpu_staging_unpin(void *host, size_t bytes)
{
    if (host != NULL) {
        gpu_cu.cuMemHostUnregister(host);
        munmap(host, bytes);
    }
}

static ncclResult_t
gpu_staging_flag(struct gpu_staging *st, int index, struct gpu_flag *flag_out)
{
    volatile uint32_t *host = st->flags + index * GPU_STAGING_FLAG_STRIDE;
    flag_out->host = host;
    GPU_CU_CHECK(cuMemHostGetDevicePointer(&flag_out->dev, (void *)host, 0));
    return ncclSuccess;
}

ncclResult_t
gpu_staging_create(const struct gpu_device *device, struct gpu_staging **out)
{
    struct gpu_staging *st;
    ncclResult_t res;
    void *page;

    SHIM_CHECK(shim_calloc(&st, 1));
    st->device = device;
    SHIM_CHECK_GOTO(gpu_staging_pin(GPU_STAGING_PAGE, &page), res, err);
    st->flags = page;
    for (int lane = 0; lane < GPU_LANE_COUNT; lane++) {
        SHIM_CHECK_GOTO(gpu_staging_flag(st, lane, &st->finished[lane]), res, err);
        GPU_CU_CHECK_GOTO(cuStreamCreate(&st->lanes[lane], CU_STREAM_NON_BLOCKING), res, err);
    }
    SHIM_CHECK_GOTO(gpu_staging_flag(st, GPU_LANE_COUNT, &st->hold), res, err);
    GPU_CU_CHECK_GOTO(cuEventCreate(&st->in_mark, CU_EVENT_DISABLE_TIMING), res, err);
    GPU_CU_CHECK_GOTO(cuEventCreate(&st->arrived, CU_EVENT_DISABLE_TIMING), res, err);
    GPU_CU_CHECK_GOTO(cuEventCreate(&st->done, CU_EVENT_DISABLE_TIMING), res, err);
    GPU_CU_CHECK_GOTO(cuEventCreate(&st->held, CU_EVENT_DISABLE_TIMING), res, err);
    *out = st;
    return ncclSuccess;
err:
    gpu_staging_destroy(st);
    return res;
}

void
gpu_staging_destroy(struct gpu_staging *st)
{
    if (st == NULL) {
        return;
    }
    if (st->holding) {
        /* The flag must outlive the wait on it (on a GPU a wait on unregistered memory is a
         * fault of the context); the caller released it. */
        gpu_cu.cuEventSynchronize(st->held);
    }
    for (int lane = 0; lane < GPU_LANE_COUNT; lane++) {
        if (st->lanes[lane] != NULL) {
            gpu_cu.cuStreamSynchronize(st->lanes[lane]);
            gpu_cu.cuStreamDestroy(st->lanes[lane]);
        }
    }
    CUevent events[] = {st->in_mark, st->arrived, st->done, st->held};
    for (size_t i = 0; i < sizeof(events) / sizeof(events[0]); i++) {
        if (events[i] != NULL) {
            gpu_cu.cuEventDestroy(events[i]);
        }
    }
    gpu_staging_unpin(st->host, st->host_bytes);
    gpu_staging_unpin((void *)st->flags, st->flags != NULL ? GPU_STAGING_PAGE : 0);
    free(st);
}

/* Sizes grow to a power of two, so a run of growing messages reallocates a few times. */
static size_t
gpu_staging_round(size_t bytes)
{
    size_t size = 1u << 20;
    while (size < bytes) {
        size *= 2;
    }
    return size;
}

ncclResult_t
gpu_staging_trim(struct gpu_staging *st)
{
    for (int lane = 0; lane < GPU_LANE_COUNT; lane++) {
        GPU_CU_CHECK(cuStreamSynchronize(st->lanes[lane]));
    }
    gpu_staging_unpin(st->host, st->host_bytes);
    st->host = NULL;
    st->host_dev = 0;
    st->host_bytes = 0;
    return ncclSuccess;
}

ncclResult_t
gpu_staging_reserve(struct gpu_staging *st, size_t host_bytes)
{
    if (host_bytes <= st->host_bytes) {
        return ncclSuccess;
    }
    SHIM_CHECK(gpu_staging_trim(st)); /* the lanes may still use the old memory */
    size_t size = gpu_staging_round(host_bytes);
    SHIM_CHECK(gpu_staging_pin(size, (void **)&st->host));
    st->host_bytes = size;
    GPU_CU_CHECK(cuMemHostGetDevicePointer(&st->host_dev, st->host, 0));
    INFO(SHIM_ALLOC, "device %d staging: %zu bytes pinned", st->device->ordinal, st->host_bytes);
    return ncclSuccess;
}

ncclResult_t
gpu_staging_arrive(struct gpu_staging *st, CUstream user)
{
    GPU_CU_CHECK(cuEventRecord(st->arrived, user));
    return ncclSuccess;
}

ncclResult_t
gpu_staging_follow_arrive(struct gpu_staging *st)
{
    for (int lane = 0; lane < GPU_LANE_COUNT; lane++) {
        GPU_CU_CHECK(cuStreamWaitEvent(st->lanes[lane], st->arrived, 0));
    }
    gpu_staging_in_touched(st); /* what follows the wait, on either lane, follows arrive */
    return ncclSuccess;
}

ncclResult_t
gpu_staging_mark_done(struct gpu_staging *st)
{
    /* The out lane needs no wait: its copies finished before their sends were posted. */
    GPU_CU_CHECK(cuEventRecord(st->done, st->lanes[GPU_LANE_IN]));
    return ncclSuccess;
}

ncclResult_t
gpu_staging_wait_done(struct gpu_staging *st, CUstream user)
{
    GPU_CU_CHECK(cuStreamWaitEvent(user, st->done, 0));
    return ncclSuccess;
}

ncclResult_t
gpu_staging_hold(struct gpu_staging *st, CUstream user, uint32_t seq)
{
    SHIM_CHECK(gpu_stream_wait_flag(user, &st->hold, seq));
    GPU_CU_CHECK(cuEventRecord(st->held, user));
    st->holding = true;
    return ncclSuccess;
}

void
gpu_staging_release(struct gpu_staging *st, uint32_t seq)
{
    gpu_flag_release(&st->hold, seq);
}

/* Posts the lane's flag with its next ticket. */
static ncclResult_t
gpu_staging_post_ticket(struct gpu_staging *st, enum gpu_lane lane, uint32_t *ticket_out)
{
    uint32_t ticket = st->posted[lane] + 1;
    SHIM_CHECK(gpu_stream_post_flag(st->lanes[lane], &st->finished[lane], ticket));
    st->posted[lane] = ticket;
    *ticket_out = ticket;
    return ncclSuccess;
}

ncclResult_t
gpu_staging_in_ticket(struct gpu_staging *st, uint32_t *ticket_out)
{
    if (!st->in_unticketed) {
        *ticket_out = st->posted[GPU_LANE_IN];
        return ncclSuccess;
    }
    SHIM_CHECK(gpu_staging_post_ticket(st, GPU_LANE_IN, ticket_out));
    st->in_unticketed = false;
    return ncclSuccess;
}

/* The out lane waits for what the in lane's kernels and copies wrote so far. */
static ncclResult_t
gpu_staging_out_follows_in(struct gpu_staging *st)
{
    if (!st->in_dirty) {
        return ncclSuccess;
    }
    GPU_CU_CHECK(cuEventRecord(st->in_mark, st->lanes[GPU_LANE_IN]));
    GPU_CU_CHECK(cuStreamWaitEvent(st->lanes[GPU_LANE_OUT], st->in_mark, 0));
    st->in_dirty = false;
    return ncclSuccess;
}

ncclResult_t
gpu_staging_copy(struct gpu_staging *st, enum gpu_lane lane, void *dst, const void *src,
                 size_t len, uint32_t *ticket_out)
{
    if (lane == GPU_LANE_OUT) {
        SHIM_CHECK(gpu_staging_out_follows_in(st));
    } else {
        gpu_staging_in_touched(st);
    }
    GPU_CU_CHECK(cuMemcpyAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, len,
                               st->lanes[lane]));
    SHIM_CHECK(gpu_staging_post_ticket(st, lane, ticket_out));
    if (lane == GPU_LANE_IN) {
        st->in_unticketed = false;
    }
    return ncclSuccess;
}

