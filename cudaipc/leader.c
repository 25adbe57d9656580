/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A GPU's leader's side of the device team, driven by the team's thread (team.c). Every
 * leader reads every rank's descriptors, matches them the same way, maps the buffers they
 * name, and hands its own GPU's share of each operation (tasks.h) to its GPU's runner
 * (runner.h: on a stream of the leader's own, or on its rank's own streams); a rank's
 * operation is done once every leader's done word for it says so.
 *
 * Order. Each rank's operations must run in the order its stream reaches them: a rank's
 * stream arrives at a group of operations all at once and then waits for them, so operations
 * of one group may run in any order among themselves, but never before an earlier group's.
 * The leader keeps, per rank, the head group: the oldest group with an operation not yet taken.
 * An operation can be taken when it is in the head group of every rank taking part:
 *   - a collective (every rank): each rank's head group holds a collective with the same
 *     number; the smallest number pending is the next one (ranks issue collectives alike);
 *   - a send and a receive: the sender's head group holds a send to the receiver, whose head
 *     group holds a receive from the sender, both the k-th message of the pair.
 * Taking an operation that heads every chain it belongs to can never block another rank's
 * chain, so taking whatever is ready, in any order, cannot deadlock a program NCCL would run.
 *
 * Taking. The runner waits until every rank taking part arrived at the operation, runs this
 * GPU's share, then for each rank whose head group is now all taken, writes its done word of
 * this leader (the group's last number). A send and its receive are the receiver's GPU's alone:
 * the other leaders take them at once, with no work. The descriptors' ring slots are free for
 * their rank once every leader took them (consumed[k]).
 *
 * The runner also counts operations run (leader_done), which tells the mapping cache which
 * mappings no kernel still uses.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "cache.h"
#include "kernels/device.h"
#include "internal.h"
#include "runner.h"
#include "tasks.h"

/* A file descriptor received on the channel, until the descriptor that needs it comes. */
struct cipc_pending_fd {
    int rank;
    uint32_t kind;
    uint32_t flags; /* the message's */
    uint64_t key;
    uint64_t size;
    int fd;
};

struct cipc_leader {
    int index;                    /* which leader: team->leaders[index] is this rank */
    pthread_mutex_t activate_lock;
    const struct gpu_device *gpu; /* atomic: set once active (cipc_leader_activate) */
    struct gpu_flag *done;        /* every rank's done word of this leader, as its GPU sees it */
    struct gpu_flag leader_done;
    uint32_t use;                 /* the mapping cache's stamp of the one being enqueued: the
                                     value leader_done reaches once it ran (runner.h) */
    uint32_t *head;               /* per rank: its oldest operation not taken */
    uint8_t *taken;               /* per rank, per ring slot: taken, in the head group */
    bool *peer_enabled;           /* per rank of this process: peer access to its device */
    int listen_fd;
    int *conns;
    int nconns, conns_cap;
    struct cipc_pending_fd *fds;
    int nfds, fds_cap;
    uint32_t forgets_read;        /* the control block's forgets when the channel was read */
    uint32_t *forgets_taken;      /* per rank: its forgets read off the channel */
    bool acks_owed;               /* some rank's forgets_closed is behind forgets_taken */
    struct cipc_cache cache;
    struct cipc_work work;        /* the operation being enqueued */
};

/* --- forming and ending ------------------------------------------------------------------- */

/* The per-rank arrays and L itself (the descriptors and connections are closed by destroy). */
static void
cipc_leader_free(struct cipc_leader *L)
{
    free(L->done);
    free(L->head);
    free(L->taken);
    free(L->forgets_taken);
    free(L->peer_enabled);
    pthread_mutex_destroy(&L->activate_lock);
    free(L);
}

ncclResult_t
cipc_leader_create(struct cipc_team *team)
{
    struct cipc_leader *L;
    const int n = team->nranks;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&L, 1));
    pthread_mutex_init(&L->activate_lock, NULL);
    L->index = team->lead;
    L->listen_fd = -1;
    SHIM_CHECK_GOTO(shim_calloc(&L->done, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&L->head, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&L->taken, (size_t)n * CIPC_RING), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&L->forgets_taken, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&L->peer_enabled, (size_t)n), res, err);
    for (int r = 0; r < n; r++) {
        L->head[r] = 1; /* operations are numbered from 1 */
    }
    SHIM_CHECK_GOTO(cipc_channel_listen(team->ctrls[team->rank]->channel, &L->listen_fd), res,
                    err);
    team->leader = L;
    return ncclSuccess;

err:
    cipc_leader_free(L);
    return res;
}

