/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A schedule's steps on device memory, for a communicator without a device team (the
 * executor's part that exec.c leaves to this file; see its header comment for the whole).
 * The staging's pinned memory holds a host copy of the user's buffers, laid out as the
 * buffers are, aliasing included, so the schedule's hazard rules hold for the copies too; and
 * the schedule's scratch, which lives only there, where messages land and kernels read it.
 * How each send and receive meets the GPU is planned when the exec is made:
 *
 *     send, COPY_OUT       copy out on the out lane (STAGING) | the message from the host copy
 *     send, NOW            the bytes came from a receive and nothing wrote them since: the
 *                          message from the host copy at once (forwarding rings, chains, trees)
 *     send, AFTER_KERNELS  scratch a kernel wrote, or (direct) the device buffer: the message
 *                          once the in lane's work so far is finished (STAGING)
 *     receive, COPY_IN     the message into the host copy | copy in on the in lane (STAGING)
 *     receive, AFTER_KERNELS  scratch, or (direct) the device buffer, which kernels enqueued
 *                          before may still read: the message once they are finished
 *     reduce, copy         a kernel (or a copy) on the in lane, done at once: whatever reads
 *                          its result is ordered after it there, or waits for it as above
 *
 * Direct: UCX moves device memory itself (tp_cuda_memory), so only scratch has a host copy.
 */
#include <string.h>

#include "base/check.h"
#include "base/clock.h"
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
 * follows; direct, scratch alone. */
