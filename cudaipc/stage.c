/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Staging: the buffers of a rank's group that some leader reaches only through a copy
 * (describe.c), copied by the rank's stream into an area the leaders map, in before the group
 * arrives and out after it is done. Two kinds of area:
 *   - device: a cuMem allocation of the rank's own device, for cudaMalloc memory nobody
 *     registered (the leaders map it as any other: an imported cuMem handle keeps memory
 *     alive, so that mapping is safe; a leader of this process uses the copy's address). Two
 *     local copies, at the device's memory bandwidth;
 *   - host: a segment of pinned shared host memory (a memfd, sent once to every leader), for
 *     the rest.
 * A buffer staged for one leader is staged for all that touch it: a copy out after done must
 * not overwrite what a leader wrote into the user's buffer itself; but what the rank's own
 * GPU's leader alone touches, in this process, stays where it is (own_part). An area grows as
 * needed; a new one replaces it, and old ones go with the next one's making, once quiet.
 * One staged group at a time per area: the next one's copies wait on an event after the last
 * one's.
 *
 * No implicit synchronization after a wait (review B6). Making an area allocates device
 * memory or page-locks host memory, which synchronizes the device's context (CUDA's implicit
 * synchronization: later work of every stream of the context waits for all earlier work);
 * behind a stream wait that only this process's threads (the team's thread opening a work
 * area) or later work of the context release, that stalls or hangs. So an area is made only
 * once this rank's streams wait on nothing (cipc_stage_quiet: every operation it posted done,
 * no host-posted group queued or held, its runner's streams idle), the call waiting on the
 * host for that, and replaced areas go only then too (unmapping and unregistering may
 * synchronize it as well); and host areas are cuMem allocations of pinned host memory
 * (gpu_host_cumem_alloc), which the leaders import, map and let go without page-locking
 * anything (cache.c), and which go without unregistering anything (cuMemHostUnregister
 * returns only once the context's earlier work is done). A driver without cuMem host memory
 * gets registered shared memory as before, and its hazard.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/check.h"
#include "internal.h"
#include "runner.h"
#include "tasks.h"

#define CIPC_STAGE_ALIGN 256
#define CIPC_STAGE_MIN ((size_t)1 << 20)

/* A staging area: pinned shared host memory (a memfd the leader maps), or, on_device, a cuMem
 * allocation of the rank's device (exported as any other, pinned in the exports while it
 * lives). */
struct cipc_stage_seg {
    int memfd;          /* host: -1 on the device (a cuMem host allocation's exported fd) */
    struct gpu_mem_import cumem; /* host, as cuMem host memory (base 0: registered instead) */
    uint8_t *host;
    CUdeviceptr dev;    /* where the rank's stream copies to and from */
    size_t size;
    uint64_t gen;       /* host: its key on the channel */
    uint64_t id;        /* on the device: its allocation id, the leader's key */
    uint32_t last_seq;  /* the last operation that used it */
    CUevent idle;       /* recorded after the copies out of the last group that used it */
    bool idle_recorded;
    struct cipc_stage_seg *next;
};

struct cipc_stage {
    bool on_device;
    struct cipc_stage_seg *segs; /* the current one first */
    uint64_t gens;
    CUevent free_event;          /* after the last staged group's copies; created on need */
    bool recorded;               /* free_event was recorded: the next group waits on it */
    bool pending;                /* the group arrived used staging: record it at the wait */
    struct cipc_stage_seg *pending_seg; /* ... in this area, whose idle event goes with it */
};

/* One staged buffer of a group being posted. */
struct cipc_staged {
    struct cipc_buf *buf;
    uint8_t via;         /* enum cipc_stage_via */
    CUdeviceptr user;    /* its first byte in the user's memory */
    CUdeviceptr area;    /* on the device: the staging area's first byte */
    size_t bytes;
    CUdeviceptr skip_lo, skip_hi; /* user bytes neither copied in nor out (own_part) */
    size_t offset;       /* in the segment */
    bool in, out;        /* copied in before arrive, out after done */
};

/* --- the areas ----------------------------------------------------------------------------- */

ncclResult_t
cipc_stage_create(struct cipc_team *team)
{
    SHIM_CHECK(shim_calloc(&team->stage, 1));
    SHIM_CHECK(shim_calloc(&team->dev_stage, 1));
    team->dev_stage->on_device = true;
    return ncclSuccess;
}

/* Frees seg; the device's context is current. The leader is told first: its mapping would
 * keep the memory. */
static ncclResult_t
cipc_stage_seg_free(struct cipc_team *team, struct cipc_stage_seg *seg, bool tell)
{
    ncclResult_t res = ncclSuccess;

    if (seg->idle != NULL) {
        gpu_cu.cuEventDestroy(seg->idle);
    }
    if (seg->memfd < 0) {
        if (tell) {
            res = cipc_export_release(team, seg->id, (uintptr_t)seg->dev);
        }
        gpu_mem_free((void *)(uintptr_t)seg->dev);
    } else {
        if (tell) {
            res = cipc_forget(team, CIPC_BUF_STAGED, seg->gen);
        }
        if (seg->cumem.base != 0) {
            gpu_mem_unimport(&seg->cumem); /* \note_sync: quiet, or the end */
        } else if (seg->dev != 0) {
            gpu_cu.cuMemHostUnregister(seg->host);
        }
        if (seg->host != NULL) {
            munmap(seg->host, seg->size);
        }
        close(seg->memfd);
    }
    free(seg);
    return res;
}

/* Frees the replaced areas whose last operation is done and whose stream passed the copies
 * out of the last group that used them (done comes before the copies out). */
static ncclResult_t
cipc_stage_trim(struct cipc_team *team, struct cipc_stage *st)
{
    struct cipc_stage_seg **link = &st->segs;

    if (*link == NULL) {
        return ncclSuccess;
    }
    /* Posting from streams (hostpost.c), a group's numbers are picked when its stream gets
     * there: an area is idle once nothing is queued and all that was posted is done. */
    bool all_done = __atomic_load_n(&team->hostposts_queued, __ATOMIC_ACQUIRE) == 0 &&
                    cipc_done_reached(team, team->rank,
                                      __atomic_load_n(&team->seq, __ATOMIC_ACQUIRE));
    for (link = &(*link)->next; *link != NULL;) {
        struct cipc_stage_seg *seg = *link;
        bool copied = !seg->idle_recorded || gpu_cu.cuEventQuery(seg->idle) == CUDA_SUCCESS;
        if (copied && (team->stream_posting
                           ? all_done
                           : cipc_done_reached(team, team->rank, seg->last_seq))) {
            *link = seg->next;
            SHIM_CHECK(cipc_stage_seg_free(team, seg, true));
        } else {
            link = &seg->next;
        }
    }
    return ncclSuccess;
}

/* Pinned host memory of seg->size bytes that every leader maps: cuMem host memory, or, where
 * the driver has none, registered shared memory; its descriptor sent to every leader. */
static ncclResult_t
cipc_stage_seg_host(struct cipc_team *team, struct cipc_stage_seg *seg)
{
    struct gpu_host_import shared;
    uint32_t flags = CIPC_STAGING_CUMEM;

    if (gpu_host_cumem_alloc(seg->size, team->gpu->ordinal, &seg->memfd, &seg->cumem) ==
        ncclSuccess) {
        seg->size = seg->cumem.size;
        seg->dev = seg->cumem.base;
    } else {
        SHIM_CHECK(gpu_host_segment("ncclshim-staging", seg->size, &seg->memfd, &shared));
        seg->host = shared.host;
        seg->dev = shared.dev;
        flags = 0;
    }
    struct cipc_channel_msg msg = {.kind = CIPC_FD_STAGING, .rank = team->rank, .key = seg->gen,
                                   .size = seg->size, .flags = flags};
    return cipc_channel_send_all(team, &msg, seg->memfd, false);
}

/* Device memory of at least seg->size bytes, exported to the leaders and pinned there. */
static ncclResult_t
cipc_stage_seg_device(struct cipc_team *team, struct cipc_stage_seg *seg)
{
    void *ptr = NULL;
    uintptr_t base;

    SHIM_CHECK(gpu_mem_alloc(seg->size, &ptr));
    seg->dev = (CUdeviceptr)(uintptr_t)ptr;
    SHIM_CHECK(gpu_mem_mapping(ptr, &base, &seg->size, &seg->id));
    SHIM_CHECK(cipc_export_cumem(team, ptr, seg->id, base, seg->size, team->seq));
    return cipc_export_pin(team, seg->id, base, 1);
}

/* Whether no host-posted group of this rank is queued (its host function not run) or held (its
 * stream waiting on its release word: hostpost.c). */
static bool
cipc_stage_hostposts_quiet(struct cipc_team *team)
{
    pthread_mutex_lock(&team->release_lock);
    bool held = team->nreleases > 0;
    pthread_mutex_unlock(&team->release_lock);
    return !held && __atomic_load_n(&team->hostposts_queued, __ATOMIC_ACQUIRE) == 0;
}

/* Waits on the host until this rank's streams wait on nothing of the team's: every operation
 * it posted done, no host-posted group queued or held, its runner's streams idle (see above).
 * Those wait only for earlier work, the host and other processes, never for what this call
 * would enqueue: this returns, unless the team fails, is revoked or goes first. */
static ncclResult_t
cipc_stage_quiet(struct cipc_team *team)
{
    while (!cipc_done_reached(team, team->rank, __atomic_load_n(&team->seq, __ATOMIC_ACQUIRE)) ||
           !cipc_stage_hostposts_quiet(team) || !team->runner->quiet(team)) {
        SHIM_CHECK(cipc_team_error(team));
        if (__atomic_load_n(&team->released, __ATOMIC_ACQUIRE) ||
            __atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
            WARN("rank %d: the communicator was revoked or went while a call waited to make "
                 "its staging memory", team->rank);
            return ncclInvalidUsage;
        }
        usleep(20);
    }
    return ncclSuccess;
}

/* An area of st of at least bytes; the current one if it is big enough. The device's context
 * is current. */
static ncclResult_t
cipc_stage_get(struct cipc_team *team, struct cipc_stage *st, size_t bytes,
               struct cipc_stage_seg **seg_out)
{
    struct cipc_stage_seg *seg = NULL;
    ncclResult_t res;

    if (st->segs != NULL && st->segs->size >= bytes) {
        *seg_out = st->segs;
        return ncclSuccess;
    }
    size_t size = st->segs != NULL ? 2 * st->segs->size : CIPC_STAGE_MIN;
    size = size > bytes ? size : bytes;
    /* Unmapping, unregistering and allocating may synchronize the context: only once nothing
     * of this rank's waits on the team do the replaced areas go and the new one come. */
    SHIM_CHECK(cipc_stage_quiet(team));
    SHIM_CHECK(cipc_stage_trim(team, st));
    SHIM_CHECK(shim_calloc(&seg, 1));
    seg->size = (size + 4095) & ~(size_t)4095;
    seg->memfd = -1;
    seg->gen = ++st->gens;
    res = st->on_device ? cipc_stage_seg_device(team, seg) : cipc_stage_seg_host(team, seg);
    if (res != ncclSuccess) {
        if (seg->memfd < 0 && seg->dev == 0) {
            free(seg);
        } else {
            cipc_stage_seg_free(team, seg, false);
        }
        return res;
    }
    INFO(SHIM_ALLOC, "rank %d: device team staging %s %llu of %zu bytes", team->rank,
         st->on_device ? "on the device" : "segment", (unsigned long long)seg->gen, seg->size);
    seg->next = st->segs;
    st->segs = seg;
    *seg_out = seg;
    return ncclSuccess;
}

/* Keeps a staged output's copy out, for cipc_stage_copy_out. */
static ncclResult_t
cipc_copy_out_keep(struct cipc_team *team, CUdeviceptr dst, CUdeviceptr src, size_t bytes)
{
    SHIM_CHECK(shim_grow(&team->copies, team->ncopies, &team->copies_cap, 8));
    team->copies[team->ncopies++] = (struct cipc_copy){.dst = dst, .src = src, .bytes = bytes};
    return ncclSuccess;
}

/* Lays the group's buffers staged through st out in one area, points their descriptors at
 * it, and enqueues the copies in; the copies out are kept for cipc_post_wait. */
static ncclResult_t
cipc_stage_group(struct cipc_team *team, struct cipc_stage *st, struct cipc_staged *staged,
                 int nstaged, uint32_t last_seq, CUstream stream)
{
    uint8_t via = st->on_device ? CIPC_STAGE_DEVICE : CIPC_STAGE_HOST;
    struct cipc_stage_seg *seg = NULL;
    size_t total = 0;

    for (int i = 0; i < nstaged; i++) {
        if (staged[i].via == via) {
            staged[i].offset = total;
            total += (staged[i].bytes + CIPC_STAGE_ALIGN - 1) & ~(size_t)(CIPC_STAGE_ALIGN - 1);
        }
    }
    if (total == 0) {
        return ncclSuccess;
    }
    SHIM_CHECK(cipc_stage_get(team, st, total, &seg));
    seg->last_seq = last_seq;
    if (st->on_device) {
        /* Marks the export used by this group, so it is not idle before the group is done. */
        SHIM_CHECK(cipc_export_cumem(team, (void *)(uintptr_t)seg->dev, seg->id, seg->dev,
                                     seg->size, last_seq));
    }
    if (st->free_event == NULL) {
        GPU_CU_CHECK(cuEventCreate(&st->free_event, CU_EVENT_DISABLE_TIMING));
    }
    if (st->recorded) {
        GPU_CU_CHECK(cuStreamWaitEvent(stream, st->free_event, 0));
    }
    st->pending = true;
    st->pending_seg = seg;
    for (int i = 0; i < nstaged; i++) {
        struct cipc_staged *s = &staged[i];
        if (s->via != via) {
            continue;
        }
        s->area = seg->dev;
        s->buf->how = st->on_device ? CIPC_BUF_CUMEM : CIPC_BUF_STAGED;
        s->buf->key = st->on_device ? seg->id : seg->gen;
        s->buf->offset = s->offset;
        s->buf->size = seg->size;
        /* The bytes around the skipped range: all of them, or the two sides of it. */
        CUdeviceptr end = s->user + s->bytes;
        CUdeviceptr pieces[2][2] = {{s->user, end}, {end, end}};
        if (s->skip_hi > s->skip_lo) {
            pieces[0][1] = s->skip_lo;
            pieces[1][0] = s->skip_hi;
        }
        for (int p = 0; p < 2; p++) {
            CUdeviceptr user = pieces[p][0], staged_at = seg->dev + s->offset + (user - s->user);
            size_t bytes = pieces[p][1] - user;
            if (bytes == 0) {
                continue;
            }
            if (s->in) {
                GPU_CU_CHECK(cuMemcpyAsync(staged_at, user, bytes, stream));
            }
            if (s->out) {
                SHIM_CHECK(cipc_copy_out_keep(team, user, staged_at, bytes));
            }
        }
    }
    return ncclSuccess;
}

/* After a group's copies out on stream: the areas it used are free for the next group. */
static ncclResult_t
cipc_stage_mark_free(struct cipc_stage *st, CUstream stream)
{
    if (st->pending) {
        GPU_CU_CHECK(cuEventRecord(st->free_event, stream));
        st->recorded = true;
        st->pending = false;
    }
    struct cipc_stage_seg *seg = st->pending_seg;
    if (seg != NULL) {
        if (seg->idle == NULL) {
            GPU_CU_CHECK(cuEventCreate(&seg->idle, CU_EVENT_DISABLE_TIMING));
        }
        GPU_CU_CHECK(cuEventRecord(seg->idle, stream));
        seg->idle_recorded = true;
        st->pending_seg = NULL;
    }
    return ncclSuccess;
}

static void
cipc_stage_destroy(struct cipc_team *team, struct cipc_stage *st)
{
    if (st == NULL) {
        return;
    }
    if (st->free_event != NULL) {
        gpu_cu.cuEventDestroy(st->free_event);
    }
    while (st->segs != NULL) {
        struct cipc_stage_seg *seg = st->segs;
        st->segs = seg->next;
        cipc_stage_seg_free(team, seg, false); /* the leader goes with the team */
    }
    free(st);
}

/* --- a group's buffers ----------------------------------------------------------------- */

/* Adds one staged buffer, but the bytes [skip_lo, skip_hi) of it (none if equal); a send and a
 * receive that overlap (in place: exactly, with the same skip) share one region, copied in
 * whole and out where the output is. */
static void
cipc_stage_add(struct cipc_staged *staged, int *nstaged, struct cipc_buf *buf, uint8_t via,
               uintptr_t user, size_t bytes, bool in, bool out, uintptr_t skip_lo,
               uintptr_t skip_hi)
{
    for (int i = 0; i < *nstaged; i++) {
        struct cipc_staged *s = &staged[i];
        uintptr_t lo = s->user, hi = s->user + s->bytes;
        if (s->via == via && user < hi && lo < user + bytes) {
            /* Only the send and receive of one operation overlap: grow to their union. */
            uintptr_t nlo = lo < user ? lo : user;
            uintptr_t nhi = hi > user + bytes ? hi : user + bytes;
            s->user = nlo;
            s->bytes = nhi - nlo;
            s->in |= in;
            s->out |= out;
            buf->region = (uint32_t)i + 1; /* resolved to the region after layout */
            return;
        }
    }
    staged[*nstaged] = (struct cipc_staged){.buf = buf, .via = via, .user = user,
                                            .bytes = bytes, .in = in, .out = out,
                                            .skip_lo = skip_lo, .skip_hi = skip_hi};
    buf->region = (uint32_t)*nstaged + 1;
    (*nstaged)++;
}

/* The bytes of a rank's send and receive buffers that its own GPU's leader alone touches
 * (tasks.h), [lo, hi) from each buffer's start: its part of an all-reduce, reduce (input) or
 * broadcast (output), its own block of a reduce-scatter's, all-to-all's or scatter's input;
 * an all-gather's input its own GPU reads too, with every other. */
struct cipc_own {
    size_t send_lo, send_hi, recv_lo, recv_hi;
};

/* Whether this rank's own GPU's leader, in this process, uses the user's buffers as they are
 * (d->own_part), and what stays out of their staging then (*own). The leader must touch both
 * buffers where they are, and an all-reduce's or broadcast's, both staged, be the same or
 * apart (their regions merge only when equal). */
static bool
cipc_own_part(struct cipc_team *team, const struct cipc_op *op, struct cipc_own *own)
{
    const int m = team->leader_of[team->rank], g = team->nleaders;
    const size_t es = kr_type_size(op->redop.type), block = op->count * es;
    const int root_k = op->root >= 0 && op->root < team->nranks ? team->leader_of[op->root] : -1;
    uintptr_t send = (uintptr_t)op->send, recv = (uintptr_t)op->recv;
    size_t lo, hi;

    memset(own, 0, sizeof(*own));
    if (g < 2 || m < 0 || !cipc_leader_here(team, m)) {
        return false;
    }
    if ((op->send != NULL && !cipc_leader_touches_local(team, m, op->send, &op->send_mem)) ||
        (op->recv != NULL && !cipc_leader_touches_local(team, m, op->recv, &op->recv_mem))) {
        return false;
    }
    int part, nparts;
    switch (op->coll) {
    case ALG_COLL_ALLREDUCE:
    case ALG_COLL_REDUCE:
    case ALG_COLL_BROADCAST:
        cipc_share_part(op->coll, m, g, root_k, &part, &nparts);
        if (part < 0 || (op->coll == ALG_COLL_ALLREDUCE && send != recv &&
                         send < recv + block && recv < send + block)) {
            return false;
        }
        cipc_part_range(op->count, es, part, nparts, &lo, &hi);
        if (op->coll != ALG_COLL_BROADCAST) { /* reads its part of the input */
            own->send_lo = lo * es, own->send_hi = hi * es;
        }
        if (op->coll != ALG_COLL_REDUCE) {    /* writes its part of the output */
            own->recv_lo = lo * es, own->recv_hi = hi * es;
        }
        return true;
    case ALG_COLL_REDUCESCATTER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_SCATTER:
        if (op->send == NULL) {
            return false; /* scatter: not the root */
        }
        own->send_lo = (size_t)team->rank * block;
        own->send_hi = own->send_lo + block;
        return true;
    case ALG_COLL_ALLGATHER:
        return true;
    default:
        return false;
    }
}

ncclResult_t
cipc_stage_descs(struct cipc_team *team, const struct cipc_op *ops, struct cipc_desc *const *descs,
                 const uint8_t (*via)[3], int nops, uint32_t last_seq, CUstream stream)
{
    struct cipc_staged *staged; /* up to three buffers an operation */
    int nstaged = 0;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&staged, 3 * (size_t)nops));
    for (int i = 0; i < nops; i++) {
        const struct cipc_op *op = &ops[i];
        struct cipc_desc *d = descs[i];
        size_t send_bytes, recv_bytes;

        cipc_op_bytes(op, team->nranks, &send_bytes, &recv_bytes);
        /* own_part: what this GPU's leader alone touches stays where it is. Not under a ring
         * or tree schedule: other GPUs read what this GPU writes there (levels.h), so every
         * leader, this one too, works in the staged copy. */
        struct cipc_own own = {0};
        d->own_part = (via[i][0] || via[i][1]) && d->algo == CIPC_ALGO_DIRECT &&
                      cipc_own_part(team, op, &own);
        uintptr_t send = (uintptr_t)op->send, recv = (uintptr_t)op->recv;
        if (via[i][0]) {
            cipc_stage_add(staged, &nstaged, &d->send, via[i][0], send, send_bytes, true, false,
                           send + own.send_lo, send + own.send_hi);
        }
        if (via[i][1]) {
            cipc_stage_add(staged, &nstaged, &d->recv, via[i][1], recv, recv_bytes, false, true,
                           recv + own.recv_lo, recv + own.recv_hi);
        }
        if (via[i][2]) {
            cipc_stage_add(staged, &nstaged, &d->scalar_buf, via[i][2],
                           (uintptr_t)op->scalar_dev, kr_type_size(op->redop.type), true, false,
                           0, 0);
        }
    }
    res = cipc_stage_group(team, team->stage, staged, nstaged, last_seq, stream);
    if (res == ncclSuccess) {
        res = cipc_stage_group(team, team->dev_stage, staged, nstaged, last_seq, stream);
    }
    /* Buffers that share a region (in place) point into it at their own place. */
    for (int i = 0; i < nops && res == ncclSuccess; i++) {
        struct cipc_buf *bufs[3] = {&descs[i]->send, &descs[i]->recv, &descs[i]->scalar_buf};
        for (int b = 0; b < 3; b++) {
            if (bufs[b]->region != 0) {
                const struct cipc_staged *s = &staged[bufs[b]->region - 1];
                bufs[b]->how = s->buf->how;
                bufs[b]->key = s->buf->key;
                bufs[b]->size = s->buf->size;
                bufs[b]->offset = s->offset + (bufs[b]->ptr - s->user);
                bufs[b]->region = 0;
                if (s->via == CIPC_STAGE_DEVICE && !descs[i]->own_part) {
                    bufs[b]->ptr = s->area + bufs[b]->offset; /* for a leader of this process */
                }
            }
        }
    }
    free(staged);
    return res;
}

