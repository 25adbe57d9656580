/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor, the one place that calls both the transport (tp_) and the kernels (kr_).
 *
 * An op's schedule is a list of steps with backward dependencies. Each step is PENDING until
 * its dependencies are DONE, then POSTED (sends and receives, until the transport completes
 * them) or run at once (reductions and copies on host memory), then DONE. A progress pass
 * walks the steps from the first one not yet done; since dependencies point backwards, one
 * pass sees a whole chain of newly ready steps. Nothing in a pass waits.
 *
 * On device memory without a device team (staged: across hosts, or one host without shared
 * memory) the same schedules run on the device buffers; exec_staged_steps.c carries a step
 * out there (copies through pinned host memory, our kernels), and a step may wait in one
 * more state, STAGING, for the GPU.
 *
 * Messages are tagged here (engine/tag.h): a send's index is its position among this
 * rank's sends to that peer in the schedule, a receive's its position among the receives
 * from that peer, which is how builders promise the two sides pair up.
 */
#include "exec_internal.h"

#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "algorithms/alg.h"
#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "base/report.h"
#include "comm.h"
#include "cpu_move.h"
#include "tag.h"

/* NCCL's in-place definitions (see alg.h), which builders use to avoid hazards. */
static bool
shim_exec_in_place(const struct shim_op *op)
{
    const uint8_t *send = op->sendbuff, *recv = op->recvbuff;
    const size_t block = op->count * kr_type_size(op->datatype);
    const int rank = op->comm->rank;

    switch (op->coll) {
    case SHIM_COLL_ALLGATHER:
        return recv != NULL && send == recv + (size_t)rank * block;
    case SHIM_COLL_REDUCESCATTER:
        return send != NULL && recv == send + (size_t)rank * block;
    case SHIM_COLL_GATHER:
        return rank == op->root && recv != NULL && send == recv + (size_t)op->root * block;
    case SHIM_COLL_SCATTER:
        return rank == op->root && send != NULL && recv == send + (size_t)op->root * block;
    default:
        return send == recv;
    }
}

/* Numbers every send and receive per peer, in schedule order, to form its tag. Management
 * schedules number each message from a per-peer counter of the communicator instead of one
 * sequence number for the whole operation (see tag.h). */
static ncclResult_t
shim_exec_assign_tags(struct shim_exec *exec)
{
    struct ncclComm *comm = exec->op.comm;
    const enum shim_coll coll = exec->op.coll;
    const enum shim_tag_kind kind =
        exec->management ? SHIM_TAG_MANAGEMENT
        : coll == SHIM_COLL_SEND || coll == SHIM_COLL_RECV ? SHIM_TAG_P2P
                                                           : SHIM_TAG_COLLECTIVE;
    uint32_t *nsent, *nreceived;

    SHIM_CHECK(shim_calloc(&nsent, 2 * (size_t)comm->nranks));
    nreceived = nsent + comm->nranks;
    for (int i = 0; i < exec->sched.nsteps; i++) {
        const struct alg_step *step = &exec->sched.steps[i];
        if (step->kind == ALG_STEP_SEND) {
            uint32_t seq = exec->management ? comm->mgmt_sent[step->peer]++ : exec->seq;
            exec->tags[i] = shim_tag_make(comm->tag_base, kind, comm->rank, seq,
                                          nsent[step->peer]++);
        } else if (step->kind == ALG_STEP_RECV) {
            uint32_t seq = exec->management ? comm->mgmt_received[step->peer]++ : exec->seq;
            exec->tags[i] = shim_tag_make(comm->tag_base, kind, step->peer, seq,
                                          nreceived[step->peer]++);
        }
    }
    free(nsent);
    return ncclSuccess;
}

/* One INFO(TUNING) line per collective and power-of-two size class, per communicator. */
static void
shim_exec_log_choice(struct ncclComm *comm, const struct shim_op *op,
                     const struct alg_args *args, const struct alg_algorithm *alg,
                     double estimate)
{
    size_t bytes = args->count * args->elem_size;
    int size_class = bytes == 0 ? 0 : 64 - __builtin_clzll((unsigned long long)bytes);
    uint64_t bit = 1ull << (size_class & 63);

    if ((comm->tuning_logged[args->coll] & bit) || !shim_log_enabled(SHIM_LOG_INFO, SHIM_TUNING)) {
        return;
    }
    comm->tuning_logged[args->coll] |= bit;
    INFO(SHIM_TUNING, "%s: %zu bytes on %d ranks -> %s, chunk %zu bytes, estimated %.1f us",
         shim_coll_name(op->coll), bytes, args->nranks, alg->name, args->chunk_bytes,
         estimate * 1e6);
}