void
cipc_leader_destroy(struct cipc_team *team, bool abort)
{
    struct cipc_leader *L = team->leader;

    if (L->gpu != NULL) {
        gpu_ctx_push(L->gpu->ctx);
        /* Nothing may still read what the mappings reach. */
        team->runner->quiesce(team, abort);
        cipc_cache_clear(&L->cache);
        gpu_ctx_pop();
    }
    for (int i = 0; i < L->nfds; i++) {
        close(L->fds[i].fd);
    }
    for (int i = 0; i < L->nconns; i++) {
        close(L->conns[i]);
    }
    if (L->listen_fd >= 0) {
        close(L->listen_fd);
    }
    free(L->fds);
    free(L->conns);
    cipc_leader_free(L);
    team->leader = NULL;
    /* A rank deregistering memory this leader mapped may let its owner free it now. */
    __atomic_store_n(&team->ctrls[team->rank]->unmapped, 1, __ATOMIC_RELEASE);
}

/* A rank of this very process on another device the leader's reaches: its addresses serve
 * as they are (LOCAL), which needs peer access from the leader's context. Enabled when its
 * first such buffer comes, when its control block surely says which device it is on. (Other
 * processes' memory comes through IPC, which enables peer access itself.) */
static ncclResult_t
cipc_leader_enable_peer(struct cipc_team *team, int rank)
{
    struct cipc_leader *L = team->leader;
    int device = team->device_here[rank];
    const struct gpu_device *peer;

    if (L->peer_enabled[rank] || device == L->gpu->ordinal || device < 0) {
        return ncclSuccess;
    }
    SHIM_CHECK(gpu_device_get(device, &peer));
    CUresult cu = gpu_cu.cuCtxEnablePeerAccess(peer->ctx, 0);
    if (cu != CUDA_SUCCESS && cu != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        return gpu_cu_fail(cu, "cuCtxEnablePeerAccess(a rank's device)", __FILE__, __LINE__);
    }
    L->peer_enabled[rank] = true;
    return ncclSuccess;
}

/* Called by the rank's own first device call (cipc_post_ready), or at the team's making, before
 * this rank enqueued anything: registering page-locked memory synchronizes the device's context
 * (CUDA's implicit synchronization), which must not come after a stream wait of this process
 * that only its threads or its later work release (review B6). Only a leader whose own rank
 * makes no device call, of a team made without a device, is activated by its thread
 * (cipc_leader_step): its rank then has nothing queued. Either thread may get here first. */
ncclResult_t
cipc_leader_activate(struct cipc_team *team)
{
    struct cipc_leader *L = team->leader;
    const struct gpu_device *gpu;
    ncclResult_t res;

    if (team->device < 0) {
        WARN("cudaipc: rank %d, a device team leader, has no CUDA device: its communicator was "
             "created without a current device", team->rank);
        return ncclInvalidUsage;
    }
    pthread_mutex_lock(&L->activate_lock);
    if (L->gpu != NULL) {
        pthread_mutex_unlock(&L->activate_lock);
        return ncclSuccess;
    }
    SHIM_CHECK_GOTO(gpu_device_get(team->device, &gpu), res, unlock);
    kr_dev_preload(gpu); /* now, not at this leader's first launch (kernels/device.h) */
    SHIM_CHECK_GOTO(gpu_ctx_push(gpu->ctx), res, unlock);
    for (int r = 0; r < team->nranks; r++) {
        SHIM_CHECK_GOTO(cipc_ctrl_register(team, r), res, out);
        L->done[r] = cipc_flag(team, r, &team->ctrls[r]->done[L->index].value);
    }
    L->leader_done = cipc_flag(team, team->rank, &team->ctrls[team->rank]->leader_done);
    SHIM_CHECK_GOTO(team->runner->activate(team, gpu, &L->leader_done), res, out);
    __atomic_store_n(&L->gpu, gpu, __ATOMIC_RELEASE);
    INFO(SHIM_INIT, "cudaipc: rank %d leads device %d, one of %d GPUs of a device team of %d "
         "ranks, its share run on %s", team->rank, gpu->ordinal, team->nleaders, team->nranks,
         team->runner->name);
    res = ncclSuccess;
out:
    gpu_ctx_pop();
unlock:
    pthread_mutex_unlock(&L->activate_lock);
    return res;
}

/* --- the channel ---------------------------------------------------------------------------- */