ncclResult_t
cipc_stage_copy_out(struct cipc_team *team, CUstream stream)
{
    for (int i = 0; i < team->ncopies; i++) {
        const struct cipc_copy *c = &team->copies[i];
        GPU_CU_CHECK(cuMemcpyAsync(c->dst, c->src, c->bytes, stream));
    }
    team->ncopies = 0;
    SHIM_CHECK(cipc_stage_mark_free(team->stage, stream));
    return cipc_stage_mark_free(team->dev_stage, stream);
}

ncclResult_t
cipc_team_release_memory(struct cipc_team *team)
{
    ncclResult_t res = ncclSuccess;

    if (team->gpu == NULL) {
        return ncclSuccess; /* never posted: nothing made */
    }
    if (__atomic_load_n(&team->hostposts_queued, __ATOMIC_ACQUIRE) != 0) {
        WARN("rank %d: device operations are still queued on streams, not yet posted: their "
             "staging memory cannot be freed", team->rank);
        return ncclInvalidUsage;
    }
    SHIM_CHECK(gpu_ctx_push(team->gpu->ctx));
    struct cipc_stage *stages[2] = {team->stage, team->dev_stage};
    for (int i = 0; i < 2 && res == ncclSuccess; i++) {
        while (stages[i]->segs != NULL && res == ncclSuccess) {
            struct cipc_stage_seg *seg = stages[i]->segs;
            stages[i]->segs = seg->next;
            res = cipc_stage_seg_free(team, seg, true);
        }
    }
    gpu_ctx_pop();
    return res;
}

