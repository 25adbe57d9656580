/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A rank posting its operations (cudaipc.h): each buffer described so every GPU's leader can
 * reach it, descriptors in the ring, the doorbells, and the gate on the stream.
 *
 * How a buffer is described, for the leaders whose share touches it (cipc_touchers), cheapest
 * first. A leader in the rank's own process uses its address as it is, where its device may
 * touch it; for the leaders in other processes:
 *   - none (every leader touching it is in this process): LOCAL;
 *   - device memory every leader's device reaches, from cudaMalloc, that its owner registered
 *     (ncclCommRegister) or a CUDA graph captured: the allocation's legacy IPC handle (made
 *     once per allocation, cached: it costs about 18 us);
 *   - such memory from a shareable cuMem allocation (ncclMemAlloc, PyTorch's expandable
 *     segments): the allocation's file descriptor, sent once on each leader's channel;
 *   - cudaMalloc memory nobody registered: staged on the device. cuIpcOpenMemHandle makes
 *     freeing an allocation another process maps undefined, and PyTorch's empty_cache()
 *     frees such buffers without a word; only a registration promises otherwise. So the
 *     rank's stream copies it into a cuMem allocation of the rank's own (which the leaders
 *     map as any other: an imported cuMem handle keeps memory alive, so that mapping is
 *     safe; a leader of this process uses the copy's address) and back. Two local copies, at
 *     the device's memory bandwidth;
 *   - anything else (managed or registered memory, a device some leader cannot reach, memory
 *     a leader of this process may not touch, a buffer across two cuMem allocations): staged
 *     through a segment of pinned shared host memory (a memfd, sent once to every leader).
 * A buffer staged for one leader is staged for all that touch it: a copy out after done must
 * not overwrite what a leader wrote into the user's buffer itself.
 * A rank's stream copies staged inputs in before it arrives and outputs out after done. A
 * staging area grows as needed; a new one replaces it, and old ones go once the operations
 * that used them are done. One staged group at a time per area: the next one's copies wait on
 * an event after the last one's.
 * Allocations are told apart by the driver's unique id, never by address: memory freed and
 * allocated again at the same address is a new allocation.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "tasks.h"
#include "team.h"

#define CIPC_STAGE_ALIGN 256
#define CIPC_STAGE_MIN ((size_t)1 << 20)

/* A staging area: pinned shared host memory (a memfd the leader maps), or, on_device, a cuMem
 * allocation of the rank's device (exported as any other, pinned in the exports while it
 * lives). */
struct cipc_stage_seg {
    int memfd;          /* host: -1 on the device */
    uint8_t *host;
    CUdeviceptr dev;    /* where the rank's stream copies to and from */
    size_t size;
    uint64_t gen;       /* host: its key on the channel */
    uint64_t id;        /* on the device: its allocation id, the leader's key */
    uint32_t last_seq;  /* the last operation that used it */
    struct cipc_stage_seg *next;
};

struct cipc_stage {
    bool on_device;
    struct cipc_stage_seg *segs; /* the current one first */
    uint64_t gens;
    CUevent free_event;          /* after the last staged group's copies; created on need */
    bool recorded;               /* free_event was recorded: the next group waits on it */
    bool pending;                /* the group arrived used staging: record it at the wait */
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

/* --- getting ready ------------------------------------------------------------------------ */

ncclResult_t
cipc_post_ready(struct cipc_team *team)
{
    ncclResult_t res;

    if (team->gpu != NULL) {
        return ncclSuccess;
    }
    if (team->device < 0) {
        WARN("rank %d: this communicator was created without a current CUDA device, so it "
             "cannot take device buffers (call cudaSetDevice before ncclCommInitRank)",
             team->rank);
        return ncclInvalidUsage;
    }
    const struct gpu_device *gpu;
    SHIM_CHECK(gpu_device_get(team->device, &gpu));
    if (!team->prepared) {
        SHIM_CHECK(cipc_hostpost_prepare(gpu));
        team->prepared = true;
    }
    SHIM_CHECK(cipc_exports_create(team));
    SHIM_CHECK(shim_calloc(&team->stage, 1));
    SHIM_CHECK(shim_calloc(&team->dev_stage, 1));
    team->dev_stage->on_device = true;
    SHIM_CHECK(gpu_ctx_push(gpu->ctx));
    SHIM_CHECK_GOTO(cipc_ctrl_register(team, team->rank), res, out);
    struct cipc_ctrl *own = team->ctrls[team->rank];
    team->arrive = cipc_flag(team, team->rank, &own->arrive);
    for (int k = 0; k < team->nleaders; k++) {
        team->done[k] = cipc_flag(team, team->rank, &own->done[k].value);
    }
    /* This GPU's leader in this process: its stream is of this rank's context. (Leaders of
     * other GPUs have contexts of their own, wherever they run.) A leader alone on its GPU
     * runs the share on this rank's streams instead. */
    int mine = team->leader_of[team->rank];
    team->leader_ctx = mine >= 0 && cipc_leader_here(team, mine) && team->own == NULL;
    if (team->own != NULL) {
        SHIM_CHECK_GOTO(cipc_ownstream_ready(team, gpu), res, out);
    } else if (team->lead >= 0) {
        GPU_CU_CHECK_GOTO(cuEventCreate(&team->arrived, CU_EVENT_DISABLE_TIMING), res, out);
    }
    team->gpu = gpu;
    res = ncclSuccess;
out:
    gpu_ctx_pop();
    return res;
}

/* Whether the kernels of leader k, which runs in this process, may touch mem at ptr as it is.
 * Host memory a kernel reaches may be; device memory only of a device its process can map
 * (reach): of its own device, cudaMalloc memory of a device it reaches (peer access), cuMem
 * memory of another device only where its owner granted that device access (cuMemMap grants
 * none, and PyTorch's expandable segments grant their own device alone). */
static bool
cipc_leader_touches_local(struct cipc_team *team, int k, const void *ptr,
                          const struct gpu_mem_info *mem)
{
    int leader_device = team->device_here[team->leaders[k]];
    unsigned long long flags = 0;

    if (mem->kind != GPU_MEM_DEVICE) {
        return true;
    }
    if (!team->reach[(size_t)team->leaders[k] * team->nranks + team->rank]) {
        return false;
    }
    if (mem->device == leader_device || mem->legacy_ipc) {
        return true;
    }
    CUmemLocation where = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = leader_device};
    return gpu_cu.cuMemGetAccess(&flags, &where, (CUdeviceptr)(uintptr_t)ptr) ==
               CUDA_SUCCESS &&
           flags == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
}

/* Which buffers of an operation a GPU's share touches (tasks.h), as a mask of leaders. */
enum cipc_which { CIPC_SEND_BUF, CIPC_RECV_BUF, CIPC_SCALAR_BUF };

/* The GPUs with a part of a reduce or broadcast (cipc_share_part), as a mask. */
static uint32_t
cipc_part_gpus(enum alg_coll coll, int g, int root_k)
{
    uint32_t parts = 0;

    for (int k = 0; k < g; k++) {
        int part, nparts;
        cipc_share_part(coll, k, g, root_k, &part, &nparts);
        parts |= part >= 0 ? 1u << k : 0;
    }
    return parts;
}

static uint32_t
cipc_touchers(const struct cipc_team *team, const struct cipc_op *op, enum cipc_which which,
              enum cipc_algo algo)
{
    const uint32_t all = (1u << team->nleaders) - 1;
    const int own = team->leader_of[team->rank];
    const uint32_t mine = own >= 0 ? 1u << own : 0;
    const int root_k = op->root >= 0 && op->root < team->nranks ? team->leader_of[op->root] : -1;
    const uint32_t root_gpu = root_k >= 0 ? 1u << root_k : 0;
    const bool input = which != CIPC_RECV_BUF;

    if (algo != CIPC_ALGO_DIRECT) {
        return all; /* a ring or tree: neighbours read both buffers (levels.h) */
    }
    switch (op->coll) {
    case ALG_COLL_ALLREDUCE:
        return all;
    case ALG_COLL_REDUCE:
        return cipc_part_gpus(op->coll, team->nleaders, root_k);
    case ALG_COLL_BROADCAST:
        return input            ? all
               : own == root_k ? root_gpu
                               : cipc_part_gpus(op->coll, team->nleaders, root_k);
    case ALG_COLL_REDUCESCATTER:
    case ALG_COLL_ALLGATHER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_SCATTER:
        return input ? all : mine;
    case ALG_COLL_GATHER:
        return root_gpu;
    default: { /* SEND, RECV: the receiver's */
        int gpu = cipc_message_gpu(op->coll, team->rank, op->root, team->leader_of,
                                   team->nranks);
        return gpu >= 0 ? 1u << gpu : 0;
    }
    }
}

/* Fills buf for bytes at ptr, used by operation seq, for the leaders in `touchers` (a mask:
 * those whose share reads or writes it); *via_out says through which staging area a copy
 * reaches it, if only a copy can. kept: the caller pins what this exports for as long as the
 * memory may be used (a registration, a capture), so cudaMalloc memory may be mapped; else
 * only where it is registered already. */
static ncclResult_t
cipc_describe(struct cipc_team *team, const void *ptr, const struct gpu_mem_info *mem,
              size_t bytes, uint32_t seq, bool kept, uint32_t touchers, struct cipc_buf *buf,
              uint8_t *via_out)
{
    uintptr_t p = (uintptr_t)ptr;

    memset(buf, 0, sizeof(*buf));
    buf->ptr = p;
    *via_out = CIPC_STAGE_NONE;
    if (ptr == NULL || bytes == 0 || touchers == 0) {
        buf->how = CIPC_BUF_NONE;
        return ncclSuccess;
    }
    /* What each leader that touches it needs: from the segment, since a leader's control
     * block may not be filled in yet. */
    bool remote = false, stage = false, other_device_here = false;
    for (int k = 0; k < team->nleaders; k++) {
        if (!(touchers & (1u << k))) {
            continue;
        }
        int lr = team->leaders[k];
        bool reachable = team->reach[(size_t)lr * team->nranks + team->rank];
        if (cipc_leader_here(team, k)) {
            stage |= !cipc_leader_touches_local(team, k, ptr, mem);
            other_device_here |= team->device_here[lr] != team->device;
        } else {
            remote = true;
            stage |= mem->kind != GPU_MEM_DEVICE || !reachable;
        }
    }
    if (!stage && !remote) {
        /* Every leader touching it is in this process: any address their kernels reach
         * serves as it is. */
        buf->how = CIPC_BUF_LOCAL;
        return ncclSuccess;
    }
    if (!stage) {
        if (mem->legacy_ipc && p + bytes <= mem->alloc_base + mem->alloc_size) {
            if (!kept && !cipc_export_pinned(team, mem->alloc_id, mem->alloc_base)) {
                /* Its owner may free it at any time: no mapping may outlive the call. A
                 * leader here on another device would not reach a staging area of this
                 * device's own (its access is this device's alone). */
                buf->how = CIPC_BUF_STAGED;
                *via_out = other_device_here ? CIPC_STAGE_HOST : CIPC_STAGE_DEVICE;
                return ncclSuccess;
            }
            buf->how = CIPC_BUF_LEGACY;
            buf->key = mem->alloc_id;
            buf->offset = p - mem->alloc_base;
            buf->size = mem->alloc_size;
            return cipc_export_legacy(team, mem, seq, &buf->handle);
        }
        uintptr_t base;
        size_t size;
        uint64_t id;
        /* One cuMem allocation's mapping, whole: else (several across the buffer, a pool's
         * allocation, an id the leaders know for another mapping) staged. */
        if (mem->fd_ipc && gpu_mem_mapping_holds(ptr, bytes, &base, &size, &id) &&
            !cipc_export_clash(team, id, base)) {
            buf->how = CIPC_BUF_CUMEM;
            buf->key = id;
            buf->offset = p - base;
            buf->size = size;
            return cipc_export_cumem(team, ptr, id, base, size, seq);
        }
    }
    buf->how = CIPC_BUF_STAGED;
    *via_out = CIPC_STAGE_HOST;
    return ncclSuccess;
}

/* --- registration -------------------------------------------------------------------------- */

ncclResult_t
cipc_team_pin(struct cipc_team *team, const void *ptr, size_t bytes,
              const struct gpu_mem_info *mem, struct cipc_pin *pin)
{
    struct cipc_buf buf;
    uint8_t via;
    ncclResult_t res;

    memset(pin, 0, sizeof(*pin));
    SHIM_CHECK(cipc_post_ready(team));
    SHIM_CHECK(gpu_ctx_push(team->gpu->ctx));
    /* Named by the last operation posted: the entry is idle once that is done. */
    res = cipc_describe(team, ptr, mem, bytes, team->seq, true,
                        (1u << team->nleaders) - 1, &buf, &via);
    if (res == ncclSuccess) {
        res = cipc_export_pin_buf(team, &buf, pin);
    }
    gpu_ctx_pop();
    return res;
}

ncclResult_t
cipc_team_unpin(struct cipc_team *team, const struct cipc_pin *pin)
{
    return cipc_export_pin(team, pin->key, pin->base, -1);
}

/* --- staging -------------------------------------------------------------------------------- */

/* Frees seg; the device's context is current. The leader is told first: its mapping would
 * keep the memory. */
static ncclResult_t
cipc_stage_seg_free(struct cipc_team *team, struct cipc_stage_seg *seg, bool tell)
{
    ncclResult_t res = ncclSuccess;

    if (seg->memfd < 0) {
        if (tell) {
            res = cipc_export_release(team, seg->id, (uintptr_t)seg->dev);
        }
        gpu_mem_free((void *)(uintptr_t)seg->dev);
    } else {
        if (tell) {
            res = cipc_forget(team, CIPC_BUF_STAGED, seg->gen);
        }
        if (seg->dev != 0) {
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

/* Frees the replaced areas whose last operation is done. */
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
        if (team->stream_posting ? all_done
                                 : cipc_done_reached(team, team->rank, seg->last_seq)) {
            *link = seg->next;
            SHIM_CHECK(cipc_stage_seg_free(team, seg, true));
        } else {
            link = &seg->next;
        }
    }
    return ncclSuccess;
}

/* Pinned shared host memory of seg->size bytes, registered, its memfd sent to every leader. */
static ncclResult_t
cipc_stage_seg_host(struct cipc_team *team, struct cipc_stage_seg *seg)
{
    struct gpu_host_import shared;

    SHIM_CHECK(gpu_host_segment("ncclshim-staging", seg->size, &seg->memfd, &shared));
    seg->host = shared.host;
    seg->dev = shared.dev;
    struct cipc_channel_msg msg = {.kind = CIPC_FD_STAGING, .rank = team->rank, .key = seg->gen,
                                   .size = seg->size};
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

/* An area of st of at least bytes; the current one if it is big enough. The device's context
 * is current. */
static ncclResult_t
cipc_stage_get(struct cipc_team *team, struct cipc_stage *st, size_t bytes,
               struct cipc_stage_seg **seg_out)
{
    struct cipc_stage_seg *seg = NULL;
    ncclResult_t res;

    SHIM_CHECK(cipc_stage_trim(team, st));
    if (st->segs != NULL && st->segs->size >= bytes) {
        *seg_out = st->segs;
        return ncclSuccess;
    }
    size_t size = st->segs != NULL ? 2 * st->segs->size : CIPC_STAGE_MIN;
    size = size > bytes ? size : bytes;
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

/* --- posting -------------------------------------------------------------------------------- */

/* Bytes of op's send and receive buffers on this rank (alg.h's layouts). */
static void
cipc_op_bytes(const struct cipc_op *op, int nranks, size_t *send_out, size_t *recv_out)
{
    size_t block = op->count * kr_type_size(op->redop.type);
    size_t all = block * (size_t)nranks;

    *send_out = block;
    *recv_out = block;
    switch (op->coll) {
    case ALG_COLL_REDUCESCATTER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_SCATTER:
        *send_out = all;
        break;
    default:
        break;
    }
    switch (op->coll) {
    case ALG_COLL_ALLGATHER:
    case ALG_COLL_ALLTOALL:
    case ALG_COLL_GATHER:
        *recv_out = all;
        break;
    default:
        break;
    }
    *send_out = op->send != NULL ? *send_out : 0;
    *recv_out = op->recv != NULL ? *recv_out : 0;
}

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

static void
cipc_desc_fill(struct cipc_team *team, const struct cipc_op *op, uint32_t seq,
               uint32_t group_last, struct cipc_desc *d)
{
    d->seq = seq;
    d->group_last = group_last;
    d->match = op->match;
    d->coll = (uint8_t)op->coll;
    d->algo = (uint8_t)cipc_team_algo(team, op->coll, op->count, op->redop.type);
    d->kind = (uint8_t)op->redop.kind;
    d->pre = op->redop.kind == KR_PREMULSUM;
    d->datatype = (int32_t)op->redop.type;
    d->root = op->root;
    d->count = op->count;
    d->divisor = op->redop.divisor;
    d->area = -1;
    memcpy(&d->scalar, op->redop.scalar, sizeof(d->scalar));
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
cipc_desc_make(struct cipc_team *team, const struct cipc_op *op, uint32_t seq,
               uint32_t group_last, bool kept, struct cipc_desc *d, uint8_t via_out[3])
{
    size_t send_bytes, recv_bytes;
    struct gpu_mem_info scalar_mem;

    memset(d, 0, sizeof(*d));
    cipc_desc_fill(team, op, seq, group_last, d);
    cipc_op_bytes(op, team->nranks, &send_bytes, &recv_bytes);
    SHIM_CHECK(cipc_describe(team, op->send, &op->send_mem, send_bytes, seq, kept,
                             cipc_touchers(team, op, CIPC_SEND_BUF, d->algo), &d->send,
                             &via_out[0]));
    SHIM_CHECK(cipc_describe(team, op->recv, &op->recv_mem, recv_bytes, seq, kept,
                             cipc_touchers(team, op, CIPC_RECV_BUF, d->algo), &d->recv,
                             &via_out[1]));
    gpu_mem_query(op->scalar_dev, &scalar_mem);
    return cipc_describe(team, op->scalar_dev, &scalar_mem, kr_type_size(op->redop.type), seq,
                         kept, cipc_touchers(team, op, CIPC_SCALAR_BUF, d->algo), &d->scalar_buf,
                         &via_out[2]);
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

/* The last match numbers this rank's posts used, which stream posting goes on from. */
static void
cipc_match_note(struct cipc_team *team, const struct cipc_op *op)
{
    if (op->coll == ALG_COLL_SEND) {
        team->sent_match[op->root] = op->match;
    } else if (op->coll == ALG_COLL_RECV) {
        team->received_match[op->root] = op->match;
    } else {
        team->coll_match = op->match;
    }
}

void
cipc_post_publish(struct cipc_team *team, uint32_t last)
{
    /* The whole group at once: the leader takes a group only when all of it is there. */
    __atomic_store_n(&team->seq, last, __ATOMIC_RELEASE);
    shm_flag_post(&team->ctrls[team->rank]->posted, last);
    cipc_leaders_ring(team);
}

ncclResult_t
cipc_post_arrive(struct cipc_team *team, const struct cipc_op *ops, int nops, CUstream stream,
                 bool capturing)
{
    struct cipc_ctrl *own = team->ctrls[team->rank];
    struct cipc_desc *descs[CIPC_RING / 2];
    uint8_t via[CIPC_RING / 2][3];
    bool staging = false;
    ncclResult_t res = cipc_team_error(team);

    if (res != ncclSuccess) {
        WARN("rank %d: the communicator's device operations failed earlier (%s); only destroy "
             "or abort remain", team->rank,
             cipc_team_cause(team)[0] ? cipc_team_cause(team) : "another process failed");
        return res;
    }
    if (nops > CIPC_RING / 2) {
        WARN("a group of %d device operations on one communicator (at most %d)", nops,
             CIPC_RING / 2);
        return ncclInvalidUsage;
    }
    SHIM_CHECK(cipc_post_ready(team));
    /* The sweep asks the driver about allocations, which needs the device's context. */
    SHIM_CHECK(gpu_ctx_push(team->gpu->ctx));
    SHIM_CHECK_GOTO(cipc_exports_sweep(team), res, out);
    SHIM_CHECK_GOTO(cipc_hostpost_reap(team), res, out);
    if ((capturing || team->stream_posting) && team->leader_ctx && gpu_one_queue()) {
        /* A graph holds the wait for the leader's work, which the leader's thread enqueues
         * later: in one queue, behind that wait, for good. */
        WARN("rank %d: with CUDA_DEVICE_MAX_CONNECTIONS=1 ncclshim cannot capture device "
             "operations into a CUDA graph in the process of their GPU's device team leader "
             "(rank %d's): run the call outside the capture, or leave "
             "CUDA_DEVICE_MAX_CONNECTIONS unset", team->rank,
             team->leaders[team->leader_of[team->rank]]);
        res = ncclInvalidUsage;
        goto out;
    }
    if (capturing || team->stream_posting) {
        res = cipc_hostpost_arrive(team, ops, nops, stream, capturing);
        goto out;
    }
    uint32_t first = team->seq + 1, last = team->seq + (uint32_t)nops;
    int enqueued = -1; /* operations whose share is enqueued, once that begins */
    SHIM_CHECK_GOTO(cipc_consumed_wait(team, -1, last - CIPC_RING), res, out);
    /* On another stream than the last operations, first wait for those to be done: arrive
     * must only grow (a later write of a smaller number would undo it), and the operations of
     * a communicator complete in the order they were issued. */
    if (stream != team->last_stream && first != 1) {
        SHIM_CHECK_GOTO(cipc_done_wait(team, stream, first - 1, false), res, out);
    }
    team->last_stream = stream;
    for (int i = 0; i < nops; i++) {
        struct cipc_desc *d = &own->ring[(first + (uint32_t)i) % CIPC_RING];

        descs[i] = d;
        SHIM_CHECK_GOTO(cipc_desc_make(team, &ops[i], first + (uint32_t)i, last, false, d,
                                       via[i]), res, out);
        d->by_event = team->arrived != NULL;
        cipc_match_note(team, &ops[i]);
        staging |= via[i][0] || via[i][1] || via[i][2];
    }
    int areas[CIPC_RING / 2]; /* a leader alone on its GPU: its stream runs the share */
    if (team->own != NULL) {
        SHIM_CHECK_GOTO(cipc_ownstream_take_group(team, ops, descs, nops, false, areas), res,
                        out);
    }
    if (staging) {
        SHIM_CHECK_GOTO(cipc_stage_descs(team, ops, descs, (const uint8_t(*)[3])via, nops, last,
                                         stream), res, out_areas);
    }
    /* Enqueued before the leaders can see the group: in its context, this GPU's leader's
     * stream must only wait for what is enqueued already. */
    SHIM_CHECK_GOTO(gpu_stream_post_flag(stream, &team->arrive, last), res, out_areas);
    if (team->arrived != NULL) {
        GPU_CU_CHECK_GOTO(cuEventRecord(team->arrived, stream), res, out_areas);
    }
    if (team->own != NULL) {
        /* This rank's stream runs its GPU's share (ownstream.c). */
        SHIM_CHECK_GOTO(cipc_ownstream_enqueue(team, areas, nops, stream, &enqueued), res,
                        out_areas);
        SHIM_CHECK_GOTO(cipc_ownstream_close_group(team, stream), res, out_areas);
        for (int i = 0; i < nops; i++) {
            cipc_ownstream_give_back(team, areas[i]);
        }
    }
    cipc_post_publish(team, last);
    team->pending_wait = last;
    res = ncclSuccess;
    goto out;
out_areas:
    /* Never posted. An area a stream may read is opened with nothing to do (and comes back
     * once that stream passed it); the others come back at once. */
    for (int i = 0; team->own != NULL && i < nops; i++) {
        if (i <= enqueued) {
            cipc_ownstream_open_empty(team, areas[i]);
            cipc_ownstream_give_back(team, areas[i]);
        } else {
            cipc_ownstream_drop(team, areas[i]);
        }
    }
out:
    gpu_ctx_pop();
    return res;
}

ncclResult_t
cipc_post_wait(struct cipc_team *team, CUstream stream)
{
    ncclResult_t res;

    if (team->posted_by_host) {
        team->posted_by_host = false; /* its host function waits for done itself */
        return ncclSuccess;
    }
    bool failed = false;
    if (team->leader_ctx) {
        /* Nothing on a stream of this context may wait for work its leader's stream has not
         * been given yet: with one hardware queue (CUDA_DEVICE_MAX_CONNECTIONS=1), or streams
         * sharing one, that work would queue behind the wait. So wait here until this GPU's
         * leader took the group (NCCL's calls, too, may wait for the other ranks to arrive).
         * Other GPUs' leaders run in contexts of their own. */
        res = cipc_consumed_wait(team, team->leader_of[team->rank], team->pending_wait);
        if (res != ncclSuccess && __atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
            return res;
        }
        /* The team failed (or was revoked): the error is the communicator's
         * (ncclCommGetAsyncError), and the stream waits on done, which only abort, destroy or
         * revoke write now. */
        failed = res != ncclSuccess;
    }
    SHIM_CHECK(gpu_ctx_push(team->gpu->ctx));
    res = cipc_done_wait(team, stream, team->pending_wait, failed);
    if (res != ncclSuccess) {
        goto out;
    }
    SHIM_CHECK_GOTO(gpu_stream_mark(&team->gates, stream), res, out);
    res = cipc_stage_copy_out(team, stream);
out:
    gpu_ctx_pop();
    return res;
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
cipc_team_persistent_bytes(const struct cipc_team *team)
{
    return team->own != NULL ? cipc_ownstream_device_bytes(team) : 0;
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
cipc_post_quiesce(struct cipc_team *team)
{
    gpu_stream_marks_wait(&team->gates, 0);
    struct cipc_stage *stages[2] = {team->stage, team->dev_stage};
    for (int i = 0; i < 2; i++) {
        if (stages[i] != NULL && stages[i]->free_event != NULL) {
            gpu_cu.cuEventSynchronize(stages[i]->free_event);
        }
    }
}

void
cipc_post_free(struct cipc_team *team)
{
    if (team->arrived != NULL) {
        gpu_cu.cuEventDestroy(team->arrived);
    }
    gpu_stream_marks_free(&team->gates);
    /* Device staging is freed in its context; without a device there is none. */
    bool pushed = team->gpu != NULL && gpu_ctx_push(team->gpu->ctx) == ncclSuccess;
    cipc_stage_destroy(team, team->stage);
    cipc_stage_destroy(team, team->dev_stage);
    if (pushed) {
        gpu_ctx_pop();
    }
    team->stage = team->dev_stage = NULL;
    cipc_exports_free(team);
    free(team->copies);
    for (int k = 0; k < CIPC_MAX_LEADERS; k++) {
        if (team->channel_fds[k] >= 0) {
            close(team->channel_fds[k]);
        }
    }
}
