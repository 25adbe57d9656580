/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The communicator: its ranks, its transport worker, its state and errors, and the
 * reduction operators created on it. comm.c holds the lifecycle (init, finalize, destroy,
 * abort); struct ncclComm is what ncclComm_t points to.
 */
#ifndef SHIM_COMM_H
#define SHIM_COMM_H

#include "config.h"
#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "base/debug.h"
#include "kernels/kernels.h"

struct shm_team;
struct shim_exec;
struct cipc_team;
struct shim_reg;
struct shim_dev_solo;
struct shim_backend;

#define SHIM_COMM_MAGIC 0x6e63636c7368696dULL /* "ncclshim" */
#define SHIM_COMM_DEAD 0xdeadc0de0000deadULL
#define SHIM_MAX_USER_OPS 64

enum shim_comm_state {
    SHIM_COMM_INITIALIZING, /* non-blocking init still running */
    SHIM_COMM_READY,
    SHIM_COMM_FINALIZED,
    SHIM_COMM_FAILED,       /* init failed or a peer failed: only destroy/abort remain */
};

/* A PreMulSum operator made by ncclRedOpCreatePreMulSum. With ncclScalarDevice residence the
 * scalar is read when each collective starts, from scalar_ptr; otherwise it was copied. */
struct shim_user_op {
    bool in_use;
    struct kr_redop redop;
    const void *scalar_ptr;
    bool scalar_device; /* scalar_ptr is device memory: read by the kernel, not the host */
};

struct shim_windows;

struct ncclComm {
    uint64_t magic;
    int rank;
    int nranks;
    int cuda_dev;
    bool cuda_dev_chosen;    /* shim_comm_args.cuda_dev_chosen */
    uint64_t id_hash;        /* equal on every rank: from the unique id */
    uint8_t tag_base;        /* the communicator's bits in every message tag */
    uint32_t seq;            /* collective sequence number, equal across ranks */
    uint32_t *p2p_sent;      /* per peer: ncclSends posted to it so far */
    uint32_t *p2p_received;  /* per peer: ncclRecvs posted from it so far */
    uint32_t *mgmt_sent;     /* per peer: split/shrink messages sent to it so far */
    uint32_t *mgmt_received; /* per peer: split/shrink messages received from it so far */
    struct tp_worker *tp;
    size_t chunk_bytes;      /* NCCLSHIM_CHUNK_BYTES, read at init */
    int ring_slots;          /* NCCLSHIM_RING_SLOTS */
    struct alg_policy policy;      /* NCCL_ALGO and NCCLSHIM_ALGO, parsed at init */
    struct alg_cost_params cost;   /* the cost model's alpha, beta, gamma */
    struct shm_team *shm;          /* every rank on this host: shared-memory collectives */
    /* Who carries out its operations on device memory (backend.h), chosen once it connected,
     * and each row's state, touched by that row alone. */
    const struct shim_backend *backend;
    struct cipc_team *dev;         /* ... and their device team, for device buffers */
    struct shim_dev_solo *solo;    /* one rank, device buffers: issue order (backend_solo.c) */
    struct shim_staged *staged;    /* no device team, device buffers: over UCX (exec_staged.c) */
    uint32_t shm_colls;            /* collectives no NCCL_ALGO/NCCLSHIM_ALGO filter touched */
    uint64_t tuning_logged[ALG_COLL_COUNT]; /* size classes whose choice INFO(TUNING) told */
    void *scratch;           /* one cached scratch buffer, reused across ops */
    struct shim_exec *spare_exec; /* one op's state, reused (exec.c) */
    size_t scratch_bytes;
    bool blocking;
    enum shim_comm_state state;  /* atomic: the init thread writes it */
    ncclResult_t async_error;    /* atomic */
    volatile int abort_flag;
    int calls_inside;            /* atomic: threads carrying out a call on this comm (group.c),
                                    which may wait there for the other ranks: abort from
                                    another thread waits them out before it frees */
    int revoked;                 /* atomic: ncclCommRevoke was called; management ops only */
    bool suspended;              /* ncclCommSuspend: no operation until ncclCommResume */
    char name[SHIM_CONFIG_NAME_MAX]; /* ncclConfig_t commName; "" without one */
    struct shim_windows *windows; /* its windows and one-sided signals (window.c), on need */
    bool grow_id_pending;        /* ncclCommGetUniqueId gave grow_id; no grow used it yet */
    ncclUniqueId grow_id;
    pthread_t init_thread;
    bool init_thread_live;
    struct shim_user_op user_ops[SHIM_MAX_USER_OPS];
    struct shim_log_scope log;  /* its last-error text and the device its log lines name */
    struct shim_reg *regs;      /* ncclCommRegister's records (register.c) */
    pthread_mutex_t lock;       /* guards the init thread's join and regs */
    struct ncclComm *next_live; /* the registry of live communicators (comm.c) */
};

struct shim_comm_args {
    int nranks;
    int rank;
    ncclUniqueId id;
    bool blocking;
    int cuda_dev;
    bool cuda_dev_chosen; /* current at init, or named: not device 0 for want of one */
    char name[SHIM_CONFIG_NAME_MAX]; /* ncclConfig_t commName, for the logs */
};

