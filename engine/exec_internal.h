/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The executor's insides, shared by exec.c (the state machine, host memory, the run loop) and
 * exec_staged_steps.c (steps on device memory staged through pinned host memory). Nothing
 * else includes this: the rest of the library sees exec.h.
 */
#ifndef SHIM_EXEC_INTERNAL_H
#define SHIM_EXEC_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "algorithms/alg.h"
#include "exec.h"
#include "kernels/kernels.h"
#include "op.h"
#include "shm/shm.h"
#include "transports/transport.h"

enum shim_step_state {
    SHIM_STEP_PENDING,
    SHIM_STEP_POSTED,
    SHIM_STEP_STAGING, /* staged: waits for the GPU (a copy, or the kernels before it) */
    SHIM_STEP_DONE,
};

struct shim_exec {
    struct shim_op op;
    struct alg_sched sched;
    const char *alg_name;
    uint32_t seq;
    uint8_t *bufs[ALG_BUF_COUNT];
    uint8_t *state;          /* enum shim_step_state, per step */
    uint64_t *tags;          /* per step; sends and receives only */
    struct tp_request *reqs; /* per step; sends and receives only */
    int step_capacity;       /* steps that state, tags and reqs hold (a spare keeps them) */
    int first_pending;       /* every step before it is done */
    bool management;         /* split/shrink exchange: per-peer numbering (tag.h) */
    int ndone;
    bool abandoned;          /* its communicator failed during the run; the run's others go on */
    bool shm;                /* runs on the communicator's shared-memory team, no schedule */
    bool shm_done;
    struct shm_op shm_op;
    struct shm_wait shm_wait; /* what the shared-memory op last blocked on */
    /* Staged (device memory through pinned host memory): bufs are device addresses. */
    bool staged;
    struct gpu_staging *staging;      /* bound before it runs (shim_exec_staged_bind) */
    bool direct;                      /* UCX takes the device buffers as they are */
    size_t shadow_off[ALG_BUF_COUNT]; /* each buffer's host copy in the exec's share */
    size_t shadow_bytes;
    uint8_t *shadow[ALG_BUF_COUNT];   /* the host copies, aliased as the buffers are */
    uint32_t *tickets;                /* per step: the lane's ticket it waits for */
    uint8_t *how;                     /* per send and receive: enum shim_staged_how */
    struct shim_staged_phases *phases; /* NCCLSHIM_STAGED_PHASES: where to add up, or NULL */
    uint64_t *since;                  /* ... and per step, when its phase began */
    int nstaging;                     /* steps STAGING now */
};

static inline void *
shim_exec_ptr(const struct shim_exec *exec, struct alg_range range)
{
    return exec->bufs[range.buf] + range.off;
}

static inline unsigned
shim_exec_kr_flags(unsigned alg_flags)
{
    return ((alg_flags & ALG_PRE_A) ? KR_PRE_A : 0) | ((alg_flags & ALG_PRE_B) ? KR_PRE_B : 0) |
           ((alg_flags & ALG_POST) ? KR_POST : 0);
}

/* A copy changes values only where the op scales raw input or divides a final sum. */
static inline bool
shim_exec_copy_scales(const struct kr_redop *redop, unsigned kr_flags)
{
    return (redop->kind == KR_PREMULSUM && (kr_flags & (KR_PRE_A | KR_PRE_B))) ||
           (redop->kind == KR_SUMPOSTDIV && (kr_flags & KR_POST));
}

/* Where a message's bytes are: a staged exec's host copy of the buffer (scratch lives only
 * there; the user's buffers, unless UCX takes device memory), else the buffer. */
static inline void *
shim_exec_wire_ptr(const struct shim_exec *exec, struct alg_range range)
{
    bool host_copy = exec->staging != NULL && (range.buf == ALG_BUF_SCRATCH || !exec->direct);
    return host_copy ? exec->shadow[range.buf] + range.off : shim_exec_ptr(exec, range);
}

static inline void
shim_exec_step_done(struct shim_exec *exec, int i)
{
    exec->state[i] = SHIM_STEP_DONE;
    exec->ndone++;
}

/* Posts a send or receive step's message (exec.c). */
ncclResult_t shim_exec_post(struct shim_exec *exec, int i);

/* How a staged send or receive meets the GPU (exec_staged_steps.c says what each means). */
enum shim_staged_how {
    SHIM_STAGED_NOW,           /* the message at once */
    SHIM_STAGED_COPY_OUT,      /* send: copy out first */
    SHIM_STAGED_AFTER_KERNELS, /* the message once the in lane's work so far is finished */
    SHIM_STAGED_COPY_IN,       /* receive: into the host copy, then copied in */
};

/* Where a staged step's time goes (NCCLSHIM_STAGED_PHASES). Phases of different steps overlap:
 * each total is the time steps spent in it, not a share of the wall time. */
enum shim_staged_phase {
    SHIM_PHASE_COPY_OUT, /* a send's copy out of device memory */
    SHIM_PHASE_KERNELS,  /* a message waiting for the in lane's work before it */
    SHIM_PHASE_SEND,     /* a send's message, posted to completed */
    SHIM_PHASE_RECV,     /* a receive's message, posted to arrived */
    SHIM_PHASE_COPY_IN,  /* a receive's copy into device memory */
    SHIM_PHASE_COUNT
};
struct shim_staged_phases {
    uint64_t ns[SHIM_PHASE_COUNT];
    uint64_t count[SHIM_PHASE_COUNT];
};

/* Staged execs (exec_staged_steps.c). Lays out the host copies of a new one's buffers and
 * plans how each send and receive meets the GPU. */
void shim_staged_plan(struct shim_exec *exec);
/* Starts a ready step of a bound one: a message, its copy first, or a kernel. */
ncclResult_t shim_staged_start(struct shim_exec *exec, int i);
/* A STAGING step: moves on once what it waits for on the GPU is finished. */
/* What it waits for, in words, for hang reports. */
const char *shim_staged_waits_for(const struct shim_exec *exec, int i);
ncclResult_t shim_staged_test(struct shim_exec *exec, int i, bool *progressed);
/* A send or receive whose message completed: a receive's bytes go in where planned, else the
 * step is done. */
ncclResult_t shim_staged_message_done(struct shim_exec *exec, int i);

#endif
