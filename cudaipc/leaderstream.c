/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The `stream` runner (runner.h): a GPU several ranks share runs its share on a stream of its
 * leader's own, which the leader's thread feeds once every rank posted:
 *
 *   the leader's stream   per operation: wait arrive of every rank taking part | the
 *                         kernels of this GPU's share | leader_done = its count | for each
 *                         rank whose group is all taken, done = the group's last number
 *   a rank's stream       write arrive | wait done of every leader (post.c, leaders.c)
 *
 * One context's streams. Ranks of the leader's process that share its GPU (the leader rank
 * itself among them) have streams of the leader stream's context, which may share a hardware
 * queue with it (all of them with CUDA_DEVICE_MAX_CONNECTIONS=1, any two when a program has
 * more streams than queues); a queue runs its work in the order it was enqueued, so a stream
 * wait enqueued before the work it waits for blocks that work for good. So in that context a
 * stream waits only for work already enqueued: the leader's stream follows the leader rank's
 * arrive through an event recorded there (`arrived`), and a call waits on the host until the
 * leader took its group before its stream waits for done (through the event `done_event`,
 * recorded after the leader rank's done, for the leader rank). Such a rank cannot post from
 * its stream (a CUDA graph would hold a wait for the leader's work, which the thread enqueues
 * only later): capturing is refused there, whatever the number of queues, since nothing
 * bounds which streams share one. Other GPUs' leaders, and ranks of other processes, are of
 * contexts of their own.
 */
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "internal.h"
#include "runner.h"
#include "tasks.h"

struct cipc_leaderstream {
    /* This rank's side. */
    bool leader_ctx;              /* its streams share a context with its GPU leader's */
    CUevent arrived;              /* it leads: recorded where its stream arrives */
    /* The leader's side. */
    const struct gpu_device *gpu; /* once active */
    CUstream stream;
    CUevent done_event;           /* after the last write of the leader rank's own done */
    struct gpu_flag leader_done;
    struct gpu_flag *arrive;      /* every rank's, as the leader's stream sees it */
    uint32_t *waited;             /* per rank: the last arrive the stream waits for */
    uint32_t ops;                 /* atomic: operations enqueued (the stream counts them done) */
};

static struct cipc_leaderstream *
cipc_ls(const struct cipc_team *team)
{
    return team->share;
}

static ncclResult_t
cipc_ls_create(struct cipc_team *team)
{
    struct cipc_leaderstream *ls;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&ls, 1));
    if (team->lead >= 0) {
        SHIM_CHECK_GOTO(shim_calloc(&ls->arrive, (size_t)team->nranks), res, err);
        SHIM_CHECK_GOTO(shim_calloc(&ls->waited, (size_t)team->nranks), res, err);
    }
    team->share = ls;
    return ncclSuccess;
err:
    free(ls->arrive);
    free(ls);
    return res;
}

static void
cipc_ls_destroy(struct cipc_team *team)
{
    struct cipc_leaderstream *ls = cipc_ls(team);

    if (ls == NULL) {
        return;
    }
    if (ls->arrived != NULL) {
        gpu_cu.cuEventDestroy(ls->arrived);
    }
    free(ls->arrive);
    free(ls->waited);
    free(ls);
    team->share = NULL;
}

static void
cipc_ls_flush(struct cipc_team *team)
{
    (void)team; /* the leader's stream writes every done word itself */
}

/* --- this rank's calls ---------------------------------------------------------------------- */

static ncclResult_t
cipc_ls_ready(struct cipc_team *team, const struct gpu_device *gpu)
{
    struct cipc_leaderstream *ls = cipc_ls(team);
    const int mine = team->leader_of[team->rank];

    (void)gpu;
    ls->leader_ctx = mine >= 0 && cipc_leader_here(team, mine);
    if (team->lead >= 0 && ls->arrived == NULL) {
        GPU_CU_CHECK(cuEventCreate(&ls->arrived, CU_EVENT_DISABLE_TIMING));
    }
    return ncclSuccess;
}

static ncclResult_t
cipc_ls_may_post_from_stream(struct cipc_team *team)
{
    if (!cipc_ls(team)->leader_ctx) {
        return ncclSuccess;
    }
    WARN("rank %d: ncclshim cannot capture device operations into a CUDA graph in the process "
         "of their GPU's device team leader (rank %d's), whose stream shares a context, and "
         "maybe a hardware queue, with the graph's: run the call outside the capture, or give "
         "every rank a leader of its own (NCCLSHIM_RANK_LEADERS=1)", team->rank,
         team->leaders[team->leader_of[team->rank]]);
    return ncclInvalidUsage;
}