/* Creates a communicator. Blocking: returns once every rank joined. Non-blocking: returns
 * ncclInProgress with *comm_out set at once; ncclCommGetAsyncError reports completion. */
ncclResult_t shim_comm_init(const struct shim_comm_args *args, struct ncclComm **comm_out);
/* A barrier with every rank (queued if a group is open); afterwards only destroy remains. */
ncclResult_t shim_comm_finalize(struct ncclComm *comm);
/* Releases local resources without waiting for any peer. */
ncclResult_t shim_comm_destroy(struct ncclComm *comm);
/* Local teardown without any peer's help; always returns. */
ncclResult_t shim_comm_abort(struct ncclComm *comm);

/* ncclInvalidArgument with a WARN unless comm is live (not NULL, not destroyed). */
ncclResult_t shim_comm_check(const struct ncclComm *comm, const char *api);
/* As shim_comm_check, and also initialised, not failed, not revoked: usable for
 * collectives. */
ncclResult_t shim_comm_check_ready(struct ncclComm *comm, const char *api);
/* For split and shrink: a ready communicator, or a revoked one (NCCL lets management go on
 * after ncclCommRevoke), or with allow_failed (NCCL_SHRINK_ABORT) one that failed. */
ncclResult_t shim_comm_check_parent(struct ncclComm *comm, bool allow_failed, const char *api);
/* ncclCommRevoke: operations in flight on other threads stop within NCCLSHIM_WAIT_MS with an
 * error, later ones are refused; destroy, abort, split and shrink remain. */
ncclResult_t shim_comm_revoke(struct ncclComm *comm);
/* ncclCommSuspend(NCCL_SUSPEND_MEM): once its device work is done, frees the memory the
 * communicator makes again on demand (device staging, scratch); operations are refused until
 * shim_comm_resume. */
ncclResult_t shim_comm_suspend(struct ncclComm *comm);
ncclResult_t shim_comm_resume(struct ncclComm *comm);
/* GPU memory the communicator holds: what suspension frees, and what it keeps. */
void shim_comm_gpu_bytes(const struct ncclComm *comm, uint64_t *releasable_out,
                         uint64_t *persistent_out);
ncclResult_t shim_comm_async_error(struct ncclComm *comm);
/* Blocks until a non-blocking init finished; returns its result. */
ncclResult_t shim_comm_wait_init(struct ncclComm *comm);
void shim_comm_set_async_error(struct ncclComm *comm, ncclResult_t res);

/* Makes comm the calling thread's current communicator: WARNs also go to its last-error text
 * and log lines show its device (its log scope, base/debug.h). NULL unbinds. */
void shim_comm_bind(struct ncclComm *comm);
/* A communicator made from a parent's ranks (split.c): created with its transport worker,
 * then connected once the members' addresses were exchanged over the parent. Discard frees
 * one that never got connected. */
ncclResult_t shim_comm_child_create(const struct ncclComm *parent, int rank, int nranks,
                                    uint64_t id_hash, bool blocking,
                                    struct ncclComm **comm_out);
ncclResult_t shim_comm_child_connect(struct ncclComm *comm, const void *const *addrs,
                                     const size_t *lens);
void shim_comm_child_discard(struct ncclComm *comm);

/* After connecting: if every rank runs on this host, maps each other's shared memory
 * (comm_shm.c). Collective over the communicator; a rank that cannot share makes them all go
 * without, which is not an error. */
ncclResult_t shim_comm_shm_setup(struct ncclComm *comm);

/* Creates a fresh unique id for ncclCommInitAll (never from NCCL_COMM_ID). */
ncclResult_t shim_comm_init_all(struct ncclComm **comms, int ncomms, const int *devlist);

/* Scratch for an op's schedule: reuses the communicator's cached buffer when it is free and
 * large enough, else allocates. put returns it (keeping the larger buffer cached). */
ncclResult_t shim_comm_scratch_get(struct ncclComm *comm, size_t bytes, void **buf_out);
void shim_comm_scratch_put(struct ncclComm *comm, void *buf, size_t bytes);

/* PreMulSum operators: ncclRedOpCreatePreMulSum and ncclRedOpDestroy. */
/* scalar_ptr: NULL when redop->scalar already holds the value (host-immediate residence),
 * else where to read it at each call (ncclScalarDevice): by the host, or, scalar_device, by
 * the kernel (device, managed or registered memory). */
ncclResult_t shim_comm_redop_create(struct ncclComm *comm, const struct kr_redop *redop,
                                    const void *scalar_ptr, bool scalar_device,
                                    ncclRedOp_t *op_out);
ncclResult_t shim_comm_redop_destroy(struct ncclComm *comm, ncclRedOp_t op);
/* Resolves a user's op for a call with `datatype` into a concrete kernel op. A scalar the
 * kernel reads comes back in *scalar_dev_out (NULL otherwise); only a call on device memory
 * (`device`) can use one: ncclInvalidUsage with a WARN for a host call. */
ncclResult_t shim_comm_redop_resolve(struct ncclComm *comm, ncclRedOp_t op,
                                     ncclDataType_t datatype, bool device,
                                     struct kr_redop *redop_out, const void **scalar_dev_out);

#endif
