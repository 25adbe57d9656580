/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device operations through staging (exec_staged.h): the batches, the gates, the thread.
 */
#include "exec_staged.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/clock.h"
#include "base/env.h"
#include "backend.h"
#include "comm.h"
#include "exec_internal.h"
#include "gpu/staging.h"
#include "gpu/stream.h"
#include "transports/transport.h"

/* One group's operations of the communicator, behind one gate. */
struct shim_staged_batch {
    struct shim_staged_batch *next;
    uint32_t gate;
    int nexecs;
    struct shim_exec *execs[];
};

struct shim_staged {
    struct ncclComm *comm;
    const struct gpu_device *gpu;
    struct gpu_staging *staging;
    bool direct;                      /* UCX takes device buffers as they are */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;              /* a batch queued or finished, or stop */
    struct shim_staged_batch *head, *tail;
    uint32_t gates;                   /* the last gate given out */
    uint32_t finished;                /* the last gate whose batch the thread is done with */
    ncclResult_t error;               /* the first failure; later batches are only released */
    bool stop;
    struct shim_staged_phases *phases; /* NCCLSHIM_STAGED_PHASES=1: the thread's sums */
    uint64_t batches, batch_ns;       /* ... and the batches' wall time */
};

static void
shim_staged_batch_free(struct shim_staged_batch *batch)
{
    for (int i = 0; i < batch->nexecs; i++) {
        shim_exec_destroy(batch->execs[i]);
    }
    free(batch);
}

/* Lays the batch's execs out in the staging, then runs them between the gate's halves. */
static ncclResult_t
shim_staged_run_batch(struct shim_staged *staged, struct shim_staged_batch *batch)
{
    size_t total = 0;

    for (int i = 0; i < batch->nexecs; i++) {
        total += shim_exec_staged_needs(batch->execs[i]);
    }
    SHIM_CHECK(gpu_staging_reserve(staged->staging, total));
    total = 0;
    for (int i = 0; i < batch->nexecs; i++) {
        SHIM_CHECK(shim_exec_staged_bind(batch->execs[i], staged->staging, total,
                                         staged->phases));
        total += shim_exec_staged_needs(batch->execs[i]);
    }
    uint64_t start = shim_clock_ns();
    SHIM_CHECK(gpu_staging_follow_arrive(staged->staging));
    SHIM_CHECK(shim_exec_run(batch->execs, batch->nexecs));
    staged->batches++;
    staged->batch_ns += shim_clock_ns() - start;
    return gpu_staging_mark_done(staged->staging);
}

/* NCCLSHIM_STAGED_PHASES=1: one line on stderr, whatever NCCL_DEBUG says, as asked. */
static void
shim_staged_print_phases(const struct shim_staged *staged)
{
    static const char *const names[SHIM_PHASE_COUNT] = {
        [SHIM_PHASE_COPY_OUT] = "copies out", [SHIM_PHASE_KERNELS] = "waits for kernels",
        [SHIM_PHASE_SEND] = "sends", [SHIM_PHASE_RECV] = "receives",
        [SHIM_PHASE_COPY_IN] = "copies in"};
    char line[512];
    int n = snprintf(line, sizeof(line), "%llu batches in %.1f us each",
                     (unsigned long long)staged->batches,
                     staged->batches ? staged->batch_ns / 1e3 / (double)staged->batches : 0.0);

    for (int p = 0; p < SHIM_PHASE_COUNT && n > 0 && (size_t)n < sizeof(line); p++) {
        const uint64_t count = staged->phases->count[p];
        n += snprintf(line + n, sizeof(line) - (size_t)n, "; %s %llu, %.1f us each", names[p],
                      (unsigned long long)count,
                      count ? staged->phases->ns[p] / 1e3 / (double)count : 0.0);
    }
    fprintf(stderr, "ncclshim staged phases: pid %d comm %p rank %d: %s\n", (int)getpid(),
            (void *)staged->comm, staged->comm->rank, line);
}

