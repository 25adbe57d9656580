/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every exported function of the NCCL ABI (device-side API entry points are in api_device.c)
 * and its pncclX profiling alias: argument checks, one log line, then hand-off to comm.c,
 * group.c or the bootstrap. Definitions are checked against the genuine nccl.h prototypes by
 * the compiler. Each call starts by clearing the thread's last-error text, so
 * ncclGetLastError describes the most recent failing call.
 */
#include <nccl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "base/check.h"
#include "bootstrap/bootstrap.h"
#include "comm.h"
#include "engine/exec_device.h"
#include "gpu/driver.h"
#include "gpu/memory.h"
#include "group.h"
#include "engine/op.h"
#include "register.h"
#include "split.h"
#include "engine/tag.h"
#include "engine/window.h"

#include "api.h"

/* The lifecycle's calls (init, split, grow, finalize, destroy, abort, revoke, suspension,
 * windows) and ncclGroupEnd reach the driver for registrations, mappings, stream creation and
 * synchronization, unmapping and freeing: calls that a global-mode capture on any thread of the
 * process forbids (cuda.h, CU_STREAM_CAPTURE_MODE_GLOBAL), failing them and breaking that
 * capture. Each runs in relaxed mode, as NCCL's do; the thread gets its own mode back after.
 * Our own threads are relaxed for good (gpu_capture_relax_thread). */
#define SHIM_API_RELAXED(call)                                                              \
    __extension__({                                                                         \
        CUstreamCaptureMode shim_api_mode_ = gpu_capture_relax();                           \
        ncclResult_t shim_api_res_ = (call);                                                \
        gpu_capture_restore(shim_api_mode_);                                                \
        shim_api_res_;                                                                      \
    })


/* --- version, ids, errors -------------------------------------------------------------------*/

SHIM_API ncclResult_t
ncclGetVersion(int *version)
{
    shim_error_clear();
    if (version == NULL) {
        WARN("ncclGetVersion: version is NULL");
        return ncclInvalidArgument;
    }
    shim_log_banner();
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}
SHIM_ALIAS(ncclGetVersion)

SHIM_API ncclResult_t
ncclGetUniqueId(ncclUniqueId *unique_id)
{
    shim_error_clear();
    if (unique_id == NULL) {
        WARN("ncclGetUniqueId: uniqueId is NULL");
        return ncclInvalidArgument;
    }
    shim_log_banner();
    return shim_bootstrap_get_unique_id(unique_id);
}
SHIM_ALIAS(ncclGetUniqueId)

SHIM_API const char *
ncclGetErrorString(ncclResult_t result)
{
    return shim_result_text(result);
}
SHIM_ALIAS(ncclGetErrorString)

SHIM_API const char *
ncclGetLastError(ncclComm_t comm)
{
    /* comm is only a hint; a stale handle must not be dereferenced. */
    bool live = comm != NULL && shim_comm_check(comm, "") == ncclSuccess;
    return shim_error_last(live ? &comm->log : NULL);
}
SHIM_ALIAS(ncclGetLastError)

SHIM_API void
ncclResetDebugInit(void)
{
    shim_log_reset();
}
SHIM_ALIAS(ncclResetDebugInit)

/* Exported by the genuine library though absent from nccl.h. */
SHIM_API void ncclResetDebugInitInternal(void);
SHIM_API void
ncclResetDebugInitInternal(void)
{
    shim_log_reset();
}

/* --- communicators --------------------------------------------------------------------------*/

static ncclResult_t
shim_api_init_rank(ncclComm_t *comm, int nranks, const ncclUniqueId *id, int rank,
                   const ncclConfig_t *config, const char *api)
{
    struct shim_comm_args args = {.nranks = nranks, .rank = rank, .id = *id};
    struct shim_config cfg;
    ncclResult_t res;

    if (comm == NULL) {
        WARN("%s: comm is NULL", api);
        return ncclInvalidArgument;
    }
    if (nranks < 1 || nranks > SHIM_TAG_MAX_RANKS) {
        WARN("%s: nranks %d is out of range 1..%d", api, nranks, SHIM_TAG_MAX_RANKS);
        return ncclInvalidArgument;
    }
    if (rank < 0 || rank >= nranks) {
        WARN("%s: rank %d is out of range for nranks %d", api, rank, nranks);
        return ncclInvalidArgument;
    }
    SHIM_CHECK(shim_config_read(config, api, &cfg));
    args.blocking = cfg.blocking_set ? cfg.blocking : true;
    memcpy(args.name, cfg.name, sizeof(args.name));
    /* The current device, as NCCL takes it; with none current, device 0, as the runtime's
     * cudaGetDevice says. */
    args.cuda_dev = gpu_device_current();
    args.cuda_dev_chosen = args.cuda_dev >= 0;
    if (args.cuda_dev < 0 && gpu_device_count() > 0) {
        args.cuda_dev = 0;
    }
    INFO(SHIM_INIT, "%s: comm %p rank %d nranks %d cudaDev %d blocking %d", api, (void *)comm,
         rank, nranks, args.cuda_dev, (int)args.blocking);

    bool grouped = shim_group_active();
    bool blocking = args.blocking;
    if (grouped) {
        /* Inside a group every rank of a clique must join at once: ncclGroupEnd waits. */
        args.blocking = false;
    }
    res = shim_comm_init(&args, comm);
    if (res == ncclInProgress && grouped) {
        SHIM_CHECK(shim_group_add_init(*comm));
        return blocking ? ncclSuccess : ncclInProgress;
    }
    return res;
}

SHIM_API ncclResult_t
ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                       ncclConfig_t *config)
{
    shim_error_clear();
    return SHIM_API_RELAXED(
        shim_api_init_rank(comm, nranks, &commId, rank, config, "ncclCommInitRankConfig"));
}
SHIM_ALIAS(ncclCommInitRankConfig)

