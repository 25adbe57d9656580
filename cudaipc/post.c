/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A rank posting its operations (cudaipc.h), the call's side: the group described
 * (describe.c) and staged where it must be (stage.c), whatever its GPU's runner needs
 * (runner.h), the gate on the stream (staged copies in, arrive, the runner's share where it
 * runs there), the descriptors posted in the ring, and then the wait for done and the copies
 * out. Once a stream of the rank was captured, hostpost.c posts instead, from the stream.
 */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "kernels/device.h"
#include "internal.h"
#include "runner.h"

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
    kr_dev_preload(gpu); /* before this rank enqueues anything, as the registrations below */
    if (!team->prepared) {
        SHIM_CHECK(cipc_hostpost_prepare(gpu));
        team->prepared = true;
    }
    SHIM_CHECK(cipc_exports_create(team));
    SHIM_CHECK(cipc_stage_create(team));
    if (team->launch_descs == NULL) {
        SHIM_CHECK(shim_calloc(&team->launch_descs, CIPC_RING / 2));
    }
    SHIM_CHECK(gpu_ctx_push(gpu->ctx));
    if (team->probe == NULL) {
        /* Made now, with the registrations: stream creation may serialize the device, which
         * must not happen behind a queued wait (team.c asks this stream about the context). */
        GPU_CU_CHECK_GOTO(cuStreamCreate(&team->probe, CU_STREAM_NON_BLOCKING), res, out);
    }
    SHIM_CHECK_GOTO(cipc_ctrl_register(team, team->rank), res, out);
    struct cipc_ctrl *own = team->ctrls[team->rank];
    team->arrive = cipc_flag(team, team->rank, &own->arrive);
    for (int k = 0; k < team->nleaders; k++) {
        team->done[k] = cipc_flag(team, team->rank, &own->done[k].value);
    }
    SHIM_CHECK_GOTO(team->runner->ready(team, gpu), res, out);
    team->gpu = gpu;
    res = ncclSuccess;
out:
    gpu_ctx_pop();
    if (res == ncclSuccess && team->leader != NULL) {
        /* Now, before this rank enqueues anything (leader.c). */
        res = cipc_leader_activate(team);
    }
    return res;
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

/* --- posting -------------------------------------------------------------------------------- */

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
    if (capturing || team->stream_posting) {
        res = team->runner->may_post_from_stream(team);
        if (res == ncclSuccess) {
            res = cipc_hostpost_arrive(team, ops, nops, stream, capturing);
        }
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
        cipc_match_note(team, &ops[i]);
        staging |= via[i][0] || via[i][1] || via[i][2];
    }
    SHIM_CHECK_GOTO(team->runner->take(team, ops, descs, nops, CIPC_FROM_CALL), res, out);
    if (staging) {
        SHIM_CHECK_GOTO(cipc_stage_descs(team, ops, descs, (const uint8_t(*)[3])via, nops, last,
                                         stream), res, out_untake);
    }
    /* Enqueued before the leaders can see the group: in its context, this GPU's leader's
     * stream must only wait for what is enqueued already. */
    SHIM_CHECK_GOTO(gpu_stream_post_flag(stream, &team->arrive, last), res, out_untake);
    SHIM_CHECK_GOTO(team->runner->enqueue(team, descs, nops, stream, CIPC_FROM_CALL, &enqueued),
                    res, out_untake);
    cipc_leaders_publish(team, last);
    team->pending_wait = last;
    cipc_post_launch_keep(team, descs, nops, CIPC_FROM_CALL);
    res = ncclSuccess;
    goto out;
out_untake:
    team->runner->untake(team, descs, nops, enqueued); /* never posted */
out:
    gpu_ctx_pop();
    return res;
}

ncclResult_t
cipc_post_launch(struct cipc_team *team, CUstream stream)
{
    struct cipc_desc *descs[CIPC_RING / 2];
    const int n = team->launch_n;

    if (n == 0) {
        return ncclSuccess;
    }
    team->launch_n = 0;
    for (int i = 0; i < n; i++) {
        descs[i] = &team->launch_descs[i];
    }
    SHIM_CHECK(gpu_ctx_push(team->gpu->ctx));
    ncclResult_t res = team->runner->launch(team, descs, n, stream,
                                            (enum cipc_post_from)team->launch_from);
    gpu_ctx_pop();
    if (res != ncclSuccess) {
        cipc_team_set_error(team, res); /* posted: the team fails (runner.h) */
    }
    return res;
}

ncclResult_t
cipc_post_wait(struct cipc_team *team, CUstream stream)
{
    ncclResult_t res;

    SHIM_CHECK(gpu_ctx_push(team->gpu->ctx));
    if (team->posted_by_host) {
        team->posted_by_host = false;
        res = cipc_hostpost_wait(team, stream);
        gpu_ctx_pop();
        return res;
    }
    res = cipc_done_wait(team, stream, team->pending_wait, false);
    if (res != ncclSuccess) {
        goto out;
    }
    SHIM_CHECK_GOTO(gpu_stream_mark(&team->gates, stream), res, out);
    res = cipc_stage_copy_out(team, stream);
out:
    gpu_ctx_pop();
    return res;
}

uint64_t
cipc_team_persistent_bytes(const struct cipc_team *team)
{
    return team->runner->persistent_bytes(team);
}

void
cipc_post_quiesce(struct cipc_team *team)
{
    gpu_stream_marks_wait(&team->gates, 0);
    cipc_stage_quiesce(team);
}

void
cipc_post_free(struct cipc_team *team)
{
    free(team->launch_descs);
    team->launch_descs = NULL;
    gpu_stream_marks_free(&team->gates);
    cipc_stage_free(team);
    cipc_exports_free(team);
    for (int k = 0; k < CIPC_MAX_LEADERS; k++) {
        if (team->channel_fds[k] >= 0) {
            close(team->channel_fds[k]);
            team->channel_fds[k] = -1;
        }
    }
}
