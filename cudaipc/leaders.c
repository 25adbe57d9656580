/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The device team's leaders, one per GPU (internal.h), and what a rank does with each of them:
 * waits for the done words they write, their channels, their doorbells, their consumed flags.
 *
 * Why a leader per GPU and not one for the host: on a host of 8 GPUs with a rank each, one
 * leader's GPU would read every other GPU's input and write every output, 7 S in and 7 S out
 * of its links for an all-reduce of S bytes, where a ring moves 1.75 S through each. Ranks
 * that share a GPU still share its leader: handing work between contexts on one GPU costs
 * about 140 us, more than a small operation's kernel.
 */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "internal.h"
#include "runner.h"
#include "tasks.h"

ncclResult_t
cipc_leaders_form(struct cipc_team *team, const int *first_on_device)
{
    team->lead = -1;
    team->nleaders = 0;
    for (int r = 0; r < team->nranks; r++) {
        int first = first_on_device[r];
        if (first < 0) {
            team->leader_of[r] = -1;
            continue;
        }
        if (first != r) {
            team->leader_of[r] = team->leader_of[first]; /* set: first < r */
            continue;
        }
        if (team->nleaders == CIPC_MAX_LEADERS) {
            INFO(SHIM_INIT, "cudaipc: the ranks on this host use more than %d GPUs, more than "
                 "a device team serves", CIPC_MAX_LEADERS);
            return ncclInvalidUsage;
        }
        team->leader_of[r] = (int8_t)team->nleaders;
        team->leaders[team->nleaders++] = r;
    }
    for (int k = 0; k < team->nleaders; k++) {
        if (team->leaders[k] == team->rank) {
            team->lead = k;
        }
    }
    return ncclSuccess;
}

bool
cipc_levels_possible(const struct cipc_team *team)
{
    const int n = team->nranks;

    if (n < 2 || team->nleaders != n) {
        return false; /* a GPU with several ranks, or a rank without one */
    }
    for (int a = 0; a < n; a++) {
        for (int b = 0; b < n; b++) {
            if (!team->reach[(size_t)a * n + b]) {
                /* Buffers through pinned host memory, where a ring's or tree's pulls would
                 * take each GPU's own data there and back too: at 4 GPUs a ring all-reduce
                 * moved 3.25 S through one GPU (the double's count), direct parts 1.50 S. */
                return false;
            }
        }
    }
    return true;
}

enum cipc_algo
cipc_team_algo(const struct cipc_team *team, enum alg_coll coll, size_t count,
               ncclDataType_t type)
{
    size_t units, unit_bytes;

    if (!team->levels_ok || coll >= ALG_COLL_SEND) {
        return CIPC_ALGO_DIRECT;
    }
    cipc_levels_units(coll, count, type, &units, &unit_bytes);
    return cipc_algo_choose(&team->policy, coll, units, unit_bytes, team->nranks);
}

const struct cipc_runner *
cipc_runner_choose(const struct cipc_team *team)
{
    for (int r = 0; r < team->nranks && team->lead >= 0; r++) {
        if (r != team->rank && team->leader_of[r] == team->lead) {
            return &cipc_runner_stream; /* a GPU other ranks share */
        }
    }
    return team->lead >= 0 ? &cipc_runner_own : &cipc_runner_stream;
}

bool
cipc_leader_here(const struct cipc_team *team, int k)
{
    int r = team->leaders[k];
    return r == team->rank || shm_team_peer_in_this_process(team->shm, r);
}

bool
cipc_done_reached(const struct cipc_team *team, int r, uint32_t seq)
{
    const struct cipc_ctrl *c = team->ctrls[r];

    for (int k = 0; k < team->nleaders; k++) {
        if ((int32_t)(__atomic_load_n(&c->done[k].value, __ATOMIC_ACQUIRE) - seq) < 0) {
            return false;
        }
    }
    return true;
}

