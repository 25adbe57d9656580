/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Who runs a GPU's share of the device team's operations: one row of this table per way,
 * chosen once, when the team is made, for this rank's GPU (cipc_runner_choose):
 *
 *   own      this rank is its GPU's only rank, and leads it: its own streams run the GPU's
 *            share, from work areas its thread fills once every rank posted (ownstream.c).
 *            Its calls never wait for another rank, and a graph may hold them.
 *   stream   its GPU serves several ranks: their leader runs the share on a stream of its
 *            own, enqueued by its thread once every rank posted (leaderstream.c); a call in
 *            that stream's context waits on the host until the leader took its operations.
 *
 * The rank's calls (post.c, hostpost.c), its waits for its own GPU (leaders.c) and its
 * leader's thread (leader.c) go through the row and never ask which one they serve. A row
 * keeps its state in team->share, which only its own file reads.
 */
#ifndef CIPC_RUNNER_H
#define CIPC_RUNNER_H

#include <cuda.h>
#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "gpu/driver.h"
#include "gpu/stream.h"

struct cipc_team;
struct cipc_op;
struct cipc_desc;
struct cipc_work;

/* How a group is posted: by its call, or by a host function on its stream (hostpost.c),
 * captured into a graph or not. */
enum cipc_post_from {
    CIPC_FROM_CALL,
    CIPC_FROM_STREAM,
    CIPC_FROM_CAPTURE,
};

struct cipc_runner {
    const char *name;
    /* May the GPUs run ring and tree schedules between them (levels.h)? */
    bool levels;

    /* --- the team (team.c) ----------------------------------------------------------- */
    ncclResult_t (*create)(struct cipc_team *team);
    /* After the thread stopped and the rank's streams passed their gates; NULL state: none. */
    void (*destroy)(struct cipc_team *team);
    /* The thread stopped: whatever it would still have written for this rank's operations
     * (done words), it writes now, so no other rank waits for a thread that went. */
    void (*flush)(struct cipc_team *team);

    /* --- this rank's calls (post.c, hostpost.c, leaders.c) ---------------------------- */
    /* Made where the program chose its device (gpu): pools, events. */
    ncclResult_t (*ready)(struct cipc_team *team, const struct gpu_device *gpu);
    /* A stream of this rank is captured, or posts from the stream since it was: ncclSuccess,
     * or ncclInvalidUsage with a WARN where this runner cannot have a graph hold its waits. */
    ncclResult_t (*may_post_from_stream)(struct cipc_team *team);
    /* Before a group of nops operations (descs describe ops) is posted: what the runner needs
     * named in each descriptor; ncclInvalidUsage with a WARN, holding nothing, if it cannot. */
    ncclResult_t (*take)(struct cipc_team *team, const struct cipc_op *ops,
                         struct cipc_desc *const *descs, int nops, enum cipc_post_from from);
    /* On stream, after the group's arrive, before it is posted: what the leader's stream must
     * find enqueued when it takes the group. *enqueued: how many operations were enqueued
     * whole (a failure leaves the next partly enqueued). */
    ncclResult_t (*enqueue)(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                            CUstream stream, enum cipc_post_from from, int *enqueued);
    /* On stream, once every team of the caller's group arrived (cipc_post_launch): whatever of
     * the GPU's share runs on this stream, which waits for other ranks' arrive. In one
     * context (ranks of one process leading shares of one GPU), every arrive of a group is
     * enqueued before any such wait, so that none waits for work behind it. A failure fails
     * the team (the group is posted). */
    ncclResult_t (*launch)(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                           CUstream stream, enum cipc_post_from from);
    /* The group is never posted: let go what take held; the first `enqueued` may be read by a
     * stream (they run nothing). */
    void (*untake)(struct cipc_team *team, struct cipc_desc *const *descs, int nops,
                   int enqueued);
    /* Enqueues on stream the wait for this rank's own GPU's share of its operations up to seq
     * (the call may first wait on the host for its leader); flags_only: the team failed, only
     * the done word serves (abort, destroy or revoke open it). */
    ncclResult_t (*follow)(struct cipc_team *team, CUstream stream, uint32_t seq,
                           bool flags_only);
    /* Every wait of this rank's streams on its own GPU's share opens, running nothing more
     * (abort, destroy, revoke, a failed team). */
    void (*release)(struct cipc_team *team);
    /* The device memory it holds that suspension keeps. */
    uint64_t (*persistent_bytes)(const struct cipc_team *team);
    /* Whether the streams it feeds in this process wait on nothing beyond this rank's own
     * operations' waits (which the caller sees done): before something synchronizes the
     * device's context (stage.c). */
    bool (*quiet)(const struct cipc_team *team);

    /* --- the leader's thread (leader.c), on a GPU's leader only -------------------------- */
    /* Made at the leader's first operation, with its device's context current; leader_done:
     * the word that counts its operations run, as the device reaches it. */
    ncclResult_t (*activate)(struct cipc_team *team, const struct gpu_device *gpu,
                             const struct gpu_flag *leader_done);
    /* Teardown, the device's context current: the share stops (abort: nothing waits for ranks
     * that will not come) before the leader's mappings go. */
    void (*quiesce)(struct cipc_team *team, bool abort);
    /* Runs the leader's matching (take_next, until it finds nothing or the runner has no room
     * for more); *progressed_out if anything moved. */
    ncclResult_t (*schedule)(struct cipc_team *team,
                             ncclResult_t (*take_next)(struct cipc_team *team, bool *found),
                             bool *progressed_out);
    /* An operation taken: begin (d: the leader rank's descriptor of it, where its stream
     * orders the share; *use_out: the value leader_done reaches once it ran, the mapping
     * cache's stamp), then each rank's arrival, then run (this GPU's share; not called where
     * there is none), then each rank taken and, for a rank whose head group is all taken,
     * done (word: its done word of this leader), then end. */
    ncclResult_t (*begin)(struct cipc_team *team, const struct cipc_desc *d,
                          uint32_t group_first, uint32_t *use_out);
    ncclResult_t (*arrival)(struct cipc_team *team, int rank, const struct cipc_desc *d);
    ncclResult_t (*run)(struct cipc_team *team, const struct cipc_work *w);
    void (*took)(struct cipc_team *team, int rank);
    ncclResult_t (*done)(struct cipc_team *team, int rank, const struct gpu_flag *word,
                         uint32_t last);
    void (*end)(struct cipc_team *team);
    /* Whether it waits for something no one wakes the thread for (the thread polls). */
    bool (*waiting)(const struct cipc_team *team);
    /* For hang reports: what waits for whom. */
    int (*describe)(const struct cipc_team *team, char *buf, size_t len);
};

extern const struct cipc_runner cipc_runner_own;
extern const struct cipc_runner cipc_runner_stream;

/* The row for this rank's GPU: own where it leads a GPU no other rank uses, else stream. */
const struct cipc_runner *cipc_runner_choose(const struct cipc_team *team);

#endif