/* What every exec needs once its schedule is built: step state, tags, scratch, a number. */
static ncclResult_t
shim_exec_arm(struct shim_exec *exec)
{
    struct ncclComm *comm = exec->op.comm;
    int nsteps = exec->sched.nsteps;

    if (nsteps > exec->step_capacity) {
        free(exec->state);
        free(exec->tags);
        free(exec->reqs);
        exec->tags = NULL;
        exec->reqs = NULL;
        exec->step_capacity = 0;
        SHIM_CHECK(shim_calloc(&exec->state, (size_t)nsteps));
        SHIM_CHECK(shim_calloc(&exec->tags, (size_t)nsteps));
        SHIM_CHECK(shim_calloc(&exec->reqs, (size_t)nsteps));
        exec->step_capacity = nsteps;
    } else if (nsteps > 0) {
        memset(exec->state, 0, (size_t)nsteps * sizeof(*exec->state));
        memset(exec->tags, 0, (size_t)nsteps * sizeof(*exec->tags));
        memset(exec->reqs, 0, (size_t)nsteps * sizeof(*exec->reqs));
    }
    if (exec->staged) {
        /* Scratch is device memory of the staging, bound later; the op was numbered when it
         * was issued. */
        SHIM_CHECK(shim_calloc(&exec->tickets, (size_t)nsteps));
        SHIM_CHECK(shim_calloc(&exec->how, (size_t)nsteps));
        exec->seq = exec->op.seq;
    } else {
        SHIM_CHECK(shim_comm_scratch_get(comm, exec->sched.scratch_bytes,
                                         (void **)&exec->bufs[ALG_BUF_SCRATCH]));
        exec->seq = exec->management ? 0 : shim_op_next_seq(comm, &exec->op);
    }
    exec->bufs[ALG_BUF_SEND] = (uint8_t *)exec->op.sendbuff;
    exec->bufs[ALG_BUF_RECV] = exec->op.recvbuff;
    SHIM_CHECK(shim_exec_assign_tags(exec));
    TRACE(SHIM_COLL, "%s seq %u: %s, %d steps, %zu scratch bytes",
          shim_coll_name(exec->op.coll), exec->seq, exec->alg_name, nsteps,
          exec->sched.scratch_bytes);
    return ncclSuccess;
}

/* What a builder (or the shared-memory path) sees of an op. */
static struct alg_args
shim_exec_args(const struct shim_op *op)
{
    const struct ncclComm *comm = op->comm;
    return (struct alg_args){
        .coll = shim_op_alg_coll(op->coll),
        .count = op->count,
        .elem_size = kr_type_size(op->datatype),
        .rank = comm->rank,
        .nranks = comm->nranks,
        .root = op->root,
        .in_place = shim_exec_in_place(op),
        .chunk_bytes = comm->chunk_bytes,
        .chunk_min_bytes = comm->chunk_min_bytes,
        .slots = comm->ring_slots,
        .prescale = op->redop.kind == KR_PREMULSUM,
        .hosts = comm->hosts.nhosts > 1 ? &comm->hosts : NULL,
    };
}

/* On one host, every collective goes through shared memory unless the user's NCCL_ALGO or
 * NCCLSHIM_ALGO chose among the UCX algorithms for it. */
static bool
shim_exec_use_shm(const struct ncclComm *comm, const struct alg_args *args)
{
    return comm->shm != NULL && shm_serves(args->coll) && (comm->shm_colls & (1u << args->coll));
}

/* Numbers op and sets up its shared-memory op; returns the number. */
static uint32_t
shim_exec_shm_start(struct ncclComm *comm, const struct shim_op *op,
                    const struct alg_args *args, struct shm_op *shm_op)
{
    struct shm_coll_args shm_args = {
        .coll = args->coll,
        .send = op->sendbuff,
        .recv = op->recvbuff,
        .count = args->count,
        .elem_size = args->elem_size,
        .root = args->root,
        .redop = op->redop,
        .prescale = args->prescale,
        .in_place = args->in_place,
    };
    uint32_t seq = shim_op_next_seq(comm, op);
    shm_team_note_cpu(comm->shm);
    shm_op_init(shm_op, comm->shm, &shm_args);
    TRACE(SHIM_COLL, "%s seq %u: shared memory, chunk %zu bytes", shim_coll_name(op->coll), seq,
          shm_op->chunk);
    return seq;
}

/* Marks exec as running its shared-memory op (set up by shim_exec_shm_start) as number seq. */
static void
shim_exec_shm_adopt(struct shim_exec *exec, uint32_t seq)
{
    exec->shm = true;
    exec->alg_name = "shm";
    exec->seq = seq;
}

/* A zeroed exec with an empty schedule: the communicator's spare one if it has it (a
 * collective a call is the common case, and calloc of this size goes past glibc's per-thread
 * cache), else a new one. The spare keeps the storage of its last schedule and per-step
 * arrays, so that a call allocates none of them (seven allocations a call before, between
 * hosts). */
static ncclResult_t
shim_exec_alloc(struct ncclComm *comm, struct shim_exec **exec_out)
{
    struct shim_exec *exec = comm->spare_exec;
    if (exec == NULL) {
        return shim_calloc(exec_out, 1);
    }
    const struct alg_sched sched = exec->sched;
    uint8_t *state = exec->state;
    uint64_t *tags = exec->tags;
    struct tp_request *reqs = exec->reqs;
    const int step_capacity = exec->step_capacity;

    comm->spare_exec = NULL;
    memset(exec, 0, sizeof(*exec));
    exec->sched = sched;
    alg_sched_reset(&exec->sched);
    exec->state = state;
    exec->tags = tags;
    exec->reqs = reqs;
    exec->step_capacity = step_capacity;
    *exec_out = exec;
    return ncclSuccess;
}

/* Frees what an exec owns but its scratch, and the exec. */
static void
shim_exec_free(struct shim_exec *exec)
{
    free(exec->how);
    free(exec->since);
    free(exec->tickets);
    free(exec->reqs);
    free(exec->tags);
    free(exec->state);
    alg_sched_free(&exec->sched);
    free(exec);
}

void
shim_exec_free_spare(struct ncclComm *comm)
{
    if (comm->spare_exec != NULL) {
        shim_exec_free(comm->spare_exec);
        comm->spare_exec = NULL;
    }
}

/* A zeroed exec for op, with an empty schedule. */
static ncclResult_t
shim_exec_new(const struct shim_op *op, struct shim_exec **exec_out)
{
    SHIM_CHECK(shim_exec_alloc(op->comm, exec_out));
    (*exec_out)->op = *op;
    return ncclSuccess;
}

