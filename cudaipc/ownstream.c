/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The `own` runner (runner.h): a leader rank alone on its GPU runs its GPU's share on its own
 * streams.
 *
 * Why. A GPU's leader enqueues its share on a stream of its own once every rank posted
 * (leader.c). A rank in that stream's context cannot make its stream wait for that work at its
 * call: a stream of a context may only wait for work already enqueued there (with one hardware
 * queue, CUDA_DEVICE_MAX_CONNECTIONS=1, a wait enqueued before the work it waits for blocks
 * that work for good). So such a call waits on the host for the other ranks, and a CUDA graph
 * cannot hold it with one queue. On a GPU whose only rank is its leader (one rank per GPU, as
 * PyTorch runs), every operation of the leader involves that rank, so the rank's call enqueues
 * the work itself, before anyone knows what it is:
 *
 *   the rank's stream     write arrive | per operation of the group: wait go >= OPEN | copy
 *                         its work area to the device | kr_dev_from over it
 *                         (device_abi.h) | kr_dev_signal over it | write go = PASSED
 *   the leader's thread   once every rank posted: the share's batch into the area, and the
 *                         done words it completes into its signals; once every rank taking
 *                         part arrived (their arrive words, read from the host): go = OPEN
 *
 * The stream waits only for words the host writes or other processes' streams write, never
 * for work of its own context that is not enqueued yet: it holds with one queue, and in a
 * graph.
 *
 * Levels. A ring or tree schedule between the GPUs (levels.h) runs as several launches of
 * kr_dev_from, one per level of the batch, each after a gate of the area's: the call knows
 * from the operation alone how many levels its GPU runs (the group's most, for every area).
 * The stream counts the levels it ran (level_done, after a fence); the thread publishes
 * them in the rank's control block (`level`: the collective's number times 64 plus the
 * levels run) and opens a gate once every GPU that level waits for has published the level
 * it waits for. Host-side waits, as for arrive: no kernel spins on another GPU's flag.
 *
 * Work areas (areas.h). One per operation in flight, named in the operation's descriptor.
 *
 * Done words. Taking operations tells the thread which ranks' done words an operation
 * completes (leader.c). A rank's word waits for the newest operation built with some of its
 * share (operations run in their numbers' order, so every older one is done by then), and for
 * nothing else: it goes into that operation's signals if its area is not open yet, else it is
 * written from the host once the stream signalled that operation done (leader_done, which
 * every operation's signals set to its number), only ever forward. Waiting for any newer
 * operation could wait for a rank that waits for this word. leader_done is its signals'
 * words[0], which kr_dev_signal writes last, after a fence (device_abi.h): once the thread
 * sees it, every done word of that operation (and of every older one) is written, so the
 * host's newer value is never overwritten by the kernel's older one, which would move the
 * word backwards and leave its rank's stream waiting for good.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "kernels/device.h"

#include "areas.h"
#include "internal.h"
#include "runner.h"
#include "tasks.h"

/* The waits of a ring or tree schedule's levels (levels.h), for the collective `match`. */
struct cipc_own_levels {
    uint32_t match;
    int ndeps;
    struct cipc_ldep deps[CIPC_LEVEL_DEPS];
};

/* An operation built whose area is not open yet: the ranks (and their numbers) whose arrive
 * it waits for, and its levels' waits. */
struct cipc_own_pending {
    int area;
    uint32_t seq;                /* the leader rank's number of it */
    int nneeds;
    int8_t need_rank[CIPC_MAX_RANKS];
    uint32_t need_seq[CIPC_MAX_RANKS];
    struct cipc_own_levels levels;
};

/* An open area of several levels: the next gate to open, and the levels published. */
struct cipc_own_running {
    int area;
    uint32_t opened;             /* gates open: levels [0, opened) may run */
    uint32_t published;          /* levels run, as the control block's `level` says */
    struct cipc_own_levels levels;
};

/* A done word to write from the host once leader_done reaches need. */
struct cipc_own_deferred {
    int rank;
    uint32_t value, need;
};

struct cipc_ownstream {
    struct cipc_area_pool *pool; /* once ready */
    struct gpu_flag leader_done; /* its stream's place run, as the device reaches it */
    CUevent done_event;          /* after the last group's signals, on its stream */
    pthread_mutex_t lock;        /* the thread's building against a release */
    bool released;               /* every area opened for good: build nothing more */
    /* The leader's thread. */
    struct cipc_own_pending pending[CIPC_RING];
    int npending;
    struct cipc_own_running running[CIPC_RING];
    int nrunning;
    int building;                /* pending[building] is being built; -1 */
    struct cipc_levels levels;   /* the schedule of the one being built (levels.h) */
    bool any_built;
    uint32_t newest;             /* the newest place built (for reports) */
    bool in_group;               /* the leader rank's group being built: its last number */
    uint32_t group_last;
    uint32_t group_built;        /* its places built so far */
    /* Per rank: the newest operation built that runs some of its share here (its done word
     * waits for that one's kernels, and no other's). */
    bool has_last[CIPC_MAX_RANKS];
    uint32_t last_for[CIPC_MAX_RANKS];
    struct cipc_own_deferred *deferred;
    int ndeferred, deferred_cap;
};

/* --- the team, and this rank's calls --------------------------------------------------------- */

static struct cipc_ownstream *
cipc_own(const struct cipc_team *team)
{
    return team->share;
}

static ncclResult_t
cipc_own_create(struct cipc_team *team)
{
    struct cipc_ownstream *own;

    SHIM_CHECK(shim_calloc(&own, 1));
    pthread_mutex_init(&own->lock, NULL);
    own->building = -1;
    team->share = own;
    return ncclSuccess;
}

static void
cipc_own_destroy(struct cipc_team *team)
{
    struct cipc_ownstream *own = cipc_own(team);

    if (own == NULL) {
        return;
    }
    if (own->done_event != NULL) {
        gpu_cu.cuEventDestroy(own->done_event);
    }
    if (own->pool != NULL) {
        cipc_areas_unprepare(own->pool);
    }
    free(own->deferred);
    pthread_mutex_destroy(&own->lock);
    free(own);
    team->share = NULL;
}

static ncclResult_t
cipc_own_ready(struct cipc_team *team, const struct gpu_device *gpu)
{
    struct cipc_ownstream *own = cipc_own(team);

    if (own->pool == NULL) {
        SHIM_CHECK(cipc_areas_prepare(gpu, &own->pool));
    }
    if (own->done_event == NULL) {
        GPU_CU_CHECK(cuEventCreate(&own->done_event, CU_EVENT_DISABLE_TIMING));
    }
    return ncclSuccess;
}

static ncclResult_t
cipc_own_may_post_from_stream(struct cipc_team *team)
{
    (void)team; /* its streams wait only for words the host or other processes write */
    return ncclSuccess;
}

/* Its rank's stream waits only for this rank's operations (work areas, gates, done words). */
static bool
cipc_own_quiet(const struct cipc_team *team)
{
    (void)team;
    return true;
}

static uint64_t
cipc_own_persistent_bytes(const struct cipc_team *team)
{
    return cipc_own(team)->pool != NULL ? cipc_areas_device_bytes() : 0;
}

/* The largest task and the most tasks of a group's operations: the thread may give an area
 * any operation of the group, so each launch is sized for the largest. */
static void
cipc_own_group_shape(const struct cipc_team *team, const struct cipc_op *ops, int nops,
                     uint64_t *bytes_out, uint32_t *tasks_out)
{
    *bytes_out = 0;
    *tasks_out = 1;
    for (int i = 0; i < nops; i++) {
        uint64_t task_bytes;
        uint32_t tasks;
        cipc_tasks_shape(ops[i].coll, ops[i].count, ops[i].redop.type, team->nranks,
                         &task_bytes, &tasks);
        *bytes_out = task_bytes > *bytes_out ? task_bytes : *bytes_out;
        *tasks_out = tasks > *tasks_out ? tasks : *tasks_out;
    }
}

/* The most levels this GPU runs of a group's operations, as their descriptors chose them
 * (levels.h); *follow_out: whether any runs a ring or tree. */
static uint32_t
cipc_own_group_levels(const struct cipc_team *team, const struct cipc_op *ops,
                      struct cipc_desc *const *descs, int nops, uint32_t *follow_out)
{
    uint32_t levels = 1;

    *follow_out = 0;
    for (int i = 0; i < nops; i++) {
        enum cipc_algo algo = (enum cipc_algo)descs[i]->algo;
        size_t units, unit_bytes;
        cipc_levels_units(ops[i].coll, ops[i].count, ops[i].redop.type, &units, &unit_bytes);
        uint32_t l = (uint32_t)cipc_levels_count(algo, ops[i].coll, units, unit_bytes,
                                                 team->nranks, team->rank, ops[i].root);
        levels = l > levels ? l : levels;
        *follow_out |= algo != CIPC_ALGO_DIRECT;
    }
    return levels;
}

/* An area taken for an operation that is never posted: back at once. */
static void
cipc_own_drop(struct cipc_ownstream *own, int area)
{
    __atomic_store_n(&own->pool->host[area].go, CIPC_AREA_PASSED, __ATOMIC_RELEASE);
    cipc_areas_give_back(own->pool, area);
}

/* A work area for each operation, held and empty, named in its descriptor, its launch sized for
 * the largest of the group and its levels for the most (as each descriptor's schedule has
 * them): the thread may give any area any operation of the group. Captured: kept while the
 * graph lives, and held again at each launch. */
static ncclResult_t
cipc_own_take(struct cipc_team *team, const struct cipc_op *ops, struct cipc_desc *const *descs,
              int nops, enum cipc_post_from from)
{
    struct cipc_ownstream *own = cipc_own(team);
    struct cipc_area_pool *pool = own->pool;
    uint64_t bytes;
    uint32_t tasks, follow;

    cipc_own_group_shape(team, ops, nops, &bytes, &tasks);
    const uint32_t levels = cipc_own_group_levels(team, ops, descs, nops, &follow);
    for (int i = 0; i < nops; i++) {
        int area = cipc_areas_take(pool, from == CIPC_FROM_CAPTURE);
        if (area < 0) {
            for (int j = 0; j < i; j++) {
                cipc_own_drop(own, descs[j]->area);
                descs[j]->area = -1;
            }
            WARN("rank %d: more than %d device operations in flight or captured into CUDA "
                 "graphs on this GPU in this process", team->rank, CIPC_AREAS);
            return ncclInvalidUsage;
        }
        pool->host[area].tasks = tasks;
        pool->host[area].task_bytes = bytes;
        pool->host[area].levels = levels;
        pool->host[area].follow = follow;
        descs[i]->area = area;
    }
    return ncclSuccess;
}

/* Per area, after arrive: wait go >= OPEN | copy the area to the device | kr_dev_from over it,
 * a level at a time, each after its gate, counting the levels run | kr_dev_signal over it |
 * go = PASSED. */
static ncclResult_t
cipc_own_enqueue_runs(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                      CUstream stream, int *enqueued)
{
    struct cipc_area_pool *pool = cipc_own(team)->pool;

    for (*enqueued = 0; *enqueued < nops; (*enqueued)++) {
        int area = descs[*enqueued]->area;
        struct cipc_area *a = &pool->host[area];
        struct gpu_flag go = cipc_areas_word(pool, &a->go);
        struct gpu_flag ran = cipc_areas_word(pool, &a->level_done);
        CUdeviceptr work = cipc_areas_work_dev(pool, area);
        SHIM_CHECK(gpu_stream_wait_flag(stream, &go, CIPC_AREA_OPEN));
        GPU_CU_CHECK(cuMemcpyAsync(work, cipc_areas_dev_of(pool, &a->work),
                                   sizeof(struct cipc_area_work), stream));
        /* The write's fence makes a level's results visible to the other GPUs first. */
        for (uint32_t level = 0; level < a->levels; level++) {
            struct gpu_flag gate = cipc_areas_word(pool, &a->level_go[level]);
            if (level > 0) {
                SHIM_CHECK(gpu_stream_wait_flag(stream, &gate, CIPC_AREA_OPEN));
            }
            SHIM_CHECK(kr_dev_launch_from(stream, team->gpu, a->task_bytes, a->tasks,
                                          work + offsetof(struct cipc_area_work, batch), level));
            if (a->follow) {
                SHIM_CHECK(gpu_stream_post_flag(stream, &ran, level + 1));
            }
        }
        SHIM_CHECK(kr_dev_signal_from(stream, team->gpu,
                                      work + offsetof(struct cipc_area_work, signals)));
        SHIM_CHECK(gpu_stream_post_flag(stream, &go, CIPC_AREA_PASSED));
    }
    return ncclSuccess;
}

/* Nothing before the group is posted: its areas run once every team of the caller's group
 * arrived (cipc_own_launch). */
static ncclResult_t
cipc_own_enqueue(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                 CUstream stream, enum cipc_post_from from, int *enqueued)
{
    (void)team, (void)descs, (void)nops, (void)stream, (void)from;
    *enqueued = -1;
    return ncclSuccess;
}

/* The runs of the group's areas, whose waits are for other ranks' arrive (in a clique of one
 * process, enqueued on this context's streams before this: runner.h); a call's group then
 * records the event the rank's waits follow (cipc_own_follow). An area is given back once
 * enqueued, reused once its stream passed it; a captured one is kept. The group is posted:
 * whatever failed, the areas not enqueued open with nothing to do (the team's error says what
 * went wrong). */
static ncclResult_t
cipc_own_launch(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                CUstream stream, enum cipc_post_from from)
{
    struct cipc_ownstream *own = cipc_own(team);
    int enqueued;
    ncclResult_t res = cipc_own_enqueue_runs(team, descs, nops, stream, &enqueued);

    if (res == ncclSuccess && from == CIPC_FROM_CALL) {
        CUresult cu = gpu_cu.cuEventRecord(own->done_event, stream);
        if (cu != CUDA_SUCCESS) {
            res = gpu_cu_fail(cu, "cuEventRecord(a group's run)", __FILE__, __LINE__);
        }
    }
    for (int i = enqueued + (res != ncclSuccess); res != ncclSuccess && i < nops; i++) {
        cipc_areas_open_empty(own->pool, descs[i]->area);
    }
    for (int i = 0; i < nops && from != CIPC_FROM_CAPTURE; i++) {
        cipc_areas_give_back(own->pool, descs[i]->area);
    }
    return res;
}

static void
cipc_own_untake(struct cipc_team *team, struct cipc_desc *const *descs, int nops, int enqueued)
{
    struct cipc_ownstream *own = cipc_own(team);

    /* An area a stream may read is opened with nothing to do (and comes back once that
     * stream passed it); the others come back at once. */
    for (int i = 0; i < nops; i++) {
        if (descs[i]->area < 0) {
            continue;
        }
        if (i <= enqueued) {
            cipc_areas_open_empty(own->pool, descs[i]->area);
            cipc_areas_give_back(own->pool, descs[i]->area);
        } else {
            cipc_own_drop(own, descs[i]->area);
        }
    }
}

/* The rank's own stream ran its GPU's share: its streams follow the event after the last
 * group's signals (its areas open with nothing to do once the team failed, so flags_only
 * changes nothing). */
static ncclResult_t
cipc_own_follow(struct cipc_team *team, CUstream stream, uint32_t seq, bool flags_only)
{
    (void)seq, (void)flags_only;
    GPU_CU_CHECK(cuStreamWaitEvent(stream, cipc_own(team)->done_event, 0));
    return ncclSuccess;
}

/* --- the leader's thread ------------------------------------------------------------------ */

/* The newest place the stream signalled done. Seen, every other word of its signals (and of
 * every older place's) is written too: kr_dev_signal writes words[0] last, after a fence. */
static uint32_t
cipc_own_leader_done(const struct cipc_team *team)
{
    return __atomic_load_n(&team->ctrls[team->rank]->leader_done, __ATOMIC_ACQUIRE);
}

static ncclResult_t
cipc_own_activate(struct cipc_team *team, const struct gpu_device *gpu,
                  const struct gpu_flag *leader_done)
{
    (void)gpu;
    cipc_own(team)->leader_done = *leader_done;
    return ncclSuccess;
}

static void
cipc_own_quiesce(struct cipc_team *team, bool abort)
{
    (void)team, (void)abort; /* the rank's streams passed their gates (cipc_post_quiesce) */
}

/* The leader rank's operation d (of the group from group_first) is built next (begin .. end,
 * with the lock held), into the group's next place (*pos_out: its number in the rank's
 * stream order, which the stream writes to leader_done once run). */
static ncclResult_t
cipc_own_begin(struct cipc_team *team, const struct cipc_desc *d, uint32_t group_first,
               uint32_t *pos_out)
{
    struct cipc_ownstream *own = cipc_own(team);

    /* The group's areas in the order its operations are built (their matching order, which no
     * rank's stream contradicts), whatever their order in the group. */
    if (!own->in_group || own->group_last != d->group_last) {
        own->in_group = true;
        own->group_last = d->group_last;
        own->group_built = 0;
    }
    uint32_t pos = group_first + own->group_built++;
    const struct cipc_desc *at = &team->ctrls[team->rank]->ring[pos % CIPC_RING];
    if (at->area < 0 || at->area >= CIPC_AREAS || own->npending == CIPC_RING ||
        (int32_t)(d->group_last - pos) < 0) {
        WARN("cudaipc: rank %d's operation %u in place %u names work area %d (%d being built)",
             team->rank, d->seq, pos, at->area, own->npending);
        return ncclInternalError;
    }
    /* The area is held and empty: its call took it so, or each launch's host function holds
     * it again. */
    struct cipc_own_pending *p = &own->pending[own->npending];
    p->area = at->area;
    p->seq = pos;
    p->nneeds = 0;
    p->levels.ndeps = 0;
    own->building = own->npending++;
    if (!own->any_built || (int32_t)(pos - own->newest) > 0) {
        own->newest = pos;
        own->any_built = true;
    }
    /* The stream says it ran this place: the word deferred writes and mappings wait for. It
     * must be words[0], which kr_dev_signal writes after every other word of the list and a
     * fence: seeing it, the thread may write the done words of that list from the host. */
    struct kr_dev_signals *s = &own->pool->host[at->area].work.signals;
    s->words[0] = (struct kr_dev_signal_word){.addr = own->leader_done.dev, .value = pos};
    s->n = 1;
    *pos_out = pos;
    return ncclSuccess;
}

/* Its share, as a batch in the area. */
static ncclResult_t
cipc_own_run(struct cipc_team *team, const struct cipc_work *w)
{
    struct cipc_ownstream *own = cipc_own(team);
    struct cipc_own_pending *p = &own->pending[own->building];
    struct cipc_area *a = &own->pool->host[p->area];
    struct cipc_levels *levels = &own->levels;

    SHIM_CHECK(cipc_tasks_collect(w, team->gpu, a->tasks, &a->work.batch, levels));
    if ((uint32_t)levels->nlevels > a->levels) {
        WARN("cudaipc: rank %d's collective %u has %d levels here, its call enqueued %u (did "
             "the ranks choose different schedules?)", team->rank, w->match, levels->nlevels,
             a->levels);
        return ncclInternalError;
    }
    p->levels.match = w->match;
    p->levels.ndeps = levels->ndeps;
    memcpy(p->levels.deps, levels->deps, (size_t)levels->ndeps * sizeof(levels->deps[0]));
    return ncclSuccess;
}

/* The ranks it waits for: their arrive words, which the thread reads before it opens the area
 * (the leader rank's own stream arrived before it runs the share). */
static ncclResult_t
cipc_own_arrival(struct cipc_team *team, int rank, const struct cipc_desc *d)
{
    struct cipc_own_pending *p = &cipc_own(team)->pending[cipc_own(team)->building];

    if (rank != team->rank) {
        p->need_rank[p->nneeds] = (int8_t)rank;
        p->need_seq[p->nneeds++] = d->seq;
    }
    return ncclSuccess;
}

/* The pending entry of operation seq, or NULL where its area is open. */
static struct cipc_own_pending *
cipc_own_pending_of(struct cipc_ownstream *own, uint32_t seq)
{
    for (int i = 0; i < own->npending; i++) {
        if (own->pending[i].seq == seq) {
            return &own->pending[i];
        }
    }
    return NULL;
}

/* Rank's operation is taken: within a build, rank's done word waits for that build. */
static void
cipc_own_took(struct cipc_team *team, int rank)
{
    struct cipc_ownstream *own = cipc_own(team);

    if (own->building < 0) {
        return; /* taken with no work here */
    }
    uint32_t seq = own->pending[own->building].seq;
    if (!own->has_last[rank] || (int32_t)(seq - own->last_for[rank]) > 0) {
        own->last_for[rank] = seq;
        own->has_last[rank] = true;
    }
}

static void
cipc_own_add_signal(struct kr_dev_signals *s, uint64_t addr, uint32_t value)
{
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->words[i].addr == addr) {
            if ((int32_t)(value - s->words[i].value) > 0) {
                s->words[i].value = value;
            }
            return;
        }
    }
    s->words[s->n++] = (struct kr_dev_signal_word){.addr = addr, .value = value};
}