SHIM_API ncclResult_t
ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank)
{
    shim_error_clear();
    return SHIM_API_RELAXED(
        shim_api_init_rank(comm, nranks, &commId, rank, NULL, "ncclCommInitRank"));
}
SHIM_ALIAS(ncclCommInitRank)

SHIM_API ncclResult_t
ncclCommInitRankScalable(ncclComm_t *newcomm, int nranks, int myrank, int nId,
                         ncclUniqueId *commIds, ncclConfig_t *config)
{
    shim_error_clear();
    if (nId < 1 || commIds == NULL) {
        WARN("ncclCommInitRankScalable: need at least one unique id (nId %d, commIds %p)", nId,
             (void *)commIds);
        return ncclInvalidArgument;
    }
    /* Every rank passes the same ids in the same order, and our root serves any number of
     * ranks, so the first id alone is a complete rendezvous. */
    return SHIM_API_RELAXED(shim_api_init_rank(newcomm, nranks, &commIds[0], myrank, config,
                                               "ncclCommInitRankScalable"));
}
SHIM_ALIAS(ncclCommInitRankScalable)

SHIM_API ncclResult_t
ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    shim_error_clear();
    if (comms == NULL || ndev < 1 || ndev > SHIM_TAG_MAX_RANKS) {
        WARN("ncclCommInitAll: comms %p, ndev %d: need an array of 1..%d handles",
             (void *)comms, ndev, SHIM_TAG_MAX_RANKS);
        return ncclInvalidArgument;
    }
    /* NCCL's checks and codes: a negative device is a bad argument, a repeated one misuse. */
    for (int i = 0; devlist != NULL && i < ndev; i++) {
        if (devlist[i] < 0) {
            WARN("ncclCommInitAll: devlist[%d] is invalid device %d", i, devlist[i]);
            return ncclInvalidArgument;
        }
        for (int j = 0; j < i; j++) {
            if (devlist[j] == devlist[i]) {
                WARN("ncclCommInitAll: device %d is in devlist twice (at %d and %d)",
                     devlist[i], j, i);
                return ncclInvalidUsage;
            }
        }
    }
    shim_log_banner();
    return SHIM_API_RELAXED(shim_comm_init_all(comms, ndev, devlist));
}
SHIM_ALIAS(ncclCommInitAll)

SHIM_API ncclResult_t
ncclCommFinalize(ncclComm_t comm)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommFinalize"));
    shim_comm_bind(comm);
    ncclResult_t res = SHIM_API_RELAXED(shim_comm_finalize(comm));
    shim_comm_bind(NULL);
    return res;
}
SHIM_ALIAS(ncclCommFinalize)

SHIM_API ncclResult_t
ncclCommDestroy(ncclComm_t comm)
{
    shim_error_clear();
    if (comm == NULL) {
        return ncclSuccess; /* as NCCL: destroying NULL is a no-op */
    }
    SHIM_CHECK(shim_comm_check(comm, "ncclCommDestroy"));
    shim_comm_bind(comm);
    return SHIM_API_RELAXED(shim_comm_destroy(comm)); /* unbinds */
}
SHIM_ALIAS(ncclCommDestroy)

SHIM_API ncclResult_t
ncclCommAbort(ncclComm_t comm)
{
    shim_error_clear();
    if (comm == NULL) {
        return ncclSuccess;
    }
    SHIM_CHECK(shim_comm_check(comm, "ncclCommAbort"));
    shim_comm_bind(comm);
    return SHIM_API_RELAXED(shim_comm_abort(comm)); /* unbinds */
}
SHIM_ALIAS(ncclCommAbort)

SHIM_API ncclResult_t
ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommGetAsyncError"));
    if (asyncError == NULL) {
        WARN("ncclCommGetAsyncError: asyncError is NULL");
        return ncclInvalidArgument;
    }
    *asyncError = shim_comm_async_error(comm);
    return ncclSuccess;
}
SHIM_ALIAS(ncclCommGetAsyncError)

/* The three queries share their checks. */
static ncclResult_t
shim_api_query(const ncclComm_t comm, const int *out, const char *api)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, api));
    if (out == NULL) {
        WARN("%s: output pointer is NULL", api);
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

SHIM_API ncclResult_t
ncclCommCount(const ncclComm_t comm, int *count)
{
    SHIM_CHECK(shim_api_query(comm, count, "ncclCommCount"));
    *count = comm->nranks;
    return ncclSuccess;
}
SHIM_ALIAS(ncclCommCount)

SHIM_API ncclResult_t
ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    SHIM_CHECK(shim_api_query(comm, device, "ncclCommCuDevice"));
    *device = comm->cuda_dev;
    return ncclSuccess;
}
SHIM_ALIAS(ncclCommCuDevice)

SHIM_API ncclResult_t
ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    SHIM_CHECK(shim_api_query(comm, rank, "ncclCommUserRank"));
    *rank = comm->rank;
    return ncclSuccess;
}
SHIM_ALIAS(ncclCommUserRank)

/* What this version does not do yet: a clear ncclInvalidUsage, never a missing symbol. */
static ncclResult_t
shim_api_unsupported(const char *api)
{
    shim_error_clear();
    WARN("%s is not supported by ncclshim yet", api);
    return ncclInvalidUsage;
}

SHIM_API ncclResult_t
ncclCommRevoke(ncclComm_t comm, int revokeFlags)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommRevoke"));
    if (revokeFlags != NCCL_REVOKE_DEFAULT) {
        WARN("ncclCommRevoke: revokeFlags 0x%x must be NCCL_REVOKE_DEFAULT", revokeFlags);
        return ncclInvalidArgument;
    }
    return SHIM_API_RELAXED(shim_comm_revoke(comm));
}
SHIM_ALIAS(ncclCommRevoke)

