/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A schedule's steps on device memory, for a communicator without a device team (the
 * executor's part that exec.c leaves to this file; see its header comment for the whole). The
 * device buffers get host copies in the staging's pinned memory, laid out as the buffers are,
 * aliasing included, so the schedule's hazard rules hold for them too:
 *
 *     send      copy out on the out lane (STAGING) | the message from the host copy
 *               (a send of bytes a receive just brought in: the message at once)
 *     receive   the message into the host copy | copy in on the in lane (STAGING) | done
 *     reduce    a kernel on the in lane, done at once: what reads its result is ordered after
 *     copy      it on that lane, or (a copy out) waits for an event of it
 *
 * Direct (UCX moves device memory itself): a send or receive waits (STAGING) for the in
 * lane's work so far, which wrote or still reads its bytes, then UCX gets the device buffer.
 */
#include <string.h>

#include "base/check.h"
#include "exec_internal.h"
#include "gpu/staging.h"
#include "kernels/device.h"

/* Bytes of each buffer that a schedule touches. */
static void
shim_staged_extents(const struct alg_sched *sched, size_t ext[ALG_BUF_COUNT])
{
    memset(ext, 0, ALG_BUF_COUNT * sizeof(ext[0]));
    for (int i = 0; i < sched->nsteps; i++) {
        const struct alg_step *step = &sched->steps[i];
        /* The ranges each kind uses, from these: sends src[0]; receives dst; copies dst and
         * src[0]; reductions all three. */
        const struct alg_range *ranges[3] = {&step->dst, &step->src[0], &step->src[1]};
        int first = step->kind == ALG_STEP_SEND ? 1 : 0;
        int n = step->kind == ALG_STEP_RECV ? 1 : step->kind == ALG_STEP_REDUCE ? 3 : 2;
        for (int r = first; r < n; r++) {
            size_t end = ranges[r]->off + ranges[r]->len;
            if (ranges[r]->len > 0 && end > ext[ranges[r]->buf]) {
                ext[ranges[r]->buf] = end;
            }
        }
    }
}

#define SHIM_SHADOW_ALIGN 64u

static size_t
shim_staged_align(size_t bytes)
{
    return (bytes + SHIM_SHADOW_ALIGN - 1) & ~(size_t)(SHIM_SHADOW_ALIGN - 1);
}

/* Lays out the host copies: the user's two buffers keep their overlap (in place), scratch
 * follows. */
static void
shim_staged_shadow_layout(struct shim_exec *exec)
{
    size_t ext[ALG_BUF_COUNT];
    uintptr_t send = (uintptr_t)exec->op.sendbuff, recv = (uintptr_t)exec->op.recvbuff;

    shim_staged_extents(&exec->sched, ext);
    bool overlap = ext[ALG_BUF_SEND] > 0 && ext[ALG_BUF_RECV] > 0 &&
                   send < recv + ext[ALG_BUF_RECV] && recv < send + ext[ALG_BUF_SEND];
    size_t end;
    if (overlap) {
        uintptr_t lo = send < recv ? send : recv;
        uintptr_t hi_send = send + ext[ALG_BUF_SEND], hi_recv = recv + ext[ALG_BUF_RECV];
        exec->shadow_off[ALG_BUF_SEND] = send - lo;
        exec->shadow_off[ALG_BUF_RECV] = recv - lo;
        end = (hi_send > hi_recv ? hi_send : hi_recv) - lo;
    } else {
        exec->shadow_off[ALG_BUF_SEND] = 0;
        exec->shadow_off[ALG_BUF_RECV] = shim_staged_align(ext[ALG_BUF_SEND]);
        end = exec->shadow_off[ALG_BUF_RECV] + ext[ALG_BUF_RECV];
    }
    exec->shadow_off[ALG_BUF_SCRATCH] = shim_staged_align(end);
    exec->shadow_bytes = shim_staged_align(exec->shadow_off[ALG_BUF_SCRATCH] +
                                         ext[ALG_BUF_SCRATCH]);
}