static ncclResult_t
cipc_ls_take(struct cipc_team *team, const struct cipc_op *ops, struct cipc_desc *const *descs,
             int nops, enum cipc_post_from from)
{
    (void)ops;
    for (int i = 0; i < nops; i++) {
        /* The leader's stream, of this context, follows this rank's arrive by the event. */
        descs[i]->by_event = from == CIPC_FROM_CALL && cipc_ls(team)->arrived != NULL;
    }
    return ncclSuccess;
}

static ncclResult_t
cipc_ls_enqueue(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                CUstream stream, enum cipc_post_from from, int *enqueued)
{
    struct cipc_leaderstream *ls = cipc_ls(team);

    (void)descs;
    *enqueued = -1;
    if (from == CIPC_FROM_CALL && ls->arrived != NULL) {
        GPU_CU_CHECK(cuEventRecord(ls->arrived, stream));
    }
    *enqueued = nops;
    return ncclSuccess;
}

static ncclResult_t
cipc_ls_launch(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
               CUstream stream, enum cipc_post_from from)
{
    (void)team, (void)descs, (void)nops, (void)stream, (void)from;
    return ncclSuccess; /* the leader's stream runs the share */
}

static void
cipc_ls_untake(struct cipc_team *team, struct cipc_desc *const *descs, int nops, int enqueued)
{
    (void)team, (void)descs, (void)nops, (void)enqueued;
}

static ncclResult_t
cipc_ls_follow(struct cipc_team *team, CUstream stream, uint32_t seq, bool flags_only)
{
    struct cipc_leaderstream *ls = cipc_ls(team);
    const int mine = team->leader_of[team->rank];

    if (ls->leader_ctx && !flags_only) {
        /* Nothing on a stream of this context may wait for work its leader's stream has not
         * been given yet: wait here until this GPU's leader took the group (NCCL's calls, too,
         * may wait for the other ranks to arrive). */
        ncclResult_t res = cipc_consumed_wait(team, mine, seq);
        if (res != ncclSuccess && __atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
            return res;
        }
        /* The team failed (or was revoked): the error is the communicator's
         * (ncclCommGetAsyncError), and the stream waits on done, which only abort, destroy or
         * revoke write now. */
        flags_only = res != ncclSuccess;
    }
    if (team->lead >= 0 && !flags_only) {
        /* The leader rank's stream follows its leader's by the event recorded after its done,
         * the group being taken. */
        GPU_CU_CHECK(cuStreamWaitEvent(stream, ls->done_event, 0));
        return ncclSuccess;
    }
    return gpu_stream_wait_flag(stream, &team->done[mine], seq);
}

static void
cipc_ls_release(struct cipc_team *team)
{
    (void)team; /* the done words, which cipc_done_release writes, are all its streams wait on */
}

/* The leader's stream, in this process, may wait for other ranks' operations too: quiet once
 * it ran every one it was given (which wait only for ranks that posted them). */
static bool
cipc_ls_quiet(const struct cipc_team *team)
{
    const struct cipc_leaderstream *ls = cipc_ls(team);

    if (team->lead < 0) {
        return true;
    }
    uint32_t ran = __atomic_load_n(&team->ctrls[team->rank]->leader_done, __ATOMIC_ACQUIRE);
    return (int32_t)(ran - __atomic_load_n(&ls->ops, __ATOMIC_ACQUIRE)) >= 0;
}

static uint64_t
cipc_ls_persistent_bytes(const struct cipc_team *team)
{
    (void)team;
    return 0;
}

/* --- the leader's thread -------------------------------------------------------------------- */

static ncclResult_t
cipc_ls_activate(struct cipc_team *team, const struct gpu_device *gpu,
                 const struct gpu_flag *leader_done)
{
    struct cipc_leaderstream *ls = cipc_ls(team);

    for (int r = 0; r < team->nranks; r++) {
        ls->arrive[r] = cipc_flag(team, r, &team->ctrls[r]->arrive);
    }
    ls->leader_done = *leader_done;
    GPU_CU_CHECK(cuEventCreate(&ls->done_event, CU_EVENT_DISABLE_TIMING));
    CUresult cu = gpu_cu.cuStreamCreate(&ls->stream, CU_STREAM_NON_BLOCKING);
    if (cu != CUDA_SUCCESS) {
        gpu_cu.cuEventDestroy(ls->done_event);
        ls->done_event = NULL;
        return gpu_cu_fail(cu, "cuStreamCreate(the leader's stream)", __FILE__, __LINE__);
    }
    ls->gpu = gpu;
    return ncclSuccess;
}