uint32_t
cipc_done_sum(const struct cipc_team *team, int r)
{
    uint32_t sum = 0;

    for (int k = 0; k < team->nleaders; k++) {
        sum += __atomic_load_n(&team->ctrls[r]->done[k].value, __ATOMIC_ACQUIRE);
    }
    return sum;
}

uint32_t
cipc_done_least(const struct cipc_team *team, int r)
{
    uint32_t least = __atomic_load_n(&team->ctrls[r]->done[0].value, __ATOMIC_ACQUIRE);

    for (int k = 1; k < team->nleaders; k++) {
        uint32_t v = __atomic_load_n(&team->ctrls[r]->done[k].value, __ATOMIC_ACQUIRE);
        least = (int32_t)(v - least) < 0 ? v : least;
    }
    return least;
}

ncclResult_t
cipc_done_wait(struct cipc_team *team, CUstream stream, uint32_t seq, bool flags_only)
{
    for (int k = 0; k < team->nleaders; k++) {
        if (k == team->leader_of[team->rank]) {
            /* Its own GPU's, as its runner has it (it may first wait on the host). */
            SHIM_CHECK(team->runner->follow(team, stream, seq, flags_only));
        } else {
            SHIM_CHECK(gpu_stream_wait_flag(stream, &team->done[k], seq));
        }
    }
    return ncclSuccess;
}

void
cipc_done_release(struct cipc_team *team, uint32_t seq)
{
    team->runner->release(team);
    for (int k = 0; k < team->nleaders; k++) {
        gpu_flag_release(&team->done[k], seq);
    }
}

/* Whether leader k's GPU has a share in operation d of this rank: a collective's every GPU,
 * a message's receiver's (any, where that is unknown). */
static bool
cipc_desc_needs_gpu(const struct cipc_team *team, const struct cipc_desc *d, int k)
{
    if (d->coll != ALG_COLL_SEND && d->coll != ALG_COLL_RECV) {
        return true;
    }
    int gpu = cipc_message_gpu((enum alg_coll)d->coll, team->rank, d->root, team->leader_of,
                               team->nranks);
    return gpu < 0 || gpu == k;
}

void
cipc_done_stand_in(struct cipc_team *team)
{
    struct cipc_ctrl *own = team->ctrls[team->rank];
    uint32_t posted = shm_flag_load(&own->posted);

    for (int k = 0; k < team->nleaders; k++) {
        int lr = team->leaders[k];
        if (lr == team->rank || !__atomic_load_n(&team->ctrls[lr]->left, __ATOMIC_ACQUIRE)) {
            continue;
        }
        uint32_t s = __atomic_load_n(&own->done[k].value, __ATOMIC_ACQUIRE) + 1;
        bool needed = false;
        while (!needed && (int32_t)(posted - s) >= 0) {
            uint32_t last = own->ring[s % CIPC_RING].group_last;
            for (uint32_t t = s; (int32_t)(last - t) >= 0 && !needed; t++) {
                /* Then the watch fails the team: that leader will not come. */
                needed = cipc_desc_needs_gpu(team, &own->ring[t % CIPC_RING], k);
            }
            if (!needed) {
                shm_flag_post(&own->consumed[k], last);
                gpu_flag_release(&team->done[k], last);
                s = last + 1;
            }
        }
    }
}

/* Whether leader k destroyed or aborted its side (or its process died). */
static bool
cipc_leader_left(const struct cipc_team *team, int k)
{
    return cipc_rank_gone(team, team->leaders[k]);
}

/* A leader opens its socket as it forms its side of the team, right after the exchange that
 * ends init; a rank that posts at once may come first, so refusals are retried until
 * NCCLSHIM_BOOTSTRAP_TIMEOUT (or the leader's death). */