static ncclResult_t
cipc_leader_keep_fd(struct cipc_leader *L, const struct cipc_channel_msg *msg, int fd)
{
    if (shim_grow(&L->fds, L->nfds, &L->fds_cap, 16) != ncclSuccess) {
        close(fd);
        return ncclSystemError;
    }
    L->fds[L->nfds++] = (struct cipc_pending_fd){.rank = msg->rank, .kind = msg->kind,
                                                  .flags = msg->flags, .key = msg->key,
                                                  .size = msg->size, .fd = fd};
    return ncclSuccess;
}

/* The kind of descriptor a buffer of this `how` comes with. */
static uint32_t
cipc_fd_kind_of(uint32_t how)
{
    return how == CIPC_BUF_CUMEM ? CIPC_FD_CUMEM : CIPC_FD_STAGING;
}

/* The descriptor rank sent for (kind, key), taken out of the table (*flags_out: its message's
 * flags); -1 if not there. */
static int
cipc_leader_take_fd(struct cipc_leader *L, int rank, uint32_t kind, uint64_t key,
                    uint32_t *flags_out)
{
    int fd = -1;

    /* The newest wins: a rank may send an allocation again after forgetting it sent it. */
    for (int i = L->nfds - 1; i >= 0; i--) {
        if (L->fds[i].rank == rank && L->fds[i].kind == kind && L->fds[i].key == key) {
            if (fd < 0) {
                fd = L->fds[i].fd;
                *flags_out = L->fds[i].flags;
            } else {
                close(L->fds[i].fd);
            }
            L->fds[i] = L->fds[--L->nfds];
        }
    }
    return fd;
}

/* A rank's word that it will not name (how, key) again: a descriptor of it that came before
 * is stale (a legacy handle comes with none: its key is an allocation id, which a staging
 * segment's generation may equal), and the mapping goes once the operations using it are
 * done. */
static void
cipc_leader_forget(struct cipc_leader *L, const struct cipc_channel_msg *msg, int fd)
{
    if (fd >= 0) {
        close(fd);
    }
    if (msg->how == CIPC_BUF_CUMEM || msg->how == CIPC_BUF_STAGED) {
        uint32_t flags;
        int stale = cipc_leader_take_fd(L, msg->rank, cipc_fd_kind_of(msg->how), msg->key,
                                        &flags);
        if (stale >= 0) {
            close(stale);
        }
    }
    cipc_cache_forget(&L->cache, msg->rank, msg->how, msg->key);
    L->forgets_taken[msg->rank]++;
    L->acks_owed = true;
}

/* Tells each rank whose forgotten mappings are all closed that they are (forgets_closed): a
 * rank deregistering a cudaMalloc buffer waits for that before its owner may free it. */
static void
cipc_leader_ack_forgets(struct cipc_team *team)
{
    struct cipc_leader *L = team->leader;
    bool owed = false;

    for (int r = 0; r < team->nranks; r++) {
        if (cipc_cache_holds_forgotten(&L->cache, r)) {
            owed = true;
        } else {
            __atomic_store_n(&team->ctrls[r]->forgets_closed[L->index], L->forgets_taken[r],
                             __ATOMIC_RELEASE);
        }
    }
    L->acks_owed = owed;
}

/* Accepts what connected and takes every message waiting. */
static ncclResult_t
cipc_leader_drain_channel(struct cipc_team *team)
{
    struct cipc_leader *L = team->leader;
    int conn;

    while (cipc_channel_accept(L->listen_fd, &conn) == 0) {
        if (shim_grow(&L->conns, L->nconns, &L->conns_cap, 8) != ncclSuccess) {
            close(conn);
            return ncclSystemError;
        }
        L->conns[L->nconns++] = conn;
    }
    for (int i = 0; i < L->nconns; i++) {
        struct cipc_channel_msg msg;
        int fd, err;
        while ((err = cipc_channel_recv(L->conns[i], &msg, &fd)) == 0) {
            if (msg.rank < 0 || msg.rank >= team->nranks) {
                close(fd);
                WARN("cudaipc: a message on the channel claims rank %d of %d", msg.rank,
                     team->nranks);
                return ncclRemoteError;
            }
            if (msg.kind == CIPC_FORGET) {
                cipc_leader_forget(L, &msg, fd);
                continue;
            }
            if (fd < 0 || (msg.kind != CIPC_FD_CUMEM && msg.kind != CIPC_FD_STAGING)) {
                if (fd >= 0) {
                    close(fd);
                }
                WARN("cudaipc: rank %d sent a message of kind %u on the channel", msg.rank,
                     msg.kind);
                return ncclRemoteError;
            }
            SHIM_CHECK(cipc_leader_keep_fd(L, &msg, fd));
        }
        if (err != EAGAIN && err != ENOTCONN) {
            WARN("cudaipc: reading the channel failed: %s", strerror(err));
            return ncclRemoteError;
        }
    }
    return ncclSuccess;
}

