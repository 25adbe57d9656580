/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Group state lives in thread-local storage, as NCCL's does: a group belongs to the thread
 * that opened it. What the outermost ncclGroupEnd does:
 *   1. wait for communicator inits started inside the group, and for the collective calls
 *      that run on threads of their own (window registration): each ran on its own thread,
 *      because every rank of a single-process clique must take part at once;
 *   2. enqueue the ops on device memory together (shim_devexec_run): stream ordered, they
 *      return at once;
 *   3. run every op on host memory together on this thread (shim_exec_run), each after the
 *      device ops issued before it on its communicator are done;
 *   4. free them. If any call inside the group failed, nothing queued runs and its error is
 *      returned, as NCCL does.
 */
#include "group.h"

#include <pthread.h>
#include <stdlib.h>

#include "base/check.h"
#include "base/env.h"
#include "call_check.h"
#include "comm.h"
#include "engine/exec.h"
#include "engine/exec_device.h"
#include "gpu/driver.h"

struct shim_group {
    int depth;
    ncclResult_t error;
    struct shim_exec **execs;
    int nexecs, exec_capacity;
    struct shim_op *devops;  /* ops on device memory, in call order */
    int ndevops, devop_capacity;
    struct ncclComm **inits;
    int ninits, init_capacity;
    struct shim_group_task **tasks;
    int ntasks, task_capacity;
};

/* A call running on a thread of its own until ncclGroupEnd joins it. */
struct shim_group_task {
    pthread_t thread;
    ncclResult_t (*fn)(void *);
    void *arg;
    ncclResult_t res;
};

static __thread struct shim_group shim_group;

/* Appends to a growable array of pointers. */
static ncclResult_t
shim_group_push(void ***array, int *count, int *capacity, void *item)
{
    if (*count == *capacity) {
        int grown = *capacity ? 2 * *capacity : 16;
        void **bigger = realloc(*array, (size_t)grown * sizeof(void *));
        if (bigger == NULL) {
            WARN("out of memory growing a group to %d entries", grown);
            return ncclSystemError;
        }
        *array = bigger;
        *capacity = grown;
    }
    (*array)[(*count)++] = item;
    return ncclSuccess;
}

bool
shim_group_active(void)
{
    return shim_group.depth > 0;
}

ncclResult_t
shim_group_start(void)
{
    shim_group.depth++;
    return ncclSuccess;
}

void
shim_group_fail(ncclResult_t res)
{
    if (shim_group.depth > 0 && shim_group.error == ncclSuccess) {
        shim_group.error = res;
    }
}

static void *
shim_group_task_main(void *arg)
{
    struct shim_group_task *task = arg;
    gpu_capture_relax_thread(); /* splits and windows register, as the calls they stand for */
    task->res = task->fn(task->arg);
    return NULL;
}

ncclResult_t
shim_group_spawn(ncclResult_t (*fn)(void *), void *arg)
{
    struct shim_group_task *task;

    SHIM_CHECK(shim_calloc(&task, 1));
    task->fn = fn;
    task->arg = arg;
    ncclResult_t res = shim_group_push((void ***)&shim_group.tasks, &shim_group.ntasks,
                                       &shim_group.task_capacity, task);
    if (res == ncclSuccess && pthread_create(&task->thread, NULL, shim_group_task_main,
                                             task) != 0) {
        WARN("cannot start a thread for a call inside a group");
        shim_group.ntasks--;
        res = ncclSystemError;
    }
    if (res != ncclSuccess) {
        free(task);
    }
    return res;
}

ncclResult_t
shim_group_add_init(struct ncclComm *comm)
{
    return shim_group_push((void ***)&shim_group.inits, &shim_group.ninits,
                           &shim_group.init_capacity, comm);
}

/* NCCLSHIM_CHECK=1, read once. */
static bool
shim_group_checked(void)
{
    static int checked = -1; /* racy first reads all compute the same value */
    if (checked < 0) {
        checked = shim_env_int(SHIM_ENV_CHECK) != 0;
    }
    return checked;
}

/* Host ops of a communicator come after the device ops issued on it before them. */
static ncclResult_t
shim_group_drain(struct ncclComm *comm)
{
    return shim_devexec_drain(comm);
}

/* Counts this thread in (delta 1) or out (-1) of comm while it carries out a call there:
 * ncclCommAbort from another thread waits until no thread is inside (comm.h). */
static void
shim_group_count(struct ncclComm *comm, int delta)
{
    __atomic_add_fetch(&comm->calls_inside, delta, __ATOMIC_ACQ_REL);
}