uint64_t
cipc_team_device_bytes(const struct cipc_team *team)
{
    uint64_t bytes = 0;

    if (team->dev_stage != NULL) {
        for (const struct cipc_stage_seg *seg = team->dev_stage->segs; seg != NULL;
             seg = seg->next) {
            bytes += seg->size;
        }
    }
    return bytes;
}

void
cipc_stage_quiesce(struct cipc_team *team)
{
    struct cipc_stage *stages[2] = {team->stage, team->dev_stage};

    for (int i = 0; i < 2; i++) {
        for (struct cipc_stage_seg *seg = stages[i] != NULL ? stages[i]->segs : NULL;
             seg != NULL; seg = seg->next) {
            if (seg->idle_recorded) {
                gpu_cu.cuEventSynchronize(seg->idle);
            }
        }
        if (stages[i] != NULL && stages[i]->free_event != NULL) {
            gpu_cu.cuEventSynchronize(stages[i]->free_event);
        }
    }
}

void
cipc_stage_free(struct cipc_team *team)
{
    /* Device staging is freed in its context; without a device there is none. */
    bool pushed = team->gpu != NULL && gpu_ctx_push(team->gpu->ctx) == ncclSuccess;
    cipc_stage_destroy(team, team->stage);
    cipc_stage_destroy(team, team->dev_stage);
    if (pushed) {
        gpu_ctx_pop();
    }
    team->stage = team->dev_stage = NULL;
    free(team->copies);
    team->copies = NULL;
    team->ncopies = team->copies_cap = 0;
}