/* Rank's done word (as the leader's GPU reaches it) goes with the newest build holding some of
 * its share: into its signals if its area is not open yet, else from the host once it ran. */
static ncclResult_t
cipc_own_done(struct cipc_team *team, int rank, const struct gpu_flag *done, uint32_t value)
{
    struct cipc_ownstream *own = cipc_own(team);
    uint32_t need = own->last_for[rank];
    struct cipc_own_pending *p = own->has_last[rank] ? cipc_own_pending_of(own, need) : NULL;

    if (p != NULL) {
        /* A word per rank and leader_done: at most KR_DEV_MAX_SIGNALS. */
        cipc_own_add_signal(&own->pool->host[p->area].work.signals, done->dev, value);
        return ncclSuccess;
    }
    /* The stream signalled need: no word of its signals is still to land (words[0] last). */
    if (!own->has_last[rank] || (int32_t)(cipc_own_leader_done(team) - need) >= 0) {
        gpu_flag_release(done, value);
        return ncclSuccess;
    }
    SHIM_CHECK(shim_grow(&own->deferred, own->ndeferred, &own->deferred_cap, 64));
    own->deferred[own->ndeferred++] =
        (struct cipc_own_deferred){.rank = rank, .value = value, .need = need};
    return ncclSuccess;
}