/* Runs a group's host ops, after NCCLSHIM_CHECK's comparison with the other ranks' calls. */
static ncclResult_t
shim_group_run(struct shim_exec *const *execs, int nexecs)
{
    for (int i = 0; i < nexecs; i++) {
        SHIM_CHECK(shim_group_drain(shim_exec_op(execs[i])->comm));
    }
    if (shim_group_checked()) {
        SHIM_CHECK(shim_call_check(execs, nexecs));
    }
    return shim_exec_run(execs, nexecs);
}

/* A device op: numbered now, in call order among the communicator's ops, then run (outside a
 * group) or kept for ncclGroupEnd. NCCLSHIM_CHECK compares host calls only: comparing would
 * make a device call wait for its peers. */
static ncclResult_t
shim_group_enqueue_device(const struct shim_op *op)
{
    struct shim_op numbered = *op;

    numbered.seq = shim_op_next_seq(op->comm, op);
    if (shim_group.depth == 0) {
        shim_group_count(op->comm, 1);
        ncclResult_t res = shim_devexec_run(&numbered, 1);
        shim_group_count(op->comm, -1);
        return res;
    }
    SHIM_CHECK(shim_grow(&shim_group.devops, shim_group.ndevops, &shim_group.devop_capacity,
                         16));
    shim_group.devops[shim_group.ndevops++] = numbered;
    return ncclSuccess;
}

/* A host op outside a group, carried out now. */
static ncclResult_t
shim_group_run_now(const struct shim_op *op)
{
    struct shim_exec *exec;
    ncclResult_t res;

    if (!shim_group_checked()) {
        SHIM_CHECK(shim_group_drain(op->comm));
        return shim_exec_run_one(op);
    }
    SHIM_CHECK(shim_exec_create(op, &exec));
    res = shim_group_run(&exec, 1);
    shim_exec_destroy(exec);
    return res;
}

ncclResult_t
shim_group_enqueue(const struct shim_op *op)
{
    struct shim_exec *exec;
    ncclResult_t res;

    if (op->device) {
        return shim_group_enqueue_device(op);
    }
    if (shim_group.depth == 0) {
        shim_group_count(op->comm, 1);
        res = shim_group_run_now(op);
        shim_group_count(op->comm, -1);
        return res;
    }
    SHIM_CHECK(shim_exec_create(op, &exec));
    SHIM_CHECK_GOTO(shim_group_push((void ***)&shim_group.execs, &shim_group.nexecs,
                                    &shim_group.exec_capacity, exec),
                    res, err_destroy);
    return ncclSuccess;

err_destroy:
    shim_exec_destroy(exec);
    return res;
}

ncclResult_t
shim_group_end(void)
{
    ncclResult_t res;

    if (shim_group.depth == 0) {
        WARN("ncclGroupEnd without a matching ncclGroupStart");
        return ncclInvalidUsage;
    }
    if (--shim_group.depth > 0) {
        return ncclSuccess;
    }

    res = shim_group.error;
    for (int i = 0; i < shim_group.ninits; i++) {
        ncclResult_t init_res = shim_comm_wait_init(shim_group.inits[i]);
        if (res == ncclSuccess) {
            res = init_res;
        }
    }
    for (int i = 0; i < shim_group.ntasks; i++) {
        pthread_join(shim_group.tasks[i]->thread, NULL);
        if (res == ncclSuccess) {
            res = shim_group.tasks[i]->res;
        }
        free(shim_group.tasks[i]);
    }
    /* Counted in once per op (a communicator may be counted several times), and out once its
     * op is done with: an exec's destroy still touches its communicator. */
    for (int i = 0; i < shim_group.ndevops; i++) {
        shim_group_count(shim_group.devops[i].comm, 1);
    }
    for (int i = 0; i < shim_group.nexecs; i++) {
        shim_group_count(shim_exec_op(shim_group.execs[i])->comm, 1);
    }
    if (res == ncclSuccess && shim_group.ndevops > 0) {
        res = shim_devexec_run(shim_group.devops, shim_group.ndevops);
    }
    if (res == ncclSuccess && shim_group.nexecs > 0) {
        res = shim_group_run(shim_group.execs, shim_group.nexecs);
    }
    for (int i = 0; i < shim_group.ndevops; i++) {
        shim_group_count(shim_group.devops[i].comm, -1);
    }
    for (int i = 0; i < shim_group.nexecs; i++) {
        struct ncclComm *comm = shim_exec_op(shim_group.execs[i])->comm;
        shim_exec_destroy(shim_group.execs[i]);
        shim_group_count(comm, -1);
    }
    free(shim_group.execs);
    free(shim_group.devops);
    free(shim_group.inits);
    free(shim_group.tasks);
    shim_group = (struct shim_group){0};
    return res;
}
