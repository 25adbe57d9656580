/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Stream posting: a rank's operations posted by a host function on their stream, so that they
 * can be captured into a CUDA graph and replayed.
 *
 * Why. A call posts its descriptors and gates its stream with numbers it picks then (arrive =
 * s, wait done >= s; the descriptor's sequence and match numbers). A graph replays what was
 * captured with the values of the capture, so those numbers cannot be in it. A host function
 * (cuLaunchHostFunc; a host node in a graph) picks them each time the stream reaches it: it
 * numbers the group, copies the descriptors made by the call into the ring, posts them and
 * writes arrive from the host, and returns.
 *
 * Waiting without a waiting host function. cuLaunchHostFunc: a host function "must not
 * perform any synchronization that may depend on outstanding CUDA work", and a process's host
 * functions may run one at a time, so one that waited for the leader's stream could stall
 * another communicator's, whose peers wait for it in turn. So each group has a release word
 * of its own in page-locked memory, and the stream waits for it after the host function
 * (a stream memory operation, captured with the rest): the host function sets it to 0, and
 * this rank's team thread sets it to 1 once done reaches the group's last number (or the
 * team fails or goes); a write of 2 after the wait says the stream passed, after which an
 * uncaptured group's word may serve another. The words live as long as the process: a graph
 * may be launched after its communicator went, and then its host function releases at once.
 *
 * For good. The leader matches descriptors in ring order, which must be each stream's order; a
 * host function posts when its stream gets there, possibly after calls made later on the host.
 * So once a stream of this rank is captured, every later operation of the rank is posted from
 * its stream too (numbered in stream order: collectives and each peer's messages go on from
 * the last numbers posted), eager calls included: each costs a host function's round trip.
 *
 * After the calls. A call posts its group and its stream writes arrive later, by a stream
 * memory operation, which may still be held up on another stream when a host function posts
 * a newer group and writes a newer number from the host: landing later, the older write
 * would move arrive back (review B7), the leaders would take the newer group as arrived
 * before the older one's stream got there, and with a GPU per rank the newer group's share
 * would run on its stream before the older one's, whose done words, written after, would
 * move back too. So when stream posting begins, the calls' last number (fixed from then on)
 * gets a release word of its own (eager_slot), which the thread opens once that operation is
 * done, and every host-posted group's stream waits for that word before its host function:
 * a stream memory operation of a fixed value, so a graph may hold it, on a word that lives
 * as long as the process, so a graph launched after its communicator went finds it open.
 *
 * Limits. Operations are numbered in the order streams reach them, so a rank calling on
 * several streams must see them reached in the same order as its peers (one stream per
 * communicator, as PyTorch uses, always does); otherwise the leaders find mismatched
 * collectives. While capturing, every buffer must reach every leader without staging (device
 * memory, exported; the exports are pinned while the graph lives, since it may run at any
 * time). Staged buffers are refused in this mode altogether. Ranks of the team may share
 * the process: their host functions only post, whatever order the driver runs them in. A
 * group whose ring slots are still taken (CIPC_RING descriptors behind) fails the team with
 * a message instead of waiting, since the room could only come from another host function of
 * the process (each stream has one host-posted group waiting at most, so it takes a great
 * many streams). A failure of the team (dead rank, NCCLSHIM_TIMEOUT, abort)
 * releases every word: the stream then goes on, its results undefined, and the error is kept
 * for ncclCommGetAsyncError, as for the stream gates.
 *
 * Lifetime. A host function finds its team through its record, which teardown detaches under a
 * lock (and waits for those running), so a graph launched after the communicator went does
 * nothing. A captured record lives as long as its graph: a user object the graph holds runs
 * its destructor once the graph, its instantiations and their launches went, and the rank's
 * next call unpins the record's buffers (returning once every leader closed its mapping, so
 * their owner may free them, as after ncclCommDeregister) and frees it; a record whose team
 * went first goes with its graph. An eager one goes after its run.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "areas.h"
#include "base/check.h"
#include "base/clock.h"
#include "internal.h"
#include "runner.h"