/* The pipeline chunk of exec's schedule: the algorithm's choice (alg_select_chunk), but whole
 * where two ranks move host memory that nothing reduces. Two ranks have no pipeline to fill,
 * each chunk lands where it belongs, and every chunk is one more message, each a rendezvous
 * for UCX across hosts (2 x 1, 1-64 MiB, five interleaved rounds, medians: broadcast
 * 1.66-2.02 GB/s in 512 KiB chunks, 1.87-2.21 whole; all-gather 0.82-0.97 and 0.93-0.99).
 * Staged device memory keeps its chunks, which overlap the copies out of the device with the
 * sends; NCCLSHIM_CHUNK_BYTES stays the largest chunk when the user sets it. */
static size_t
shim_exec_chunk(const struct shim_exec *exec, const struct alg_algorithm *alg,
                const struct alg_args *args)
{
    const struct ncclComm *comm = exec->op.comm;
    const size_t bytes = alg_bytes(args, args->count);
    const bool unreduced = args->coll == ALG_COLL_BROADCAST || args->coll == ALG_COLL_ALLGATHER;

    if (args->nranks == 2 && unreduced && !exec->staged && !comm->chunk_bytes_set) {
        return bytes > args->chunk_bytes ? bytes : args->chunk_bytes; /* whole; nothing to weigh */
    }
    return alg_select_chunk(alg, args, &comm->cost);
}

/* Chooses exec's algorithm, builds and arms its schedule; destroys exec on failure. */
static ncclResult_t
shim_exec_schedule(struct shim_exec *exec, struct alg_args args)
{
    const struct shim_op *op = &exec->op;
    struct ncclComm *comm = op->comm;
    ncclResult_t res;
    double estimate;
    const struct alg_algorithm *alg = alg_select(&args, &comm->policy, &comm->cost, &estimate);
    if (alg == NULL) {
        WARN("no algorithm implements %s yet", shim_coll_name(op->coll));
        res = ncclInvalidUsage;
        goto err_free;
    }
    args.chunk_bytes = shim_exec_chunk(exec, alg, &args);
    shim_exec_log_choice(comm, op, &args, alg, estimate);
    exec->alg_name = alg->name;
    SHIM_CHECK_GOTO(alg->build(&args, &exec->sched), res, err_free);
    SHIM_CHECK_GOTO(shim_exec_arm(exec), res, err_free);
    return ncclSuccess;

err_free:
    shim_exec_destroy(exec);
    return res;
}

ncclResult_t
shim_exec_create(const struct shim_op *op, struct shim_exec **exec_out)
{
    struct shim_exec *exec;

    SHIM_CHECK(shim_exec_new(op, &exec));
    struct alg_args args = shim_exec_args(op);
    if (shim_exec_use_shm(op->comm, &args)) {
        shim_exec_shm_adopt(exec, shim_exec_shm_start(op->comm, op, &args, &exec->shm_op));
        *exec_out = exec;
        return ncclSuccess;
    }
    SHIM_CHECK(shim_exec_schedule(exec, args));
    *exec_out = exec;
    return ncclSuccess;
}

ncclResult_t
shim_exec_create_staged(const struct shim_op *op, bool direct, struct shim_exec **exec_out)
{
    struct shim_exec *exec;

    /* Not the communicator's spare: a staged exec ends on the staging's thread. */
    SHIM_CHECK(shim_calloc(&exec, 1));
    exec->op = *op;
    exec->staged = true;
    exec->direct = direct;
    alg_sched_init(&exec->sched);
    SHIM_CHECK(shim_exec_schedule(exec, shim_exec_args(op)));
    shim_staged_plan(exec);
    *exec_out = exec;
    return ncclSuccess;
}

ncclResult_t
shim_exec_create_schedule(struct ncclComm *comm, struct alg_sched *sched, const void *send,
                          void *recv, struct shim_exec **exec_out)
{
    struct shim_exec *exec;
    ncclResult_t res;

    SHIM_CHECK(shim_exec_alloc(comm, &exec));
    exec->op = (struct shim_op){.coll = SHIM_COLL_BARRIER, .sendbuff = send, .recvbuff = recv,
                                .datatype = ncclInt8, .redop = {.kind = KR_SUM,
                                                                .type = ncclInt8},
                                .root = -1, .comm = comm};
    exec->alg_name = "management";
    exec->management = true;
    alg_sched_free(&exec->sched); /* a spare's storage: the given schedule takes its place */
    exec->sched = *sched;
    alg_sched_init(sched); /* the exec owns the steps now */
    SHIM_CHECK_GOTO(shim_exec_arm(exec), res, err);
    *exec_out = exec;
    return ncclSuccess;
err:
    shim_exec_destroy(exec);
    return res;
}

ncclResult_t
shim_exec_run_schedule(struct ncclComm *comm, struct alg_sched *sched, const void *send,
                       void *recv)
{
    struct shim_exec *exec;

    SHIM_CHECK(shim_exec_create_schedule(comm, sched, send, recv, &exec));
    ncclResult_t res = shim_exec_run(&exec, 1);
    shim_exec_destroy(exec);
    return res;
}

