/* SPDX-License-Identifier: Apache-2.0 */
/* The simulator described in sim.h. Deliberately simple: correctness over speed. */
#include "sim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_shim/exec.h"

enum { SIM_PENDING, SIM_POSTED, SIM_DONE };

struct sim_rank {
    struct alg_sched sched;
    uint8_t *bufs[ALG_BUF_COUNT];
    uint8_t *state;
    int *match; /* per step: for a send/recv, its position among messages with that peer */
};

/* xorshift: small, seeded, reproducible. */
static unsigned
sim_rand(unsigned *state)
{
    unsigned x = *state;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    return *state = x;
}

static bool
sim_ready(const struct sim_rank *r, const struct alg_step *step)
{
    for (int d = 0; d < step->ndeps; d++) {
        if (r->state[step->deps[d]] != SIM_DONE) {
            return false;
        }
    }
    return true;
}

/* The step of rank `to` that receives message `k` from `from`, or -1. */
static int
sim_find_recv(const struct sim_rank *ranks, int from, int to, int k)
{
    const struct sim_rank *r = &ranks[to];
    for (int i = 0; i < r->sched.nsteps; i++) {
        const struct alg_step *s = &r->sched.steps[i];
        if (s->kind == ALG_STEP_RECV && s->peer == from && r->match[i] == k) {
            return i;
        }
    }
    return -1;
}

bool
sim_run(const struct sim_op *op, struct sim_report *report)
{
    const int n = op->args.nranks;
    struct sim_rank *ranks = calloc((size_t)n, sizeof(*ranks));
    unsigned rng = op->seed ? op->seed : 1;
    bool ok = false;

    memset(report, 0, sizeof(*report));
    for (int r = 0; r < n; r++) {
        struct alg_args args = op->args;
        args.rank = r;
        alg_sched_init(&ranks[r].sched);
        if (op->build(&args, &ranks[r].sched) != ncclSuccess) {
            snprintf(report->error, sizeof(report->error), "rank %d: builder failed", r);
            goto out;
        }
        struct sim_rank *rk = &ranks[r];
        rk->bufs[ALG_BUF_SEND] = op->send[r];
        rk->bufs[ALG_BUF_RECV] = op->recv[r];
        rk->bufs[ALG_BUF_SCRATCH] = malloc(rk->sched.scratch_bytes + 1);
        rk->state = calloc((size_t)rk->sched.nsteps + 1, 1);
        rk->match = calloc((size_t)rk->sched.nsteps + 1, sizeof(int));
        int *nsent = calloc((size_t)n, sizeof(int)), *nrecv = calloc((size_t)n, sizeof(int));
        for (int i = 0; i < rk->sched.nsteps; i++) {
            const struct alg_step *s = &rk->sched.steps[i];
            for (int d = 0; d < s->ndeps; d++) {
                if (s->deps[d] < 0 || s->deps[d] >= i) {
                    snprintf(report->error, sizeof(report->error),
                             "rank %d step %d depends on step %d, not an earlier one", r, i,
                             s->deps[d]);
                    free(nsent), free(nrecv);
                    goto out;
                }
            }
            if (s->kind == ALG_STEP_SEND) {
                rk->match[i] = nsent[s->peer]++;
                report->bytes_sent[r < 64 ? r : 63] += s->src[0].len;
            } else if (s->kind == ALG_STEP_RECV) {
                rk->match[i] = nrecv[s->peer]++;
            }
        }
        free(nsent), free(nrecv);
        report->steps += rk->sched.nsteps;
    }

    /* Each round: list every possible action, take one at random. */
    int total = report->steps, done = 0;
    int *cand_rank = malloc(sizeof(int) * ((size_t)total + 1));
    int *cand_step = malloc(sizeof(int) * ((size_t)total + 1));
    while (done < total) {
        int ncand = 0;
        for (int r = 0; r < n; r++) {
            for (int i = 0; i < ranks[r].sched.nsteps; i++) {
                const struct alg_step *s = &ranks[r].sched.steps[i];
                bool can = false;
                if (ranks[r].state[i] == SIM_PENDING) {
                    can = sim_ready(&ranks[r], s);
                } else if (ranks[r].state[i] == SIM_POSTED && s->kind == ALG_STEP_SEND) {
                    int j = sim_find_recv(ranks, r, s->peer, ranks[r].match[i]);
                    can = j >= 0 && ranks[s->peer].state[j] == SIM_POSTED;
                }
                if (can) {
                    cand_rank[ncand] = r;
                    cand_step[ncand++] = i;
                }
            }
        }
        if (ncand == 0) {
            snprintf(report->error, sizeof(report->error),
                     "deadlock: %d of %d steps done, nothing can move (seed %u)", done, total,
                     op->seed);
            break;
        }
        int pick = (int)(sim_rand(&rng) % (unsigned)ncand);
        struct sim_rank *rk = &ranks[cand_rank[pick]];
        int i = cand_step[pick];
        const struct alg_step *s = &rk->sched.steps[i];
        if (rk->state[i] == SIM_PENDING) {
            if (s->kind == ALG_STEP_SEND || s->kind == ALG_STEP_RECV) {
                rk->state[i] = SIM_POSTED;
            } else {
                shim_exec_compute(rk->bufs, s, &op->redops[cand_rank[pick]]);
                rk->state[i] = SIM_DONE;
                done++;
            }
            continue;
        }
        /* A matched pair: deliver, complete both. */
        struct sim_rank *dst = &ranks[s->peer];
        int j = sim_find_recv(ranks, cand_rank[pick], s->peer, rk->match[i]);
        const struct alg_step *rs = &dst->sched.steps[j];
        if (rs->dst.len != s->src[0].len) {
            snprintf(report->error, sizeof(report->error),
                     "rank %d sends %zu bytes (step %d) to rank %d, which expects %zu (step %d)",
                     cand_rank[pick], s->src[0].len, i, s->peer, rs->dst.len, j);
            break;
        }
        memcpy(dst->bufs[rs->dst.buf] + rs->dst.off, rk->bufs[s->src[0].buf] + s->src[0].off,
               s->src[0].len);
        rk->state[i] = SIM_DONE;
        dst->state[j] = SIM_DONE;
        done += 2;
    }
    free(cand_rank);
    free(cand_step);
    ok = done == total;
out:
    for (int r = 0; r < n; r++) {
        free(ranks[r].bufs[ALG_BUF_SCRATCH]);
        free(ranks[r].state);
        free(ranks[r].match);
        alg_sched_free(&ranks[r].sched);
    }
    free(ranks);
    return ok;
}