static void
cipc_own_end(struct cipc_team *team)
{
    cipc_own(team)->building = -1;
}


/* Writes the deferred done words whose operation the stream ran (all: every one); whether any
 * (with the lock). */
static bool
cipc_own_write_deferred(struct cipc_team *team, bool all)
{
    struct cipc_ownstream *own = cipc_own(team);
    uint32_t done = cipc_own_leader_done(team);
    bool wrote = false;

    for (int i = 0; i < own->ndeferred;) {
        const struct cipc_own_deferred *d = &own->deferred[i];
        if (!all && (int32_t)(done - d->need) < 0) {
            i++;
            continue;
        }
        struct gpu_flag word = {.host = &team->ctrls[d->rank]->done[team->lead].value};
        gpu_flag_release(&word, d->value);
        own->deferred[i] = own->deferred[--own->ndeferred];
        wrote = true;
    }
    return wrote;
}

/* The value of the control block's `level` once this GPU ran `levels` levels of collective
 * match: it only grows, collectives being taken, and run, in their numbers' order. */
static uint32_t
cipc_own_level_value(uint32_t match, uint32_t levels)
{
    return match * 64u + levels;
}

/* Whether the waits of level `level` of r are met: the other GPUs ran those levels. */
static bool
cipc_own_level_ready(const struct cipc_team *team, const struct cipc_own_levels *lv,
                     uint32_t level)
{
    for (int i = 0; i < lv->ndeps; i++) {
        const struct cipc_ldep *d = &lv->deps[i];
        if (d->level != level) {
            continue;
        }
        uint32_t ran = __atomic_load_n(&team->ctrls[d->rank]->level, __ATOMIC_ACQUIRE);
        if ((int32_t)(ran - cipc_own_level_value(lv->match, d->done + 1u)) < 0) {
            return false;
        }
    }
    return true;
}