int
shim_exec_describe(const struct shim_exec *exec, char *buf, size_t len)
{
    static const char *const kinds[] = {"send", "receive", "reduce", "copy"};
    const struct shim_op *op = &exec->op;
    int n = snprintf(buf, len, "%s seq %u, count %zu %s, root %d, %s: ", shim_coll_name(op->coll),
                     exec->seq, op->count, kr_type_name(op->datatype), op->root, exec->alg_name);

    if (n < 0 || (size_t)n >= len) {
        return n;
    }
    buf += n, len -= (size_t)n;
    if (exec->shm) {
        return n + shm_op_describe(&exec->shm_op,
                                   exec->shm_wait.addr != NULL ? &exec->shm_wait : NULL, buf,
                                   len);
    }
    for (int i = exec->first_pending; i < exec->sched.nsteps; i++) {
        const struct alg_step *step = &exec->sched.steps[i];
        if (exec->state[i] == SHIM_STEP_DONE) {
            continue;
        }
        if (exec->state[i] == SHIM_STEP_STAGING) {
            return n + snprintf(buf, len, "%d/%d steps done, step %d (%s of %zu bytes, rank %d) "
                                "waits for %s", exec->ndone, exec->sched.nsteps, i,
                                kinds[step->kind],
                                step->kind == ALG_STEP_SEND ? step->src[0].len : step->dst.len,
                                step->peer, shim_staged_waits_for(exec, i));
        }
        if (exec->state[i] == SHIM_STEP_POSTED) {
            return n + snprintf(buf, len, "%d/%d steps done, step %d waits for rank %d (%s of "
                                "%zu bytes, tag 0x%016llx)", exec->ndone, exec->sched.nsteps, i,
                                step->peer, kinds[step->kind],
                                step->kind == ALG_STEP_SEND ? step->src[0].len : step->dst.len,
                                (unsigned long long)exec->tags[i]);
        }
    }
    return n + snprintf(buf, len, "%d/%d steps done", exec->ndone, exec->sched.nsteps);
}

const struct shim_op *
shim_exec_op(const struct shim_exec *exec)
{
    return &exec->op;
}

uint32_t
shim_exec_seq(const struct shim_exec *exec)
{
    return exec->seq;
}

void
shim_exec_destroy(struct shim_exec *exec)
{
    if (exec == NULL) {
        return;
    }
    if (exec->shm && exec->op.comm->shm->owner == &exec->shm_op) {
        exec->op.comm->shm->owner = NULL; /* failed midway; the communicator is failed too */
    }
    for (int i = 0; exec->state != NULL && i < exec->sched.nsteps; i++) {
        if (exec->state[i] == SHIM_STEP_POSTED) {
            tp_request_cancel(exec->op.comm->tp, &exec->reqs[i]);
        }
    }
    if (!exec->staged) {
        shim_comm_scratch_put(exec->op.comm, exec->bufs[ALG_BUF_SCRATCH],
                              exec->sched.scratch_bytes);
    }
    if (!exec->staged && exec->op.comm != NULL && exec->op.comm->spare_exec == NULL) {
        exec->op.comm->spare_exec = exec; /* with its schedule's and steps' storage */
    } else {
        shim_exec_free(exec);
    }
}

bool
shim_exec_done(const struct shim_exec *exec)
{
    return exec->shm ? exec->shm_done : exec->ndone == exec->sched.nsteps;
}

/* Reductions and copies run to completion here: on host memory they are plain CPU work. */
void
shim_exec_compute(uint8_t *const bufs[ALG_BUF_COUNT], const struct alg_step *step,
                  const struct kr_redop *redop)
{
    size_t count = step->dst.len / kr_type_size(redop->type);
    unsigned flags = shim_exec_kr_flags(step->flags);
    void *dst = bufs[step->dst.buf] + step->dst.off;
    const void *a = bufs[step->src[0].buf] + step->src[0].off;

    if (step->kind == ALG_STEP_REDUCE) {
        const void *b = bufs[step->src[1].buf] + step->src[1].off;
        kr_reduce_host(dst, a, b, count, redop, flags);
        return;
    }
    if (shim_exec_copy_scales(redop, flags)) {
        kr_reduce_host(dst, a, NULL, count, redop, flags);
    } else if (dst != a) {
        kr_copy_host(dst, a, step->dst.len);
    }
}

/* Posts a send or receive step's message. */
ncclResult_t
shim_exec_post(struct shim_exec *exec, int i)
{
    const struct alg_step *step = &exec->sched.steps[i];
    struct tp_worker *tp = exec->op.comm->tp;

    if (step->kind == ALG_STEP_SEND) {
        SHIM_CHECK(tp_send_post(tp, step->peer, shim_exec_wire_ptr(exec, step->src[0]),
                                step->src[0].len, exec->tags[i], &exec->reqs[i]));
    } else {
        SHIM_CHECK(tp_recv_post(tp, step->peer, shim_exec_wire_ptr(exec, step->dst),
                                step->dst.len, exec->tags[i], &exec->reqs[i]));
    }
    exec->state[i] = SHIM_STEP_POSTED;
    if (exec->since != NULL) {
        exec->since[i] = shim_clock_ns();
    }
    return ncclSuccess;
}

static bool
shim_exec_ready(const struct shim_exec *exec, const struct alg_step *step)
{
    for (int d = 0; d < step->ndeps; d++) {
        if (exec->state[step->deps[d]] != SHIM_STEP_DONE) {
            return false;
        }
    }
    return true;
}

/* Starts a ready step; a step that completes at once is DONE on return. */
static ncclResult_t
shim_exec_start(struct shim_exec *exec, int i)
{
    const struct alg_step *step = &exec->sched.steps[i];

    if (exec->staging != NULL) {
        return shim_staged_start(exec, i);
    }
    switch (step->kind) {
    case ALG_STEP_SEND:
    case ALG_STEP_RECV:
        return shim_exec_post(exec, i);
    default:
        shim_exec_compute(exec->bufs, step, &exec->op.redop);
        shim_exec_step_done(exec, i);
        return ncclSuccess;
    }
}