/* The checks split and shrink share; *blocking_out from config, else the parent's. */
static ncclResult_t
shim_api_child_checks(ncclComm_t comm, ncclComm_t *newcomm, const ncclConfig_t *config,
                      bool allow_failed, bool *blocking_out, const char *api)
{
    SHIM_CHECK(shim_comm_check_parent(comm, allow_failed, api));
    if (newcomm == NULL) {
        WARN("%s: newcomm is NULL", api);
        return ncclInvalidArgument;
    }
    struct shim_config cfg;
    SHIM_CHECK(shim_config_read(config, api, &cfg));
    *blocking_out = cfg.blocking_set ? cfg.blocking : comm->blocking;
    return ncclSuccess;
}

SHIM_API ncclResult_t
ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t *newcomm, ncclConfig_t *config)
{
    bool blocking;
    ncclResult_t res;

    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommSplit"));
    shim_comm_bind(comm);
    SHIM_CHECK_GOTO(shim_api_child_checks(comm, newcomm, config, false, &blocking,
                                          "ncclCommSplit"),
                    res, out);
    if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
        WARN("ncclCommSplit: color %d must be >= 0 or NCCL_SPLIT_NOCOLOR", color);
        res = ncclInvalidArgument;
        goto out;
    }
    res = SHIM_API_RELAXED(shim_comm_split(comm, color, key, blocking, newcomm));
out:
    shim_comm_bind(NULL);
    return res;
}
SHIM_ALIAS(ncclCommSplit)

SHIM_API ncclResult_t
ncclCommShrink(ncclComm_t comm, int *excludeRanksList, int excludeRanksCount,
               ncclComm_t *newcomm, ncclConfig_t *config, int shrinkFlags)
{
    bool blocking;
    ncclResult_t res;

    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommShrink"));
    shim_comm_bind(comm);
    SHIM_CHECK_GOTO(shim_api_child_checks(comm, newcomm, config,
                                          shrinkFlags == NCCL_SHRINK_ABORT, &blocking,
                                          "ncclCommShrink"),
                    res, out);
    if (excludeRanksCount < 0 || (excludeRanksCount > 0 && excludeRanksList == NULL)) {
        WARN("ncclCommShrink: excludeRanksList %p with count %d", (void *)excludeRanksList,
             excludeRanksCount);
        res = ncclInvalidArgument;
        goto out;
    }
    if (shrinkFlags != NCCL_SHRINK_DEFAULT && shrinkFlags != NCCL_SHRINK_ABORT) {
        WARN("ncclCommShrink: shrinkFlags 0x%x is not NCCL_SHRINK_DEFAULT or NCCL_SHRINK_ABORT",
             shrinkFlags);
        res = ncclInvalidArgument;
        goto out;
    }
    /* NCCL_SHRINK_ABORT: the parent's operations are aborted first. Host ones ran inside
     * their calls; device ones may still hold their streams (a rank died): those stop waiting
     * now, as at revoke, before the child's making synchronizes the device (registration:
     * CUDA's implicit synchronization would hold the child's work behind them). Then a parent
     * that failed may be shrunk. */
    if (shrinkFlags == NCCL_SHRINK_ABORT) {
        shim_devexec_backend(comm)->release(comm);
    }
    res = SHIM_API_RELAXED(
        shim_comm_shrink(comm, excludeRanksList, excludeRanksCount, blocking, newcomm));
out:
    shim_comm_bind(NULL);
    return res;
}
SHIM_ALIAS(ncclCommShrink)

SHIM_API ncclResult_t
ncclCommSuspend(ncclComm_t comm, int flags)
{
    ncclResult_t res;

    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommSuspend"));
    if (flags != NCCL_SUSPEND_MEM) {
        WARN("ncclCommSuspend: flags 0x%x: NCCL_SUSPEND_MEM (0x%x) is the one suspension",
             flags, NCCL_SUSPEND_MEM);
        return ncclInvalidArgument;
    }
    shim_comm_bind(comm);
    res = SHIM_API_RELAXED(shim_comm_suspend(comm));
    shim_comm_bind(NULL);
    return res;
}
SHIM_ALIAS(ncclCommSuspend)

SHIM_API ncclResult_t
ncclCommResume(ncclComm_t comm)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommResume"));
    return SHIM_API_RELAXED(shim_comm_resume(comm));
}
SHIM_ALIAS(ncclCommResume)

SHIM_API ncclResult_t
ncclCommMemStats(ncclComm_t comm, ncclCommMemStat_t stat, uint64_t *value)
{
    uint64_t releasable, persistent;

    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommMemStats"));
    if (value == NULL) {
        WARN("ncclCommMemStats: value is NULL");
        return ncclInvalidArgument;
    }
    shim_comm_gpu_bytes(comm, &releasable, &persistent);
    switch (stat) {
    case ncclStatGpuMemSuspend:
        *value = releasable;
        return ncclSuccess;
    case ncclStatGpuMemSuspended:
        *value = comm->suspended ? 1 : 0;
        return ncclSuccess;
    case ncclStatGpuMemPersist:
        *value = persistent;
        return ncclSuccess;
    case ncclStatGpuMemTotal:
        *value = releasable + persistent;
        return ncclSuccess;
    }
    WARN("ncclCommMemStats: %d is not an ncclCommMemStat_t", (int)stat);
    return ncclInvalidArgument;
}
SHIM_ALIAS(ncclCommMemStats)

SHIM_API ncclResult_t
ncclCommGetUniqueId(ncclComm_t comm, ncclUniqueId *uniqueId)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check_ready(comm, "ncclCommGetUniqueId"));
    if (uniqueId == NULL) {
        WARN("ncclCommGetUniqueId: uniqueId is NULL");
        return ncclInvalidArgument;
    }
    return shim_comm_grow_id(comm, uniqueId);
}
SHIM_ALIAS(ncclCommGetUniqueId)