/* Follows the open areas of several levels: publishes the levels their stream ran, opens the
 * gates whose waits are met, and lets an area go once its stream ran every level (with the
 * lock); whether anything moved. */
static bool
cipc_own_follow_levels(struct cipc_team *team)
{
    struct cipc_ownstream *own = cipc_own(team);
    uint32_t *level_word = &team->ctrls[team->rank]->level;
    bool moved = false;

    for (int i = 0; i < own->nrunning;) {
        struct cipc_own_running *r = &own->running[i];
        struct cipc_area *a = &own->pool->host[r->area];
        uint32_t ran = __atomic_load_n(&a->level_done, __ATOMIC_ACQUIRE);
        if (ran > r->published) {
            /* Only forward: an older collective's last levels may be seen after a newer's. */
            uint32_t value = cipc_own_level_value(r->levels.match, ran);
            if ((int32_t)(value - __atomic_load_n(level_word, __ATOMIC_RELAXED)) > 0) {
                __atomic_store_n(level_word, value, __ATOMIC_RELEASE);
            }
            r->published = ran;
            moved = true;
        }
        while (r->opened < a->levels && cipc_own_level_ready(team, &r->levels, r->opened)) {
            __atomic_store_n(&a->level_go[r->opened++], CIPC_AREA_OPEN, __ATOMIC_RELEASE);
            moved = true;
        }
        if (ran < a->levels) {
            i++;
            continue;
        }
        __atomic_store_n(&a->running, 0, __ATOMIC_RELEASE);
        *r = own->running[--own->nrunning];
    }
    return moved;
}

