/* SPDX-License-Identifier: Apache-2.0 */
/*
 * An operation's kernel tasks (tasks.h).
 */
#include "tasks.h"

#include <string.h>

#include "base/check.h"
#include "kernels/device.h"

static struct kr_dev_src
cipc_src(const struct cipc_work *w, int rank, uint64_t ptr)
{
    return (struct kr_dev_src){
        .ptr = ptr,
        .pre = w->redop.kind == KR_PREMULSUM && w->pre[rank],
        .scalar = w->scalar[rank],
        .scalar_ptr = w->scalar_ptr[rank],
    };
}

void
cipc_share_part(enum alg_coll coll, int k, int g, int root_gpu, int *part, int *nparts)
{
    *part = k;
    *nparts = g;
    if ((coll == ALG_COLL_REDUCE && g > 1) || coll == ALG_COLL_BROADCAST) {
        *part = k == root_gpu ? -1 : k < root_gpu ? k : k - 1;
        *nparts = g - 1;
    }
}

void
cipc_work_whole(struct cipc_work *w)
{
    for (int r = 0; r < w->nranks; r++) {
        w->owns[r] = 1;
        w->on_root_gpu[r] = 1;
    }
    w->part = 0;
    w->nparts = 1;
}

/* Reductions. */
static ncclResult_t
cipc_tasks_reduce(const struct cipc_work *w, struct kr_dev_launch *l)
{
    const int n = w->nranks;
    const size_t es = kr_type_size(w->redop.type);
    const uint64_t block = w->count * es;
    struct kr_dev_src srcs[CIPC_MAX_RANKS];
    uint64_t dsts[CIPC_MAX_RANKS];

    if (w->coll == ALG_COLL_REDUCESCATTER) {
        for (int j = 0; j < n; j++) {
            if (!w->owns[j]) {
                continue;
            }
            for (int r = 0; r < n; r++) {
                srcs[r] = cipc_src(w, r, w->send[r] + (uint64_t)j * block);
            }
            SHIM_CHECK(kr_dev_add(l, srcs, n, &w->recv[j], 1, w->count));
        }
        return ncclSuccess;
    }
    if (w->part < 0) {
        return ncclSuccess;
    }
    size_t lo, hi;
    cipc_part_range(w->count, es, w->part, w->nparts, &lo, &hi);
    int ndst = 0;
    for (int r = 0; r < n; r++) {
        srcs[r] = cipc_src(w, r, w->send[r] + lo * es);
        if (w->coll == ALG_COLL_ALLREDUCE || r == w->root) {
            dsts[ndst++] = w->recv[r] + lo * es;
        }
    }
    return kr_dev_add(l, srcs, n, dsts, ndst, hi - lo);
}

static ncclResult_t
cipc_copy(struct kr_dev_launch *l, uint64_t src, const uint64_t *dsts, int ndst, uint64_t bytes)
{
    struct kr_dev_src s = {.ptr = src};
    return kr_dev_add(l, &s, 1, dsts, ndst, bytes);
}

/* Broadcast: this GPU's part into the outputs of the ranks not on the root's GPU; the root's
 * GPU copies the whole input into its own ranks' outputs. */
static ncclResult_t
cipc_tasks_broadcast(const struct cipc_work *w, struct kr_dev_launch *l, uint64_t block)
{
    uint64_t dsts[CIPC_MAX_RANKS];
    int ndst = 0;

    if (w->owns[w->root]) {
        for (int r = 0; r < w->nranks; r++) {
            if (w->owns[r]) {
                dsts[ndst++] = w->recv[r];
            }
        }
        return cipc_copy(l, w->send[w->root], dsts, ndst, block);
    }
    if (w->part < 0) {
        return ncclSuccess;
    }
    size_t lo, hi;
    cipc_part_range(block, 1, w->part, w->nparts, &lo, &hi);
    for (int r = 0; r < w->nranks; r++) {
        if (!w->on_root_gpu[r]) {
            dsts[ndst++] = w->recv[r] + lo;
        }
    }
    return cipc_copy(l, w->send[w->root] + lo, dsts, ndst, hi - lo);
}

static ncclResult_t
cipc_tasks_copy(const struct cipc_work *w, struct kr_dev_launch *l)
{
    const int n = w->nranks;
    const uint64_t block = w->count * kr_type_size(w->redop.type);
    uint64_t dsts[CIPC_MAX_RANKS];

    switch (w->coll) {
    case ALG_COLL_BROADCAST:
        return cipc_tasks_broadcast(w, l, block);
    case ALG_COLL_ALLGATHER:
        for (int j = 0; j < n; j++) {
            int ndst = 0;
            for (int r = 0; r < n; r++) {
                if (w->owns[r]) {
                    dsts[ndst++] = w->recv[r] + (uint64_t)j * block;
                }
            }
            SHIM_CHECK(cipc_copy(l, w->send[j], dsts, ndst, block));
        }
        return ncclSuccess;
    case ALG_COLL_ALLTOALL:
        for (int q = 0; q < n; q++) {
            for (int p = 0; p < n && w->owns[q]; p++) {
                uint64_t dst = w->recv[q] + (uint64_t)p * block;
                SHIM_CHECK(cipc_copy(l, w->send[p] + (uint64_t)q * block, &dst, 1, block));
            }
        }
        return ncclSuccess;
    case ALG_COLL_GATHER:
        for (int p = 0; p < n && w->owns[w->root]; p++) {
            uint64_t dst = w->recv[w->root] + (uint64_t)p * block;
            SHIM_CHECK(cipc_copy(l, w->send[p], &dst, 1, block));
        }
        return ncclSuccess;
    case ALG_COLL_SCATTER:
        for (int p = 0; p < n; p++) {
            if (w->owns[p]) {
                SHIM_CHECK(cipc_copy(l, w->send[w->root] + (uint64_t)p * block, &w->recv[p], 1,
                                     block));
            }
        }
        return ncclSuccess;
    case ALG_COLL_SEND:
        return cipc_copy(l, w->send[0], &w->recv[0], 1, block);
    default:
        WARN("cudaipc: collective %d has no kernel tasks", (int)w->coll);
        return ncclInternalError;
    }
}