struct cipc_hostpost {
    struct cipc_team *team;          /* NULL once it went (under cipc_hostpost_lock) */
    struct cipc_hostpost *next;      /* the team's list (under cipc_hostpost_lock) */
    bool captured;                   /* runs at every launch of its graph; kept for good */
    int slot;                        /* its release word */
    struct cipc_area_pool *areas;    /* where descs' work areas are (areas.h), where its GPU's
                                        runner takes some; NULL */
    struct cipc_pin *pins;           /* captured: the exports its buffers pinned, 3 per op */
    bool bound;                      /* captured: its graph holds a user object for it */
    bool graph_gone;                 /* ... whose destructor ran: the graph and every launch
                                        of it went (under cipc_hostpost_lock) */
    bool posting;                    /* the call that queued it still reads it: the host
                                        function, run meanwhile, leaves the freeing to it */
    bool ran;                        /* ... and the host function ran (both under the lock) */
    int nops;
    struct cipc_desc descs[];        /* numbered when it runs */
};

static pthread_mutex_t cipc_hostpost_lock = PTHREAD_MUTEX_INITIALIZER;
/* Captured records of teams that went: a graph may still be launched, and its host function
 * must find its record saying so. Kept for the life of the process. */
static struct cipc_hostpost *cipc_hostposts_kept;

/* The release words (see above): CIPC_RELEASE_SLOTS of them, each 0 (held), 1 (released) or
 * 2 (the stream passed). A captured group keeps its word for good; an uncaptured one's returns
 * once its stream passed it. Made with the first team of the process; they go with its last
 * one unless a group was ever captured (a graph may be launched any time). */
#define CIPC_RELEASE_SLOTS 16384
#define CIPC_RELEASE_HELD 0u
#define CIPC_RELEASE_OPEN 1u
#define CIPC_RELEASE_PASSED 2u
static struct {
    pthread_mutex_t lock;           /* taken by calls, never by a host function or destructor */
    uint32_t *words;
    CUdeviceptr dev;
    int nfree;
    int free[CIPC_RELEASE_SLOTS];
    /* Atomic: given back (by a call, a host function or a destructor, which must not block:
     * so marked, not listed), reusable once its stream passed it; gathered under the lock. */
    int returned[CIPC_RELEASE_SLOTS];
    CUcontext ctx;                  /* registered in it */
    int teams;                      /* alive, prepared */
    bool captured;                  /* a group was captured: the words stay */
} cipc_releases = {.lock = PTHREAD_MUTEX_INITIALIZER};

ncclResult_t
cipc_hostpost_prepare(const struct gpu_device *gpu)
{
    const size_t bytes = CIPC_RELEASE_SLOTS * sizeof(uint32_t);
    ncclResult_t res = ncclSuccess;

    pthread_mutex_lock(&cipc_releases.lock);
    if (cipc_releases.words != NULL) {
        cipc_releases.teams++;
        goto out;
    }
    uint32_t *words = aligned_alloc(4096, bytes);
    if (words == NULL) {
        WARN("out of memory for %zu bytes of release words", bytes);
        res = ncclSystemError;
        goto out;
    }
    memset(words, 0, bytes);
    CUdeviceptr dev = 0;
    SHIM_CHECK_GOTO(gpu_ctx_push(gpu->ctx), res, err_free);
    /* Portable: streams of every device of the process wait on them. */
    GPU_CU_CHECK_GOTO(cuMemHostRegister(words, bytes, CU_MEMHOSTREGISTER_PORTABLE |
                                                          CU_MEMHOSTREGISTER_DEVICEMAP),
                      res, err_pop);
    GPU_CU_CHECK_GOTO(cuMemHostGetDevicePointer(&dev, words, 0), res, err_unregister);
    gpu_ctx_pop();
    cipc_releases.words = words;
    cipc_releases.dev = dev;
    cipc_releases.ctx = gpu->ctx;
    cipc_releases.teams = 1;
    for (int i = 0; i < CIPC_RELEASE_SLOTS; i++) {
        cipc_releases.free[i] = CIPC_RELEASE_SLOTS - 1 - i;
        __atomic_store_n(&cipc_releases.returned[i], 0, __ATOMIC_RELAXED);
    }
    cipc_releases.nfree = CIPC_RELEASE_SLOTS;
    goto out;

err_unregister:
    gpu_cu.cuMemHostUnregister(words);
err_pop:
    gpu_ctx_pop();
err_free:
    free(words);
out:
    pthread_mutex_unlock(&cipc_releases.lock);
    return res;
}