/* Opens the areas whose ranks all arrived, follows the levels, writes the deferred done words
 * that may go; whether anything moved. */
static bool
cipc_own_step(struct cipc_team *team)
{
    struct cipc_ownstream *own = cipc_own(team);
    bool moved = false;

    pthread_mutex_lock(&own->lock);
    for (int i = 0; i < own->npending && !own->released;) {
        struct cipc_own_pending *p = &own->pending[i];
        bool arrived = true;
        for (int j = 0; j < p->nneeds && arrived; j++) {
            uint32_t a = __atomic_load_n(&team->ctrls[p->need_rank[j]]->arrive,
                                         __ATOMIC_ACQUIRE);
            arrived = (int32_t)(a - p->need_seq[j]) >= 0;
        }
        if (!arrived) {
            i++;
            continue;
        }
        struct cipc_area *a = &own->pool->host[p->area];
        if (a->follow) {
            /* Not reusable until the thread saw its stream run every level. */
            __atomic_store_n(&a->running, 1, __ATOMIC_RELEASE);
            own->running[own->nrunning++] = (struct cipc_own_running){
                .area = p->area, .opened = 1, .levels = p->levels};
        }
        __atomic_store_n(&a->go, CIPC_AREA_OPEN, __ATOMIC_RELEASE);
        *p = own->pending[--own->npending];
        moved = true;
    }
    moved |= cipc_own_follow_levels(team);
    moved |= cipc_own_write_deferred(team, false);
    pthread_mutex_unlock(&own->lock);
    return moved;
}

