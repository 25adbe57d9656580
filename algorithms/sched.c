/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Appending steps to a schedule. Builders call these without checking each result: an
 * allocation failure is remembered in the schedule and reported once by alg_sched_finish,
 * which keeps the algorithm files free of error plumbing.
 */
#include "alg.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"

void
alg_sched_init(struct alg_sched *sched)
{
    memset(sched, 0, sizeof(*sched));
}

void
alg_sched_free(struct alg_sched *sched)
{
    free(sched->steps);
    alg_sched_init(sched);
}

ncclResult_t
alg_sched_finish(struct alg_sched *sched)
{
    if (sched->out_of_memory) {
        WARN("out of memory building a schedule of %d steps", sched->capacity);
        return ncclSystemError;
    }
    return ncclSuccess;
}

/* Appends a zeroed step with up to three dependencies and returns its index, or -1. */
static int
alg_step_append(struct alg_sched *sched, enum alg_step_kind kind, int dep0, int dep1, int dep2)
{
    if (shim_grow(&sched->steps, sched->nsteps, &sched->capacity, 64) != ncclSuccess) {
        sched->out_of_memory = true;
        return -1;
    }
    int index = sched->nsteps++;
    struct alg_step *step = &sched->steps[index];
    memset(step, 0, sizeof(*step));
    step->kind = (uint8_t)kind;
    step->peer = -1;
    const int deps[ALG_MAX_DEPS] = {dep0, dep1, dep2};
    for (int i = 0; i < ALG_MAX_DEPS; i++) {
        if (deps[i] >= 0) {
            step->deps[step->ndeps++] = deps[i];
        }
    }
    return index;
}

int
alg_send(struct alg_sched *sched, int peer, struct alg_range src, int dep0, int dep1)
{
    int index = alg_step_append(sched, ALG_STEP_SEND, dep0, dep1, -1);
    if (index >= 0) {
        sched->steps[index].peer = peer;
        sched->steps[index].src[0] = src;
    }
    return index;
}

int
alg_recv(struct alg_sched *sched, int peer, struct alg_range dst, int dep0, int dep1)
{
    int index = alg_step_append(sched, ALG_STEP_RECV, dep0, dep1, -1);
    if (index >= 0) {
        sched->steps[index].peer = peer;
        sched->steps[index].dst = dst;
    }
    return index;
}

int
alg_reduce(struct alg_sched *sched, struct alg_range dst, struct alg_range a,
           struct alg_range b, unsigned flags, int dep0, int dep1, int dep2)
{
    int index = alg_step_append(sched, ALG_STEP_REDUCE, dep0, dep1, dep2);
    if (index >= 0) {
        struct alg_step *step = &sched->steps[index];
        step->dst = dst;
        step->src[0] = a;
        step->src[1] = b;
        step->flags = (uint8_t)flags;
    }
    return index;
}

int
alg_copy(struct alg_sched *sched, struct alg_range dst, struct alg_range src, unsigned flags,
         int dep0, int dep1)
{
    int index = alg_step_append(sched, ALG_STEP_COPY, dep0, dep1, -1);
    if (index >= 0) {
        struct alg_step *step = &sched->steps[index];
        step->dst = dst;
        step->src[0] = src;
        step->flags = (uint8_t)flags;
    }
    return index;
}