SHIM_API ncclResult_t
ncclCommGrow(ncclComm_t comm, int nRanks, const ncclUniqueId *uniqueId, int rank,
             ncclComm_t *newcomm, ncclConfig_t *config)
{
    bool blocking;
    ncclResult_t res;

    shim_error_clear();
    if (comm == NULL) {
        /* A new rank: it joins as ncclCommInitRankConfig would. */
        if (uniqueId == NULL) {
            WARN("ncclCommGrow: a new rank (comm NULL) needs the unique id");
            return ncclInvalidArgument;
        }
        return SHIM_API_RELAXED(
            shim_api_init_rank(newcomm, nRanks, uniqueId, rank, config, "ncclCommGrow"));
    }
    SHIM_CHECK(shim_api_child_checks(comm, newcomm, config, false, &blocking, "ncclCommGrow"));
    if (rank != -1) {
        WARN("ncclCommGrow: rank %d: a rank of the communicator passes -1 (it keeps its rank "
             "%d)", rank, comm->rank);
        return ncclInvalidArgument;
    }
    if (nRanks <= comm->nranks || nRanks > SHIM_TAG_MAX_RANKS) {
        WARN("ncclCommGrow: nRanks %d must be above the communicator's %d (and at most %d)",
             nRanks, comm->nranks, SHIM_TAG_MAX_RANKS);
        return ncclInvalidArgument;
    }
    shim_comm_bind(comm);
    res = SHIM_API_RELAXED(shim_comm_grow(comm, nRanks, uniqueId, blocking, newcomm));
    shim_comm_bind(NULL);
    return res;
}
SHIM_ALIAS(ncclCommGrow)

SHIM_API ncclResult_t
ncclSetEncryption(const ncclEncryptionConfig_t *config)
{
    shim_error_clear();
    if (config == NULL) {
        WARN("ncclSetEncryption: config is NULL");
        return ncclInvalidArgument;
    }
    if (config->magic != NCCL_API_MAGIC || config->size < sizeof(ncclEncryptionConfig_t)) {
        WARN("ncclSetEncryption: ncclEncryptionConfig_t has magic 0x%x and size %zu: initialize "
             "it with NCCL_ENCRYPTION_CONFIG_INITIALIZER", config->magic, config->size);
        return ncclInvalidArgument;
    }
    switch (config->mode) {
    case NCCL_ENCRYPTION_MODE_NONE:
        return ncclSuccess; /* what ncclshim's sockets and UCX carry anyway */
    case NCCL_ENCRYPTION_MODE_PSK:
        /* Accepting a key while every byte goes in the clear would be a lie. */
        WARN("ncclSetEncryption: NCCL_ENCRYPTION_MODE_PSK is not supported: ncclshim's "
             "bootstrap sockets and UCX transfers are not encrypted");
        return ncclInvalidUsage;
    default:
        WARN("ncclSetEncryption: mode %d is not an ncclEncryptionMode_t", config->mode);
        return ncclInvalidArgument;
    }
}
SHIM_ALIAS(ncclSetEncryption)

/* One-sided calls and windows drive the communicator's worker on the caller's thread: device
 * work that drives it from the communicator's own thread (the network path) finishes first,
 * and ncclCommAbort from another thread waits until the call left (calls_inside). Their
 * driver calls (registrations, mappings) run in relaxed capture mode, as every call of ours
 * that a program may make while it captures: the thread's own mode comes back at leave. */
static __thread CUstreamCaptureMode shim_one_sided_mode;

/* The thread takes part in comm's one-sided call from here to leave. */
static void
shim_api_one_sided_join(ncclComm_t comm)
{
    shim_comm_bind(comm);
    shim_one_sided_mode = gpu_capture_relax();
}

static ncclResult_t
shim_api_one_sided_leave(ncclComm_t comm, ncclResult_t res)
{
    gpu_capture_restore(shim_one_sided_mode);
    shim_comm_bind(NULL);
    __atomic_sub_fetch(&comm->calls_inside, 1, __ATOMIC_ACQ_REL);
    return res;
}

static ncclResult_t
shim_api_one_sided_enter(ncclComm_t comm, const char *api)
{
    SHIM_CHECK(shim_comm_check_ready(comm, api));
    __atomic_add_fetch(&comm->calls_inside, 1, __ATOMIC_ACQ_REL);
    shim_api_one_sided_join(comm);
    ncclResult_t res =
        shim_devexec_backend(comm)->drives_worker ? shim_devexec_drain(comm) : ncclSuccess;
    if (res != ncclSuccess) {
        shim_api_one_sided_leave(comm, res);
    }
    return res;
}

/* A window's registration or deregistration: collective, so inside a group (which may hold
 * several ranks of one clique, driven by this thread) it runs on a thread of its own, and
 * ncclGroupEnd joins it; the caller reads *win after ncclGroupEnd, as with NCCL. */
struct shim_window_call {
    ncclComm_t comm;
    bool reg;                /* register, else deregister */
    void *buff;
    size_t size;
    ncclWindow_t *win_out;   /* register */
    ncclWindow_t win;        /* deregister */
};

/* The call, on a thread that joined it; frees c and leaves. */
static ncclResult_t
shim_api_window_call_run(struct shim_window_call *c)
{
    ncclComm_t comm = c->comm;
    ncclResult_t res = c->reg ? shim_window_register(comm, c->buff, c->size, c->win_out)
                              : shim_window_deregister(comm, c->win);
    free(c);
    return shim_api_one_sided_leave(comm, res);
}

/* Inside a group: the call's own thread joins it first. */
static ncclResult_t
shim_api_window_call_task(void *arg)
{
    struct shim_window_call *c = arg;
    shim_api_one_sided_join(c->comm);
    return shim_api_window_call_run(c);
}

static ncclResult_t
shim_api_window_call(const struct shim_window_call *call, const char *api)
{
    struct shim_window_call *c;

    SHIM_CHECK(shim_api_one_sided_enter(call->comm, api));
    ncclResult_t res = shim_calloc(&c, 1);
    if (res != ncclSuccess) {
        return shim_api_one_sided_leave(call->comm, res);
    }
    *c = *call;
    if (!shim_group_active()) {
        return shim_api_window_call_run(c);
    }
    /* The call's thread joins it: this one gets its mode back and lets go. */
    gpu_capture_restore(shim_one_sided_mode);
    shim_comm_bind(NULL);
    res = shim_group_spawn(shim_api_window_call_task, c);
    if (res != ncclSuccess) {
        free(c);
        __atomic_sub_fetch(&call->comm->calls_inside, 1, __ATOMIC_ACQ_REL);
    }
    return res;
}