/* Moves the words given back whose stream passed them to the free list (with the lock). */
static void
cipc_releases_gather(void)
{
    for (int s = 0; s < CIPC_RELEASE_SLOTS; s++) {
        if (__atomic_load_n(&cipc_releases.returned[s], __ATOMIC_ACQUIRE) &&
            __atomic_load_n(&cipc_releases.words[s], __ATOMIC_ACQUIRE) == CIPC_RELEASE_PASSED) {
            __atomic_store_n(&cipc_releases.returned[s], 0, __ATOMIC_RELAXED);
            cipc_releases.free[cipc_releases.nfree++] = s;
        }
    }
}

/* Whether every word is free, or given back and passed by its stream (with the lock). */
static bool
cipc_releases_idle(void)
{
    cipc_releases_gather();
    return cipc_releases.nfree == CIPC_RELEASE_SLOTS;
}

void
cipc_hostpost_unprepare(void)
{
    pthread_mutex_lock(&cipc_releases.lock);
    if (--cipc_releases.teams > 0 || cipc_releases.captured) {
        pthread_mutex_unlock(&cipc_releases.lock);
        return;
    }
    /* The streams were released; give them a moment to pass their words, bounded (abort must
     * return at once): a word a stream still waits on must stay registered (a wait on
     * unregistered memory is a fault), so where one does, the words stay for good. */
    uint64_t until = (uint64_t)shim_clock_ns() + 200000000u;
    while (!cipc_releases_idle() && (uint64_t)shim_clock_ns() < until) {
        pthread_mutex_unlock(&cipc_releases.lock);
        usleep(100);
        pthread_mutex_lock(&cipc_releases.lock);
    }
    if (cipc_releases.teams == 0 && cipc_releases_idle()) {
        if (gpu_ctx_push(cipc_releases.ctx) == ncclSuccess) {
            gpu_cu.cuMemHostUnregister(cipc_releases.words);
            gpu_ctx_pop();
        }
        free(cipc_releases.words);
        cipc_releases.words = NULL;
    }
    pthread_mutex_unlock(&cipc_releases.lock);
}

static struct gpu_flag
cipc_release_flag(int slot)
{
    return (struct gpu_flag){.host = &cipc_releases.words[slot],
                             .dev = cipc_releases.dev + (CUdeviceptr)slot * sizeof(uint32_t)};
}

static void
cipc_release_set(int slot, uint32_t value)
{
    __atomic_store_n(&cipc_releases.words[slot], value, __ATOMIC_RELEASE);
}

/* A free word, or -1 (with a WARN) when every one is taken. */
static int
cipc_release_take(int rank, bool captured)
{
    int slot = -1;

    pthread_mutex_lock(&cipc_releases.lock);
    if (cipc_releases.nfree == 0) {
        cipc_releases_gather(); /* words of uncaptured groups whose streams passed them */
    }
    if (cipc_releases.nfree > 0) {
        slot = cipc_releases.free[--cipc_releases.nfree];
        cipc_release_set(slot, CIPC_RELEASE_HELD);
        cipc_releases.captured |= captured;
    }
    pthread_mutex_unlock(&cipc_releases.lock);
    if (slot < 0) {
        WARN("rank %d: more than %d device groups posted from streams at once or captured in "
             "this process's CUDA graphs", rank, CIPC_RELEASE_SLOTS);
    }
    return slot;
}

/* A group's word, back once its stream passed it: one store, so that host functions and
 * destructors may give back (the lock's holder makes driver calls). */