/* --- resolving buffers ------------------------------------------------------------------- */

/* Where the leader's kernels reach rank's buf; 0 for a buffer the rank does not use.
 * own_part: d->own_part of the buffer's descriptor (post.c): this GPU's part of it is in the
 * user's buffer, not in its staging, where this leader is that of the rank's GPU and process. */
static ncclResult_t
cipc_leader_resolve(struct cipc_team *team, int rank, const struct cipc_buf *buf,
                    bool own_part, uint64_t *addr_out)
{
    struct cipc_leader *L = team->leader;
    uint32_t use = L->use;
    bool here = rank == team->rank || shm_team_peer_in_this_process(team->shm, rank);

    if (own_part && here && buf->how != CIPC_BUF_NONE &&
        team->leader_of[rank] == L->index) {
        *addr_out = buf->ptr;
        return ncclSuccess; /* this leader's device: no peer access needed */
    }
    switch (buf->how) {
    case CIPC_BUF_NONE:
        *addr_out = 0;
        return ncclSuccess;
    case CIPC_BUF_LOCAL:
        if (!here) {
            /* Only leaders of its process touch it (post.c): not this leader's share. */
            *addr_out = 0;
            return ncclSuccess;
        }
        *addr_out = buf->ptr;
        return cipc_leader_enable_peer(team, rank);
    case CIPC_BUF_LEGACY:
    case CIPC_BUF_CUMEM:
        if (here) {
            /* Exported for the leaders of other processes; here, as it is (the rank checked
             * that this leader's device may touch it). */
            *addr_out = buf->ptr;
            return cipc_leader_enable_peer(team, rank);
        }
        break;
    default:
        break;
    }
    struct cipc_map *m = cipc_cache_find(&L->cache, rank, buf->how, buf->key, use);
    if (m == NULL) {
        int fd = -1;
        uint32_t flags = 0;
        if (buf->how != CIPC_BUF_LEGACY) {
            uint32_t kind = cipc_fd_kind_of(buf->how);
            fd = cipc_leader_take_fd(L, rank, kind, buf->key, &flags);
            if (fd < 0) {
                SHIM_CHECK(cipc_leader_drain_channel(team));
                fd = cipc_leader_take_fd(L, rank, kind, buf->key, &flags);
            }
            if (fd < 0) {
                WARN("cudaipc: rank %d's %s %llu was never sent on the channel", rank,
                     kind == CIPC_FD_CUMEM ? "allocation" : "staging segment",
                     (unsigned long long)buf->key);
                return ncclInternalError;
            }
        }
        SHIM_CHECK(cipc_cache_map(&L->cache, L->gpu, rank, buf, fd, flags, use, &m));
    }
    *addr_out = (uint64_t)m->base + buf->offset;
    return ncclSuccess;
}

/* --- heads and groups --------------------------------------------------------------------- */

static struct cipc_desc *
cipc_slot(struct cipc_team *team, int rank, uint32_t seq)
{
    return &team->ctrls[rank]->ring[seq % CIPC_RING];
}

/* Whether rank's head group is posted; then *first and *last bound it. */
static bool
cipc_head_group(struct cipc_team *team, int rank, uint32_t *first, uint32_t *last)
{
    uint32_t head = team->leader->head[rank];
    uint32_t posted = shm_flag_load(&team->ctrls[rank]->posted);

    if ((int32_t)(posted - head) < 0) {
        return false;
    }
    *first = head;
    *last = cipc_slot(team, rank, head)->group_last;
    return true;
}

static bool
cipc_taken(const struct cipc_team *team, int rank, uint32_t seq)
{
    return team->leader->taken[(size_t)rank * CIPC_RING + seq % CIPC_RING];
}

/* In rank's head group, the untaken operation that `want` accepts; NULL if none. */
typedef bool (*cipc_pick)(const struct cipc_desc *d, const void *arg);

static struct cipc_desc *
cipc_find(struct cipc_team *team, int rank, cipc_pick want, const void *arg)
{
    uint32_t first, last;

    if (!cipc_head_group(team, rank, &first, &last)) {
        return NULL;
    }
    for (uint32_t s = first; (int32_t)(last - s) >= 0; s++) {
        struct cipc_desc *d = cipc_slot(team, rank, s);
        if (!cipc_taken(team, rank, s) && want(d, arg)) {
            return d;
        }
    }
    return NULL;
}

static bool
cipc_is_coll(enum alg_coll coll)
{
    return coll != ALG_COLL_SEND && coll != ALG_COLL_RECV;
}