/* Matching builds into areas until all are built and waiting for their ranks (CIPC_RING at
 * most) or released; then the areas move on. */
static ncclResult_t
cipc_own_schedule(struct cipc_team *team,
                  ncclResult_t (*take_next)(struct cipc_team *team, bool *found),
                  bool *progressed_out)
{
    struct cipc_ownstream *own = cipc_own(team);
    ncclResult_t res = ncclSuccess;

    pthread_mutex_lock(&own->lock);
    for (bool found = true; res == ncclSuccess && found;) {
        if (own->released || own->npending == CIPC_RING) {
            break; /* areas are all built and waiting for their ranks: later */
        }
        res = take_next(team, &found);
        *progressed_out |= found;
    }
    pthread_mutex_unlock(&own->lock);
    *progressed_out |= cipc_own_step(team);
    return res;
}

/* At teardown, once the thread stopped: every done word still deferred (the rank's operations
 * are done, or aborted). */
static void
cipc_own_flush(struct cipc_team *team)
{
    if (cipc_own(team) != NULL) {
        pthread_mutex_lock(&cipc_own(team)->lock);
        cipc_own_write_deferred(team, true);
        pthread_mutex_unlock(&cipc_own(team)->lock);
    }
}


static bool
cipc_own_waiting(const struct cipc_team *team)
{
    const struct cipc_ownstream *own = cipc_own(team);

    return own->npending > 0 || own->nrunning > 0 || own->ndeferred > 0;
}