static void
shim_staged_shadow_layout(struct shim_exec *exec)
{
    size_t ext[ALG_BUF_COUNT];
    uintptr_t send = (uintptr_t)exec->op.sendbuff, recv = (uintptr_t)exec->op.recvbuff;

    shim_staged_extents(&exec->sched, ext);
    if (exec->direct) {
        exec->shadow_off[ALG_BUF_SCRATCH] = 0;
        exec->shadow_bytes = shim_staged_align(ext[ALG_BUF_SCRATCH]);
        return;
    }
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

/* How far back a send looks for the step that last wrote its bytes; past it, the bytes are
 * copied out of device memory again, which is always right. Forwarding steps (rings, chains,
 * trees) find theirs within a few steps. */
#define SHIM_FORWARD_LOOKBACK 64

/* Whether the last step before send i that wrote any of its bytes is a receive of all of them:
 * then they are in the host copy and nothing changed them since (steps writing the same
 * bytes are ordered, so that receive is done before the send is ready). */
static bool
shim_staged_forwards(const struct shim_exec *exec, int i)
{
    const struct alg_range *src = &exec->sched.steps[i].src[0];
    size_t lo = shim_staged_shadow_pos(exec, *src), hi = lo + src->len;

    for (int j = i - 1; j >= 0 && j >= i - SHIM_FORWARD_LOOKBACK; j--) {
        const struct alg_step *w = &exec->sched.steps[j];
        if (w->kind == ALG_STEP_SEND) {
            continue;
        }
        size_t wlo = shim_staged_shadow_pos(exec, w->dst), whi = wlo + w->dst.len;
        if (wlo < hi && lo < whi) {
            return w->kind == ALG_STEP_RECV && wlo <= lo && hi <= whi;
        }
    }
    return false;
}

static enum shim_staged_how
shim_staged_plan_step(const struct shim_exec *exec, int i)
{
    const struct alg_step *step = &exec->sched.steps[i];

    if (step->kind == ALG_STEP_RECV) {
        bool in_place = step->dst.buf == ALG_BUF_SCRATCH || exec->direct;
        return step->dst.len == 0 ? SHIM_STAGED_NOW
               : in_place         ? SHIM_STAGED_AFTER_KERNELS
                                  : SHIM_STAGED_COPY_IN;
    }
    if (step->src[0].len == 0) {
        return SHIM_STAGED_NOW;
    }
    if (exec->direct && step->src[0].buf != ALG_BUF_SCRATCH) {
        return SHIM_STAGED_AFTER_KERNELS;
    }
    if (shim_staged_forwards(exec, i)) {
        return SHIM_STAGED_NOW;
    }
    return step->src[0].buf == ALG_BUF_SCRATCH ? SHIM_STAGED_AFTER_KERNELS
                                                : SHIM_STAGED_COPY_OUT;
}

void
shim_staged_plan(struct shim_exec *exec)
{
    shim_staged_shadow_layout(exec);
    for (int i = 0; i < exec->sched.nsteps; i++) {
        enum alg_step_kind kind = exec->sched.steps[i].kind;
        if (kind == ALG_STEP_SEND || kind == ALG_STEP_RECV) {
            exec->how[i] = (uint8_t)shim_staged_plan_step(exec, i);
        }
    }
}

size_t
shim_exec_staged_needs(const struct shim_exec *exec)
{
    return exec->shadow_bytes;
}

ncclResult_t
shim_exec_staged_bind(struct shim_exec *exec, struct gpu_staging *staging, size_t host_off,
                      struct shim_staged_phases *phases)
{
    if (phases != NULL) {
        SHIM_CHECK(shim_calloc(&exec->since, (size_t)exec->sched.nsteps));
        exec->phases = phases;
    }
    exec->staging = staging;
    for (int b = 0; b < ALG_BUF_COUNT; b++) {
        if (b == ALG_BUF_SCRATCH || !exec->direct) {
            exec->shadow[b] = staging->host + host_off + exec->shadow_off[b];
        }
    }
    /* Kernels and copies address scratch through the device's view of the same memory. */
    exec->bufs[ALG_BUF_SCRATCH] =
        (uint8_t *)(uintptr_t)(staging->host_dev + host_off + exec->shadow_off[ALG_BUF_SCRATCH]);
    return ncclSuccess;
}

/* Step i's phase ends now (NCCLSHIM_STAGED_PHASES); the next one, if any, begins. */
static void
shim_staged_phase_end(struct shim_exec *exec, int i, enum shim_staged_phase phase)
{
    if (exec->phases != NULL) {
        uint64_t now = shim_clock_ns();
        exec->phases->ns[phase] += now - exec->since[i];
        exec->phases->count[phase]++;
        exec->since[i] = now;
    }
}

/* The phase a STAGING step is in. */
static enum shim_staged_phase
shim_staged_stage_phase(const struct shim_exec *exec, int i)
{
    switch (exec->how[i]) {
    case SHIM_STAGED_COPY_OUT:
        return SHIM_PHASE_COPY_OUT;
    case SHIM_STAGED_COPY_IN:
        return SHIM_PHASE_COPY_IN;
    default:
        return SHIM_PHASE_KERNELS;
    }
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

/* What a STAGING step waits for: its copy out on the out lane; its copy in, or the work
 * before it, on the in lane. */
static enum gpu_lane
shim_staged_lane(const struct shim_exec *exec, int i)
{
    return exec->how[i] == SHIM_STAGED_COPY_OUT ? GPU_LANE_OUT : GPU_LANE_IN;
}

const char *
shim_staged_waits_for(const struct shim_exec *exec, int i)
{
    switch (exec->how[i]) {
    case SHIM_STAGED_COPY_OUT:
        return "its copy out of device memory";
    case SHIM_STAGED_COPY_IN:
        return "its copy into device memory";
    default:
        return "the kernels enqueued before it";
    }
}

/* A step begins what it must wait for on the GPU: a copy between its device bytes and their
 * host copy (out before a send, in after a receive), or the in lane's work so far. */
static ncclResult_t
shim_staged_stage(struct shim_exec *exec, int i)
{
    const struct alg_step *step = &exec->sched.steps[i];

    if (exec->how[i] == SHIM_STAGED_AFTER_KERNELS) {
        SHIM_CHECK(gpu_staging_in_ticket(exec->staging, &exec->tickets[i]));
    } else {
        bool out = exec->how[i] == SHIM_STAGED_COPY_OUT;
        struct alg_range range = out ? step->src[0] : step->dst;
        void *dev = shim_exec_ptr(exec, range), *host = shim_exec_wire_ptr(exec, range);
        SHIM_CHECK(gpu_staging_copy(exec->staging, out ? GPU_LANE_OUT : GPU_LANE_IN,
                                    out ? host : dev, out ? dev : host, range.len,
                                    &exec->tickets[i]));
    }
    exec->state[i] = SHIM_STEP_STAGING;
    exec->nstaging++;
    if (exec->since != NULL) {
        exec->since[i] = shim_clock_ns();
    }
    return ncclSuccess;
}

/* A STAGING step whose wait is over: a send's message goes, and a receive's that waited for
 * the kernels; a copied-in receive is done. */
ncclResult_t
shim_staged_test(struct shim_exec *exec, int i, bool *progressed)
{
    if (!gpu_staging_finished(exec->staging, shim_staged_lane(exec, i), exec->tickets[i])) {
        return ncclSuccess;
    }
    exec->nstaging--;
    *progressed = true;
    shim_staged_phase_end(exec, i, shim_staged_stage_phase(exec, i));
    if (exec->how[i] == SHIM_STAGED_COPY_IN) {
        shim_exec_step_done(exec, i);
        return ncclSuccess;
    }
    return shim_exec_post(exec, i);
}

ncclResult_t
shim_staged_start(struct shim_exec *exec, int i)
{
    const struct alg_step *step = &exec->sched.steps[i];

    if (step->kind == ALG_STEP_REDUCE || step->kind == ALG_STEP_COPY) {
        SHIM_CHECK(shim_staged_compute_device(exec, step));
        shim_exec_step_done(exec, i);
        return ncclSuccess;
    }
    bool waits = exec->how[i] == SHIM_STAGED_COPY_OUT ||
                 exec->how[i] == SHIM_STAGED_AFTER_KERNELS;
    return waits ? shim_staged_stage(exec, i) : shim_exec_post(exec, i);
}

ncclResult_t
shim_staged_message_done(struct shim_exec *exec, int i)
{
    bool send = exec->sched.steps[i].kind == ALG_STEP_SEND;

    shim_staged_phase_end(exec, i, send ? SHIM_PHASE_SEND : SHIM_PHASE_RECV);
    if (!send && exec->how[i] == SHIM_STAGED_COPY_IN) {
        return shim_staged_stage(exec, i); /* the bytes go in */
    }
    shim_exec_step_done(exec, i);
    return ncclSuccess;
}
