/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Communicator lifecycle: init (blocking, non-blocking on a thread of its own, and several at
 * once for ncclCommInitAll), finalize, destroy, abort; the registry that tells a live
 * communicator from a destroyed one; errors; the scratch cache; PreMulSum operators.
 *
 * Init is: create the transport worker, trade worker addresses through the bootstrap root,
 * connect to every peer. Every later exchange between ranks goes over the transport.
 */
#include "comm.h"
#include "register.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/env.h"
#include "base/report.h"
#include "bootstrap/bootstrap.h"
#include "engine/backend.h"
#include "engine/connect.h"
#include "engine/exec.h"
#include "engine/exec_device.h"
#include "engine/window.h"
#include "gpu/driver.h"
#include "group.h"

/* Live communicators, so a destroyed or made-up handle is an error and not a crash. */
static pthread_mutex_t shim_comm_registry_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ncclComm *shim_comm_registry;

/* Bumped by every unregister, so a thread may remember the last communicator it found live
 * (the hot path: the same communicator call after call) until any communicator goes away. */
static unsigned shim_comm_registry_gen; /* atomic */
static __thread const struct ncclComm *shim_comm_known_live;
static __thread unsigned shim_comm_known_gen;

static void
shim_comm_register(struct ncclComm *comm)
{
    pthread_mutex_lock(&shim_comm_registry_lock);
    comm->next_live = shim_comm_registry;
    shim_comm_registry = comm;
    pthread_mutex_unlock(&shim_comm_registry_lock);
}

static void
shim_comm_unregister(struct ncclComm *comm)
{
    pthread_mutex_lock(&shim_comm_registry_lock);
    for (struct ncclComm **link = &shim_comm_registry; *link != NULL;
         link = &(*link)->next_live) {
        if (*link == comm) {
            *link = comm->next_live;
            break;
        }
    }
    __atomic_add_fetch(&shim_comm_registry_gen, 1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&shim_comm_registry_lock);
}

static bool
shim_comm_is_live(const struct ncclComm *comm)
{
    bool live = false;

    if (comm == shim_comm_known_live &&
        shim_comm_known_gen == __atomic_load_n(&shim_comm_registry_gen, __ATOMIC_ACQUIRE)) {
        return true;
    }
    pthread_mutex_lock(&shim_comm_registry_lock);
    for (const struct ncclComm *c = shim_comm_registry; c != NULL && !live; c = c->next_live) {
        live = c == comm;
    }
    if (live) {
        shim_comm_known_live = comm;
        shim_comm_known_gen = shim_comm_registry_gen;
    }
    pthread_mutex_unlock(&shim_comm_registry_lock);
    return live;
}