static void
cipc_release_give_back(int slot)
{
    __atomic_store_n(&cipc_releases.returned[slot], 1, __ATOMIC_RELEASE);
}

bool
cipc_hostpost_release(struct cipc_team *team, bool all)
{
    pthread_mutex_lock(&team->release_lock);
    for (int i = 0; i < team->nreleases;) {
        const struct cipc_release *r = &team->releases[i];
        if (all || cipc_done_reached(team, team->rank, r->last)) {
            cipc_release_set(r->slot, CIPC_RELEASE_OPEN);
            team->releases[i] = team->releases[--team->nreleases];
        } else {
            i++;
        }
    }
    bool left = team->nreleases > 0;
    pthread_mutex_unlock(&team->release_lock);
    return left;
}

/* The team thread opens slot once done reaches last. */
static ncclResult_t
cipc_hostpost_hold(struct cipc_team *team, int slot, uint32_t last)
{
    pthread_mutex_lock(&team->release_lock);
    ncclResult_t res = shim_grow(&team->releases, team->nreleases, &team->releases_cap, 64);
    if (res == ncclSuccess) {
        team->releases[team->nreleases++] = (struct cipc_release){.slot = slot, .last = last};
    }
    pthread_mutex_unlock(&team->release_lock);
    return res;
}

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
    struct shm_wait wait;
    /* A host function may not wait for room: that could take another host function of the
     * process, run after this one. Each stream posting from the host has at most one group
     * waiting at a time, so the ring is full only with a great many streams at once. */
    bool room = true;
    for (int k = 0; k < team->nleaders && res == ncclSuccess && room; k++) {
        room = shm_flag_reached(&own->consumed[k], last - CIPC_RING, team->rank, &wait);
    }
    if (!room) {
        WARN("rank %d: more than %d device operations of this rank wait for a leader while "
             "a stream posts %d more: too many streams at once", team->rank, CIPC_RING,
             hp->nops);
        res = ncclInvalidUsage;
    }
    if (res == ncclSuccess) {
        for (int i = 0; i < hp->nops; i++) {
            struct cipc_desc *d = &own->ring[(first + (uint32_t)i) % CIPC_RING];
            *d = hp->descs[i];
            d->seq = first + (uint32_t)i;
            d->group_last = last;
            d->match = cipc_hostpost_number(team, d);
        }
        cipc_leaders_publish(team, last);
        /* What the stream's write would do: the leader's stream waits for it. Every call's
         * write landed (the stream waited for eager_slot). */
        __atomic_store_n(team->arrive.host, last, __ATOMIC_RELEASE);
        *last_out = last;
    }
    pthread_mutex_unlock(&team->post_lock);
    return res;
}