ncclResult_t
shim_exec_progress(struct shim_exec *exec, bool *progressed_out)
{
    struct tp_worker *tp = exec->op.comm->tp;
    bool progressed = false;

    if (exec->shm) {
        enum shm_status status =
            shm_op_progress(&exec->shm_op, exec->op.comm->shm, &exec->shm_wait);
        exec->shm_done = status == SHM_DONE;
        *progressed_out = status != SHM_BLOCKED;
        return ncclSuccess;
    }
    for (int i = exec->first_pending; i < exec->sched.nsteps; i++) {
        if (exec->state[i] == SHIM_STEP_PENDING && shim_exec_ready(exec, &exec->sched.steps[i])) {
            SHIM_CHECK(shim_exec_start(exec, i));
            progressed = true;
        }
        if (exec->state[i] == SHIM_STEP_STAGING) {
            SHIM_CHECK(shim_staged_test(exec, i, &progressed));
        }
        if (exec->state[i] == SHIM_STEP_POSTED) {
            bool done;
            SHIM_CHECK(tp_request_test(tp, &exec->reqs[i], &done));
            if (done && exec->staging != NULL) {
                SHIM_CHECK(shim_staged_message_done(exec, i));
            } else if (done) {
                shim_exec_step_done(exec, i);
            }
            progressed |= done;
        }
        if (i == exec->first_pending && exec->state[i] == SHIM_STEP_DONE) {
            exec->first_pending++;
        }
    }
    *progressed_out = progressed;
    return ncclSuccess;
}

/* ncclInvalidUsage if the communicator was aborted, or revoked (management exchanges, which
 * split and shrink run after a revoke, go on). A failed peer is not checked here: the
 * transport fails exactly the requests that involve it, and a peer that finished and closed
 * its side (destroy is local) must not fail an operation that no longer needs it. A peer
 * that gave up says so itself (shim_exec_check_notices). */
static ncclResult_t
shim_exec_check_comm(const struct shim_exec *exec)
{
    struct ncclComm *comm = exec->op.comm;

    if (__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        WARN("rank %d: communicator %p was aborted during an operation", comm->rank,
             (void *)comm);
        return ncclInvalidUsage;
    }
    if (!exec->management && __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)) {
        WARN("rank %d: communicator %p was revoked during %s seq %u", comm->rank, (void *)comm,
             shim_coll_name(exec->op.coll), exec->seq);
        return ncclInvalidUsage;
    }
    return ncclSuccess;
}

/* The environment's say in how runs wait, read once. */
struct shim_exec_tunables {
    int64_t spin_us; /* NCCLSHIM_SPIN_US, -1 when unset */
    int wait_ms;
    uint64_t timeout_ns;
};

static struct shim_exec_tunables shim_exec_tunables_value;
static pthread_once_t shim_exec_tunables_once = PTHREAD_ONCE_INIT;

static void
shim_exec_tunables_load(void)
{
    struct shim_exec_tunables *t = &shim_exec_tunables_value;
    t->spin_us = shim_env_str(SHIM_ENV_SPIN_US) != NULL ? shim_env_int(SHIM_ENV_SPIN_US) : -1;
    t->wait_ms = (int)shim_env_int(SHIM_ENV_WAIT_MS);
    t->timeout_ns = (uint64_t)shim_env_int(SHIM_ENV_TIMEOUT) * 1000000000u;
}

static const struct shim_exec_tunables *
shim_exec_tunables(void)
{
    pthread_once(&shim_exec_tunables_once, shim_exec_tunables_load);
    return &shim_exec_tunables_value;
}

/* What the ops of a run that could not move are waiting for. */
struct shim_exec_waits {
    bool transport;                /* a UCX message */
    const struct shm_wait *shm;    /* a shared-memory flag */
    bool oversubscribed;           /* more local ranks than CPUs */
    bool shares_cpu;               /* an awaited rank was last seen on our CPU */
    bool newcomer;                 /* an awaited rank has not reached its op yet */
    bool device;                   /* a staging copy on the GPU, which no fd announces */
};

static void
shim_exec_note_wait(const struct shim_exec *exec, struct shim_exec_waits *waits)
{
    if (!exec->shm) {
        waits->transport = true;
        waits->device |= exec->nstaging > 0;
        return;
    }
    waits->oversubscribed |= exec->op.comm->shm->oversubscribed;
    waits->newcomer |= !shm_op_peer_arrived(&exec->shm_op, &exec->shm_wait);
    if (exec->shm_wait.addr != NULL) {
        waits->shares_cpu |= shm_team_peer_shares_cpu(exec->op.comm->shm, exec->shm_wait.peer);
        if (waits->shm == NULL) {
            waits->shm = &exec->shm_wait;
        }
    }
}

/* Nothing moved for NCCLSHIM_WAIT_MS: is every rank of the communicator's host team that
 * the op may still need alive? Not only the one we wait for: it may itself wait for a rank
 * that died, and never post again. A rank that finished its part and exited is no failure
 * (a broadcast's root, or a fast rank woken first, may be gone before we look). */
/* Whether exec may still need anything from peer: a shared-memory op asks shm/; a
 * collective's schedule needs every rank (the one it waits for may wait for another); a
 * send, a receive or a management exchange needs the peers of its steps not yet done (an
 * exchange after a failure involves only the survivors, and must not fail on the dead). */
static bool
shim_exec_needs(const struct shim_exec *exec, int peer)
{
    if (exec->shm) {
        return shm_op_needs(&exec->shm_op, exec->op.comm->shm, peer);
    }
    if (!exec->management && exec->op.coll != SHIM_COLL_SEND &&
        exec->op.coll != SHIM_COLL_RECV) {
        return true;
    }
    for (int i = exec->first_pending; i < exec->sched.nsteps; i++) {
        const struct alg_step *step = &exec->sched.steps[i];
        if (exec->state[i] != SHIM_STEP_DONE && step->peer == peer &&
            (step->kind == ALG_STEP_SEND || step->kind == ALG_STEP_RECV)) {
            return true;
        }
    }
    return false;
}