ncclResult_t
shim_comm_check(const struct ncclComm *comm, const char *api)
{
    if (comm == NULL) {
        WARN("%s: communicator is NULL", api);
        return ncclInvalidArgument;
    }
    if (!shim_comm_is_live(comm)) {
        WARN("%s: communicator %p is not a live communicator (destroyed, or never created)",
             api, (const void *)comm);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* Waits for a non-blocking init's thread, once. */
static void
shim_comm_join_init(struct ncclComm *comm)
{
    pthread_mutex_lock(&comm->lock);
    if (comm->init_thread_live) {
        pthread_join(comm->init_thread, NULL);
        comm->init_thread_live = false;
    }
    pthread_mutex_unlock(&comm->lock);
}

ncclResult_t
shim_comm_check_ready(struct ncclComm *comm, const char *api)
{
    SHIM_CHECK(shim_comm_check(comm, api));
    enum shim_comm_state state = __atomic_load_n(&comm->state, __ATOMIC_ACQUIRE);
    if (state == SHIM_COMM_INITIALIZING) {
        /* A collective on a communicator still joining: wait for the join, as NCCL would
         * order it behind init. */
        shim_comm_join_init(comm);
        state = __atomic_load_n(&comm->state, __ATOMIC_ACQUIRE);
    }
    if (__atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE)) {
        WARN("%s: communicator %p was revoked; only split, shrink, destroy and abort remain",
             api, (void *)comm);
        return ncclInvalidUsage;
    }
    if (comm->suspended) {
        WARN("%s: communicator %p is suspended (ncclCommSuspend): ncclCommResume it first",
             api, (void *)comm);
        return ncclInvalidUsage;
    }
    switch (state) {
    case SHIM_COMM_READY:
        return ncclSuccess;
    case SHIM_COMM_FINALIZED:
        WARN("%s: communicator %p was finalized", api, (void *)comm);
        return ncclInvalidUsage;
    default:
        WARN("%s: communicator %p has failed (%s); only ncclCommAbort/Destroy remain", api,
             (void *)comm, shim_result_text(comm->async_error));
        return ncclInvalidUsage;
    }
}

ncclResult_t
shim_comm_check_parent(struct ncclComm *comm, bool allow_failed, const char *api)
{
    SHIM_CHECK(shim_comm_check(comm, api));
    shim_comm_join_init(comm);
    enum shim_comm_state state = __atomic_load_n(&comm->state, __ATOMIC_ACQUIRE);
    bool revoked = __atomic_load_n(&comm->revoked, __ATOMIC_ACQUIRE);
    if (state == SHIM_COMM_READY || (state == SHIM_COMM_FAILED && allow_failed) ||
        (revoked && state != SHIM_COMM_INITIALIZING)) {
        return ncclSuccess;
    }
    return shim_comm_check_ready(comm, api); /* says what is wrong */
}

ncclResult_t
shim_comm_revoke(struct ncclComm *comm)
{
    __atomic_store_n(&comm->revoked, 1, __ATOMIC_RELEASE);
    shim_devexec_backend(comm)->release(comm); /* device operations in flight stop waiting */
    INFO(SHIM_INIT, "comm %p rank %d nranks %d - Revoked", (void *)comm, comm->rank,
         comm->nranks);
    return ncclSuccess;
}

ncclResult_t
shim_comm_suspend(struct ncclComm *comm)
{
    SHIM_CHECK(shim_comm_check_ready(comm, "ncclCommSuspend"));
    /* The device work already enqueued still uses what goes: it finishes first. */
    SHIM_CHECK(shim_devexec_drain(comm));
    SHIM_CHECK(shim_devexec_backend(comm)->release_memory(comm));
    free(comm->scratch);
    comm->scratch = NULL;
    comm->scratch_bytes = 0;
    shim_connect_suspend(comm);
    comm->suspended = true;
    INFO(SHIM_INIT, "comm %p rank %d nranks %d - Suspended", (void *)comm, comm->rank,
         comm->nranks);
    return ncclSuccess;
}

ncclResult_t
shim_comm_resume(struct ncclComm *comm)
{
    SHIM_CHECK(shim_comm_check(comm, "ncclCommResume"));
    if (!comm->suspended) {
        WARN("ncclCommResume: communicator %p is not suspended", (void *)comm);
        return ncclInvalidUsage;
    }
    comm->suspended = false; /* what went is made again when an operation needs it */
    INFO(SHIM_INIT, "comm %p rank %d nranks %d - Resumed", (void *)comm, comm->rank,
         comm->nranks);
    return ncclSuccess;
}

void
shim_comm_gpu_bytes(const struct ncclComm *comm, uint64_t *releasable_out,
                    uint64_t *persistent_out)
{
    /* The device team's staging areas, which suspension frees, and the work areas of a GPU
     * alone with its rank, which it keeps; the kernels' code belongs to the process, other
     * ranks' memory to its owners. */
    shim_devexec_backend(comm)->device_bytes(comm, releasable_out, persistent_out);
}

ncclResult_t
shim_comm_async_error(struct ncclComm *comm)
{
    if (__atomic_load_n(&comm->state, __ATOMIC_ACQUIRE) == SHIM_COMM_INITIALIZING) {
        return ncclInProgress;
    }
    shim_comm_join_init(comm);
    ncclResult_t res = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    /* A failure the device team's thread found: a dead rank, a timeout, a CUDA error. */
    return res != ncclSuccess ? res : shim_devexec_comm_error(comm);
}

ncclResult_t
shim_comm_wait_init(struct ncclComm *comm)
{
    shim_comm_join_init(comm);
    ncclResult_t res = __atomic_load_n(&comm->async_error, __ATOMIC_ACQUIRE);
    /* A failure the device team's thread found: a dead rank, a timeout, a CUDA error. */
    return res != ncclSuccess ? res : shim_devexec_comm_error(comm);
}


/* Worker, address exchange through the bootstrap root, endpoints to every peer. */
static ncclResult_t
shim_comm_connect(struct ncclComm *comm, const ncclUniqueId *id)
{
    struct shim_bootstrap_table *table;
    const void *addr, **addrs;
    size_t len;
    ncclResult_t res;

    SHIM_CHECK(shim_connect_open(comm));
    SHIM_CHECK(shim_connect_address(comm, &addr, &len));
    int timeout_ms = (int)shim_env_int(SHIM_ENV_BOOTSTRAP_TIMEOUT) * 1000;
    SHIM_CHECK(shim_bootstrap_exchange(id, comm->rank, comm->nranks, addr, len, timeout_ms,
                                       &table));
    /* Ids from NCCL_COMM_ID repeat across communicators; the root's session does not. */
    comm->id_hash ^= table->session;
    comm->tag_base = (uint8_t)(comm->id_hash >> 56);
    SHIM_CHECK_GOTO(shim_calloc(&addrs, (size_t)comm->nranks), res, out_table);
    for (int r = 0; r < comm->nranks; r++) {
        addrs[r] = table->data + table->offsets[r];
    }
    res = shim_connect_peers(comm, addrs, table->lens);
    free(addrs);
out_table:
    shim_bootstrap_table_free(table);
    return res;
}

static ncclResult_t
shim_comm_init_body(struct ncclComm *comm, const ncclUniqueId *id)
{
    shim_comm_bind(comm);
    shim_log_banner();
    ncclResult_t res = shim_comm_connect(comm, id);
    if (res == ncclSuccess) {
        __atomic_store_n(&comm->state, SHIM_COMM_READY, __ATOMIC_RELEASE);
        INFO(SHIM_INIT, "comm %p rank %d nranks %d cudaDev %d%s%s - Init COMPLETE",
             (void *)comm, comm->rank, comm->nranks, comm->cuda_dev,
             comm->name[0] != '\0' ? " name " : "", comm->name);
    } else {
        shim_comm_set_async_error(comm, res);
    }
    shim_comm_bind(NULL);
    return res;
}

struct shim_comm_init_job {
    struct ncclComm *comm;
    ncclUniqueId id;
};

static void *
shim_comm_init_thread(void *arg)
{
    struct shim_comm_init_job *job = arg;
    gpu_capture_relax_thread(); /* the program may capture in global mode meanwhile */
    shim_comm_init_body(job->comm, &job->id);
    free(job);
    return NULL;
}

static ncclResult_t
shim_comm_alloc(const struct shim_comm_args *args, uint64_t id_hash, struct ncclComm **comm_out)
{
    struct ncclComm *comm;

    SHIM_CHECK(shim_calloc(&comm, 1));
    if (alg_policy_parse(shim_env_str(SHIM_ENV_NCCL_ALGO), shim_env_str(SHIM_ENV_ALGO),
                         &comm->policy) != ncclSuccess) {
        free(comm);
        return ncclInvalidArgument;
    }
    comm->cost = shim_connect_cost_params();
    shim_report_install();
    comm->id_hash = id_hash;
    comm->magic = SHIM_COMM_MAGIC;
    comm->rank = args->rank;
    comm->nranks = args->nranks;
    comm->cuda_dev = args->cuda_dev;
    comm->cuda_dev_chosen = args->cuda_dev_chosen;
    comm->blocking = args->blocking;
    memcpy(comm->name, args->name, sizeof(comm->name));
    comm->state = SHIM_COMM_INITIALIZING;
    comm->chunk_bytes_set = shim_env_str(SHIM_ENV_CHUNK_BYTES) != NULL;
    comm->chunk_bytes = comm->chunk_bytes_set ? (size_t)shim_env_int(SHIM_ENV_CHUNK_BYTES)
                                              : SHIM_CHUNK_BYTES_ONE_HOST;
    comm->ring_slots = (int)shim_env_int(SHIM_ENV_RING_SLOTS);
    if (comm->chunk_bytes == 0 || comm->ring_slots < 1 || comm->ring_slots > 64) {
        WARN("NCCLSHIM_CHUNK_BYTES must be > 0 and NCCLSHIM_RING_SLOTS in 1..64 (got %zu, %d)",
             comm->chunk_bytes, comm->ring_slots);
        free(comm);
        return ncclInvalidArgument;
    }
    /* One allocation for the four per-peer counters. */
    if (shim_calloc(&comm->p2p_sent, 4 * (size_t)args->nranks) != ncclSuccess) {
        free(comm);
        return ncclSystemError;
    }
    comm->p2p_received = comm->p2p_sent + args->nranks;
    comm->mgmt_sent = comm->p2p_received + args->nranks;
    comm->mgmt_received = comm->mgmt_sent + args->nranks;
    pthread_mutex_init(&comm->lock, NULL);
    shim_log_scope_init(&comm->log, comm->cuda_dev);
    *comm_out = comm;
    return ncclSuccess;
}

/* abort: the device team releases every stream waiting on this rank's operations instead of
 * waiting for them. */
static void
shim_comm_free(struct ncclComm *comm, bool abort)
{
    shim_comm_unregister(comm);
    shim_reg_free_all(comm);
    shim_exec_free_spare(comm);
    shim_connect_close(comm, abort);
    shim_windows_free(comm); /* after the worker: puts in flight may read their copies */
    free(comm->scratch);
    free(comm->p2p_sent);
    pthread_mutex_destroy(&comm->lock);
    shim_log_scope_destroy(&comm->log);
    comm->magic = SHIM_COMM_DEAD;
    free(comm);
}

ncclResult_t
shim_comm_init(const struct shim_comm_args *args, struct ncclComm **comm_out)
{
    struct ncclComm *comm;
    uint64_t id_hash;
    ncclResult_t res;

    SHIM_CHECK(shim_bootstrap_id_hash(&args->id, &id_hash));
    SHIM_CHECK(shim_comm_alloc(args, id_hash, &comm));
    shim_comm_register(comm);
    if (args->blocking) {
        SHIM_CHECK_GOTO(shim_comm_init_body(comm, &args->id), res, err_free);
        *comm_out = comm;
        return ncclSuccess;
    }

    struct shim_comm_init_job *job;
    SHIM_CHECK_GOTO(shim_calloc(&job, 1), res, err_free);
    job->comm = comm;
    job->id = args->id;
    if (pthread_create(&comm->init_thread, NULL, shim_comm_init_thread, job) != 0) {
        WARN("rank %d: cannot start the init thread: %s", args->rank, strerror(errno));
        free(job);
        res = ncclSystemError;
        goto err_free;
    }
    comm->init_thread_live = true;
    *comm_out = comm;
    return ncclInProgress;

err_free:
    shim_comm_free(comm, true);
    return res;
}

ncclResult_t
shim_comm_child_create(const struct ncclComm *parent, int rank, int nranks, bool blocking,
                       struct ncclComm **comm_out)
{
    struct shim_comm_args args = {.nranks = nranks, .rank = rank, .blocking = blocking,
                                  .cuda_dev = parent->cuda_dev,
                                  .cuda_dev_chosen = parent->cuda_dev_chosen};
    struct ncclComm *comm;
    ncclResult_t res;

    SHIM_CHECK(shim_comm_alloc(&args, 0, &comm)); /* its identity comes at connect */
    shim_comm_register(comm);
    SHIM_CHECK_GOTO(shim_connect_open(comm), res, err_free);
    *comm_out = comm;
    return ncclSuccess;

err_free:
    shim_comm_free(comm, true);
    return res;
}

ncclResult_t
shim_comm_child_connect(struct ncclComm *comm, uint64_t id_hash, const void *const *addrs,
                        const size_t *lens)
{
    comm->id_hash = id_hash;
    comm->tag_base = (uint8_t)(id_hash >> 56);
    SHIM_CHECK(shim_connect_peers(comm, addrs, lens));
    __atomic_store_n(&comm->state, SHIM_COMM_READY, __ATOMIC_RELEASE);
    INFO(SHIM_INIT, "comm %p rank %d nranks %d cudaDev %d - Init COMPLETE (from a parent)",
         (void *)comm, comm->rank, comm->nranks, comm->cuda_dev);
    return ncclSuccess;
}

void
shim_comm_child_discard(struct ncclComm *comm)
{
    shim_comm_free(comm, true);
}

struct shim_comm_init_all_job {
    struct shim_comm_args args;
    struct ncclComm *comm;
    ncclResult_t res;
};

static void *
shim_comm_init_all_thread(void *arg)
{
    struct shim_comm_init_all_job *job = arg;
    gpu_capture_relax_thread();
    job->res = shim_comm_init(&job->args, &job->comm);
    return NULL;
}

ncclResult_t
shim_comm_init_all(struct ncclComm **comms, int ncomms, const int *devlist)
{
    struct shim_comm_init_all_job *jobs;
    pthread_t *threads;
    ncclUniqueId id;
    ncclResult_t res = ncclSuccess;
    int started = 0;

    SHIM_CHECK(shim_bootstrap_private_id(&id));
    SHIM_CHECK(shim_calloc(&jobs, (size_t)ncomms));
    SHIM_CHECK_GOTO(shim_calloc(&threads, (size_t)ncomms), res, out_jobs);
    /* Every rank joins the rendezvous at once, so each needs a thread of its own. */
    for (; started < ncomms; started++) {
        struct shim_comm_init_all_job *job = &jobs[started];
        job->args = (struct shim_comm_args){.nranks = ncomms, .rank = started, .id = id,
                                            .blocking = true,
                                            .cuda_dev = devlist ? devlist[started] : started,
                                            .cuda_dev_chosen = true};
        if (pthread_create(&threads[started], NULL, shim_comm_init_all_thread, job) != 0) {
            WARN("ncclCommInitAll: cannot start thread %d: %s", started, strerror(errno));
            res = ncclSystemError;
            break;
        }
    }
    for (int i = 0; i < started; i++) {
        pthread_join(threads[i], NULL);
        if (res == ncclSuccess && jobs[i].res != ncclSuccess) {
            res = jobs[i].res;
        }
    }
    for (int i = 0; i < started; i++) {
        if (res == ncclSuccess) {
            comms[i] = jobs[i].comm;
        } else if (jobs[i].res == ncclSuccess) {
            shim_comm_abort(jobs[i].comm);
        }
    }
    free(threads);
out_jobs:
    free(jobs);
    return res;
}

/* NCCL's finalize flushes and agrees with the peers that the communicator is quiet: here a
 * barrier. Inside a group it is queued like a collective, so one thread can finalize every
 * communicator of an ncclCommInitAll clique between ncclGroupStart and ncclGroupEnd. */
ncclResult_t
shim_comm_finalize(struct ncclComm *comm)
{
    struct shim_op barrier = {.coll = SHIM_COLL_BARRIER, .datatype = ncclInt8,
                              .redop = {.kind = KR_SUM, .type = ncclInt8}, .root = -1,
                              .comm = comm};

    SHIM_CHECK(shim_comm_check_ready(comm, "ncclCommFinalize"));
    SHIM_CHECK(shim_group_enqueue(&barrier));
    __atomic_store_n(&comm->state, SHIM_COMM_FINALIZED, __ATOMIC_RELEASE);
    INFO(SHIM_INIT, "comm %p rank %d nranks %d - Finalize %s", (void *)comm, comm->rank,
         comm->nranks, shim_group_active() ? "queued in group" : "COMPLETE");
    return ncclSuccess;
}

/* Local, as NCCL's: it never waits for the other ranks, so one thread may destroy the
 * communicators of a clique one after another. Every operation on host memory completed
 * inside its call, and the transport flushes what we sent before it closes. */
ncclResult_t
shim_comm_destroy(struct ncclComm *comm)
{
    shim_comm_join_init(comm);
    INFO(SHIM_INIT, "comm %p rank %d nranks %d - Destroy COMPLETE", (void *)comm, comm->rank,
         comm->nranks);
    shim_comm_bind(NULL);
    shim_comm_free(comm, false);
    return ncclSuccess;
}

ncclResult_t
shim_comm_abort(struct ncclComm *comm)
{
    __atomic_store_n(&comm->abort_flag, 1, __ATOMIC_RELEASE);
    shim_comm_join_init(comm);
    /* Calls of other threads (a watchdog aborts while the program's thread waits in a call)
     * see the abort and leave before anything of the communicator goes. */
    shim_devexec_backend(comm)->interrupt(comm);
    for (int waited_ms = 0; __atomic_load_n(&comm->calls_inside, __ATOMIC_ACQUIRE) > 0;
         waited_ms++) {
        if (waited_ms % 5000 == 4999) {
            WARN("rank %d: ncclCommAbort still waits for a call of another thread to return",
                 comm->rank);
        }
        usleep(1000);
    }
    INFO(SHIM_INIT, "comm %p rank %d nranks %d - Abort COMPLETE", (void *)comm, comm->rank,
         comm->nranks);
    shim_comm_bind(NULL);
    shim_comm_free(comm, true);
    return ncclSuccess;
}



ncclResult_t
shim_comm_redop_create(struct ncclComm *comm, const struct kr_redop *redop,
                       const void *scalar_ptr, bool scalar_device, ncclRedOp_t *op_out)
{
    for (int i = 0; i < SHIM_MAX_USER_OPS; i++) {
        if (!comm->user_ops[i].in_use) {
            comm->user_ops[i] = (struct shim_user_op){true, *redop, scalar_ptr, scalar_device};
            *op_out = (ncclRedOp_t)(ncclNumOps + i);
            return ncclSuccess;
        }
    }
    WARN("ncclRedOpCreatePreMulSum: communicator %p already has %d operators; destroy some",
         (void *)comm, SHIM_MAX_USER_OPS);
    return ncclInvalidUsage;
}

static struct shim_user_op *
shim_comm_user_op(struct ncclComm *comm, ncclRedOp_t op)
{
    int index = (int)op - (int)ncclNumOps;
    if (index < 0 || index >= SHIM_MAX_USER_OPS || !comm->user_ops[index].in_use) {
        return NULL;
    }
    return &comm->user_ops[index];
}

ncclResult_t
shim_comm_redop_destroy(struct ncclComm *comm, ncclRedOp_t op)
{
    struct shim_user_op *user = shim_comm_user_op(comm, op);
    if (user == NULL) {
        WARN("ncclRedOpDestroy: op %d was not created on communicator %p (or was destroyed)",
             (int)op, (void *)comm);
        return ncclInvalidArgument;
    }
    user->in_use = false;
    return ncclSuccess;
}

ncclResult_t
shim_comm_redop_resolve(struct ncclComm *comm, ncclRedOp_t op, ncclDataType_t datatype,
                        bool device, struct kr_redop *redop_out, const void **scalar_dev_out)
{
    struct kr_redop redop = {.type = datatype};

    *scalar_dev_out = NULL;
    switch (op) {
    case ncclSum:
        redop.kind = KR_SUM;
        break;
    case ncclProd:
        redop.kind = KR_PROD;
        break;
    case ncclMax:
        redop.kind = KR_MAX;
        break;
    case ncclMin:
        redop.kind = KR_MIN;
        break;
    case ncclAvg:
        /* NCCL's numerics: floating types pre-multiply each input by float(1/n) rounded to
         * the type; integers sum, then divide. */
        if (kr_type_is_float(datatype)) {
            redop.kind = KR_PREMULSUM;
            double scale = datatype == ncclFloat64 ? 1.0 / comm->nranks
                                                   : (double)(float)(1.0 / comm->nranks);
            kr_scalar_from_double(datatype, scale, redop.scalar);
        } else {
            redop.kind = KR_SUMPOSTDIV;
            redop.divisor = (uint64_t)comm->nranks;
        }
        break;
    default: {
        struct shim_user_op *user = shim_comm_user_op(comm, op);
        if (user == NULL) {
            WARN("reduction op %d is neither built in nor created on communicator %p",
                 (int)op, (void *)comm);
            return ncclInvalidArgument;
        }
        if (user->redop.type != datatype) {
            WARN("reduction op %d was created for datatype %s but the call uses %s", (int)op,
                 kr_type_name(user->redop.type), kr_type_name(datatype));
            return ncclInvalidArgument;
        }
        redop = user->redop;
        if (user->scalar_device && !device) {
            WARN("reduction op %d has its scalar in device memory, but the call's buffers are "
                 "host memory: a device scalar needs device buffers", (int)op);
            return ncclInvalidUsage;
        }
        if (user->scalar_device) {
            *scalar_dev_out = user->scalar_ptr;
        } else if (user->scalar_ptr != NULL) {
            memcpy(redop.scalar, user->scalar_ptr, kr_type_size(datatype));
        }
    }
    }
    *redop_out = redop;
    return ncclSuccess;
}