/* Every area of this rank's operations posted and not open opens with nothing to do, for
 * good. */
static void
cipc_own_release(struct cipc_team *team)
{
    struct cipc_ownstream *own = cipc_own(team);
    struct cipc_ctrl *ctrl = team->ctrls[team->rank];

    if (own == NULL || own->pool == NULL) {
        return;
    }
    pthread_mutex_lock(&own->lock);
    own->released = true;
    /* Built and waiting for ranks that will not come: they run nothing. */
    for (int i = 0; i < own->npending; i++) {
        cipc_areas_open_empty(own->pool, own->pending[i].area);
    }
    own->npending = 0;
    /* Running, their levels waiting for GPUs that will not come: every gate opens. */
    for (int i = 0; i < own->nrunning; i++) {
        struct cipc_area *a = &own->pool->host[own->running[i].area];
        cipc_areas_open_levels(a);
        __atomic_store_n(&a->running, 0, __ATOMIC_RELEASE);
    }
    own->nrunning = 0;
    /* Posted, not built: the same. (Taken ones are built; the ring holds the rest.) */
    uint32_t posted = shm_flag_load(&ctrl->posted);
    uint32_t consumed = shm_flag_load(&ctrl->consumed[team->lead]);
    for (uint32_t s = consumed + 1; (int32_t)(posted - s) >= 0; s++) {
        const struct cipc_desc *d = &ctrl->ring[s % CIPC_RING];
        if (d->area >= 0 && d->area < CIPC_AREAS &&
            __atomic_load_n(&own->pool->host[d->area].go, __ATOMIC_ACQUIRE) == CIPC_AREA_HELD) {
            cipc_areas_open_empty(own->pool, d->area);
        }
    }
    pthread_mutex_unlock(&own->lock);
}