static bool
cipc_want_coll(const struct cipc_desc *d, const void *arg)
{
    return cipc_is_coll((enum alg_coll)d->coll) && d->match == *(const uint32_t *)arg;
}

static bool
cipc_want_send(const struct cipc_desc *d, const void *arg)
{
    (void)arg;
    return d->coll == ALG_COLL_SEND;
}

/* The receive matching a send: from its sender, the same message number. */
struct cipc_recv_key {
    int src;
    uint32_t match;
};

static bool
cipc_want_recv(const struct cipc_desc *d, const void *arg)
{
    const struct cipc_recv_key *k = arg;
    return d->coll == ALG_COLL_RECV && d->root == k->src && d->match == k->match;
}

/* Marks d taken; if that completes rank's head group, moves the head past it, enqueues the
 * write of done and frees the ring slots. */
static ncclResult_t
cipc_take(struct cipc_team *team, int rank, const struct cipc_desc *d)
{
    struct cipc_leader *L = team->leader;
    uint32_t first, last;

    L->taken[(size_t)rank * CIPC_RING + d->seq % CIPC_RING] = 1;
    team->runner->took(team, rank);
    cipc_head_group(team, rank, &first, &last);
    for (uint32_t s = first; (int32_t)(last - s) >= 0; s++) {
        if (!cipc_taken(team, rank, s)) {
            return ncclSuccess;
        }
    }
    for (uint32_t s = first; (int32_t)(last - s) >= 0; s++) {
        L->taken[(size_t)rank * CIPC_RING + s % CIPC_RING] = 0;
    }
    L->head[rank] = last + 1;
    SHIM_CHECK(team->runner->done(team, rank, &L->done[rank], last));
    shm_flag_post(&team->ctrls[rank]->consumed[L->index], last);
    return ncclSuccess;
}

/* --- enqueueing ----------------------------------------------------------------------------- */

/* The start of an operation taken (its place in the leader rank's stream order, where that
 * stream runs the share), until cipc_leader_end; the mapping cache's stamp for it. */
static ncclResult_t
cipc_leader_begin(struct cipc_team *team, const struct cipc_desc *d)
{
    struct cipc_leader *L = team->leader;

    return team->runner->begin(team, d, L->head[team->rank], &L->use);
}

/* Every rank's part of one collective agrees (the call NCCL requires of every rank). */
static ncclResult_t
cipc_check_agree(struct cipc_team *team, struct cipc_desc *const *descs)
{
    const struct cipc_desc *a = descs[0];

    for (int r = 1; r < team->nranks; r++) {
        const struct cipc_desc *b = descs[r];
        if (b->coll != a->coll || b->count != a->count || b->datatype != a->datatype ||
            b->root != a->root || (cipc_reduces((enum alg_coll)a->coll) && b->kind != a->kind)) {
            WARN("cudaipc: collective %u differs between ranks 0 and %d: collective %d/%d, "
                 "count %llu/%llu, datatype %d/%d, root %d/%d, op %d/%d", a->match, r, a->coll,
                 b->coll, (unsigned long long)a->count, (unsigned long long)b->count,
                 a->datatype, b->datatype, a->root, b->root, a->kind, b->kind);
            return ncclInvalidUsage;
        }
        if (b->algo != a->algo) {
            WARN("cudaipc: collective %u runs between GPUs by %s at rank 0 and by %s at rank "
                 "%d: NCCL_ALGO and NCCLSHIM_ALGO must be the same on every rank", a->match,
                 cipc_algo_name((enum cipc_algo)a->algo), cipc_algo_name((enum cipc_algo)b->algo),
                 r);
            return ncclInvalidUsage;
        }
    }
    return ncclSuccess;
}

/* This GPU's share of a collective (tasks.h): the ranks on it, and its part of the sliced
 * ones (cipc_share_part). */
static void
cipc_work_share(const struct cipc_team *team, struct cipc_work *w)
{
    const int k = team->leader->index, g = team->nleaders;
    const int root_gpu = w->root >= 0 && w->root < team->nranks ? team->leader_of[w->root] : -1;

    for (int r = 0; r < team->nranks; r++) {
        w->owns[r] = team->leader_of[r] == k;
        w->on_root_gpu[r] = root_gpu >= 0 && team->leader_of[r] == root_gpu;
    }
    cipc_share_part(w->coll, k, g, root_gpu, &w->part, &w->nparts);
}