static void
cipc_ls_quiesce(struct cipc_team *team, bool abort)
{
    struct cipc_leaderstream *ls = cipc_ls(team);

    if (ls->gpu == NULL) {
        return;
    }
    if (abort) {
        /* Let the stream past every wait for a rank that will not come: its kernels then run
         * on whatever the buffers hold, and it empties. */
        for (int r = 0; r < team->nranks; r++) {
            gpu_flag_release(&ls->arrive[r], ls->waited[r]);
        }
    }
    gpu_cu.cuStreamSynchronize(ls->stream);
    gpu_cu.cuStreamDestroy(ls->stream);
    gpu_cu.cuEventDestroy(ls->done_event);
    ls->stream = NULL;
    ls->done_event = NULL;
    ls->gpu = NULL;
}

static ncclResult_t
cipc_ls_schedule(struct cipc_team *team,
                 ncclResult_t (*take_next)(struct cipc_team *team, bool *found),
                 bool *progressed_out)
{
    ncclResult_t res = ncclSuccess;

    for (bool found = true; res == ncclSuccess && found;) {
        res = take_next(team, &found);
        *progressed_out |= found;
    }
    return res;
}

static ncclResult_t
cipc_ls_begin(struct cipc_team *team, const struct cipc_desc *d, uint32_t group_first,
              uint32_t *use_out)
{
    (void)d, (void)group_first;
    *use_out = cipc_ls(team)->ops + 1;
    return ncclSuccess;
}

static ncclResult_t
cipc_ls_arrival(struct cipc_team *team, int rank, const struct cipc_desc *d)
{
    struct cipc_leaderstream *ls = cipc_ls(team);

    if (d->by_event && rank == team->rank) {
        /* The leader rank's stream, in this context: it recorded the event before it posted
         * the group, and records it again only once the leader took the whole group. */
        GPU_CU_CHECK(cuStreamWaitEvent(ls->stream, ls->arrived, 0));
        return ncclSuccess;
    }
    if ((int32_t)(d->seq - ls->waited[rank]) > 0) {
        ls->waited[rank] = d->seq;
    }
    return gpu_stream_wait_flag(ls->stream, &ls->arrive[rank], d->seq);
}

/* This GPU's share on the leader's stream, counted done there for the mapping cache. */
static ncclResult_t
cipc_ls_run(struct cipc_team *team, const struct cipc_work *w)
{
    struct cipc_leaderstream *ls = cipc_ls(team);

    SHIM_CHECK(cipc_tasks_launch(w, ls->stream, ls->gpu));
    uint32_t ops = ls->ops + 1;
    SHIM_CHECK(gpu_stream_post_flag(ls->stream, &ls->leader_done, ops));
    __atomic_store_n(&ls->ops, ops, __ATOMIC_RELEASE);
    return ncclSuccess;
}

static void
cipc_ls_took(struct cipc_team *team, int rank)
{
    (void)team, (void)rank;
}

static ncclResult_t
cipc_ls_done(struct cipc_team *team, int rank, const struct gpu_flag *word, uint32_t last)
{
    struct cipc_leaderstream *ls = cipc_ls(team);

    SHIM_CHECK(gpu_stream_post_flag(ls->stream, word, last));
    if (rank == team->rank) {
        /* Before consumed: the leader rank's call, waiting for that, then waits on it. */
        GPU_CU_CHECK(cuEventRecord(ls->done_event, ls->stream));
    }
    return ncclSuccess;
}

static void
cipc_ls_end(struct cipc_team *team)
{
    (void)team;
}

static bool
cipc_ls_waiting(const struct cipc_team *team)
{
    (void)team; /* the ranks' posts ring the doorbell */
    return false;
}

static int
cipc_ls_describe(const struct cipc_team *team, char *buf, size_t len)
{
    (void)team;
    if (len > 0) {
        buf[0] = '\0';
    }
    return 0;
}

const struct cipc_runner cipc_runner_stream = {
    .name = "the leader's stream",
    .levels = false,
    .create = cipc_ls_create,
    .destroy = cipc_ls_destroy,
    .flush = cipc_ls_flush,
    .ready = cipc_ls_ready,
    .may_post_from_stream = cipc_ls_may_post_from_stream,
    .take = cipc_ls_take,
    .enqueue = cipc_ls_enqueue,
    .launch = cipc_ls_launch,
    .untake = cipc_ls_untake,
    .follow = cipc_ls_follow,
    .release = cipc_ls_release,
    .persistent_bytes = cipc_ls_persistent_bytes,
    .quiet = cipc_ls_quiet,
    .activate = cipc_ls_activate,
    .quiesce = cipc_ls_quiesce,
    .schedule = cipc_ls_schedule,
    .begin = cipc_ls_begin,
    .arrival = cipc_ls_arrival,
    .run = cipc_ls_run,
    .took = cipc_ls_took,
    .done = cipc_ls_done,
    .end = cipc_ls_end,
    .waiting = cipc_ls_waiting,
    .describe = cipc_ls_describe,
};
