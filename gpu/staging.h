/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory moved through pinned host memory, for a communicator whose ranks reach each
 * other only over the network (across hosts, or one host without a device team). The
 * executor (engine/exec.c) runs the algorithms' schedules unchanged on the device buffers;
 * what it cannot do on device memory (hand bytes to UCX, take bytes from it) goes through
 * this: pinned host memory for a copy of every buffer (and the schedules' scratch, which
 * lives there: received chunks are reduced by kernels reading it where it landed) and two
 * streams of our own, the lanes.
 *
 *     out lane:  [wait arrived] copy device -> host | post out = t | copy ... | post out = t+1
 *     in lane:   [wait arrived] copy host -> device | post in = u | kernels ... | [done]
 *
 * A copy returns a ticket, the value its lane's flag takes once it is finished; the host sees
 * that without a system call (gpu_staging_finished). The out lane copies what the in lane's
 * kernels wrote: before each copy out it waits for the in lane's work so far, when there is
 * new work there. The device and host copies of one op overlap across chunks: a chunk goes
 * out while the next is reduced and the one after comes in.
 *
 * The gate on the user's stream is two events here: the lanes wait for `arrived`, recorded on
 * the user's stream, before they touch its buffers, and the user's stream waits for `done`,
 * recorded on the in lane after a batch's last work. Events, not flags: the lanes share the
 * user's context, and a stream of a context may only wait for work already enqueued in it
 * (with one hardware queue, CUDA_DEVICE_MAX_CONNECTIONS=1, or streams sharing one, work
 * enqueued after a wait queues behind it). So the user's stream waits for done only once the
 * in lane has its last work of the batch (the caller waits on the host for that), and the
 * lanes wait for arrived only after it was recorded.
 *
 * One thread drives a staging at a time, with the device's primary context current.
 */
#ifndef GPU_STAGING_H
#define GPU_STAGING_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "stream.h"

enum gpu_lane {
    GPU_LANE_OUT, /* device to host */
    GPU_LANE_IN,  /* host to device, and kernels */
    GPU_LANE_COUNT
};

struct gpu_staging {
    const struct gpu_device *device;
    CUstream lanes[GPU_LANE_COUNT];
    uint32_t posted[GPU_LANE_COUNT]; /* the last ticket given out per lane */
    struct gpu_flag finished[GPU_LANE_COUNT];
    CUevent arrived, done;           /* the user's stream's gate */
    struct gpu_flag hold;            /* a failed batch's gate, opened from the host */
    CUevent held;                    /* after the last wait on hold */
    bool holding;
    CUevent in_mark;                 /* the in lane's work, for the out lane to wait for */
    bool in_dirty;                   /* the in lane got work since in_mark was recorded */
    bool in_unticketed;              /* ... since its flag was last posted */
    volatile uint32_t *flags;        /* the flags' page, pinned */
    uint8_t *host;                   /* pinned, host_bytes */
    CUdeviceptr host_dev;            /* the same memory as kernels and copies address it */
    size_t host_bytes;
};

/* Makes device's lanes and flags; the device's primary context must be current. */
ncclResult_t gpu_staging_create(const struct gpu_device *device, struct gpu_staging **out);
/* Frees everything once the lanes' work is finished (which waits for the user's streams to
 * reach their last arrived). */
void gpu_staging_destroy(struct gpu_staging *st);

/* At least host_bytes of pinned host memory. Growing waits for the lanes' work so far, which
 * may still use the old memory. */
ncclResult_t gpu_staging_reserve(struct gpu_staging *st, size_t host_bytes);

/* Suspension: gives the pinned memory back once the lanes' work is finished; the next
 * reserve pins it again. */
ncclResult_t gpu_staging_trim(struct gpu_staging *st);

/* The gate's halves, in this order, each once per batch: the user's stream records arrived
 * (the caller); both lanes wait for it (the batch's first work); the in lane records done
 * (after the batch's last work); the user's stream waits for it (the caller, once the batch
 * got that far). */
ncclResult_t gpu_staging_arrive(struct gpu_staging *st, CUstream user);
ncclResult_t gpu_staging_follow_arrive(struct gpu_staging *st);
ncclResult_t gpu_staging_mark_done(struct gpu_staging *st);
ncclResult_t gpu_staging_wait_done(struct gpu_staging *st, CUstream user);
/* Instead of waiting for done, after a batch failed: the user's stream waits until the host
 * opens the hold (gpu_staging_release: abort, destroy, revoke), as NCCL's streams stay blocked
 * rather than go on with wrong data. Nothing of the context's opens it, so it may wait. */
ncclResult_t gpu_staging_hold(struct gpu_staging *st, CUstream user, uint32_t seq);
void gpu_staging_release(struct gpu_staging *st, uint32_t seq);
/* Copies len bytes on a lane (host <-> device, or device to device on the in lane);
 * *ticket_out is what gpu_staging_finished waits for. */
ncclResult_t gpu_staging_copy(struct gpu_staging *st, enum gpu_lane lane, void *dst,
                              const void *src, size_t len, uint32_t *ticket_out);
/* The in lane's stream, for kernels; the caller says when it enqueued work there. */
static inline CUstream
gpu_staging_in_stream(const struct gpu_staging *st)
{
    return st->lanes[GPU_LANE_IN];
}
static inline void
gpu_staging_in_touched(struct gpu_staging *st)
{
    st->in_dirty = true;
    st->in_unticketed = true;
}
/* A ticket for the in lane's work so far (posting its flag only if it got work since). */
ncclResult_t gpu_staging_in_ticket(struct gpu_staging *st, uint32_t *ticket_out);
/* Whether the lane's work up to ticket is finished. */
static inline bool
gpu_staging_finished(const struct gpu_staging *st, enum gpu_lane lane, uint32_t ticket)
{
    return gpu_flag_reached(&st->finished[lane], ticket);
}

#endif