/* Where range's bytes sit among the host copies: a position in one address space, so that
 * aliased buffers compare as the device buffers do. */
static size_t
shim_staged_shadow_pos(const struct shim_exec *exec, struct alg_range range)
{
    return exec->shadow_off[range.buf] + range.off;
}

/* How far back a send looks for the receive that brought its bytes in; past it, the bytes
 * are copied out of device memory again, which is always right. Forwarding steps (rings,
 * chains, trees) find theirs within a few steps. */
#define SHIM_FORWARD_LOOKBACK 64

/* A send goes out of the host copy as it is when the last step before it that wrote any of
 * its bytes is a receive of all of them: nothing changed them on the device since, and the
 * receive is done before the send is ready (steps writing the same bytes are ordered). */
static void
shim_staged_find_forwards(struct shim_exec *exec)
{
    for (int i = 0; i < exec->sched.nsteps; i++) {
        const struct alg_step *send = &exec->sched.steps[i];
        if (send->kind != ALG_STEP_SEND) {
            continue;
        }
        size_t lo = shim_staged_shadow_pos(exec, send->src[0]), hi = lo + send->src[0].len;
        for (int j = i - 1; j >= 0 && j >= i - SHIM_FORWARD_LOOKBACK; j--) {
            const struct alg_step *w = &exec->sched.steps[j];
            if (w->kind == ALG_STEP_SEND) {
                continue;
            }
            size_t wlo = shim_staged_shadow_pos(exec, w->dst), whi = wlo + w->dst.len;
            if (wlo < hi && lo < whi) {
                exec->forward[i] = w->kind == ALG_STEP_RECV && wlo <= lo && hi <= whi;
                break;
            }
        }
    }
}

void
shim_staged_plan(struct shim_exec *exec)
{
    shim_staged_shadow_layout(exec);
    shim_staged_find_forwards(exec);
}

void
shim_exec_staged_needs(const struct shim_exec *exec, size_t *host_bytes, size_t *dev_bytes)
{
    *host_bytes = exec->shadow_bytes;
    *dev_bytes = shim_staged_align(exec->sched.scratch_bytes);
}

void
shim_exec_staged_bind(struct shim_exec *exec, struct gpu_staging *staging, bool direct,
                      size_t host_off, size_t dev_off)
{
    exec->staging = staging;
    exec->direct = direct;
    for (int b = 0; b < ALG_BUF_COUNT && !direct; b++) {
        exec->shadow[b] = staging->host + host_off + exec->shadow_off[b];
    }
    exec->bufs[ALG_BUF_SCRATCH] = (uint8_t *)(uintptr_t)(staging->dev + dev_off);
}

/* A reduction operand on the device: PreMulSum's scalar comes with it (the host's value, or
 * the device scalar the call gave). */
static struct kr_dev_src
shim_staged_dev_src(const struct shim_exec *exec, const void *ptr, bool pre)
{
    struct kr_dev_src src = {
        .ptr = (uintptr_t)ptr,
        .pre = pre && exec->op.redop.kind == KR_PREMULSUM,
        .scalar_ptr = (uintptr_t)exec->op.scalar_dev,
    };
    memcpy(&src.scalar, exec->op.redop.scalar, sizeof(src.scalar));
    return src;
}

