/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream ordering: how a device operation is fitted into the user's stream, and how the
 * streams that carry out operations wait for one another. Everything here enqueues; nothing
 * waits on the host.
 *
 * A gate on the user's stream is two stream memory operations on flags in pinned host memory
 * (for ordering streams of different processes; within one context only events order
 * streams, since its streams may share a hardware queue and a wait would then block the
 * work it waits for, if that was enqueued after it):
 *
 *     user's stream:  ... earlier work ... | post arrive = s | wait done >= s | later work ...
 *
 * `arrive` tells whoever carries the operation out that the stream reached it (the inputs are
 * ready, the outputs free); the stream then stops until `done` reaches s, so later kernels,
 * copies, events and synchronisation see the results. The one carrying the operation out waits
 * for arrive on a stream of its own and posts done after the work: the same two operations,
 * gpu_stream_wait_flag and gpu_stream_post_flag. Flags count operations, compared cyclically
 * as CU_STREAM_WAIT_VALUE_GEQ does, so a counter may wrap.
 *
 * Releasing (abort): a gate stops waiting once done is written from the host with the last
 * number any stream waits for (gpu_flag_release). Later work on the stream then runs.
 *
 * Groups with several streams (gpu_streams_fork, gpu_streams_join): as NCCL does, every
 * stream's work before the group precedes every operation of the group (the first stream
 * waits on an event of each other one), and every stream's work after the group follows all
 * of them (each waits on an event of the first).
 *
 * The caller makes the stream's context current (gpu_ctx_push), but for the functions that
 * take a context.
 */
#ifndef GPU_STREAM_H
#define GPU_STREAM_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stdint.h>

/* A flag in memory registered with the driver: its host address, and the address streams
 * use for it (the same on most systems, but the driver decides). */
struct gpu_flag {
    volatile uint32_t *host;
    CUdeviceptr dev;
};

/* The context a user's stream belongs to; for NULL (the legacy default stream) the context of
 * fallback_device's primary context, which is what NCCL does with the communicator's device. */
ncclResult_t gpu_stream_ctx(cudaStream_t stream, int fallback_device, CUcontext *ctx_out);
/* Whether stream is being captured into a CUDA graph: what is enqueued on it then runs only
 * when the graph is launched, as often as it is. */
ncclResult_t gpu_stream_capturing(cudaStream_t stream, CUcontext ctx, bool *capturing_out);

/* Enqueues on stream: post flag = seq once earlier work is done (with a memory barrier before
 * it, so whoever sees the flag sees that work); wait until flag >= seq, flushing remote writes
 * where the stream's device can (stream.c says why either way is enough). */
ncclResult_t gpu_stream_post_flag(CUstream stream, const struct gpu_flag *flag, uint32_t seq);
ncclResult_t gpu_stream_wait_flag(CUstream stream, const struct gpu_flag *flag, uint32_t seq);

/* From the host: lets every wait on flag for seq or less go (abort, failure). */
void gpu_flag_release(const struct gpu_flag *flag, uint32_t seq);
/* Whether flag has reached seq, read from the host. */
bool gpu_flag_reached(const struct gpu_flag *flag, uint32_t seq);

/* A set of user streams of one context, for a group's fork and join. */
#define GPU_GROUP_MAX_STREAMS 64
struct gpu_stream_set {
    CUcontext ctx;
    int n;
    cudaStream_t streams[GPU_GROUP_MAX_STREAMS];
};
/* The streams a communicator gated or gave work that touches memory of its own, each with
 * an event recorded after the latest such work: what teardown waits for before that memory
 * goes (a stream still waiting on unregistered memory would fault). Streams whose last mark
 * has passed are forgotten once there are many, so a program cycling through streams keeps a
 * short list. The marked stream's context must be current. */
struct gpu_stream_mark {
    CUstream stream;
    CUevent event;
};
struct gpu_stream_marks {
    struct gpu_stream_mark *marks;
    int n, cap;
};
/* Records stream's mark after the work enqueued on it so far. */
ncclResult_t gpu_stream_mark(struct gpu_stream_marks *marks, CUstream stream);
/* Waits until every mark has passed, for budget_ms at most (0: no limit); whether they all
 * did. Needs no current context. */
bool gpu_stream_marks_wait(const struct gpu_stream_marks *marks, int64_t budget_ms);
/* Frees the marks (their events); the list is empty again. */
void gpu_stream_marks_free(struct gpu_stream_marks *marks);

/* Adds stream to the set unless there already (ncclInvalidUsage past the maximum). */
ncclResult_t gpu_stream_set_add(struct gpu_stream_set *set, cudaStream_t stream);
/* streams[0] waits for the work enqueued so far on every other stream of the set. */
ncclResult_t gpu_streams_fork(const struct gpu_stream_set *set);
/* Every other stream of the set waits for the work enqueued so far on streams[0]. */
ncclResult_t gpu_streams_join(const struct gpu_stream_set *set);

#endif