SHIM_API ncclResult_t
ncclCommWindowRegister(ncclComm_t comm, void *buff, size_t size, ncclWindow_t *win,
                       int winFlags)
{
    const int known = NCCL_WIN_COLL_SYMMETRIC | NCCL_WIN_STRICT_ORDERING | NCCL_WIN_GIN_ONLY |
                      NCCL_WIN_CFT_COUNTED;

    shim_error_clear();
    if ((winFlags & ~known) != 0) {
        WARN("ncclCommWindowRegister: winFlags 0x%x has unknown bits", winFlags);
        return ncclInvalidArgument;
    }
    struct shim_window_call call = {.comm = comm, .reg = true, .buff = buff, .size = size,
                                    .win_out = win};
    return SHIM_API_RELAXED(shim_api_window_call(&call, "ncclCommWindowRegister"));
}
SHIM_ALIAS(ncclCommWindowRegister)

SHIM_API ncclResult_t
ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win)
{
    shim_error_clear();
    struct shim_window_call call = {.comm = comm, .win = win};
    return SHIM_API_RELAXED(shim_api_window_call(&call, "ncclCommWindowDeregister"));
}
SHIM_ALIAS(ncclCommWindowDeregister)

ncclResult_t
shim_api_no_device_window(const char *api)
{
    WARN("%s: ncclshim's windows have no multimem addresses and no CFT, LE or peer device "
         "handles (it has no NVLink SHARP and no device-side window kernels)", api);
    return ncclInvalidUsage;
}

SHIM_API ncclResult_t
ncclWinGetUserPtr(ncclComm_t comm, ncclWindow_t win, void **outUserPtr)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclWinGetUserPtr"));
    return shim_window_user_ptr(comm, win, outUserPtr);
}
SHIM_ALIAS(ncclWinGetUserPtr)

SHIM_API ncclResult_t
ncclPutSignal(const void *localbuff, size_t count, ncclDataType_t datatype, int peer,
              ncclWindow_t peerWin, size_t peerWinOffset, int sigIdx, int ctx,
              unsigned int flags, ncclComm_t comm, cudaStream_t stream)
{
    shim_error_clear();
    if (kr_type_size(datatype) == 0) {
        WARN("ncclPutSignal: datatype %d is not an ncclDataType_t", (int)datatype);
        return ncclInvalidArgument;
    }
    if (flags != 0) {
        WARN("ncclPutSignal: flags 0x%x: they are reserved and must be 0", flags);
        return ncclInvalidArgument;
    }
    SHIM_CHECK(shim_api_one_sided_enter(comm, "ncclPutSignal"));
    size_t bytes = count * kr_type_size(datatype);
    return shim_api_one_sided_leave(comm, shim_put_signal(comm, localbuff, bytes, peer,
                                                          peerWin, peerWinOffset, sigIdx,
                                                          ctx, stream));
}
SHIM_ALIAS(ncclPutSignal)

SHIM_API ncclResult_t
ncclSignal(int peer, int sigIdx, int ctx, unsigned int flags, ncclComm_t comm,
           cudaStream_t stream)
{
    shim_error_clear();
    if (flags != 0) {
        WARN("ncclSignal: flags 0x%x: they are reserved and must be 0", flags);
        return ncclInvalidArgument;
    }
    SHIM_CHECK(shim_api_one_sided_enter(comm, "ncclSignal"));
    return shim_api_one_sided_leave(comm,
                                    shim_put_signal(comm, NULL, 0, peer, NULL, 0, sigIdx, ctx,
                                                    stream));
}
SHIM_ALIAS(ncclSignal)

SHIM_API ncclResult_t
ncclWaitSignal(int nDesc, ncclWaitSignalDesc_t *signalDescs, ncclComm_t comm,
               cudaStream_t stream)
{
    shim_error_clear();
    SHIM_CHECK(shim_api_one_sided_enter(comm, "ncclWaitSignal"));
    return shim_api_one_sided_leave(comm, shim_wait_signal(comm, signalDescs, nDesc, stream));
}
SHIM_ALIAS(ncclWaitSignal)

SHIM_API ncclResult_t
ncclGroupSimulateEnd(ncclSimInfo_t *simInfo)
{
    shim_error_clear();
    if (simInfo == NULL) {
        WARN("ncclGroupSimulateEnd: simInfo is NULL");
        return ncclInvalidArgument;
    }
    return shim_api_unsupported("ncclGroupSimulateEnd");
}
SHIM_ALIAS(ncclGroupSimulateEnd)

/* Registration: register.c. */
SHIM_API ncclResult_t
ncclCommRegister(const ncclComm_t comm, void *buff, size_t size, void **handle)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check_ready(comm, "ncclCommRegister"));
    if (handle == NULL || (buff == NULL && size > 0)) {
        WARN("ncclCommRegister: buff %p size %zu handle %p", buff, size, (void *)handle);
        return ncclInvalidArgument;
    }
    return shim_reg_add(comm, buff, size, handle);
}
SHIM_ALIAS(ncclCommRegister)

SHIM_API ncclResult_t
ncclCommDeregister(const ncclComm_t comm, void *handle)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclCommDeregister"));
    return shim_reg_remove(comm, handle);
}
SHIM_ALIAS(ncclCommDeregister)

/* The host buffers ncclMemAlloc gave out and ncclMemFree has not taken back, so that
 * ncclMemFree refuses any other pointer (free() of it would corrupt the heap or crash). An
 * array searched from the end: programs hold a few such buffers. */
static pthread_mutex_t shim_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static void **shim_mem_ptrs; /* grows, never shrinks; kept for the life of the process */
static size_t shim_mem_count, shim_mem_cap;

