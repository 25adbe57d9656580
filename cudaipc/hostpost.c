/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream posting: a rank's operations posted by a host function on their stream, so that they
 * can be captured into a CUDA graph and replayed.
 *
 * Why. A call posts its descriptors and gates its stream with numbers it picks then (arrive =
 * s, wait done >= s; the descriptor's sequence and match numbers). A graph replays what was
 * captured with the values of the capture, so those numbers cannot be in it. A host function
 * (cuLaunchHostFunc; a host node in a graph) picks them each time the stream reaches it: it
 * numbers the group, copies the descriptors made by the call into the ring, posts them, writes
 * arrive from the host and waits on the host until done; then the stream goes on.
 *
 * For good. The leader matches descriptors in ring order, which must be each stream's order; a
 * host function posts when its stream gets there, possibly after calls made later on the host.
 * So once a stream of this rank is captured, every later operation of the rank is posted from
 * its stream too (numbered in stream order: collectives and each peer's messages go on from
 * the last numbers posted), eager calls included: each costs a host function's round trip.
 *
 * Limits. Operations are numbered in the order streams reach them, so a rank calling on
 * several streams must see them reached in the same order as its peers (one stream per
 * communicator, as PyTorch uses, always does); otherwise the leader finds mismatched
 * collectives. While capturing, every buffer must reach the leader without staging (device
 * memory, exported; the exports are pinned while the team lives, since the graph may run at
 * any time) and no other rank of the team may share this process: host functions of one
 * process may run on one driver thread, and the first would wait for the second forever.
 * Staged buffers are refused in this mode altogether. A failure of the team (dead rank,
 * NCCLSHIM_TIMEOUT, abort) ends a host function's wait: the stream then goes on, its results
 * undefined, and the error is kept for ncclCommGetAsyncError, as for the stream gates.
 *
 * Lifetime. A host function finds its team through its record, which teardown detaches under a
 * lock (and waits for those running), so a graph launched after the communicator went does
 * nothing. A captured record lives as long as the process (a graph may be launched any time);
 * an eager one goes after its run.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "team.h"

struct cipc_hostpost {
    struct cipc_team *team;          /* NULL once it went (under cipc_hostpost_lock) */
    struct cipc_hostpost *next;      /* the team's list (under cipc_hostpost_lock) */
    bool captured;                   /* runs at every launch of its graph; kept for good */
    int nops;
    struct cipc_desc descs[];        /* numbered when it runs */
};

static pthread_mutex_t cipc_hostpost_lock = PTHREAD_MUTEX_INITIALIZER;
/* Captured records of teams that went: a graph may still be launched, and its host function
 * must find its record saying so. Kept for the life of the process. */
static struct cipc_hostpost *cipc_hostposts_kept;

/* The next match number of d's kind, in this rank's stream order. */
static uint32_t
cipc_hostpost_number(struct cipc_team *team, const struct cipc_desc *d)
{
    if (d->coll == ALG_COLL_SEND) {
        return ++team->sent_match[d->root];
    }
    if (d->coll == ALG_COLL_RECV) {
        return ++team->received_match[d->root];
    }
    return ++team->coll_match;
}

/* Numbers and posts hp's group, writes arrive; *last_out: its last number. */
static ncclResult_t
cipc_hostpost_post(struct cipc_team *team, const struct cipc_hostpost *hp, uint32_t *last_out)
{
    struct cipc_ctrl *own = team->ctrls[team->rank];
    ncclResult_t res;

    pthread_mutex_lock(&team->post_lock);
    res = cipc_team_error(team);
    uint32_t first = team->seq + 1, last = team->seq + (uint32_t)hp->nops;
    if (res == ncclSuccess) {
        res = cipc_ring_wait(team, last);
    }
    if (res == ncclSuccess) {
        for (int i = 0; i < hp->nops; i++) {
            struct cipc_desc *d = &own->ring[(first + (uint32_t)i) % CIPC_RING];
            *d = hp->descs[i];
            d->seq = first + (uint32_t)i;
            d->group_last = last;
            d->match = cipc_hostpost_number(team, d);
        }
        cipc_post_publish(team, last);
        /* What the stream's write would do: the leader's stream waits for it. */
        __atomic_store_n(team->arrive.host, last, __ATOMIC_RELEASE);
        *last_out = last;
    }
    pthread_mutex_unlock(&team->post_lock);
    return res;
}

/* Until done reaches last, the team fails, or abort or revoke released this rank's gates
 * (which writes done). The leader's stream writes done and wakes no one: poll, gently. */
static void
cipc_hostpost_wait(struct cipc_team *team, uint32_t last)
{
    uint64_t spin_until = (uint64_t)shim_clock_ns() + 20000;

    while (!gpu_flag_reached(&team->done, last) && cipc_team_error(team) == ncclSuccess &&
           !__atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
        if ((uint64_t)shim_clock_ns() > spin_until) {
            usleep(20);
        }
    }
}

/* The host function. It may make no CUDA call. */
static void CUDA_CB
cipc_hostpost_run(void *arg)
{
    struct cipc_hostpost *hp = arg;

    pthread_mutex_lock(&cipc_hostpost_lock);
    struct cipc_team *team = hp->team;
    if (team != NULL) {
        team->hostposts_running++;
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
    if (team != NULL) {
        uint32_t last = 0;
        shim_log_bind(team->log);
        ncclResult_t res = cipc_hostpost_post(team, hp, &last);
        if (!hp->captured) {
            __atomic_sub_fetch(&team->hostposts_queued, 1, __ATOMIC_RELEASE);
        }
        if (res == ncclSuccess) {
            cipc_hostpost_wait(team, last);
        } else if (cipc_team_error(team) == ncclSuccess) {
            cipc_team_set_error(team, res);
        }
        shim_log_bind(NULL);
    }
    pthread_mutex_lock(&cipc_hostpost_lock);
    if (team != NULL) {
        team->hostposts_running--;
    }
    if (!hp->captured) {
        if (hp->team != NULL) {
            struct cipc_hostpost **link = &hp->team->hostposts;
            while (*link != hp) {
                link = &(*link)->next;
            }
            *link = hp->next;
        }
        free(hp);
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
}

/* Why this rank cannot capture now, or NULL. */
static const char *
cipc_hostpost_refusal(struct cipc_team *team)
{
    for (int r = 0; r < team->nranks; r++) {
        if (r != team->rank && shm_team_peer_pid(team->shm, r) == getpid()) {
            return "another rank of the communicator is in this process (its host functions "
                   "could wait for each other)";
        }
    }
    return NULL;
}

ncclResult_t
cipc_hostpost_arrive(struct cipc_team *team, const struct cipc_op *ops, int nops,
                     CUstream stream, bool capturing)
{
    struct cipc_hostpost *hp;
    ncclResult_t res;

    if (capturing && !team->stream_posting) {
        const char *why = cipc_hostpost_refusal(team);
        if (why != NULL) {
            WARN("rank %d: a device call on a stream being captured into a CUDA graph: %s",
                 team->rank, why);
            return ncclInvalidUsage;
        }
        INFO(SHIM_GRAPH, "rank %d: a stream is captured: operations are posted from their "
             "streams from now on", team->rank);
        team->stream_posting = true;
    }
    hp = calloc(1, sizeof(*hp) + (size_t)nops * sizeof(hp->descs[0]));
    if (hp == NULL) {
        WARN("rank %d: out of memory for a group of %d device operations", team->rank, nops);
        return ncclSystemError;
    }
    hp->captured = capturing;
    hp->nops = nops;
    SHIM_CHECK_GOTO(gpu_ctx_push(team->gpu->ctx), res, err_free);
    for (int i = 0; i < nops; i++) {
        bool staged[3];
        /* Numbered as the last posted: the exports it makes stay until it is posted and done
         * (hostposts_queued holds them) or, captured, for good (pinned). */
        res = cipc_desc_make(team, &ops[i], team->seq, team->seq, &hp->descs[i], staged);
        if (res == ncclSuccess && (staged[0] || staged[1] || staged[2])) {
            WARN("rank %d: a buffer that reaches the device team's leader only through a "
                 "staging copy (managed or registered host memory, or a device the leader "
                 "cannot reach) on a communicator posting from its streams since a CUDA graph "
                 "capture: use device memory", team->rank);
            res = ncclInvalidUsage;
        }
        const struct cipc_buf *bufs[3] = {&hp->descs[i].send, &hp->descs[i].recv,
                                          &hp->descs[i].scalar_buf};
        for (int b = 0; b < 3 && res == ncclSuccess && capturing; b++) {
            struct cipc_pin pin;
            res = cipc_export_pin_buf(team, bufs[b], &pin);
        }
        if (res != ncclSuccess) {
            goto err_pop;
        }
    }
    if (!capturing) {
        __atomic_add_fetch(&team->hostposts_queued, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_lock(&cipc_hostpost_lock);
    hp->team = team;
    hp->next = team->hostposts;
    team->hostposts = hp;
    pthread_mutex_unlock(&cipc_hostpost_lock);
    CUresult cu = gpu_cu.cuLaunchHostFunc(stream, cipc_hostpost_run, hp);
    if (cu != CUDA_SUCCESS) {
        /* Never to run: take it back. */
        pthread_mutex_lock(&cipc_hostpost_lock);
        team->hostposts = hp->next;
        pthread_mutex_unlock(&cipc_hostpost_lock);
        if (!capturing) {
            __atomic_sub_fetch(&team->hostposts_queued, 1, __ATOMIC_RELEASE);
        }
        res = gpu_cu_fail(cu, "cuLaunchHostFunc(posting a device operation)", __FILE__,
                          __LINE__);
        goto err_pop;
    }
    gpu_ctx_pop();
    team->posted_by_host = true;
    return ncclSuccess;

err_pop:
    gpu_ctx_pop();
err_free:
    free(hp);
    return res;
}

void
cipc_hostpost_detach(struct cipc_team *team)
{
    pthread_mutex_lock(&cipc_hostpost_lock);
    while (team->hostposts != NULL) {
        struct cipc_hostpost *hp = team->hostposts;
        team->hostposts = hp->next;
        hp->team = NULL;
        hp->next = NULL;
        if (hp->captured) {
            hp->next = cipc_hostposts_kept;
            cipc_hostposts_kept = hp;
        }
    }
    while (team->hostposts_running > 0) {
        pthread_mutex_unlock(&cipc_hostpost_lock);
        usleep(100);
        pthread_mutex_lock(&cipc_hostpost_lock);
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
}
