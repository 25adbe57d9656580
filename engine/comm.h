/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The communicator as the operations see it: struct ncclComm, what ncclComm_t points to (its
 * ranks, transport worker, shared-memory team, device back-end, state and errors), and the
 * little the engine asks of it (comm.c here). Its lifecycle, which makes and ends it, is
 * nccl_shim/comm.h's, a layer above.
 */
#ifndef ENGINE_COMM_H
#define ENGINE_COMM_H

#include <nccl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "base/debug.h"
#include "kernels/kernels.h"

/* ncclConfig_t's commName, kept for the logs. */
#define SHIM_COMM_NAME_MAX 64

struct shm_team;
struct shim_exec;
struct shim_reg;
struct shim_backend;

#define SHIM_COMM_MAGIC 0x6e63636c7368696dULL /* "ncclshim" */
#define SHIM_COMM_DEAD 0xdeadc0de0000deadULL
#define SHIM_MAX_USER_OPS 64
/* The largest pipeline chunk of the UCX schedules where the user set none: on one host, and
 * where the ranks span hosts. Over TCP every message costs CPU time on both ends (UCX copies
 * an eager message out of its receive buffer, the kernel walks its stack per segment), and on
 * 2-core hosts a transfer is CPU-bound: 512 KiB took the 2 x 1 broadcast from about 1.6 to
 * 2.2 GB/s and the 2 x 2 all-reduce from about 0.75-0.9 to 0.8-1.07 (docs/performance.md). */
#define SHIM_CHUNK_BYTES_ONE_HOST ((size_t)128 << 10)
#define SHIM_CHUNK_BYTES_ACROSS_HOSTS ((size_t)512 << 10)
/* And the smallest across hosts: a chunk that crosses in less time than a message's fixed
 * cost does not pay for its message. The cost model's optimum for a short pipeline (its 15 us
 * a message is a small message's latency, not a rendezvous on two contended CPUs) cut the
 * 16 KiB blocks of a 2 x 2 all-gather or reduce-scatter in two. 64 KiB at 2 x 2, four
 * interleaved rounds, GB/s without -> with: all-gather 0.26 -> 0.35, reduce-scatter
 * 0.23 -> 0.31, all-reduce 0.38 -> 0.47; the 2 x 1 all-reduce, which overlaps its two
 * chunks' reduction and sending on uncontended CPUs, 0.78 -> 0.72 (docs/performance.md). */
#define SHIM_CHUNK_MIN_ACROSS_HOSTS ((size_t)32 << 10)

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
    uint32_t seq;            /* collective sequence number, equal across ranks until a failure */
    uint32_t *p2p_sent;      /* per peer: ncclSends posted to it so far */
    uint32_t *p2p_received;  /* per peer: ncclRecvs posted from it so far */
    uint32_t *mgmt_sent;     /* per peer: split/shrink messages sent to it so far */
    uint32_t *mgmt_received; /* per peer: split/shrink messages received from it so far */
    struct tp_worker *tp;
    size_t chunk_bytes;      /* NCCLSHIM_CHUNK_BYTES, else by layout (shim_connect_hosts) */
    bool chunk_bytes_set;    /* the user set NCCLSHIM_CHUNK_BYTES */
    size_t chunk_min_bytes;  /* the smallest chunk the cost model may pick; 0: its own floor */
    int ring_slots;          /* NCCLSHIM_RING_SLOTS */
    struct alg_policy policy;      /* NCCL_ALGO and NCCLSHIM_ALGO, parsed at init */
    struct alg_cost_params cost;   /* the cost model's alpha, beta, gamma */
    struct shm_team *shm;          /* every rank on this host: shared-memory collectives */
    struct alg_hosts hosts;        /* which ranks share a host; nhosts 0 until connected */
    /* Who carries out its operations on device memory (backend.h), chosen once it connected,
     * and that row's state, touched by the row alone. */
    const struct shim_backend *backend;
    void *backend_state;
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
    char name[SHIM_COMM_NAME_MAX]; /* ncclConfig_t commName; "" without one */
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

/* Makes comm the calling thread's current communicator: WARNs also go to its last-error text
 * and log lines show its device (its log scope, base/debug.h). NULL unbinds. */
void shim_comm_bind(struct ncclComm *comm);
/* The first failure sticks (ncclCommGetAsyncError); the communicator is failed from then on. */
void shim_comm_set_async_error(struct ncclComm *comm, ncclResult_t res);

/* Scratch for an op's schedule: reuses the communicator's cached buffer when it is free and
 * large enough, else allocates. put returns it (keeping the larger buffer cached). */
ncclResult_t shim_comm_scratch_get(struct ncclComm *comm, size_t bytes, void **buf_out);
void shim_comm_scratch_put(struct ncclComm *comm, void *buf, size_t bytes);

#endif