static ncclResult_t
shim_mem_track(void *ptr)
{
    ncclResult_t res = ncclSuccess;

    pthread_mutex_lock(&shim_mem_lock);
    if (shim_mem_count == shim_mem_cap) {
        size_t cap = shim_mem_cap ? 2 * shim_mem_cap : 16;
        void **ptrs = realloc(shim_mem_ptrs, cap * sizeof(*ptrs));
        if (ptrs == NULL) {
            WARN("ncclMemAlloc: out of memory tracking %zu buffers", cap);
            res = ncclSystemError;
            goto out;
        }
        shim_mem_ptrs = ptrs;
        shim_mem_cap = cap;
    }
    shim_mem_ptrs[shim_mem_count++] = ptr;
out:
    pthread_mutex_unlock(&shim_mem_lock);
    return res;
}

/* Forgets ptr if ncclMemAlloc gave it out; false if it did not. */
static bool
shim_mem_untrack(void *ptr)
{
    bool found = false;

    pthread_mutex_lock(&shim_mem_lock);
    for (size_t i = shim_mem_count; i-- > 0;) {
        if (shim_mem_ptrs[i] == ptr) {
            shim_mem_ptrs[i] = shim_mem_ptrs[--shim_mem_count];
            found = true;
            break;
        }
    }
    pthread_mutex_unlock(&shim_mem_lock);
    return found;
}

/* ncclMemAlloc: device memory in NCCL, and here with a driver: a cuMem allocation other
 * ranks' processes can map (gpu/memory.c). Without a driver the buffers our host path works
 * on are plain page-aligned host memory. With a driver, it and ncclMemFree run in relaxed
 * capture mode, as NCCL's do: creating, mapping and unmapping memory is among what a capture
 * in global mode elsewhere in the program forbids, and would break. */
SHIM_API ncclResult_t
ncclMemAlloc(void **ptr, size_t size)
{
    shim_error_clear();
    if (ptr == NULL) {
        WARN("ncclMemAlloc: ptr is NULL");
        return ncclInvalidArgument;
    }
    if (gpu_device_count() > 0) {
        CUstreamCaptureMode mode = gpu_capture_relax();
        ncclResult_t res = gpu_mem_alloc(size, ptr);
        gpu_capture_restore(mode);
        return res;
    }
    void *mem;
    if (posix_memalign(&mem, 4096, size ? size : 1) != 0) {
        WARN("ncclMemAlloc: cannot allocate %zu bytes of host memory", size);
        return ncclSystemError;
    }
    if (shim_mem_track(mem) != ncclSuccess) {
        free(mem);
        return ncclSystemError;
    }
    *ptr = mem;
    return ncclSuccess;
}
SHIM_ALIAS(ncclMemAlloc)

SHIM_API ncclResult_t
ncclMemFree(void *ptr)
{
    shim_error_clear();
    if (ptr == NULL) {
        return ncclSuccess; /* as cudaFree(NULL) */
    }
    if (gpu_device_count() > 0) {
        CUstreamCaptureMode mode = gpu_capture_relax();
        ncclResult_t res = gpu_mem_free(ptr);
        gpu_capture_restore(mode);
        return res;
    }
    if (!shim_mem_untrack(ptr)) {
        WARN("ncclMemFree: %p was not allocated by ncclMemAlloc (or was freed already)", ptr);
        return ncclInvalidArgument;
    }
    free(ptr);
    return ncclSuccess;
}
SHIM_ALIAS(ncclMemFree)

/* --- reduction operators --------------------------------------------------------------------*/

/*
 * comm.c numbers a communicator's PreMulSum ops ncclNumOps + index, as NCCL does, so the op of
 * one communicator would pass for another's that has an op at the same index. The handle the
 * user sees also carries a tag of its communicator above the index bits:
 * ncclNumOps + (tag << SHIM_OP_INDEX_BITS) + index, at most 2^30 + 4 < ncclMaxRedOp.
 */
#define SHIM_OP_INDEX_BITS 6
#define SHIM_OP_TAG_BITS 24
_Static_assert(SHIM_MAX_USER_OPS <= 1 << SHIM_OP_INDEX_BITS, "op index bits too few");

static uint32_t
shim_api_op_tag(const struct ncclComm *comm)
{
    return ((uint32_t)((uintptr_t)comm >> 4) * 0x9e3779b1u) >> (32 - SHIM_OP_TAG_BITS);
}

/* The handle of comm.c's op for the user. */
static ncclRedOp_t
shim_api_op_encode(const struct ncclComm *comm, ncclRedOp_t op)
{
    return (ncclRedOp_t)((int)op + (int)(shim_api_op_tag(comm) << SHIM_OP_INDEX_BITS));
}

/* The user's op as comm.c numbers it: built-in and negative values unchanged; a dynamic op
 * of another communicator is refused. */
static ncclResult_t
shim_api_op_decode(const struct ncclComm *comm, ncclRedOp_t op, const char *api,
                   ncclRedOp_t *op_out)
{
    if ((int)op < (int)ncclNumOps) {
        *op_out = op;
        return ncclSuccess;
    }
    uint32_t rel = (uint32_t)op - (uint32_t)ncclNumOps;
    if (rel >> SHIM_OP_INDEX_BITS != shim_api_op_tag(comm)) {
        WARN("%s: reduction op %d was not created on communicator %p (another's, or none)", api,
             (int)op, (const void *)comm);
        return ncclInvalidArgument;
    }
    *op_out = (ncclRedOp_t)((int)ncclNumOps + (int)(rel & ((1u << SHIM_OP_INDEX_BITS) - 1)));
    return ncclSuccess;
}