/* A peer that sent its failure notice (its communicator failed) posts nothing more on this
 * communicator but a shrink's exchanges: an operation that still needs it cannot complete,
 * though what the peer waits for may be a third rank that we never hear from (a ring
 * neighbour's neighbour, dead), or nothing failed near us at all (its timeout ran out). A
 * management exchange goes on: a shrink is where the survivors, failed ones included, meet. */
static ncclResult_t
shim_exec_check_notices(const struct shim_exec *exec)
{
    struct ncclComm *comm = exec->op.comm;
    const char *why;
    int first = tp_worker_notice_first(comm->tp, &why);

    if (first < 0 || exec->management) {
        return ncclSuccess;
    }
    for (int peer = 0; peer < comm->nranks; peer++) {
        if (peer != comm->rank && tp_worker_noticed(comm->tp, peer) &&
            shim_exec_needs(exec, peer)) {
            WARN("rank %d: rank %d gave up on communicator %p, so %s seq %u cannot complete "
                 "(rank %d said: %s)", comm->rank, peer, (void *)comm,
                 shim_coll_name(exec->op.coll), exec->seq, first, why);
            return ncclRemoteError;
        }
    }
    return ncclSuccess;
}

static ncclResult_t
shim_exec_check_shm_peers(const struct shim_exec *exec)
{
    struct ncclComm *comm = exec->op.comm;

    for (int peer = 0; peer < comm->nranks; peer++) {
        if (peer != comm->rank && shim_exec_needs(exec, peer) &&
            !shm_team_peer_alive(comm->shm, peer)) {
            WARN("rank %d: rank %d died during %s seq %u (shared memory)", comm->rank, peer,
                 shim_coll_name(exec->op.coll), exec->seq);
            return ncclRemoteError;
        }
    }
    return ncclSuccess;
}

/* How long a rank polls before it sleeps: NCCLSHIM_SPIN_US if set. Otherwise long while
 * only shared memory is awaited: a sleeping rank's wakeup costs tens of microseconds on a
 * virtual machine, more than the wait it saves. With more ranks than CPUs that polling is a
 * loop of sched_yield, which hands the CPU to the ranks that have work (4 ranks on 2 CPUs,
 * 8 B all-reduce, medians of 8 alternating runs: 11.6 us with 20 us of it, 7.7 with 200).
 * Short when the network is awaited: UCX's event fds wake a sleeper. */
#define SHIM_SPIN_NS_SHM 200000u
#define SHIM_SPIN_NS_NETWORK 20000u
/* Ten times that when every awaited rank is already in the op, posting its chunks: its next
 * post is a chunk's work away, and a sleep there costs more than the spin. Two ranks that
 * both slept mid-op paid a wakeup (a few hundred us on this VM) per chunk from then on: 2-rank
 * broadcast sweeps fell to 0.06-0.8 GB/s on some runs, where they make 4-7. */
#define SHIM_SPIN_IN_OP_FACTOR 10u

/* And up to 2^SHIM_SPIN_MAX_SHIFT times that when sleeps keep ending sooner than the spin
 * before them would have (shim_exec_adapt_spin). Two ranks that both sleep can otherwise
 * feed each other: each one's wakeup outlasts the other's spin, so the other sleeps too, and
 * every call costs a spin and a wakeup. Seen as whole 2-rank runs of small all-gathers at
 * about 275 us a call (1 pass in 3 of a full compare), where others take 0.5. Per thread: it
 * is this thread's wakeups that are measured. */
#define SHIM_SPIN_MAX_SHIFT 4u
static __thread unsigned shim_spin_shift;

static uint64_t
shim_exec_spin_ns(int64_t spin_us, const struct shim_exec_waits *waits)
{
    if (spin_us >= 0) {
        uint64_t ns = (uint64_t)spin_us * 1000u; /* the user's choice, as given */
        return waits->transport || waits->newcomer ? ns : ns * SHIM_SPIN_IN_OP_FACTOR;
    }
    if (waits->device) {
        return SHIM_SPIN_NS_SHM; /* a copy takes microseconds; sleeps below are 1 ms */
    }
    if (waits->transport) {
        return SHIM_SPIN_NS_NETWORK;
    }
    uint64_t ns = (uint64_t)SHIM_SPIN_NS_SHM << shim_spin_shift;
    return waits->newcomer ? ns : ns * SHIM_SPIN_IN_OP_FACTOR;
}

/* After a sleep on a shared-memory flag that followed a spin of spun ns. A sleep that ended
 * within a few spins means the peer was close: spin longer from now on. The measure includes
 * our own wakeup, which is the cost in question (the 275 us calls above: a 200 us spin, the
 * rest wakeups). A sleep much longer than the spin (a peer really away) brings it back down. */
static void
shim_exec_adapt_spin(uint64_t spun, uint64_t slept)
{
    if (slept < 4 * spun && shim_spin_shift < SHIM_SPIN_MAX_SHIFT) {
        shim_spin_shift++;
    } else if (slept > 16 * spun && shim_spin_shift > 0) {
        shim_spin_shift--;
    }
}

/* How long a rank polls shared memory without yielding its CPU. */
#define SHIM_PAUSE_NS 3000u

static inline void
shim_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}

/* The awaited rank was last seen on our CPU, with a CPU to spare: it cannot post while we poll
 * there, and yielding hands the CPU back and forth at 2-3 us a call; the scheduler may keep
 * the two together for a whole run (cpu_move.c). Move to another CPU; failing that, sleep on
 * the flag, so the peer's post wakes us, perhaps on an idle CPU. 2 ranks, 8 B all-reduce,
 * 30 alternating runs: polling first took 8 us a call in 3 runs, yielding 2-3 us in 8. */