int
cipc_message_gpu(enum alg_coll coll, int rank, int peer, const int8_t *leader_of, int nranks)
{
    int receiver = coll == ALG_COLL_SEND ? peer : rank;
    return receiver >= 0 && receiver < nranks ? leader_of[receiver] : -1;
}

ncclResult_t
cipc_tasks_launch(const struct cipc_work *work, CUstream stream, const struct gpu_device *device)
{
    bool reduces = cipc_reduces(work->coll);
    struct kr_dev_launch l;

    kr_dev_begin(&l, stream, device, reduces ? &work->redop : NULL);
    SHIM_CHECK(reduces ? cipc_tasks_reduce(work, &l) : cipc_tasks_copy(work, &l));
    return kr_dev_end(&l);
}

void
cipc_tasks_shape(enum alg_coll coll, size_t count, ncclDataType_t type, int nranks,
                 uint64_t *task_bytes_out, uint32_t *tasks_out)
{
    bool per_rank = coll == ALG_COLL_ALLGATHER || coll == ALG_COLL_ALLTOALL ||
                    coll == ALG_COLL_GATHER;

    *task_bytes_out = (uint64_t)count * kr_type_size(type);
    *tasks_out = per_rank ? (uint32_t)nranks : 1;
}

/* Where the leader's GPU reaches ref's place in work's buffers, unit_bytes per unit. */
static uint64_t
cipc_level_addr(const struct cipc_work *w, const struct cipc_lref *ref, size_t unit_bytes)
{
    uint64_t base = ref->buf == CIPC_LSEND ? w->send[ref->rank] : w->recv[ref->rank];
    return base + ref->off * unit_bytes;
}

/* A ring or tree schedule's tasks for this GPU, level by level. */
static ncclResult_t
cipc_tasks_levels(const struct cipc_work *w, struct kr_dev_launch *l,
                  struct cipc_levels *levels)
{
    size_t units, unit_bytes;

    cipc_levels_units(w->coll, w->count, w->redop.type, &units, &unit_bytes);
    SHIM_CHECK(cipc_levels_build(w->algo, w->coll, units, unit_bytes, w->nranks, w->level_rank,
                                 w->root, levels));
    for (int i = 0; i < levels->ntasks; i++) {
        const struct cipc_ltask *t = &levels->tasks[i];
        struct kr_dev_src srcs[3];
        uint64_t dst = cipc_level_addr(w, &t->dst, unit_bytes);
        for (int k = 0; k < t->nsrc; k++) {
            uint64_t ptr = cipc_level_addr(w, &t->src[k], unit_bytes);
            srcs[k] = t->src[k].pre ? cipc_src(w, t->src[k].rank, ptr)
                                    : (struct kr_dev_src){.ptr = ptr};
        }
        if (t->nsrc == 1 && srcs[0].ptr == dst) {
            continue; /* an own block in place */
        }
        kr_dev_set_level(l, t->level);
        kr_dev_set_post(l, t->post);
        SHIM_CHECK(kr_dev_add(l, srcs, t->nsrc, &dst, 1, t->count));
    }
    return ncclSuccess;
}

ncclResult_t
cipc_tasks_collect(const struct cipc_work *work, const struct gpu_device *device,
                   uint32_t max_tasks, struct kr_dev_batch *batch, struct cipc_levels *levels)
{
    bool reduces = cipc_reduces(work->coll);
    struct kr_dev_launch l;
    uint32_t most = 0;

    levels->nlevels = 1;
    levels->ntasks = levels->ndeps = 0;
    kr_dev_begin_collect(&l, device, reduces ? &work->redop : NULL);
    if (work->algo != CIPC_ALGO_DIRECT) {
        SHIM_CHECK(cipc_tasks_levels(work, &l, levels));
    } else {
        SHIM_CHECK(reduces ? cipc_tasks_reduce(work, &l) : cipc_tasks_copy(work, &l));
    }
    for (uint32_t i = 0, run = 0; i < l.batch.ntasks; i++) {
        run = i > 0 && l.batch.tasks[i].level == l.batch.tasks[i - 1].level ? run + 1 : 1;
        most = run > most ? run : most;
    }
    if (most > max_tasks) {
        WARN("cudaipc: a GPU's share of collective %d is %u kernel tasks at one level, more "
             "than the %u its launch was sized for", (int)work->coll, most, max_tasks);
        return ncclInternalError;
    }
    memcpy(batch, &l.batch, sizeof(*batch));
    return ncclSuccess;
}