SHIM_API ncclResult_t
ncclRedOpCreatePreMulSum(ncclRedOp_t *op, void *scalar, ncclDataType_t datatype,
                         ncclScalarResidence_t residence, ncclComm_t comm)
{
    struct kr_redop redop = {.kind = KR_PREMULSUM, .type = datatype};

    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclRedOpCreatePreMulSum"));
    if (op == NULL || scalar == NULL) {
        WARN("ncclRedOpCreatePreMulSum: op %p and scalar %p must not be NULL", (void *)op,
             scalar);
        return ncclInvalidArgument;
    }
    if (kr_type_size(datatype) == 0) {
        WARN("ncclRedOpCreatePreMulSum: invalid datatype %d", (int)datatype);
        return ncclInvalidArgument;
    }
    if (residence != ncclScalarHostImmediate && residence != ncclScalarDevice) {
        WARN("ncclRedOpCreatePreMulSum: invalid residence %d", (int)residence);
        return ncclInvalidArgument;
    }
    const void *deferred = NULL;
    bool on_device = false;
    if (residence == ncclScalarHostImmediate) {
        memcpy(redop.scalar, scalar, kr_type_size(datatype));
    } else {
        /* Read when each collective starts, as NCCL reads it then: by the kernel if a kernel
         * can reach it, else by the host at the call. */
        struct gpu_mem_info mem;
        gpu_mem_query(scalar, &mem);
        if (mem.error != CUDA_SUCCESS) {
            return gpu_cu_fail(mem.error, "cuPointerGetAttributes(scalar)", __FILE__, __LINE__);
        }
        on_device = gpu_mem_reachable(mem.kind);
        deferred = scalar;
    }
    ncclRedOp_t index_op;
    SHIM_CHECK(shim_comm_redop_create(comm, &redop, deferred, on_device, &index_op));
    *op = shim_api_op_encode(comm, index_op);
    return ncclSuccess;
}
SHIM_ALIAS(ncclRedOpCreatePreMulSum)

SHIM_API ncclResult_t
ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm)
{
    shim_error_clear();
    SHIM_CHECK(shim_comm_check(comm, "ncclRedOpDestroy"));
    if ((int)op < 0) {
        WARN("ncclRedOpDestroy: op %d is not a reduction operator", (int)op);
        return ncclInvalidArgument;
    }
    if ((int)op < (int)ncclNumOps) {
        WARN("ncclRedOpDestroy: op %d is built in and cannot be destroyed", (int)op);
        return ncclInvalidArgument;
    }
    SHIM_CHECK(shim_api_op_decode(comm, op, "ncclRedOpDestroy", &op));
    return shim_comm_redop_destroy(comm, op);
}
SHIM_ALIAS(ncclRedOpDestroy)

/* --- collectives ----------------------------------------------------------------------------*/

static bool
shim_coll_rooted(enum shim_coll coll)
{
    return coll == SHIM_COLL_BROADCAST || coll == SHIM_COLL_REDUCE ||
           coll == SHIM_COLL_GATHER || coll == SHIM_COLL_SCATTER || coll == SHIM_COLL_SEND ||
           coll == SHIM_COLL_RECV;
}

/* Which of its buffers this rank uses in op (alg.h's layouts). NCCL lets the others be
 * anything, so shim_api_check_op sets them to NULL and no algorithm can ever touch them. */
static void
shim_api_buffers_used(const struct shim_op *op, bool *send_used_out, bool *recv_used_out)
{
    const bool root = op->comm->rank == op->root;

    *send_used_out = true;
    *recv_used_out = true;
    switch (op->coll) {
    case SHIM_COLL_BROADCAST:
    case SHIM_COLL_SCATTER:
        *send_used_out = root;
        break;
    case SHIM_COLL_REDUCE:
    case SHIM_COLL_GATHER:
        *recv_used_out = root;
        break;
    case SHIM_COLL_SEND:
        *recv_used_out = false;
        break;
    case SHIM_COLL_RECV:
        *send_used_out = false;
        break;
    default:
        break;
    }
}

/* Where the buffers live decides the path: memory a kernel reaches (device, managed,
 * registered) makes the call stream ordered; plain host memory runs in the call. NCCL takes
 * only the former; both buffers of one call must be of the same side. */
static ncclResult_t
shim_api_check_memory(struct shim_op *op, const char *api)
{
    gpu_mem_query(op->sendbuff, &op->send_mem);
    gpu_mem_query(op->recvbuff, &op->recv_mem);
    CUresult cu = op->send_mem.error != CUDA_SUCCESS ? op->send_mem.error : op->recv_mem.error;
    if (cu != CUDA_SUCCESS) {
        /* Not host memory for all we know: a host path would touch device memory. */
        return gpu_cu_fail(cu, "cuPointerGetAttributes(a buffer of the call)", __FILE__,
                           __LINE__);
    }
    bool send_dev = gpu_mem_reachable(op->send_mem.kind);
    bool recv_dev = gpu_mem_reachable(op->recv_mem.kind);
    op->device = send_dev || recv_dev;
    if (op->device && op->sendbuff != NULL && op->recvbuff != NULL && send_dev != recv_dev) {
        WARN("%s: sendbuff %p is %s but recvbuff %p is %s: both must be memory a kernel can "
             "reach (device, managed or registered host memory), or both plain host memory",
             api, op->sendbuff, gpu_mem_kind_name(op->send_mem.kind), op->recvbuff,
             gpu_mem_kind_name(op->recv_mem.kind));
        return ncclInvalidArgument;
    }
    return ncclSuccess;
}