/* The host function. It makes no CUDA call and waits for no GPU work. */
static void CUDA_CB
cipc_hostpost_run(void *arg)
{
    struct cipc_hostpost *hp = arg;
    bool held = false;

    pthread_mutex_lock(&cipc_hostpost_lock);
    struct cipc_team *team = hp->team;
    if (team != NULL) {
        team->hostposts_running++;
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
    cipc_release_set(hp->slot, CIPC_RELEASE_HELD);
    for (int i = 0; hp->areas != NULL && i < hp->nops; i++) {
        if (hp->descs[i].area >= 0) {
            cipc_areas_hold(hp->areas, hp->descs[i].area);
        }
    }
    if (team != NULL) {
        uint32_t last = 0;
        shim_log_bind(team->log);
        ncclResult_t res = ncclSuccess;
        /* A team stopping has no thread left to open the word: post nothing. */
        if (!__atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
            res = cipc_hostpost_post(team, hp, &last);
        }
        if (res == ncclSuccess && last != 0) {
            res = cipc_hostpost_hold(team, hp->slot, last);
            held = res == ncclSuccess;
        }
        if (!hp->captured) {
            __atomic_sub_fetch(&team->hostposts_queued, 1, __ATOMIC_RELEASE);
        }
        if (res != ncclSuccess && cipc_team_error(team) == ncclSuccess) {
            cipc_team_set_error(team, res);
        }
        shim_log_bind(NULL);
    }
    if (!held) {
        /* Nothing to wait for (failed, or no team any more): the stream goes on, running
         * nothing from its work areas. */
        for (int i = 0; hp->areas != NULL && i < hp->nops; i++) {
            if (hp->descs[i].area >= 0) {
                cipc_areas_open_empty(hp->areas, hp->descs[i].area);
            }
        }
        cipc_release_set(hp->slot, CIPC_RELEASE_OPEN);
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
        cipc_release_give_back(hp->slot);
        if (hp->posting) {
            hp->ran = true;
        } else {
            free(hp);
        }
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
}

/* What a captured record holds besides itself: its release word and its work areas, given
 * back once nothing can launch it (with cipc_hostpost_lock). */
static void
cipc_hostpost_give_back(struct cipc_hostpost *hp)
{
    cipc_release_give_back(hp->slot);
    for (int i = 0; hp->areas != NULL && i < hp->nops; i++) {
        if (hp->descs[i].area >= 0) {
            cipc_areas_give_back(hp->areas, hp->descs[i].area);
        }
    }
    free(hp->pins);
    free(hp);
}

/* The user object's destructor, on a driver thread once the graph and every launch of it went
 * (no CUDA call here, and no wait): the team's next call unpins the record's buffers; a record
 * whose team went already goes now. */
static void CUDA_CB
cipc_hostpost_graph_gone(void *arg)
{
    struct cipc_hostpost *hp = arg;

    pthread_mutex_lock(&cipc_hostpost_lock);
    if (hp->bound) {
        hp->graph_gone = true;
        if (hp->team != NULL) {
            __atomic_add_fetch(&hp->team->graphs_gone, 1, __ATOMIC_RELEASE);
        } else {
            struct cipc_hostpost **link = &cipc_hostposts_kept;
            while (*link != NULL && *link != hp) {
                link = &(*link)->next;
            }
            if (*link == hp) {
                *link = hp->next;
                cipc_hostpost_give_back(hp);
            }
        }
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
}

/* A captured record lives as long as its graph, as NCCL's graph registration does: a user
 * object the graph holds says when the graph and its launches went. Without one (a driver
 * that refuses), the record and its pins stay for the team's life, as they did. */
static void
cipc_hostpost_bind_graph(struct cipc_team *team, struct cipc_hostpost *hp, CUstream stream)
{
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    CUgraph graph = NULL;
    CUuserObject object;

    if (gpu_cu.cuStreamGetCaptureInfo(stream, &status, NULL, &graph, NULL, NULL) !=
            CUDA_SUCCESS ||
        status != CU_STREAM_CAPTURE_STATUS_ACTIVE || graph == NULL ||
        gpu_cu.cuUserObjectCreate(&object, hp, cipc_hostpost_graph_gone, 1,
                                  CU_USER_OBJECT_NO_DESTRUCTOR_SYNC) != CUDA_SUCCESS) {
        INFO(SHIM_GRAPH, "rank %d: a captured group's buffers stay pinned while the "
             "communicator lives (no user object for its graph)", team->rank);
        return;
    }
    pthread_mutex_lock(&cipc_hostpost_lock);
    hp->bound = true;
    pthread_mutex_unlock(&cipc_hostpost_lock);
    if (gpu_cu.cuGraphRetainUserObject(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE) !=
        CUDA_SUCCESS) {
        pthread_mutex_lock(&cipc_hostpost_lock);
        hp->bound = false; /* its destructor, run by the release, leaves it be */
        pthread_mutex_unlock(&cipc_hostpost_lock);
        gpu_cu.cuUserObjectRelease(object, 1);
        INFO(SHIM_GRAPH, "rank %d: a captured group's buffers stay pinned while the "
             "communicator lives (its graph took no user object)", team->rank);
    }
}

ncclResult_t
cipc_hostpost_reap(struct cipc_team *team)
{
    uint32_t gone = __atomic_load_n(&team->graphs_gone, __ATOMIC_ACQUIRE);
    struct cipc_hostpost *reaped = NULL;
    ncclResult_t res = ncclSuccess;

    if (gone == team->graphs_reaped) {
        return ncclSuccess;
    }
    team->graphs_reaped = gone;
    pthread_mutex_lock(&cipc_hostpost_lock);
    for (struct cipc_hostpost **link = &team->hostposts; *link != NULL;) {
        struct cipc_hostpost *hp = *link;
        if (hp->graph_gone) {
            *link = hp->next;
            hp->next = reaped;
            reaped = hp;
        } else {
            link = &hp->next;
        }
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
    while (reaped != NULL) {
        struct cipc_hostpost *hp = reaped;
        reaped = hp->next;
        /* The last unpin of cudaMalloc memory returns once every leader closed its mapping:
         * from then on its owner may free it, as after ncclCommDeregister. */
        for (int p = 0; p < 3 * hp->nops; p++) {
            if (hp->pins[p].pinned) {
                ncclResult_t r = cipc_export_pin(team, hp->pins[p].key, hp->pins[p].base, -1);
                res = res != ncclSuccess ? res : r;
            }
        }
        pthread_mutex_lock(&cipc_hostpost_lock);
        cipc_hostpost_give_back(hp);
        pthread_mutex_unlock(&cipc_hostpost_lock);
    }
    return res;
}

ncclResult_t
cipc_hostpost_arrive(struct cipc_team *team, const struct cipc_op *ops, int nops,
                     CUstream stream, bool capturing)
{
    struct cipc_hostpost *hp;
    bool taken = false; /* the runner took what it needs for the group */
    ncclResult_t res;

    if (capturing && !team->stream_posting) {
        if (team->seq != 0) {
            /* The calls' last operation: every host-posted group waits for it (above). Taken
             * for good, as a captured group's word. */
            int slot = cipc_release_take(team->rank, true);
            if (slot < 0) {
                return ncclInvalidUsage; /* said why */
            }
            SHIM_CHECK(cipc_hostpost_hold(team, slot, team->seq));
            team->eager_slot = slot;
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
    if (capturing && (hp->pins = calloc(3 * (size_t)nops, sizeof(*hp->pins))) == NULL) {
        free(hp);
        WARN("rank %d: out of memory for a group of %d device operations", team->rank, nops);
        return ncclSystemError;
    }
    if (cipc_releases.words == NULL) {
        WARN("rank %d: no release words (their registration failed when the team was made): "
             "operations cannot be posted from streams", team->rank);
        res = ncclSystemError;
        goto err_free;
    }
    hp->slot = cipc_release_take(team->rank, capturing);
    if (hp->slot < 0) {
        res = ncclInvalidUsage;
        goto err_free;
    }
    SHIM_CHECK_GOTO(gpu_ctx_push(team->gpu->ctx), res, err_slot);
    struct cipc_desc *descs[CIPC_RING / 2];
    uint8_t via[CIPC_RING / 2][3];
    bool staging = false;
    for (int i = 0; i < nops; i++) {
        /* Numbered as the last posted: the exports it makes stay until it is posted and done
         * (hostposts_queued holds them) or, captured, for good (pinned). Captured, cudaMalloc
         * memory is mapped, not staged: a graph replays its copies' addresses, and a host
         * function may not wait for room in a staging area. */
        descs[i] = &hp->descs[i];
        res = cipc_desc_make(team, &ops[i], team->seq, team->seq, capturing, descs[i], via[i]);
        staging |= via[i][0] || via[i][1] || via[i][2];
        if (res == ncclSuccess && capturing && staging) {
            WARN("rank %d: a buffer that reaches a device team leader only through a staging "
                 "copy (managed or registered host memory, or a device some GPU's leader "
                 "cannot reach) captured into a CUDA graph: use device memory", team->rank);
            res = ncclInvalidUsage;
        }
        const struct cipc_buf *bufs[3] = {&hp->descs[i].send, &hp->descs[i].recv,
                                          &hp->descs[i].scalar_buf};
        for (int b = 0; b < 3 && res == ncclSuccess && capturing; b++) {
            res = cipc_export_pin_buf(team, bufs[b], &hp->pins[3 * i + b]);
        }
        if (res != ncclSuccess) {
            goto err_pop;
        }
    }
    const enum cipc_post_from from = capturing ? CIPC_FROM_CAPTURE : CIPC_FROM_STREAM;
    res = team->runner->take(team, ops, descs, nops, from);
    if (res != ncclSuccess) {
        goto err_pop;
    }
    taken = true;
    hp->areas = cipc_areas_of(team->gpu);
    if (staging) {
        /* Copied in before the host function posts and writes arrive; out after the wait. */
        res = cipc_stage_descs(team, ops, descs, (const uint8_t(*)[3])via, nops, team->seq,
                               stream);
        if (res != ncclSuccess) {
            goto err_pop;
        }
    }
    if (!capturing) {
        __atomic_add_fetch(&team->hostposts_queued, 1, __ATOMIC_RELEASE);
    }
    if (team->eager_slot >= 0) {
        /* Its host function after the calls' every operation (above). */
        struct gpu_flag eager = cipc_release_flag(team->eager_slot);
        res = gpu_stream_wait_flag(stream, &eager, CIPC_RELEASE_OPEN);
        if (res != ncclSuccess) {
            goto err_pop;
        }
    }
    pthread_mutex_lock(&cipc_hostpost_lock);
    hp->team = team;
    hp->next = team->hostposts;
    hp->posting = true; /* the stream may run the host function before enqueue reads descs */
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
    /* After it, whatever of the share runs on this stream (runner.h: launched once every team
     * of the group arrived); then the stream waits for the word and says it passed
     * (cipc_hostpost_wait). A failure here leaves the host function queued: it runs, and the
     * team's error says what went wrong. */
    int enqueued;
    res = team->runner->enqueue(team, descs, nops, stream, from, &enqueued);
    if (res == ncclSuccess && capturing) {
        cipc_hostpost_bind_graph(team, hp, stream);
    }
    gpu_ctx_pop();
    if (res == ncclSuccess) {
        cipc_post_launch_keep(team, descs, nops, from);
        team->wait_slot = hp->slot; /* reused only once the stream passed it */
        team->posted_by_host = true;
    }
    pthread_mutex_lock(&cipc_hostpost_lock);
    hp->posting = false;
    if (hp->ran) {
        free(hp);
    }
    pthread_mutex_unlock(&cipc_hostpost_lock);
    if (res != ncclSuccess) {
        cipc_team_set_error(team, res);
    }
    return res;

err_pop:
    team->ncopies = 0; /* staged copies out of a group that never posts */
    if (taken) {
        team->runner->untake(team, descs, nops, -1);
    }
    gpu_ctx_pop();
err_slot:
    cipc_release_set(hp->slot, CIPC_RELEASE_PASSED);
    cipc_release_give_back(hp->slot);
err_free:
    free(hp->pins);
    free(hp);
    return res;
}

ncclResult_t
cipc_hostpost_wait(struct cipc_team *team, CUstream stream)
{
    struct gpu_flag release = cipc_release_flag(team->wait_slot);
    ncclResult_t res = gpu_stream_wait_flag(stream, &release, CIPC_RELEASE_OPEN);

    if (res == ncclSuccess) {
        res = gpu_stream_post_flag(stream, &release, CIPC_RELEASE_PASSED);
    }
    if (res == ncclSuccess) {
        res = cipc_stage_copy_out(team, stream);
    }
    if (res != ncclSuccess) {
        cipc_team_set_error(team, res);
    }
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
        if (hp->captured && hp->graph_gone) {
            cipc_hostpost_give_back(hp); /* nothing can launch it */
        } else if (hp->captured) {
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
    /* The thread is gone: whatever it would have opened opens now. */
    cipc_hostpost_release(team, true);
    free(team->releases);
    team->releases = NULL;
    team->nreleases = team->releases_cap = 0;
}