/* A reduction or copy on device memory: one kernel (or a copy) on the staging's in lane. */
static ncclResult_t
shim_staged_compute_device(struct shim_exec *exec, const struct alg_step *step)
{
    struct gpu_staging *st = exec->staging;
    const struct kr_redop *redop = &exec->op.redop;
    unsigned flags = shim_exec_kr_flags(step->flags);
    void *dst = shim_exec_ptr(exec, step->dst);
    const void *a = shim_exec_ptr(exec, step->src[0]);

    if (step->kind == ALG_STEP_COPY && !shim_exec_copy_scales(redop, flags)) {
        uint32_t unused;
        return dst == a || step->dst.len == 0
                   ? ncclSuccess
                   : gpu_staging_copy(st, GPU_LANE_IN, dst, a, step->dst.len, &unused);
    }
    struct kr_dev_src srcs[2] = {shim_staged_dev_src(exec, a, flags & KR_PRE_A)};
    int nsrc = 1;
    if (step->kind == ALG_STEP_REDUCE) {
        srcs[nsrc++] = shim_staged_dev_src(exec, shim_exec_ptr(exec, step->src[1]),
                                         flags & KR_PRE_B);
    }
    uint64_t out = (uintptr_t)dst;
    struct kr_dev_launch l;
    kr_dev_begin(&l, gpu_staging_in_stream(st), st->device, redop);
    kr_dev_set_post(&l, flags & KR_POST);
    SHIM_CHECK(kr_dev_add(&l, srcs, nsrc, &out, 1, step->dst.len / kr_type_size(redop->type)));
    SHIM_CHECK(kr_dev_end(&l));
    gpu_staging_in_touched(st);
    return ncclSuccess;
}

/* The lane a STAGING step waits on: direct, the in lane's work; else its copy's. */
static enum gpu_lane
shim_staged_stage_lane(const struct shim_exec *exec, int i)
{
    return !exec->direct && exec->sched.steps[i].kind == ALG_STEP_SEND ? GPU_LANE_OUT
                                                                        : GPU_LANE_IN;
}

/* A staged step begins what its message must wait for: a copy between its device bytes and
 * their host copy, or (direct) the in lane's work so far. */
static ncclResult_t
shim_staged_stage(struct shim_exec *exec, int i)
{
    const struct alg_step *step = &exec->sched.steps[i];
    enum gpu_lane lane = shim_staged_stage_lane(exec, i);

    if (exec->direct) {
        SHIM_CHECK(gpu_staging_in_ticket(exec->staging, &exec->tickets[i]));
    } else {
        struct alg_range range = lane == GPU_LANE_OUT ? step->src[0] : step->dst;
        void *dev = shim_exec_ptr(exec, range), *host = shim_exec_wire_ptr(exec, range);
        SHIM_CHECK(gpu_staging_copy(exec->staging, lane, lane == GPU_LANE_OUT ? host : dev,
                                    lane == GPU_LANE_OUT ? dev : host, range.len,
                                    &exec->tickets[i]));
    }
    exec->state[i] = SHIM_STEP_STAGING;
    exec->nstaging++;
    return ncclSuccess;
}

/* A STAGING step whose wait is over: a send's message goes, and a direct receive's; a
 * staged receive's bytes are in. */
ncclResult_t
shim_staged_test(struct shim_exec *exec, int i, bool *progressed)
{
    if (!gpu_staging_finished(exec->staging, shim_staged_stage_lane(exec, i), exec->tickets[i])) {
        return ncclSuccess;
    }
    exec->nstaging--;
    *progressed = true;
    if (exec->sched.steps[i].kind == ALG_STEP_SEND || exec->direct) {
        return shim_exec_post(exec, i);
    }
    shim_exec_step_done(exec, i);
    return ncclSuccess;
}

ncclResult_t
shim_staged_start(struct shim_exec *exec, int i)
{
    const struct alg_step *step = &exec->sched.steps[i];

    switch (step->kind) {
    case ALG_STEP_SEND:
        if ((exec->direct || !exec->forward[i]) && step->src[0].len > 0) {
            return shim_staged_stage(exec, i);
        }
        return shim_exec_post(exec, i);
    case ALG_STEP_RECV:
        if (exec->direct && step->dst.len > 0) {
            return shim_staged_stage(exec, i); /* the in lane's kernels may still read there */
        }
        return shim_exec_post(exec, i);
    default:
        SHIM_CHECK(shim_staged_compute_device(exec, step));
        shim_exec_step_done(exec, i);
        return ncclSuccess;
    }
}

ncclResult_t
shim_staged_received(struct shim_exec *exec, int i)
{
    if (exec->direct || exec->sched.steps[i].dst.len == 0) {
        shim_exec_step_done(exec, i);
        return ncclSuccess;
    }
    return shim_staged_stage(exec, i); /* the bytes go in */
}