static ncclResult_t
cipc_enqueue_coll(struct cipc_team *team, struct cipc_desc *const *descs)
{
    struct cipc_leader *L = team->leader;
    struct cipc_work *w = &L->work;
    const struct cipc_desc *d0 = descs[0];

    SHIM_CHECK(cipc_check_agree(team, descs));
    SHIM_CHECK(cipc_leader_begin(team, descs[team->rank]));
    memset(w, 0, sizeof(*w));
    w->coll = (enum alg_coll)d0->coll;
    w->nranks = team->nranks;
    w->root = d0->root;
    w->count = d0->count;
    w->redop = (struct kr_redop){.kind = (enum kr_op_kind)d0->kind,
                                 .type = (ncclDataType_t)d0->datatype,
                                 .divisor = d0->divisor};
    for (int r = 0; r < team->nranks; r++) {
        const struct cipc_desc *d = descs[r];
        SHIM_CHECK(cipc_leader_resolve(team, r, &d->send, d->own_part, &w->send[r]));
        SHIM_CHECK(cipc_leader_resolve(team, r, &d->recv, d->own_part, &w->recv[r]));
        SHIM_CHECK(cipc_leader_resolve(team, r, &d->scalar_buf, false, &w->scalar_ptr[r]));
        w->pre[r] = d->pre;
        w->scalar[r] = d->scalar;
    }
    cipc_work_share(team, w);
    w->match = d0->match;
    w->algo = (enum cipc_algo)d0->algo; /* every rank's, as cipc_check_agree found */
    w->level_rank = team->rank;
    if (w->algo != CIPC_ALGO_DIRECT && !team->runner->levels) {
        WARN("cudaipc: collective %u chose a %s schedule, which needs every rank alone on its "
             "GPU", d0->match, cipc_algo_name(w->algo));
        return ncclInternalError;
    }
    for (int r = 0; r < team->nranks; r++) {
        SHIM_CHECK(team->runner->arrival(team, r, descs[r]));
    }
    SHIM_CHECK(team->runner->run(team, w));
    for (int r = 0; r < team->nranks; r++) {
        SHIM_CHECK(cipc_take(team, r, descs[r]));
    }
    team->runner->end(team);
    return ncclSuccess;
}

static ncclResult_t
cipc_enqueue_p2p(struct cipc_team *team, int src, const struct cipc_desc *send, int dst,
                 const struct cipc_desc *recv)
{
    struct cipc_leader *L = team->leader;
    struct cipc_work *w = &L->work;
    size_t send_bytes = send->count * kr_type_size((ncclDataType_t)send->datatype);
    size_t recv_bytes = recv->count * kr_type_size((ncclDataType_t)recv->datatype);

    if (send_bytes != recv_bytes) {
        WARN("cudaipc: rank %d sends %zu bytes to rank %d, which receives %zu (message %u of "
             "the pair)", src, send_bytes, dst, recv_bytes, send->match);
        return ncclInvalidUsage;
    }
    if (src == dst) {
        /* A message to itself: its send takes a place in the sender's stream order too, with
         * nothing to do. */
        SHIM_CHECK(cipc_leader_begin(team, send));
        team->runner->end(team);
    }
    /* On this GPU: where its leader rank's stream runs it, the receiver is that rank. */
    SHIM_CHECK(cipc_leader_begin(team, recv));
    memset(w, 0, sizeof(*w));
    w->coll = ALG_COLL_SEND;
    w->nranks = 1;
    w->count = send_bytes;
    w->redop = (struct kr_redop){.kind = KR_SUM, .type = ncclInt8};
    w->part = -1;
    SHIM_CHECK(cipc_leader_resolve(team, src, &send->send, false, &w->send[0]));
    SHIM_CHECK(cipc_leader_resolve(team, dst, &recv->recv, false, &w->recv[0]));
    SHIM_CHECK(team->runner->arrival(team, src, send));
    if (dst != src) {
        SHIM_CHECK(team->runner->arrival(team, dst, recv));
    }
    SHIM_CHECK(team->runner->run(team, w));
    SHIM_CHECK(cipc_take(team, src, send));
    SHIM_CHECK(cipc_take(team, dst, recv));
    team->runner->end(team);
    return ncclSuccess;
}