static void
shim_exec_part_from_peer(const struct shm_wait *wait, uint64_t now)
{
    if (!shim_cpu_move_away(now)) {
        shm_wait_sleep(wait, 1);
    }
}

/* Every unfinished op of a run, one line each, to stderr whatever NCCL_DEBUG says: the user
 * asked (SIGUSR1) or is about to get a timeout error. */
static void
shim_exec_report(struct shim_exec *const *execs, int nexecs, const char *why)
{
    char line[512];

    for (int i = 0; i < nexecs; i++) {
        const struct ncclComm *comm = execs[i]->op.comm;
        if (shim_exec_done(execs[i])) {
            continue;
        }
        shim_exec_describe(execs[i], line, sizeof(line));
        fprintf(stderr, "ncclshim report (%s): pid %d comm %p rank %d of %d: %s\n", why,
                (int)getpid(), (const void *)comm, comm->rank, comm->nranks, line);
    }
}

/* A communicator's op failed in a run (res): its ops stop there, the others of the run go
 * on (their communicators are sound, and their peers wait for them). The communicator keeps
 * the error for ncclCommGetAsyncError and tells its peers, whose operations may wait on it for
 * what it will never send (a dead rank's neighbours see the death; the ranks that wait on
 * them would not). A revoked one has not failed; an aborted one says nothing: its endpoints
 * close at once, which every peer sees. *first_failure keeps the run's first res. */
static void
shim_exec_fail_comm(struct shim_exec *const *execs, int nexecs, struct ncclComm *comm,
                    ncclResult_t res, ncclResult_t *first_failure)
{
    if (*first_failure == ncclSuccess) {
        *first_failure = res;
    }
    for (int i = 0; i < nexecs; i++) {
        execs[i]->abandoned |= execs[i]->op.comm == comm;
    }
    if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)) {
        return;
    }
    shim_comm_set_async_error(comm, res);
    if (!__atomic_load_n(&comm->abort_flag, __ATOMIC_ACQUIRE)) {
        tp_worker_notice_send(comm->tp, shim_error_last(&comm->log));
    }
}

static bool
shim_exec_running(const struct shim_exec *exec)
{
    return !exec->abandoned && !shim_exec_done(exec);
}