static void *
shim_staged_thread(void *arg)
{
    struct shim_staged *staged = arg;
    bool pushed = gpu_ctx_push(staged->gpu->ctx) == ncclSuccess;

    gpu_capture_relax_thread();
    shim_comm_bind(staged->comm); /* WARNs land in the communicator's last error */
    pthread_mutex_lock(&staged->lock);
    for (;;) {
        while (staged->head == NULL && !staged->stop) {
            pthread_cond_wait(&staged->cond, &staged->lock);
        }
        struct shim_staged_batch *batch = staged->head;
        if (batch == NULL) {
            break;
        }
        ncclResult_t failed = staged->error;
        pthread_mutex_unlock(&staged->lock);

        ncclResult_t res = failed;
        if (res == ncclSuccess) {
            res = pushed ? shim_staged_run_batch(staged, batch) : ncclUnhandledCudaError;
            if (res != ncclSuccess &&
                !__atomic_load_n(&staged->comm->revoked, __ATOMIC_ACQUIRE)) {
                shim_comm_set_async_error(staged->comm, res);
            }
        }

        /* Freed before it counts as finished: a failed exec cancels its requests on the
         * worker, which a host call may drive once drain returns. */
        uint32_t gate = batch->gate;
        pthread_mutex_lock(&staged->lock);
        staged->head = batch->next;
        if (staged->head == NULL) {
            staged->tail = NULL;
        }
        pthread_mutex_unlock(&staged->lock);
        shim_staged_batch_free(batch);
        pthread_mutex_lock(&staged->lock);
        if (res != ncclSuccess && staged->error == ncclSuccess) {
            staged->error = res;
        }
        __atomic_store_n(&staged->finished, gate, __ATOMIC_RELEASE);
        pthread_cond_broadcast(&staged->cond);
    }
    pthread_mutex_unlock(&staged->lock);
    shim_comm_bind(NULL);
    if (pushed) {
        gpu_ctx_pop();
    }
    return NULL;
}

static ncclResult_t
shim_staged_create(struct ncclComm *comm, const struct gpu_device *gpu,
                   struct shim_staged **out)
{
    struct shim_staged *staged;
    ncclResult_t res;

    SHIM_CHECK(shim_calloc(&staged, 1));
    staged->comm = comm;
    staged->gpu = gpu;
    pthread_mutex_init(&staged->lock, NULL);
    pthread_cond_init(&staged->cond, NULL);
    SHIM_CHECK_GOTO(gpu_staging_create(gpu, &staged->staging), res, err);
    staged->direct = shim_env_str(SHIM_ENV_DEVICE_DIRECT) != NULL
                         ? shim_env_int(SHIM_ENV_DEVICE_DIRECT) != 0
                         : tp_cuda_memory();
    if (shim_env_int(SHIM_ENV_STAGED_PHASES) != 0) {
        SHIM_CHECK_GOTO(shim_calloc(&staged->phases, 1), res, err);
    }
    int rc = pthread_create(&staged->thread, NULL, shim_staged_thread, staged);
    if (rc != 0) {
        WARN("rank %d: cannot start the thread of device operations: %s", comm->rank,
             strerror(rc));
        res = ncclSystemError;
        goto err;
    }
    INFO(SHIM_INIT, "comm %p rank %d: device buffers go over the network, %s", (void *)comm,
         comm->rank, staged->direct ? "handed to UCX as they are"
                                    : "staged through pinned host memory");
    *out = staged;
    return ncclSuccess;
err:
    free(staged->phases);
    gpu_staging_destroy(staged->staging);
    pthread_mutex_destroy(&staged->lock);
    pthread_cond_destroy(&staged->cond);
    free(staged);
    return res;
}

static ncclResult_t
shim_staged_arrive(struct ncclComm *comm, const struct shim_op *ops, int nops,
                   const struct gpu_device *gpu, CUstream stream, bool capturing)
{
    (void)capturing; /* refused by the row (captures: false) */
    struct shim_staged_batch *batch;
    ncclResult_t res;

    if (comm->backend_state == NULL) {
        struct shim_staged *made;
        SHIM_CHECK(shim_staged_create(comm, gpu, &made));
        comm->backend_state = made;
    }
    struct shim_staged *staged = comm->backend_state;
    SHIM_CHECK(shim_calloc_bytes((void **)&batch, 1,
                                 sizeof(*batch) + (size_t)nops * sizeof(batch->execs[0]),
                                 __FILE__, __LINE__));
    for (int i = 0; i < nops; i++) {
        SHIM_CHECK_GOTO(shim_exec_create_staged(&ops[i], staged->direct, &batch->execs[i]), res,
                        err);
        batch->nexecs++;
    }
    pthread_mutex_lock(&staged->lock);
    batch->gate = staged->gates + 1;
    /* The last batch is finished (its call waited for that): arrived is free to record. */
    res = gpu_staging_arrive(staged->staging, stream);
    if (res == ncclSuccess) {
        __atomic_store_n(&staged->gates, batch->gate, __ATOMIC_RELEASE);
        if (staged->tail != NULL) {
            staged->tail->next = batch;
        } else {
            staged->head = batch;
        }
        staged->tail = batch;
        pthread_cond_broadcast(&staged->cond);
    }
    pthread_mutex_unlock(&staged->lock);
    if (res != ncclSuccess) {
        goto err;
    }
    return ncclSuccess;
err:
    shim_staged_batch_free(batch);
    return res;
}