/* The next collective, if every rank's head group holds it; *found_out if enqueued. */
static ncclResult_t
cipc_step_coll(struct cipc_team *team, bool *found_out)
{
    struct cipc_desc *descs[CIPC_MAX_RANKS] = {NULL};
    uint32_t next = 0;
    bool any = false, all = true;

    *found_out = false;
    for (int r = 0; r < team->nranks; r++) {
        uint32_t first, last;
        bool has = false;
        if (!cipc_head_group(team, r, &first, &last)) {
            all = false;
            continue;
        }
        /* The smallest collective number pending anywhere is the next one for every rank. */
        for (uint32_t s = first; (int32_t)(last - s) >= 0; s++) {
            const struct cipc_desc *c = cipc_slot(team, r, s);
            if (!cipc_taken(team, r, s) && cipc_is_coll((enum alg_coll)c->coll)) {
                has = true;
                if (!any || (int32_t)(c->match - next) < 0) {
                    next = c->match;
                    any = true;
                }
            }
        }
        all &= has;
    }
    if (!any) {
        return ncclSuccess;
    }
    for (int r = 0; r < team->nranks; r++) {
        descs[r] = cipc_find(team, r, cipc_want_coll, &next);
        if (descs[r] == NULL) {
            if (all) {
                /* Every rank waits on a collective, and one of them never posts this one. */
                WARN("cudaipc: rank %d's next device collective is not collective %u, which "
                     "other ranks posted (a call made on host memory by some ranks and on "
                     "device memory by others?)", r, next);
                return ncclInvalidUsage;
            }
            return ncclSuccess;
        }
    }
    *found_out = true;
    return cipc_enqueue_coll(team, descs);
}

/* Whether the send or receive d of rank is another GPU's: the receiver's leader copies. */
static bool
cipc_p2p_elsewhere(const struct cipc_team *team, int rank, const struct cipc_desc *d)
{
    int gpu = cipc_message_gpu((enum alg_coll)d->coll, rank, d->root, team->leader_of,
                               team->nranks);
    return gpu >= 0 && gpu != team->leader->index;
}

struct cipc_rank_key {
    const struct cipc_team *team;
    int rank;
};

static bool
cipc_want_elsewhere(const struct cipc_desc *d, const void *arg)
{
    const struct cipc_rank_key *k = arg;
    return !cipc_is_coll((enum alg_coll)d->coll) && cipc_p2p_elsewhere(k->team, k->rank, d);
}

/* Takes, with no work, a send or receive in a head group that is another GPU's to carry out;
 * *found_out if one (taking it may move that rank's head on: the caller looks again). */
static ncclResult_t
cipc_step_p2p_elsewhere(struct cipc_team *team, bool *found_out)
{
    *found_out = false;
    for (int r = 0; r < team->nranks; r++) {
        struct cipc_rank_key key = {.team = team, .rank = r};
        const struct cipc_desc *d = cipc_find(team, r, cipc_want_elsewhere, &key);
        if (d == NULL) {
            continue;
        }
        *found_out = true;
        if (r != team->rank) {
            return cipc_take(team, r, d);
        }
        /* The leader rank's: it takes a place in that rank's stream order, with nothing to do. */
        SHIM_CHECK(cipc_leader_begin(team, d));
        SHIM_CHECK(cipc_take(team, r, d));
        team->runner->end(team);
        return ncclSuccess;
    }
    return ncclSuccess;
}

/* Any send whose receive is posted; *found_out if enqueued. */
static ncclResult_t
cipc_step_p2p(struct cipc_team *team, bool *found_out)
{
    SHIM_CHECK(cipc_step_p2p_elsewhere(team, found_out));
    if (*found_out) {
        return ncclSuccess;
    }
    for (int src = 0; src < team->nranks; src++) {
        uint32_t first, last;
        if (!cipc_head_group(team, src, &first, &last)) {
            continue;
        }
        for (uint32_t s = first; (int32_t)(last - s) >= 0; s++) {
            const struct cipc_desc *send = cipc_slot(team, src, s);
            /* Another GPU's send is taken by cipc_step_p2p_elsewhere, next turn (its group may
             * have been posted since that looked). */
            if (cipc_taken(team, src, s) || !cipc_want_send(send, NULL) || send->root < 0 ||
                send->root >= team->nranks || cipc_p2p_elsewhere(team, src, send)) {
                continue;
            }
            struct cipc_recv_key key = {.src = src, .match = send->match};
            const struct cipc_desc *recv = cipc_find(team, send->root, cipc_want_recv, &key);
            if (recv != NULL) {
                *found_out = true;
                return cipc_enqueue_p2p(team, src, send, send->root, recv);
            }
        }
    }
    return ncclSuccess;
}

/* The next operation every rank taking part posted, if any: collectives first. */
static ncclResult_t
cipc_take_next(struct cipc_team *team, bool *found_out)
{
    SHIM_CHECK(cipc_step_coll(team, found_out));
    if (*found_out) {
        return ncclSuccess;
    }
    return cipc_step_p2p(team, found_out);
}

static bool
cipc_anything_posted(struct cipc_team *team)
{
    for (int r = 0; r < team->nranks; r++) {
        if (shm_flag_load(&team->ctrls[r]->posted) != 0) {
            return true;
        }
    }
    return false;
}