/* Checks that hold for every collective and point-to-point call. */
static ncclResult_t
shim_api_check_op(struct shim_op *op, const char *api)
{
    struct ncclComm *comm = op->comm;
    size_t elem_size = kr_type_size(op->datatype);

    SHIM_CHECK(shim_comm_check_ready(comm, api));
    if (elem_size == 0) {
        WARN("%s: invalid datatype %d", api, (int)op->datatype);
        return ncclInvalidArgument;
    }
    /* Multiplications and masks (element sizes are powers of two): this runs on every call,
     * and a division costs tens of cycles. */
    size_t all_bytes;
    if (__builtin_mul_overflow(op->count, elem_size * (size_t)comm->nranks, &all_bytes)) {
        WARN("%s: count %zu of %s overflows the address space", api, op->count,
             kr_type_name(op->datatype));
        return ncclInvalidArgument;
    }
    ncclRedOp_t index_op = ncclSum;
    if (shim_coll_reduces(op->coll)) {
        SHIM_CHECK(shim_api_op_decode(comm, op->user_op, api, &index_op));
    }
    if (shim_coll_rooted(op->coll) && (op->root < 0 || op->root >= comm->nranks)) {
        WARN("%s: %s %d is out of range for %d ranks", api,
             op->coll == SHIM_COLL_SEND || op->coll == SHIM_COLL_RECV ? "peer" : "root",
             op->root, comm->nranks);
        return ncclInvalidArgument;
    }
    bool send_used, recv_used;
    shim_api_buffers_used(op, &send_used, &recv_used);
    if (op->count > 0 && ((send_used && op->sendbuff == NULL) ||
                          (recv_used && op->recvbuff == NULL))) {
        WARN("%s: %s is NULL with count %zu", api,
             send_used && op->sendbuff == NULL ? "sendbuff" : "recvbuff", op->count);
        return ncclInvalidArgument;
    }
    op->sendbuff = send_used ? op->sendbuff : NULL;
    op->recvbuff = recv_used ? op->recvbuff : NULL;
    if ((((uintptr_t)op->sendbuff | (uintptr_t)op->recvbuff) & (elem_size - 1)) != 0) {
        WARN("%s: sendbuff %p and recvbuff %p must be aligned to the %zu-byte %s elements", api,
             op->sendbuff, op->recvbuff, elem_size, kr_type_name(op->datatype));
        return ncclInvalidArgument;
    }
    SHIM_CHECK(shim_api_check_memory(op, api));
    if (shim_coll_reduces(op->coll)) {
        SHIM_CHECK(shim_comm_redop_resolve(comm, index_op, op->datatype, op->device,
                                           &op->redop, &op->scalar_dev));
    } else {
        op->redop = (struct kr_redop){.kind = KR_SUM, .type = op->datatype}; /* copies only */
    }
    return op->device ? shim_devexec_check(op, api) : ncclSuccess;
}

ncclResult_t
shim_api_collective(struct shim_op *op, const char *api)
{
    ncclResult_t res;

    shim_error_clear();
    SHIM_CHECK(shim_comm_check(op->comm, api));
    shim_comm_bind(op->comm);
    SHIM_CHECK_GOTO(shim_api_check_op(op, api), res, out);
    INFO(SHIM_COLL, "%s: opCount %x sendbuff %p recvbuff %p count %zu datatype %d op %d "
         "root %d comm %p [nranks=%d] stream %p", shim_coll_name(op->coll), op->comm->seq,
         op->sendbuff, op->recvbuff, op->count, (int)op->datatype, (int)op->user_op, op->root,
         (void *)op->comm, op->comm->nranks, (void *)op->stream);
    res = shim_group_enqueue(op);
out:
    if (SHIM_FAILED(res)) {
        shim_group_fail(res);
    }
    shim_comm_bind(NULL);
    return res;
}

/* ncclX from its row of the table (api.h). */
#define SHIM_API_DEFINE_COLLECTIVE(name, coll_id, count_name, mid, op_arg, root_arg)           \
    SHIM_API ncclResult_t                                                                     \
    nccl##name(const void *sendbuff, void *recvbuff, size_t count_name,                       \
               ncclDataType_t datatype, SHIM_API_UNPAREN mid ncclComm_t comm,                 \
               cudaStream_t stream)                                                           \
    {                                                                                         \
        struct shim_op desc = SHIM_API_OP(coll_id, count_name, op_arg, root_arg);             \
        return shim_api_collective(&desc, "nccl" #name);                                      \
    }                                                                                         \
    SHIM_ALIAS(nccl##name)

SHIM_API_COLLECTIVES(SHIM_API_DEFINE_COLLECTIVE)
#undef SHIM_API_DEFINE_COLLECTIVE

/* ncclBcast, ncclSend and ncclRecv: one buffer, `buff`, serves as both, and `root` is the
 * root or the peer, as nccl.h names it. */
#define SHIM_API_DEFINE_ONE_BUFFER(name, coll_id, buff_decl, buff, root_name)                \
    SHIM_API ncclResult_t                                                                     \
    nccl##name(buff_decl, size_t count, ncclDataType_t datatype, int root_name,               \
               ncclComm_t comm, cudaStream_t stream)                                          \
    {                                                                                         \
        struct shim_op desc = {.coll = SHIM_COLL_##coll_id, .sendbuff = buff,                 \
                               .recvbuff = (void *)buff, .count = count,                      \
                               .datatype = datatype, .root = root_name, .stream = stream,     \
                               .comm = comm};                                                 \
        return shim_api_collective(&desc, "nccl" #name);                                      \
    }                                                                                         \
    SHIM_ALIAS(nccl##name)

SHIM_API_DEFINE_ONE_BUFFER(Bcast, BROADCAST, void *buff, buff, root)
SHIM_API_DEFINE_ONE_BUFFER(Send, SEND, const void *sendbuff, sendbuff, peer)
SHIM_API_DEFINE_ONE_BUFFER(Recv, RECV, void *recvbuff, recvbuff, peer)
#undef SHIM_API_DEFINE_ONE_BUFFER

/* --- groups ---------------------------------------------------------------------------------*/

SHIM_API ncclResult_t
ncclGroupStart(void)
{
    shim_error_clear();
    return shim_group_start();
}
SHIM_ALIAS(ncclGroupStart)

SHIM_API ncclResult_t
ncclGroupEnd(void)
{
    /* No shim_error_clear: a call that failed inside the group keeps its message. */
    return SHIM_API_RELAXED(shim_group_end());
}
SHIM_ALIAS(ncclGroupEnd)
