/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device team as one rank holds it: forming and ending it, its control blocks'
 * registration with the driver, and the thread that schedules (on a GPU's leader) and watches
 * (on every rank): a rank that died, NCCLSHIM_TIMEOUT, hang reports, the team's error.
 */
#include "internal.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/report.h"
#include "runner.h"

/* How long the leader polls (its doorbell; the arrive words its work areas wait for) before
 * it sleeps: a rank posting or arriving right after another costs no wakeup. */
#define CIPC_SPIN_NS 20000

bool
cipc_team_busy(const struct cipc_team *team)
{
    return !cipc_done_reached(team, team->rank, __atomic_load_n(&team->seq, __ATOMIC_ACQUIRE));
}

int
cipc_team_describe(const struct cipc_team *team, char *buf, size_t len)
{
    const struct cipc_ctrl *own = team->ctrls[team->rank];
    int n = snprintf(buf, len, "device operations: posted up to %u, arrived %u, done %u%s",
                     __atomic_load_n(&team->seq, __ATOMIC_ACQUIRE),
                     __atomic_load_n(&own->arrive, __ATOMIC_ACQUIRE),
                     cipc_done_least(team, team->rank), team->lead >= 0 ? "; leader: " : "");
    if (team->lead >= 0 && n >= 0 && (size_t)n < len) {
        n += cipc_leader_describe(team, buf + n, len - (size_t)n);
    }
    if (team->lead >= 0 && n >= 0 && (size_t)n < len) {
        n += team->runner->describe(team, buf + n, len - (size_t)n);
    }
    return n;
}

/* --- the thread ---------------------------------------------------------------------------- */

struct cipc_watch {
    int wait_ms;
    uint64_t timeout_ns;
    uint32_t seen_done;   /* done words at the last look, summed (a leader: every rank's) */
    uint64_t last_move;   /* when something last moved */
    unsigned reports;     /* SIGUSR1 requests seen */
};

/* Work of this process's that faulted on the device (an illegal address, say) leaves its
 * context unusable for good, a sticky error: every later call in it answers that error, and
 * what this rank's operations wait for there never comes. A query of the team's own idle
 * stream says so without waiting for anything. Not the legacy stream: while a blocking stream
 * of the context is captured, no thread may touch it, relaxed or not (cuda.h), and the query
 * would break the program's capture. */
static ncclResult_t
cipc_team_check_device(struct cipc_team *team)
{
    if (team->gpu == NULL || team->probe == NULL) {
        return ncclSuccess;
    }
    CUresult cu = gpu_cu.cuStreamQuery(team->probe);
    if (cu != CUDA_SUCCESS && cu != CUDA_ERROR_NOT_READY) {
        WARN("rank %d: device %d's CUDA context failed with this rank's operations in flight "
             "(its work faulted; the error is sticky, the context unusable)", team->rank,
             team->gpu->ordinal);
        return gpu_cu_fail(cu, "cuStreamQuery(the team's idle stream)", __FILE__, __LINE__);
    }
    return ncclSuccess;
}

/* After NCCLSHIM_WAIT_MS without news: whoever this rank waits for must be there, and so
 * must its own device. */
static ncclResult_t
cipc_team_check_peers(struct cipc_team *team)
{
    SHIM_CHECK(cipc_team_check_device(team));
    if (team->lead >= 0) {
        SHIM_CHECK(cipc_leader_check_peers(team));
    }
    for (int k = 0; k < team->nleaders && cipc_team_busy(team); k++) {
        int lr = team->leaders[k];
        if (lr != team->rank && cipc_rank_gone(team, lr)) {
            WARN("rank %d: rank %d (pid %d), a device team leader, died or left the "
                 "communicator with this rank's operations in flight", team->rank, lr,
                 (int)shm_team_peer_pid(team->shm, lr));
            return ncclRemoteError;
        }
    }
    return ncclSuccess;
}

static void
cipc_team_report(struct cipc_team *team, const char *why)
{
    char line[2048];

    cipc_team_describe(team, line, sizeof(line));
    fprintf(stderr, "ncclshim report (%s): pid %d device team %016llx rank %d of %d: %s\n", why,
            (int)getpid(), (unsigned long long)team->id, team->rank, team->nranks, line);
}

/* Everything the thread watches, once per turn. */
static void
cipc_team_watch(struct cipc_team *team, struct cipc_watch *w, bool progressed)
{
    uint64_t now = (uint64_t)shim_clock_ns();
    int32_t verdict = __atomic_load_n(&team->ctrls[CIPC_VERDICT]->error, __ATOMIC_ACQUIRE);
    uint32_t done = cipc_done_sum(team, team->rank);

    /* A leader serves every rank: any rank's operation finishing is news to it. */
    for (int r = 0; team->leader != NULL && r < team->nranks; r++) {
        done += r != team->rank ? cipc_done_sum(team, r) : 0;
    }
    bool busy = cipc_team_busy(team) || (team->leader != NULL && cipc_leader_busy(team));

    if (verdict != ncclSuccess && cipc_team_error(team) == ncclSuccess) {
        /* This rank's own operations end with the team's: say where they stood, as this
         * rank's own timeout would have, whichever rank's clock ran out first. */
        if (busy) {
            cipc_team_report(team, "device team failed");
        }
        WARN("rank %d: the device team failed with error %d (a leader logged the cause)",
             team->rank, (int)verdict);
        cipc_team_set_error(team, (ncclResult_t)verdict);
    }
    if (shim_report_requests() != w->reports) {
        w->reports = shim_report_requests();
        cipc_team_report(team, "on request");
    }
    if (progressed || done != w->seen_done || !busy) {
        w->seen_done = done;
        w->last_move = now;
        return;
    }
    if (cipc_team_error(team) != ncclSuccess) {
        return;
    }
    if (now - w->last_move >= (uint64_t)w->wait_ms * 1000000u) {
        ncclResult_t res = cipc_team_check_peers(team);
        if (res != ncclSuccess) {
            cipc_team_set_error(team, res);
            return;
        }
    }
    if (w->timeout_ns != 0 && now - w->last_move >= w->timeout_ns) {
        cipc_team_report(team, "NCCLSHIM_TIMEOUT");
        WARN("rank %d: no progress of device operations for NCCLSHIM_TIMEOUT=%llu s; giving up "
             "(the report above says where they stand)", team->rank,
             (unsigned long long)(w->timeout_ns / 1000000000u));
        cipc_team_set_error(team, ncclRemoteError);
    }
}

/* Until someone posts or NCCLSHIM_WAIT_MS passes; a leader polls its doorbell briefly first,
 * since the ranks of one operation post close together. */
static void
cipc_team_sleep(struct cipc_team *team, int wait_ms)
{
    struct shm_flag *flag = team->lead >= 0 ? &team->ctrls[team->rank]->doorbell
                                            : &team->ctrls[team->rank]->posted;
    uint32_t seen = shm_flag_load(flag);
    struct shm_wait wait;

    if (team->lead >= 0) {
        uint64_t until = (uint64_t)shim_clock_ns() + CIPC_SPIN_NS;
        while ((uint64_t)shim_clock_ns() < until) {
            if (shm_flag_load(flag) != seen || __atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
                return;
            }
        }
    }
    if (!shm_flag_reached(flag, seen + 1, team->rank, &wait)) {
        shm_wait_sleep(&wait, wait_ms);
    }
}

static void *
cipc_team_main(void *arg)
{
    struct cipc_team *team = arg;
    struct cipc_watch w = {
        .wait_ms = (int)shim_env_int(SHIM_ENV_WAIT_MS),
        .timeout_ns = (uint64_t)shim_env_int(SHIM_ENV_TIMEOUT) * 1000000000u,
        .last_move = (uint64_t)shim_clock_ns(),
        .reports = shim_report_requests(),
    };

    uint64_t last_progress = 0;

    w.wait_ms = w.wait_ms > 0 ? w.wait_ms : 100;
    gpu_capture_relax_thread();
    shim_log_bind(team->log);
    while (!__atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
        bool progressed = false;
        if (team->leader != NULL && cipc_team_error(team) == ncclSuccess) {
            ncclResult_t res = cipc_leader_step(team, &progressed);
            if (res != ncclSuccess) {
                cipc_team_set_error(team, res);
            }
        }
        if (team->gpu != NULL) {
            cipc_done_stand_in(team);
        }
        cipc_team_watch(team, &w, progressed);
        /* Groups posted by host functions wait for their words: the leader's stream writes
         * done and wakes no one, so while some are held, poll. */
        bool held = cipc_hostpost_release(team, cipc_team_error(team) != ncclSuccess);
        /* Work areas wait for ranks' arrive words, which wake no one either (ownstream.c):
         * a rank's stream waits on the thread's look, so look again at once for a while. */
        bool areas = team->leader != NULL && team->runner->waiting(team);
        uint64_t now = (uint64_t)shim_clock_ns();
        if (progressed) {
            last_progress = now;
        }
        if (areas && !progressed && now - last_progress < CIPC_SPIN_NS) {
            sched_yield();
        } else if ((held || areas) && !progressed) {
            usleep(20);
        } else if (!progressed) {
            cipc_team_sleep(team, w.wait_ms);
        }
    }
    return NULL;
}

/* --- forming and ending ------------------------------------------------------------------- */

/* Everything this rank's side holds, in the reverse order of its making; the one way out of
 * a team, made or half made. The thread has stopped and the streams passed their gates;
 * abort: the leader's share waits for no rank. */
static void
cipc_team_free(struct cipc_team *team, bool abort)
{
    cipc_post_free(team);
    if (team->probe != NULL) {
        gpu_cu.cuStreamDestroy(team->probe); /* the handle names its context */
    }
    if (team->prepared) {
        cipc_hostpost_unprepare();
    }
    if (team->leader != NULL) {
        cipc_leader_destroy(team, abort);
    }
    if (team->runner != NULL) {
        team->runner->destroy(team);
    }
    if (team->registered != NULL) {
        cipc_ctrl_unregister_all(team);
    }
    free(team->registered);
    free(team->ctrls);
    free(team->reach);
    free(team->device_here);
    free(team->leader_of);
    pthread_mutex_destroy(&team->reg_lock);
    pthread_mutex_destroy(&team->post_lock);
    pthread_mutex_destroy(&team->release_lock);
    free(team);
}

ncclResult_t
cipc_team_create(const struct cipc_team_args *args, struct cipc_team **team_out)
{
    const int n = args->shm->nranks;
    struct cipc_team *team;
    ncclResult_t res;

    if (n > CIPC_MAX_RANKS || args->first_on_device == NULL || args->device_here == NULL) {
        INFO(SHIM_INIT, "cudaipc: %d ranks on this host, more than a device team serves (%d)",
             n, CIPC_MAX_RANKS);
        return ncclInvalidUsage;
    }
    SHIM_CHECK(shim_calloc(&team, 1));
    pthread_mutex_init(&team->reg_lock, NULL);
    pthread_mutex_init(&team->post_lock, NULL);
    pthread_mutex_init(&team->release_lock, NULL);
    team->shm = args->shm;
    team->rank = args->shm->rank;
    team->nranks = n;
    team->device = args->device;
    team->id = args->id;
    team->log = args->log;
    for (int k = 0; k < CIPC_MAX_LEADERS; k++) {
        team->channel_fds[k] = -1;
    }
    team->eager_slot = -1;
    SHIM_CHECK_GOTO(shim_calloc(&team->reach, (size_t)n * n), res, err);
    memcpy(team->reach, args->reach, (size_t)n * n);
    SHIM_CHECK_GOTO(shim_calloc(&team->device_here, (size_t)n), res, err);
    memcpy(team->device_here, args->device_here, (size_t)n * sizeof(int));
    SHIM_CHECK_GOTO(shim_calloc(&team->leader_of, (size_t)n), res, err);
    SHIM_CHECK_GOTO(cipc_leaders_form(team, args->first_on_device), res, err);
    if (args->policy != NULL) {
        team->policy = *args->policy;
    } else {
        SHIM_CHECK_GOTO(alg_policy_parse(NULL, NULL, &team->policy), res, err);
    }
    team->levels_ok = cipc_levels_possible(team);
    SHIM_CHECK_GOTO(shim_calloc(&team->ctrls, (size_t)n), res, err);
    SHIM_CHECK_GOTO(shim_calloc(&team->registered, (size_t)n), res, err);
    for (int r = 0; r < n; r++) {
        team->ctrls[r] = shm_team_aux(args->shm, r);
    }
    struct cipc_ctrl *own = team->ctrls[team->rank];
    /* Host addresses now; the streams' addresses once the block is registered (post.c). */
    team->arrive.host = &own->arrive;
    for (int k = 0; k < team->nleaders; k++) {
        team->done[k].host = &own->done[k].value;
    }
    team->runner = cipc_runner_choose(team);
    SHIM_CHECK_GOTO(team->runner->create(team), res, err);
    if (team->lead >= 0) {
        SHIM_CHECK_GOTO(cipc_leader_create(team), res, err);
    }
    /* Page-locked memory is registered now, not between a queued stream wait and its release
     * (registration may wait for the whole device), where the program chose the device; a
     * program that did not (host memory only, likely) gets it at its first device call. A
     * device this process does not have serves host memory only: device calls are refused. */
    if (args->ready_now && team->device >= 0 && team->device < gpu_device_count()) {
        SHIM_CHECK_GOTO(cipc_post_ready(team), res, err); /* a leader activated with it */
    }
    int rc = pthread_create(&team->thread, NULL, cipc_team_main, team);
    if (rc != 0) {
        WARN("cudaipc: cannot start the device team's thread: %s", strerror(rc));
        res = ncclSystemError;
        goto err;
    }
    team->thread_started = true;
    *team_out = team;
    return ncclSuccess;

err:
    cipc_team_free(team, true);
    return res;
}

ncclResult_t
cipc_team_drain(struct cipc_team *team)
{
    /* The leader's stream writes done, and no one wakes a sleeper: poll, gently. The thread
     * turns a stall into an error (a dead rank; NCCLSHIM_TIMEOUT). Operations waiting for a
     * host function to post them count too. */
    while (cipc_team_busy(team) ||
           __atomic_load_n(&team->hostposts_queued, __ATOMIC_ACQUIRE) > 0) {
        ncclResult_t res = cipc_team_error(team);
        if (res != ncclSuccess) {
            WARN("rank %d: device operations of this communicator failed before they finished "
                 "(%s)", team->rank,
                 cipc_team_cause(team)[0] ? cipc_team_cause(team) : "another process failed");
            return res;
        }
        usleep(20);
    }
    return ncclSuccess;
}

void
cipc_team_release(struct cipc_team *team)
{
    /* A call waiting for the leader to take its operations stops waiting too. */
    __atomic_store_n(&team->released, 1, __ATOMIC_RELEASE);
    cipc_done_release(team, __atomic_load_n(&team->seq, __ATOMIC_ACQUIRE));
}

void
cipc_team_interrupt(struct cipc_team *team)
{
    if (team != NULL) {
        /* cipc_consumed_wait sleeps at most NCCLSHIM_WAIT_MS at a time and then looks. */
        __atomic_store_n(&team->stop, 1, __ATOMIC_RELEASE);
    }
}

void
cipc_team_destroy(struct cipc_team *team, bool abort)
{
    if (team == NULL) {
        return;
    }
    if (!abort && team->gpu != NULL) {
        /* Bounded: the thread turns a stall into an error (dead rank, NCCLSHIM_TIMEOUT). */
        (void)cipc_team_drain(team);
    }
    bool busy = cipc_team_busy(team);
    /* A rank waiting for this one (the leader, for a collective this rank never posts) learns
     * that it will not come, as of a rank that died. */
    __atomic_store_n(&team->ctrls[team->rank]->left, 1, __ATOMIC_RELEASE);
    if (team->thread_started) {
        __atomic_store_n(&team->stop, 1, __ATOMIC_RELEASE);
        if (team->lead >= 0) {
            shm_flag_bump(&team->ctrls[team->rank]->doorbell);
        } else {
            struct shm_flag *posted = &team->ctrls[team->rank]->posted;
            shm_flag_post(posted, shm_flag_load(posted)); /* wakes the thread */
        }
        pthread_join(team->thread, NULL);
    }
    team->runner->flush(team);
    if (team->gpu != NULL && (abort || busy)) {
        /* Nothing waits for us any more: every gate of this rank's streams opens. */
        cipc_done_release(team, __atomic_load_n(&team->seq, __ATOMIC_ACQUIRE));
    }
    /* Host functions still to run (a graph may be launched later) find no team. */
    cipc_hostpost_detach(team);
    if (team->gpu != NULL) {
        /* The streams must be past their gates before the flags they read go away (on a GPU
         * a wait on unregistered memory is a fault of the context). */
        gpu_ctx_push(team->gpu->ctx);
        cipc_post_quiesce(team);
        gpu_ctx_pop();
    }
    cipc_team_free(team, abort || busy);
}