static ncclResult_t
shim_staged_wait(struct ncclComm *comm, CUstream stream)
{
    struct shim_staged *staged = comm->backend_state;

    /* The user's stream may wait for done only once the in lane has the batch's last work
     * (gpu/staging.h): until the thread finished the batch, which is the last one given out. */
    pthread_mutex_lock(&staged->lock);
    uint32_t gate = staged->gates;
    while ((int32_t)(staged->finished - gate) < 0) {
        pthread_cond_wait(&staged->cond, &staged->lock);
    }
    bool failed = staged->error != ncclSuccess;
    pthread_mutex_unlock(&staged->lock);
    if (failed) {
        /* The error is the communicator's (ncclCommGetAsyncError); the stream stays blocked
         * until abort, destroy or revoke. */
        return gpu_staging_hold(staged->staging, stream, gate);
    }
    return gpu_staging_wait_done(staged->staging, stream);
}

static void
shim_staged_release(struct ncclComm *comm)
{
    struct shim_staged *staged = comm->backend_state;

    if (staged != NULL) {
        gpu_staging_release(staged->staging, __atomic_load_n(&staged->gates, __ATOMIC_ACQUIRE));
    }
}

static bool
shim_staged_busy(const struct ncclComm *comm)
{
    const struct shim_staged *staged = comm->backend_state;

    return staged != NULL && __atomic_load_n(&staged->finished, __ATOMIC_ACQUIRE) !=
                                 __atomic_load_n(&staged->gates, __ATOMIC_ACQUIRE);
}

static ncclResult_t
shim_staged_drain(struct ncclComm *comm)
{
    struct shim_staged *staged = comm->backend_state;

    if (staged == NULL) {
        return ncclSuccess;
    }
    pthread_mutex_lock(&staged->lock);
    while (staged->finished != staged->gates) {
        pthread_cond_wait(&staged->cond, &staged->lock);
    }
    ncclResult_t res = staged->error;
    pthread_mutex_unlock(&staged->lock);
    return res;
}

static ncclResult_t
shim_staged_error(const struct ncclComm *comm)
{
    const struct shim_staged *staged = comm->backend_state;

    return staged != NULL ? __atomic_load_n(&staged->error, __ATOMIC_ACQUIRE) : ncclSuccess;
}

static void
shim_staged_destroy(struct ncclComm *comm, bool abort)
{
    struct shim_staged *staged = comm->backend_state;

    if (staged == NULL) {
        return;
    }
    /* On abort the thread's run sees the abort flag and fails, and later batches are skipped;
     * otherwise every batch runs first. */
    pthread_mutex_lock(&staged->lock);
    if (abort && staged->error == ncclSuccess) {
        staged->error = ncclInvalidUsage;
    }
    pthread_mutex_unlock(&staged->lock);
    shim_staged_drain(comm);
    pthread_mutex_lock(&staged->lock);
    staged->stop = true;
    pthread_cond_broadcast(&staged->cond);
    pthread_mutex_unlock(&staged->lock);
    pthread_join(staged->thread, NULL);
    shim_staged_release(comm);
    gpu_ctx_push(staged->gpu->ctx);
    gpu_staging_destroy(staged->staging);
    if (staged->phases != NULL) {
        shim_staged_print_phases(staged);
        free(staged->phases);
    }
    gpu_ctx_pop();
    pthread_mutex_destroy(&staged->lock);
    pthread_cond_destroy(&staged->cond);
    free(staged);
    comm->backend_state = NULL;
}

static void
shim_staged_interrupt(struct ncclComm *comm)
{
    (void)comm; /* a batch's waits look at the abort flag themselves */
}

static ncclResult_t
shim_staged_release_memory(struct ncclComm *comm)
{
    struct shim_staged *staged = comm->backend_state;
    ncclResult_t res;

    if (staged == NULL) {
        return ncclSuccess;
    }
    /* The batches are done (suspension drained them): the pinned copies go, and the next
     * batch pins them again. Host memory, so ncclCommMemStats does not count it. */
    SHIM_CHECK(gpu_ctx_push(staged->gpu->ctx));
    res = gpu_staging_trim(staged->staging);
    gpu_ctx_pop();
    return res;
}

static void
shim_staged_device_bytes(const struct ncclComm *comm, uint64_t *releasable,
                         uint64_t *persistent)
{
    (void)comm; /* its staging is pinned host memory */
    *releasable = *persistent = 0;
}

/* Every communicator of several ranks: whatever its ranks share, the network reaches them. */
static bool
shim_staged_serves(const struct ncclComm *comm, const struct shim_backend_peers *peers)
{
    (void)peers;
    return comm->nranks > 1;
}

const struct shim_backend shim_backend_staged = {
    .name = "network path",
    .serves = shim_staged_serves,
    .captures = false,      /* the thread runs what the call hands it: nothing to replay */
    .drives_worker = true,
    .arrive = shim_staged_arrive,
    .wait = shim_staged_wait,
    .drain = shim_staged_drain,
    .busy = shim_staged_busy,
    .error = shim_staged_error,
    .release = shim_staged_release,
    .interrupt = shim_staged_interrupt,
    .release_memory = shim_staged_release_memory,
    .device_bytes = shim_staged_device_bytes,
    .destroy = shim_staged_destroy,
};