ncclResult_t
cipc_channel_open(struct cipc_team *team, int k)
{
    const int lr = team->leaders[k];
    const struct cipc_ctrl *leader = team->ctrls[lr];
    uint64_t deadline = (uint64_t)shim_clock_ns() +
                        (uint64_t)shim_env_int(SHIM_ENV_BOOTSTRAP_TIMEOUT) * 1000000000u;
    char name[CIPC_CHANNEL_NAME_MAX];
    int err;

    while (team->channel_fds[k] < 0) {
        memcpy(name, (const char *)leader->channel, sizeof(name));
        name[sizeof(name) - 1] = '\0';
        err = name[0] != '\0' ? cipc_channel_connect(name, &team->channel_fds[k]) : ECONNREFUSED;
        if (err == 0) {
            break;
        }
        if ((err != ECONNREFUSED && err != ENOENT) || (uint64_t)shim_clock_ns() > deadline ||
            !shm_team_peer_alive(team->shm, lr)) {
            WARN("rank %d: cannot connect to the socket of rank %d, a device team leader, "
                 "@%s: %s", team->rank, lr, name, strerror(err));
            return ncclRemoteError;
        }
        usleep(1000);
    }
    return ncclSuccess;
}

ncclResult_t
cipc_channel_send_all(struct cipc_team *team, const struct cipc_channel_msg *msg, int fd,
                      bool remote_only)
{
    for (int k = 0; k < team->nleaders; k++) {
        /* A leader that left takes no more operations and closes what it mapped: nothing to
         * tell it, and its socket may be gone already (a failed send tells the same). */
        if ((remote_only && cipc_leader_here(team, k)) || cipc_leader_left(team, k)) {
            continue;
        }
        ncclResult_t res = cipc_channel_open(team, k);
        if (res == ncclSuccess) {
            res = cipc_channel_send(team->channel_fds[k], msg, fd);
        }
        if (res != ncclSuccess && !cipc_leader_left(team, k)) {
            return res;
        }
    }
    return ncclSuccess;
}

bool
cipc_leader_unmapped(const struct cipc_team *team, int k)
{
    const int lr = team->leaders[k];
    return lr != team->rank &&
           (__atomic_load_n(&team->ctrls[lr]->unmapped, __ATOMIC_ACQUIRE) != 0 ||
            !shm_team_peer_alive(team->shm, lr));
}

void
cipc_leaders_ring(struct cipc_team *team)
{
    for (int k = 0; k < team->nleaders; k++) {
        shm_flag_bump(&team->ctrls[team->leaders[k]]->doorbell);
    }
}

void
cipc_leaders_publish(struct cipc_team *team, uint32_t last)
{
    /* The whole group at once: the leader takes a group only when all of it is there. */
    __atomic_store_n(&team->seq, last, __ATOMIC_RELEASE);
    shm_flag_post(&team->ctrls[team->rank]->posted, last);
    cipc_leaders_ring(team);
}

ncclResult_t
cipc_consumed_wait(struct cipc_team *team, int k, uint32_t seq)
{
    struct cipc_ctrl *own = team->ctrls[team->rank];
    int wait_ms = (int)shim_env_int(SHIM_ENV_WAIT_MS);
    struct shm_wait wait;
    const int first = k < 0 ? 0 : k, end = k < 0 ? team->nleaders : k + 1;

    for (int j = first; j < end; j++) {
        while (!shm_flag_reached(&own->consumed[j], seq, team->rank, &wait)) {
            SHIM_CHECK(cipc_team_error(team));
            if (__atomic_load_n(&team->released, __ATOMIC_ACQUIRE)) {
                WARN("rank %d: the communicator was revoked while an operation waited for a "
                     "device team leader", team->rank);
                return ncclInvalidUsage;
            }
            if (__atomic_load_n(&team->stop, __ATOMIC_ACQUIRE)) {
                WARN("rank %d: the communicator went while an operation waited for a device "
                     "team leader", team->rank);
                return ncclInvalidUsage;
            }
            shm_wait_sleep(&wait, wait_ms > 0 ? wait_ms : 100);
        }
    }
    return ncclSuccess;
}