ncclResult_t
cipc_leader_step(struct cipc_team *team, bool *progressed_out)
{
    struct cipc_leader *L = team->leader;
    ncclResult_t res = ncclSuccess;

    *progressed_out = false;
    uint32_t forgets = __atomic_load_n(&team->ctrls[team->rank]->forgets, __ATOMIC_ACQUIRE);
    if (__atomic_load_n(&L->gpu, __ATOMIC_ACQUIRE) == NULL) {
        /* Not active: nothing is mapped, so a forget (a registration exports before any
         * operation, and its deregistration waits for an answer) is answered at once. */
        if (forgets != L->forgets_read) {
            L->forgets_read = forgets;
            SHIM_CHECK(cipc_leader_drain_channel(team));
            cipc_leader_ack_forgets(team);
        }
        if (!cipc_anything_posted(team)) {
            return ncclSuccess;
        }
        /* Other ranks posted before this rank's first device call (a team made without a
         * device): this rank has queued nothing yet. */
        SHIM_CHECK(cipc_leader_activate(team));
    }
    SHIM_CHECK(gpu_ctx_push(L->gpu->ctx));
    if (forgets != L->forgets_read) {
        L->forgets_read = forgets;
        res = cipc_leader_drain_channel(team);
    }
    cipc_cache_reap(&L->cache, __atomic_load_n(&team->ctrls[team->rank]->leader_done,
                                               __ATOMIC_ACQUIRE));
    if (L->acks_owed) {
        cipc_leader_ack_forgets(team);
    }
    if (res == ncclSuccess) {
        res = team->runner->schedule(team, cipc_take_next, progressed_out);
    }
    gpu_ctx_pop();
    return res;
}

/* --- watching ------------------------------------------------------------------------------- */

/* This leader's done word of rank r, and what r posted. */
static uint32_t
cipc_leader_done_of(const struct cipc_team *team, int r)
{
    return __atomic_load_n(&team->ctrls[r]->done[team->leader->index].value, __ATOMIC_ACQUIRE);
}

static uint32_t
cipc_posted(const struct cipc_team *team, int r)
{
    return __atomic_load_n(&team->ctrls[r]->posted.value, __ATOMIC_ACQUIRE);
}

bool
cipc_leader_busy(const struct cipc_team *team)
{
    for (int r = 0; r < team->nranks; r++) {
        if ((int32_t)(cipc_leader_done_of(team, r) - cipc_posted(team, r)) < 0) {
            return true;
        }
    }
    return false;
}

/* Whether an operation pending anywhere needs rank: its own, a collective (every rank takes
 * part), or a send or receive with it. */
static bool
cipc_leader_needs(struct cipc_team *team, int rank)
{
    if ((int32_t)(cipc_leader_done_of(team, rank) - cipc_posted(team, rank)) < 0) {
        return true;
    }
    for (int r = 0; r < team->nranks; r++) {
        uint32_t first, last;
        if (r == rank || !cipc_head_group(team, r, &first, &last)) {
            continue;
        }
        for (uint32_t s = first; (int32_t)(last - s) >= 0; s++) {
            const struct cipc_desc *d = cipc_slot(team, r, s);
            if (!cipc_taken(team, r, s) &&
                (cipc_is_coll((enum alg_coll)d->coll) || d->root == rank)) {
                return true;
            }
        }
    }
    return false;
}

ncclResult_t
cipc_leader_check_peers(struct cipc_team *team)
{
    for (int r = 0; r < team->nranks; r++) {
        if (r != team->rank && cipc_rank_gone(team, r) && cipc_leader_needs(team, r)) {
            WARN("cudaipc: rank %d (pid %d) died or left the communicator while the device "
                 "team still needs it", r, (int)shm_team_peer_pid(team->shm, r));
            return ncclRemoteError;
        }
    }
    return ncclSuccess;
}

int
cipc_leader_describe(const struct cipc_team *team, char *buf, size_t len)
{
    const struct cipc_leader *L = team->leader;
    int n = snprintf(buf, len, "operations run up to %u, %d mappings; next per rank:",
                     __atomic_load_n(&team->ctrls[team->rank]->leader_done, __ATOMIC_ACQUIRE),
                     cipc_cache_count(&L->cache));
    for (int r = 0; r < team->nranks && n >= 0 && (size_t)n < len; r++) {
        n += snprintf(buf + n, len - (size_t)n, " %u/%u", L->head[r],
                      shm_flag_load(&team->ctrls[r]->posted));
    }
    return n;
}
