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

void
alg_sched_reset(struct alg_sched *sched)
{
    sched->nsteps = 0;
    sched->scratch_bytes = 0;
    sched->out_of_memory = false;
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

bool
alg_slots_init(struct alg_slots *slots, struct alg_sched *sched, int count, size_t bytes)
{
    slots->count = count > 0 ? count : 1;
    slots->base = 0;
    slots->bytes = bytes;
    slots->taken = 0;
    slots->user = malloc((size_t)slots->count * sizeof(int));
    if (slots->user == NULL) {
        sched->out_of_memory = true;
        return false;
    }
    for (int i = 0; i < slots->count; i++) {
        slots->user[i] = -1;
    }
    return true;
}

void
alg_slots_free(struct alg_slots *slots)
{
    free(slots->user);
    slots->user = NULL;
}

int
alg_slot_take(struct alg_slots *slots, size_t len, struct alg_range *range_out)
{
    const int slot = (int)(slots->taken++ % (unsigned long)slots->count);

    *range_out = alg_range_make(ALG_BUF_SCRATCH, slots->base + (size_t)slot * slots->bytes, len);
    return slot;
}

int
alg_recv_reduce(struct alg_sched *sched, struct alg_slots *slots, int peer,
                struct alg_range dst, struct alg_range a, unsigned flags, int dep0, int dep1)
{
    struct alg_range scratch;
    const int slot = alg_slot_take(slots, dst.len, &scratch);
    int rx = alg_recv(sched, peer, scratch, slots->user[slot], -1);
    int reduced = alg_reduce(sched, dst, a, scratch, flags, rx, dep0, dep1);

    slots->user[slot] = reduced;
    return reduced;
}

ncclResult_t
alg_reduce_alone(const struct alg_args *args, struct alg_sched *sched)
{
    const size_t bytes = alg_bytes(args, args->count);

    alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, bytes),
             alg_range_make(ALG_BUF_SEND, 0, bytes), ALG_PRE_A | ALG_POST, -1, -1);
    return alg_sched_finish(sched);
}