ncclResult_t
shim_exec_run(struct shim_exec *const *execs, int nexecs)
{
    struct tp_worker **workers;
    int nworkers = 0, remaining = 0;
    ncclResult_t res = ncclSuccess;
    ncclResult_t first_failure = ncclSuccess;

    struct tp_worker *few_workers[16];
    bool transport_ops = false;
    if (nexecs <= 16) {
        workers = few_workers;
    } else {
        SHIM_CHECK(shim_calloc(&workers, (size_t)nexecs));
    }
    for (int i = 0; i < nexecs; i++) {
        struct tp_worker *tp = execs[i]->op.comm->tp;
        /* A communicator with windows serves its peers' emulated puts (window_host.c) while it
         * waits, whatever it waits for. */
        transport_ops |= !execs[i]->shm || execs[i]->op.comm->windows != NULL;
        int w = 0;
        while (w < nworkers && workers[w] != tp) {
            w++;
        }
        if (w == nworkers) {
            workers[nworkers++] = tp;
        }
        remaining += shim_exec_running(execs[i]);
    }

    const struct shim_exec_tunables *tun = shim_exec_tunables();
    const int64_t spin_us = tun->spin_us;
    const int wait_ms = tun->wait_ms;
    const uint64_t timeout_ns = tun->timeout_ns;
    unsigned reports_seen = shim_report_requests();
    uint64_t last_progress = shim_clock_ns();
    uint64_t last_step = last_progress;
    struct shm_wait watched = {0}; /* the shared-memory flag awaited at the last look */
    for (bool first_pass = true; remaining > 0; first_pass = false) {
        bool progressed = false;
        bool stepped = false;
        /* Shared-memory ops alone leave UCX be: nothing of theirs moves there (unless the
         * communicator has windows). Nor does the first pass, which has posted nothing yet:
         * a small send completes as it is posted, and UCX's progress over TCP is a system
         * call (epoll_wait) that a root of a small broadcast would otherwise make per call. */
        for (int w = 0; transport_ops && !first_pass && w < nworkers; w++) {
            progressed |= tp_worker_progress(workers[w]);
        }
        struct shim_exec_waits waits = {0};
        bool failed_now = false;
        remaining = 0;
        for (int i = 0; i < nexecs; i++) {
            bool moved = false;
            if (!shim_exec_running(execs[i])) {
                continue;
            }
            res = shim_exec_progress(execs[i], &moved);
            if (res == ncclSuccess && !moved) {
                res = shim_exec_check_comm(execs[i]);
            }
            if (res == ncclSuccess && !moved) {
                res = shim_exec_check_notices(execs[i]);
                if (res != ncclSuccess) {
                    /* As at a timeout: the peer's may have run out, and ours shows nothing. */
                    shim_exec_report(execs, nexecs, "a peer gave up");
                }
            }
            if (res != ncclSuccess) {
                shim_exec_fail_comm(execs, nexecs, execs[i]->op.comm, res, &first_failure);
                res = ncclSuccess;
                failed_now = true;
                continue;
            }
            progressed |= moved;
            stepped |= moved;
            if (!shim_exec_done(execs[i])) {
                remaining++;
                shim_exec_note_wait(execs[i], &waits);
            }
        }
        if (failed_now) {
            continue; /* what is left, counted again without the failed communicator's ops */
        }
        if (remaining == 0) {
            break;
        }
        uint64_t now = shim_clock_ns();
        if (shim_report_requests() != reports_seen) {
            reports_seen = shim_report_requests();
            shim_exec_report(execs, nexecs, "on request");
        }
        /* The timeout and the liveness checks count steps of our operations, not transport
         * events: keepalives and other peers' teardown keep UCX busy during a partition. */
        if (stepped) {
            last_step = now;
        }
        /* An awaited flag that moved, short of what we wait for, is a peer at work: poll on.
         * Only silence for the spin time is worth a sleep. */
        if (waits.shm != NULL) {
            progressed |= waits.shm->addr == watched.addr && waits.shm->seen != watched.seen;
            watched = *waits.shm;
        }
        if (timeout_ns != 0 && now - last_step >= timeout_ns) {
            /* Every op left is stuck: each communicator of one fails. */
            shim_exec_report(execs, nexecs, "NCCLSHIM_TIMEOUT");
            for (int i = 0; i < nexecs; i++) {
                if (shim_exec_running(execs[i])) {
                    WARN("rank %d: no progress for NCCLSHIM_TIMEOUT=%llu s; giving up (the "
                         "report above says what each operation waits for)",
                         execs[i]->op.comm->rank, (unsigned long long)(timeout_ns / 1000000000u));
                    shim_exec_fail_comm(execs, nexecs, execs[i]->op.comm, ncclRemoteError,
                                        &first_failure);
                }
            }
            break;
        } else if (progressed) {
            last_progress = now;
        } else if (waits.shares_cpu && !waits.oversubscribed && !waits.transport) {
            shim_exec_part_from_peer(waits.shm, now);
        } else if (now - last_progress < shim_exec_spin_ns(spin_us, &waits)) {
            /* Another rank is about to answer: poll. Briefly without a system call, as a
             * peer on another CPU answers within a microsecond or two; then yielding, in
             * case the peer waits for our CPU. */
            if (waits.transport || waits.oversubscribed || now - last_progress > SHIM_PAUSE_NS) {
                sched_yield();
            } else {
                shim_cpu_relax();
            }
        } else if (waits.transport) {
            /* Nothing moved for a while: sleep until the network has news for us (briefly,
             * if shared-memory ops or staging copies wait too: they have no event fd). */
            bool briefly = waits.shm != NULL || waits.device;
            SHIM_CHECK_GOTO(tp_worker_wait(workers, nworkers, briefly ? 1 : wait_ms), res, out);
        } else if (waits.shm != NULL) {
            shm_wait_sleep(waits.shm, wait_ms);
            if (spin_us < 0) {
                shim_exec_adapt_spin(shim_exec_spin_ns(spin_us, &waits), shim_clock_ns() - now);
            }
        }
        /* Long without news: on one host a dead rank shows at once by its pid, sooner than
         * UCX's keepalive would tell (tens of seconds over shared memory). */
        if (!stepped && shim_clock_ns() - last_step >= (uint64_t)wait_ms * 1000000u) {
            for (int i = 0; i < nexecs; i++) {
                if (shim_exec_running(execs[i]) && execs[i]->op.comm->shm != NULL) {
                    ncclResult_t alive = shim_exec_check_shm_peers(execs[i]);
                    if (alive != ncclSuccess) {
                        shim_exec_fail_comm(execs, nexecs, execs[i]->op.comm, alive,
                                            &first_failure);
                    }
                }
            }
        }
    }
out:
    if (workers != few_workers) {
        free(workers);
    }
    return res != ncclSuccess ? res : first_failure;
}

/* Polls of a shared-memory op before the full run loop takes over. */
#define SHIM_QUICK_POLLS 64

ncclResult_t
shim_exec_run_one(const struct shim_op *op)
{
    struct ncclComm *comm = op->comm;
    struct alg_args args = shim_exec_args(op);
    struct shim_exec *exec;
    ncclResult_t res;

    if (shim_exec_use_shm(comm, &args)) {
        /* A call outside a group on one host, the latency-bound case: most small calls
         * finish within a few polls of an op on the stack; only one that must wait gets an
         * exec and the run loop. */
        struct shm_op quick;
        struct shm_wait wait = {0};
        uint32_t seq = shim_exec_shm_start(comm, op, &args, &quick);
        for (int poll = 0; poll < SHIM_QUICK_POLLS; poll++) {
            enum shm_status status = shm_op_progress(&quick, comm->shm, &wait);
            if (status == SHM_DONE) {
                return ncclSuccess;
            }
            if (status != SHM_BLOCKED) {
                continue;
            }
            /* As shim_exec_run waits. */
            if (wait.addr == NULL || !shm_team_peer_shares_cpu(comm->shm, wait.peer)) {
                shim_cpu_relax();
            } else if (comm->shm->oversubscribed) {
                sched_yield();
            } else {
                shim_exec_part_from_peer(&wait, shim_clock_ns());
            }
        }
        res = shim_exec_new(op, &exec);
        if (res != ncclSuccess) {
            if (comm->shm->owner == &quick) {
                comm->shm->owner = NULL; /* the peers will fail too, at their timeout */
            }
            return res;
        }
        shim_exec_shm_adopt(exec, seq);
        exec->shm_op = quick;
        exec->shm_wait = wait;
        if (comm->shm->owner == &quick) {
            comm->shm->owner = &exec->shm_op; /* the op moved */
        }
        res = shim_exec_run(&exec, 1);
        shim_exec_destroy(exec);
        return res;
    }
    SHIM_CHECK(shim_exec_create(op, &exec));
    res = shim_exec_run(&exec, 1);
    shim_exec_destroy(exec);
    return res;
}