static int
cipc_own_describe(const struct cipc_team *team, char *buf, size_t len)
{
    const struct cipc_ownstream *own = cipc_own(team);
    int n = snprintf(buf, len, "; own stream: %d built waiting for ranks", own->npending);

    for (int i = 0; i < own->npending && n >= 0 && (size_t)n < len; i++) {
        const struct cipc_own_pending *p = &own->pending[i];
        n += snprintf(buf + n, len - (size_t)n, " %u (area %d, go %u):", p->seq, p->area,
                      own->pool->host[p->area].go);
        for (int j = 0; j < p->nneeds && n >= 0 && (size_t)n < len; j++) {
            n += snprintf(buf + n, len - (size_t)n, " r%d>=%u", p->need_rank[j],
                          p->need_seq[j]);
        }
    }
    for (int i = 0; i < own->nrunning && n >= 0 && (size_t)n < len; i++) {
        const struct cipc_own_running *r = &own->running[i];
        const struct cipc_area *a = &own->pool->host[r->area];
        n += snprintf(buf + n, len - (size_t)n, "; collective %u (area %d) at level %u of %u, "
                      "ran %u", r->levels.match, r->area, r->opened, a->levels, a->level_done);
        for (int j = 0; j < r->levels.ndeps && n >= 0 && (size_t)n < len; j++) {
            const struct cipc_ldep *d = &r->levels.deps[j];
            if (d->level == r->opened) {
                n += snprintf(buf + n, len - (size_t)n, " waits r%d level %u (r%d at %u)",
                              d->rank, d->done, d->rank,
                              __atomic_load_n(&team->ctrls[d->rank]->level, __ATOMIC_ACQUIRE));
            }
        }
    }
    if (n >= 0 && (size_t)n < len) {
        n += snprintf(buf + n, len - (size_t)n, ", newest %u, %d done words deferred",
                      own->newest, own->ndeferred);
    }
    return n;
}

const struct cipc_runner cipc_runner_own = {
    .name = "its rank's own streams",
    .levels = true,
    .create = cipc_own_create,
    .destroy = cipc_own_destroy,
    .flush = cipc_own_flush,
    .ready = cipc_own_ready,
    .may_post_from_stream = cipc_own_may_post_from_stream,
    .take = cipc_own_take,
    .enqueue = cipc_own_enqueue,
    .launch = cipc_own_launch,
    .untake = cipc_own_untake,
    .follow = cipc_own_follow,
    .release = cipc_own_release,
    .persistent_bytes = cipc_own_persistent_bytes,
    .quiet = cipc_own_quiet,
    .activate = cipc_own_activate,
    .quiesce = cipc_own_quiesce,
    .schedule = cipc_own_schedule,
    .begin = cipc_own_begin,
    .arrival = cipc_own_arrival,
    .run = cipc_own_run,
    .took = cipc_own_took,
    .done = cipc_own_done,
    .end = cipc_own_end,
    .waiting = cipc_own_waiting,
    .describe = cipc_own_describe,
};
