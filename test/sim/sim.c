/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The simulator described in sim.h. Correctness over speed, but linear in the number of
 * steps: each step counts the dependencies it still waits for, a finished step releases its
 * dependents, and the possible actions live in one array from which a random one is taken.
 */
#include "sim.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec.h"

enum { SIM_PENDING, SIM_POSTED, SIM_DONE };
enum { SIM_START, SIM_MATCH };

/* An in-flight transfer: the bytes it reads (a send) or writes (a receive). */
struct sim_flight {
    uintptr_t lo, hi;
    bool writes;
    int step;
};

struct sim_rank {
    int nparts;
    int nsteps;
    struct alg_step *steps;
    int *part;                                  /* per step: which operation it belongs to */
    uint8_t *bufs[SIM_MAX_PARTS][ALG_BUF_COUNT]; /* per part */
    size_t size[SIM_MAX_PARTS][ALG_BUF_COUNT];   /* SIM_UNCHECKED: unknown */
    size_t elem[SIM_MAX_PARTS];
    uint8_t *state;
    int *waiting;                /* per step: dependencies not done yet */
    int *dep_first, *dep_list;   /* per step: the steps that depend on it (CSR) */
    int *partner;                /* send/recv: the matching step on the peer */
    int *rfirst, *rlist;         /* per source rank: our receives from it, in order (CSR) */
    struct sim_flight *inflight; /* posted sends and receives */
    int *flight_pos;             /* per step: its index in inflight */
    int ninflight;
};

struct sim {
    const struct sim_op *op;
    struct sim_report *report;
    int n;
    struct sim_rank *ranks;
    int *cand; /* (rank, step, action) triples */
    int ncand;
    int done, total;
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

static bool __attribute__((format(printf, 2, 3)))
sim_fail(struct sim *sim, const char *fmt, ...)
{
    if (sim->report->error[0] == '\0') {
        va_list ap;
        va_start(ap, fmt);
        int len = vsnprintf(sim->report->error, sizeof(sim->report->error), fmt, ap);
        va_end(ap);
        if (len >= 0 && (size_t)len < sizeof(sim->report->error)) {
            snprintf(sim->report->error + len, sizeof(sim->report->error) - (size_t)len,
                     " (seed %u)", sim->op->seed);
        }
    }
    return false;
}

static const char *
sim_kind_name(int kind)
{
    static const char *names[] = {"send", "recv", "reduce", "copy"};
    return kind >= 0 && kind < 4 ? names[kind] : "?";
}

static const char *
sim_buf_name(int buf)
{
    static const char *names[] = {"SEND", "RECV", "SCRATCH"};
    return buf >= 0 && buf < ALG_BUF_COUNT ? names[buf] : "?";
}

/* The address a range starts at; NULL for an empty range on a missing buffer. */
static uint8_t *
sim_ptr(const struct sim_rank *rk, int i, struct alg_range r)
{
    uint8_t *base = rk->bufs[rk->part[i]][r.buf];
    return base ? base + r.off : NULL;
}

/* A range lies in a buffer this rank has, inside its size. */
static bool
sim_check_range(struct sim *sim, int r, int i, struct alg_range range, const char *what)
{
    const struct sim_rank *rk = &sim->ranks[r];
    const struct alg_step *s = &rk->steps[i];
    const int p = rk->part[i];

    if (range.buf >= ALG_BUF_COUNT) {
        return sim_fail(sim, "rank %d step %d (%s): %s names buffer %d", r, i,
                        sim_kind_name(s->kind), what, range.buf);
    }
    if (range.len == 0) {
        return true;
    }
    if (rk->bufs[p][range.buf] == NULL) {
        return sim_fail(sim, "rank %d step %d (%s): %s uses %s [%zu, +%zu), a buffer this "
                        "rank does not have (NULL)", r, i, sim_kind_name(s->kind), what,
                        sim_buf_name(range.buf), range.off, range.len);
    }
    size_t size = rk->size[p][range.buf];
    if (size != SIM_UNCHECKED && (range.off > size || range.len > size - range.off)) {
        return sim_fail(sim, "rank %d step %d (%s): %s %s [%zu, +%zu) lies outside the %zu "
                        "bytes of that buffer", r, i, sim_kind_name(s->kind), what,
                        sim_buf_name(range.buf), range.off, range.len, size);
    }
    return true;
}

static bool
sim_overlap(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen)
{
    return alen > 0 && blen > 0 && a < b + blen && b < a + alen;
}

/* Static checks of one step: ranges, peers, operand shapes. */
static bool
sim_check_step(struct sim *sim, int r, int i)
{
    struct sim_rank *rk = &sim->ranks[r];
    const struct alg_step *s = &rk->steps[i];
    const size_t elem = rk->elem[rk->part[i]];

    switch (s->kind) {
    case ALG_STEP_SEND:
    case ALG_STEP_RECV:
        if (s->peer < 0 || s->peer >= sim->n) {
            return sim_fail(sim, "rank %d step %d (%s): peer %d of %d ranks", r, i,
                            sim_kind_name(s->kind), s->peer, sim->n);
        }
        return s->kind == ALG_STEP_SEND ? sim_check_range(sim, r, i, s->src[0], "source")
                                        : sim_check_range(sim, r, i, s->dst, "destination");
    case ALG_STEP_REDUCE:
    case ALG_STEP_COPY: {
        const int nsrc = s->kind == ALG_STEP_REDUCE ? 2 : 1;
        if (!sim_check_range(sim, r, i, s->dst, "destination")) {
            return false;
        }
        if (s->dst.len % elem != 0 || s->dst.off % elem != 0) {
            return sim_fail(sim, "rank %d step %d (%s): destination %s [%zu, +%zu) is not in "
                            "whole %zu-byte elements", r, i, sim_kind_name(s->kind),
                            sim_buf_name(s->dst.buf), s->dst.off, s->dst.len, elem);
        }
        for (int k = 0; k < nsrc; k++) {
            if (!sim_check_range(sim, r, i, s->src[k], k ? "second operand" : "operand")) {
                return false;
            }
            if (s->src[k].len != s->dst.len || s->src[k].off % elem != 0) {
                return sim_fail(sim, "rank %d step %d (%s): operand %s [%zu, +%zu) does not "
                                "match destination %s [%zu, +%zu)", r, i,
                                sim_kind_name(s->kind), sim_buf_name(s->src[k].buf),
                                s->src[k].off, s->src[k].len, sim_buf_name(s->dst.buf),
                                s->dst.off, s->dst.len);
            }
            const uint8_t *d = sim_ptr(rk, i, s->dst), *a = sim_ptr(rk, i, s->src[k]);
            if (d != a && sim_overlap(d, s->dst.len, a, s->src[k].len)) {
                return sim_fail(sim, "rank %d step %d (%s): destination %s [%zu, +%zu) "
                                "partly overlaps operand %s [%zu, +%zu)", r, i,
                                sim_kind_name(s->kind), sim_buf_name(s->dst.buf), s->dst.off,
                                s->dst.len, sim_buf_name(s->src[k].buf), s->src[k].off,
                                s->src[k].len);
            }
        }
        return true;
    }
    default:
        return sim_fail(sim, "rank %d step %d: unknown kind %d", r, i, s->kind);
    }
}

/* Builds every rank's schedule (all parts, concatenated) and checks each step. */
static bool
sim_build(struct sim *sim)
{
    const struct sim_op *op = sim->op;

    for (int r = 0; r < sim->n; r++) {
        struct sim_rank *rk = &sim->ranks[r];
        struct sim_part single;
        const struct sim_part *parts = &single;
        rk->nparts = 1;
        if (op->parts) {
            rk->nparts = op->nparts[r];
            parts = op->parts[r];
            if (rk->nparts < 0 || rk->nparts > SIM_MAX_PARTS) {
                return sim_fail(sim, "rank %d: %d operations in a group", r, rk->nparts);
            }
        } else {
            single = (struct sim_part){
                .build = op->build, .args = op->args, .send = op->send[r],
                .recv = op->recv[r],
                .send_bytes = op->send_bytes ? op->send_bytes[r] : SIM_UNCHECKED,
                .recv_bytes = op->recv_bytes ? op->recv_bytes[r] : SIM_UNCHECKED};
            single.args.rank = r;
        }
        for (int p = 0; p < rk->nparts; p++) {
            struct alg_sched sched;
            alg_sched_init(&sched);
            if (parts[p].build(&parts[p].args, &sched) != ncclSuccess) {
                alg_sched_free(&sched);
                return sim_fail(sim, "rank %d: builder of operation %d failed", r, p);
            }
            const int base = rk->nsteps;
            const size_t total = (size_t)base + (size_t)sched.nsteps + 1;
            struct alg_step *steps = realloc(rk->steps, sizeof(*steps) * total);
            int *part = realloc(rk->part, sizeof(int) * total);
            if (steps) {
                rk->steps = steps;
            }
            if (part) {
                rk->part = part;
            }
            if (!steps || !part) {
                alg_sched_free(&sched);
                return sim_fail(sim, "out of memory");
            }
            for (int i = 0; i < sched.nsteps; i++) {
                struct alg_step s = sched.steps[i];
                if (s.ndeps > ALG_MAX_DEPS) {
                    alg_sched_free(&sched);
                    return sim_fail(sim, "rank %d operation %d step %d: %d dependencies", r,
                                    p, i, s.ndeps);
                }
                for (int d = 0; d < s.ndeps; d++) {
                    if (s.deps[d] < 0 || s.deps[d] >= i) {
                        alg_sched_free(&sched);
                        return sim_fail(sim, "rank %d operation %d step %d depends on step "
                                        "%d, not an earlier one", r, p, i, s.deps[d]);
                    }
                    s.deps[d] += base;
                }
                rk->steps[base + i] = s;
                rk->part[base + i] = p;
            }
            rk->nsteps += sched.nsteps;
            rk->bufs[p][ALG_BUF_SEND] = parts[p].send;
            rk->bufs[p][ALG_BUF_RECV] = parts[p].recv;
            rk->size[p][ALG_BUF_SEND] = parts[p].send_bytes;
            rk->size[p][ALG_BUF_RECV] = parts[p].recv_bytes;
            rk->size[p][ALG_BUF_SCRATCH] = sched.scratch_bytes;
            rk->elem[p] = parts[p].args.elem_size ? parts[p].args.elem_size : 1;
            /* Garbage, so an algorithm that reads scratch it did not fill gets wrong sums. */
            rk->bufs[p][ALG_BUF_SCRATCH] = malloc(sched.scratch_bytes + 1);
            if (rk->bufs[p][ALG_BUF_SCRATCH] == NULL) {
                alg_sched_free(&sched);
                return sim_fail(sim, "out of memory for %zu bytes of scratch",
                                sched.scratch_bytes);
            }
            memset(rk->bufs[p][ALG_BUF_SCRATCH], 0xa5, sched.scratch_bytes + 1);
            alg_sched_free(&sched);
        }
        for (int i = 0; i < rk->nsteps; i++) {
            if (!sim_check_step(sim, r, i)) {
                return false;
            }
            if (rk->steps[i].kind == ALG_STEP_SEND) {
                sim->report->bytes_sent[r] += rk->steps[i].src[0].len;
            }
        }
        sim->report->steps += rk->nsteps;
    }
    return true;
}

/* Dependents, receive lists and message partners; message counts and lengths must agree. */
static bool
sim_link(struct sim *sim)
{
    const int n = sim->n;

    for (int r = 0; r < n; r++) {
        struct sim_rank *rk = &sim->ranks[r];
        const size_t ns = (size_t)rk->nsteps + 1;
        rk->state = calloc(ns, 1);
        rk->waiting = calloc(ns, sizeof(int));
        rk->dep_first = calloc(ns + 1, sizeof(int));
        rk->dep_list = calloc(ns * ALG_MAX_DEPS, sizeof(int));
        rk->partner = malloc(ns * sizeof(int));
        rk->rfirst = calloc((size_t)n + 1, sizeof(int));
        rk->rlist = malloc(ns * sizeof(int));
        rk->inflight = malloc(ns * sizeof(*rk->inflight));
        rk->flight_pos = malloc(ns * sizeof(int));
        if (!rk->state || !rk->waiting || !rk->dep_first || !rk->dep_list || !rk->partner ||
            !rk->rfirst || !rk->rlist || !rk->inflight || !rk->flight_pos) {
            return sim_fail(sim, "out of memory");
        }
        for (int i = 0; i < rk->nsteps; i++) {
            const struct alg_step *s = &rk->steps[i];
            rk->waiting[i] = s->ndeps;
            for (int d = 0; d < s->ndeps; d++) {
                rk->dep_first[s->deps[d] + 1]++;
            }
            if (s->kind == ALG_STEP_RECV) {
                rk->rfirst[s->peer + 1]++;
            }
            rk->partner[i] = -1;
        }
        for (int i = 0; i < rk->nsteps; i++) {
            rk->dep_first[i + 1] += rk->dep_first[i];
        }
        for (int p = 0; p < n; p++) {
            rk->rfirst[p + 1] += rk->rfirst[p];
        }
        int *fill = calloc(ns + (size_t)n, sizeof(int)), *rfill = fill + ns;
        if (fill == NULL) {
            return sim_fail(sim, "out of memory");
        }
        for (int i = 0; i < rk->nsteps; i++) {
            const struct alg_step *s = &rk->steps[i];
            for (int d = 0; d < s->ndeps; d++) {
                int dep = s->deps[d];
                rk->dep_list[rk->dep_first[dep] + fill[dep]++] = i;
            }
            if (s->kind == ALG_STEP_RECV) {
                rk->rlist[rk->rfirst[s->peer] + rfill[s->peer]++] = i;
            }
        }
        free(fill);
    }
    /* The k-th send from r to p pairs with p's k-th receive from r. */
    int *nsent = calloc((size_t)n * (size_t)n, sizeof(int));
    if (nsent == NULL) {
        return sim_fail(sim, "out of memory");
    }
    bool ok = true;
    for (int r = 0; r < n && ok; r++) {
        struct sim_rank *rk = &sim->ranks[r];
        for (int i = 0; i < rk->nsteps && ok; i++) {
            const struct alg_step *s = &rk->steps[i];
            if (s->kind != ALG_STEP_SEND) {
                continue;
            }
            struct sim_rank *peer = &sim->ranks[s->peer];
            int k = nsent[r * n + s->peer]++;
            int nrecv = peer->rfirst[r + 1] - peer->rfirst[r];
            if (k >= nrecv) {
                ok = sim_fail(sim, "rank %d sends message %d to rank %d (step %d), which "
                              "receives only %d from rank %d", r, k, s->peer, i, nrecv, r);
                break;
            }
            int j = peer->rlist[peer->rfirst[r] + k];
            if (peer->steps[j].dst.len != s->src[0].len) {
                ok = sim_fail(sim, "rank %d sends %zu bytes (step %d, message %d) to rank %d, "
                              "which expects %zu (step %d)", r, s->src[0].len, i, k, s->peer,
                              peer->steps[j].dst.len, j);
                break;
            }
            rk->partner[i] = j;
            peer->partner[j] = i;
        }
    }
    for (int r = 0; r < n && ok; r++) {
        for (int p = 0; p < n && ok; p++) {
            int nrecv = sim->ranks[p].rfirst[r + 1] - sim->ranks[p].rfirst[r];
            if (nrecv > nsent[r * n + p]) {
                ok = sim_fail(sim, "rank %d receives %d messages from rank %d, which sends "
                              "only %d", p, nrecv, r, nsent[r * n + p]);
            }
        }
    }
    free(nsent);
    return ok;
}

static void
sim_add(struct sim *sim, int r, int i, int action)
{
    sim->cand[3 * sim->ncand] = r;
    sim->cand[3 * sim->ncand + 1] = i;
    sim->cand[3 * sim->ncand + 2] = action;
    sim->ncand++;
}

/* What a step reads and writes, by address; a no-op copy touches nothing. */
struct sim_access {
    const uint8_t *rd[2];
    size_t rdlen[2];
    const uint8_t *wr;
    size_t wrlen;
};

static struct sim_access
sim_access(const struct sim *sim, int r, int i)
{
    const struct sim_rank *rk = &sim->ranks[r];
    const struct alg_step *s = &rk->steps[i];
    struct sim_access acc = {{NULL, NULL}, {0, 0}, NULL, 0};

    switch (s->kind) {
    case ALG_STEP_SEND:
        acc.rd[0] = sim_ptr(rk, i, s->src[0]), acc.rdlen[0] = s->src[0].len;
        break;
    case ALG_STEP_RECV:
        acc.wr = sim_ptr(rk, i, s->dst), acc.wrlen = s->dst.len;
        break;
    case ALG_STEP_REDUCE:
        acc.rd[1] = sim_ptr(rk, i, s->src[1]), acc.rdlen[1] = s->src[1].len;
        /* fall through */
    default: {
        const struct kr_redop *redop = &sim->op->redops[r];
        bool scales = (redop->kind == KR_PREMULSUM && (s->flags & (ALG_PRE_A | ALG_PRE_B))) ||
                      (redop->kind == KR_SUMPOSTDIV && (s->flags & ALG_POST));
        acc.rd[0] = sim_ptr(rk, i, s->src[0]), acc.rdlen[0] = s->src[0].len;
        acc.wr = sim_ptr(rk, i, s->dst), acc.wrlen = s->dst.len;
        if (s->kind == ALG_STEP_COPY && !scales && acc.wr == acc.rd[0]) {
            acc.wrlen = acc.rdlen[0] = 0; /* the executor skips it */
        }
    }
    }
    return acc;
}

/* A step about to start must not write what an in-flight transfer touches, nor read what an
 * in-flight receive writes. */
static bool
sim_check_race(struct sim *sim, int r, int i)
{
    const struct sim_rank *rk = &sim->ranks[r];
    struct sim_access a = sim_access(sim, r, i);
    uintptr_t lo[3], hi[3];
    bool wr[3];
    int nacc = 0;

    for (int k = 0; k < 2; k++) {
        if (a.rdlen[k] > 0) {
            lo[nacc] = (uintptr_t)a.rd[k], hi[nacc] = lo[nacc] + a.rdlen[k], wr[nacc++] = false;
        }
    }
    if (a.wrlen > 0) {
        lo[nacc] = (uintptr_t)a.wr, hi[nacc] = lo[nacc] + a.wrlen, wr[nacc++] = true;
    }
    for (int k = 0; k < nacc; k++) {
        for (int f = 0; f < rk->ninflight; f++) {
            const struct sim_flight *b = &rk->inflight[f];
            if ((wr[k] || b->writes) && lo[k] < b->hi && b->lo < hi[k]) {
                const struct alg_step *s = &rk->steps[i], *t = &rk->steps[b->step];
                return sim_fail(sim, "rank %d: step %d (%s, peer %d) races with step %d (%s, "
                                "peer %d), still in flight, over the same bytes; add a "
                                "dependency", r, i, sim_kind_name(s->kind), s->peer, b->step,
                                sim_kind_name(t->kind), t->peer);
            }
        }
    }
    return true;
}

/* Posts a send or receive: in flight until matched. */
static void
sim_inflight_add(struct sim *sim, int r, int i)
{
    struct sim_rank *rk = &sim->ranks[r];
    struct sim_access a = sim_access(sim, r, i);
    struct sim_flight *f = &rk->inflight[rk->ninflight];

    f->writes = a.wrlen > 0;
    f->lo = f->writes ? (uintptr_t)a.wr : (uintptr_t)a.rd[0];
    f->hi = f->lo + (f->writes ? a.wrlen : a.rdlen[0]);
    f->step = i;
    rk->flight_pos[i] = rk->ninflight++;
}

static void
sim_inflight_remove(struct sim_rank *rk, int i)
{
    int pos = rk->flight_pos[i];
    rk->inflight[pos] = rk->inflight[--rk->ninflight];
    rk->flight_pos[rk->inflight[pos].step] = pos;
}

static void
sim_finish_step(struct sim *sim, int r, int i)
{
    struct sim_rank *rk = &sim->ranks[r];
    rk->state[i] = SIM_DONE;
    sim->done++;
    for (int k = rk->dep_first[i]; k < rk->dep_first[i + 1]; k++) {
        int j = rk->dep_list[k];
        if (--rk->waiting[j] == 0) {
            sim_add(sim, r, j, SIM_START);
        }
    }
}

/* Names where each rank stands, for a deadlock report. */
static void
sim_describe_stuck(struct sim *sim)
{
    char *out = sim->report->error;
    size_t size = sizeof(sim->report->error), len = strlen(out);
    for (int r = 0; r < sim->n && len + 64 < size; r++) {
        const struct sim_rank *rk = &sim->ranks[r];
        for (int i = 0; i < rk->nsteps; i++) {
            if (rk->state[i] != SIM_DONE) {
                const struct alg_step *s = &rk->steps[i];
                int w = snprintf(out + len, size - len, "; rank %d at step %d (%s%s peer %d)",
                                 r, i, rk->state[i] == SIM_POSTED ? "posted " : "",
                                 sim_kind_name(s->kind), s->peer);
                len += w > 0 ? (size_t)w : 0;
                break;
            }
        }
    }
}

static bool
sim_execute(struct sim *sim)
{
    unsigned rng = sim->op->seed ? sim->op->seed : 1;

    sim->total = sim->report->steps;
    sim->cand = malloc(sizeof(int) * 3 * ((size_t)sim->total + 1));
    if (sim->cand == NULL) {
        return sim_fail(sim, "out of memory");
    }
    for (int r = 0; r < sim->n; r++) {
        for (int i = 0; i < sim->ranks[r].nsteps; i++) {
            if (sim->ranks[r].waiting[i] == 0) {
                sim_add(sim, r, i, SIM_START);
            }
        }
    }
    while (sim->done < sim->total) {
        if (sim->ncand == 0) {
            sim_fail(sim, "deadlock: %d of %d steps done, nothing can move", sim->done,
                     sim->total);
            sim_describe_stuck(sim);
            return false;
        }
        int pick = (int)(sim_rand(&rng) % (unsigned)sim->ncand);
        int r = sim->cand[3 * pick], i = sim->cand[3 * pick + 1];
        int action = sim->cand[3 * pick + 2];
        sim->ncand--;
        memmove(&sim->cand[3 * pick], &sim->cand[3 * sim->ncand], 3 * sizeof(int));

        struct sim_rank *rk = &sim->ranks[r];
        const struct alg_step *s = &rk->steps[i];
        if (action == SIM_START) {
            if (!sim_check_race(sim, r, i)) {
                return false;
            }
            if (s->kind == ALG_STEP_REDUCE || s->kind == ALG_STEP_COPY) {
                shim_exec_compute(rk->bufs[rk->part[i]], s, &sim->op->redops[r]);
                sim_finish_step(sim, r, i);
                continue;
            }
            rk->state[i] = SIM_POSTED;
            sim_inflight_add(sim, r, i);
            struct sim_rank *peer = &sim->ranks[s->peer];
            int j = rk->partner[i];
            if (peer->state[j] == SIM_POSTED) {
                /* A pair is keyed by its send. */
                if (s->kind == ALG_STEP_SEND) {
                    sim_add(sim, r, i, SIM_MATCH);
                } else {
                    sim_add(sim, s->peer, j, SIM_MATCH);
                }
            }
            continue;
        }
        /* A matched pair: deliver, complete both. */
        struct sim_rank *dst = &sim->ranks[s->peer];
        int j = rk->partner[i];
        const struct alg_step *rs = &dst->steps[j];
        if (s->src[0].len > 0) {
            memcpy(sim_ptr(dst, j, rs->dst), sim_ptr(rk, i, s->src[0]), s->src[0].len);
        }
        sim_inflight_remove(rk, i);
        sim_inflight_remove(dst, j);
        sim_finish_step(sim, r, i);
        sim_finish_step(sim, s->peer, j);
    }
    return true;
}

bool
sim_run(const struct sim_op *op, struct sim_report *report)
{
    struct sim sim = {.op = op, .report = report, .n = op->args.nranks};
    bool ok = false;

    memset(report, 0, sizeof(*report));
    if (sim.n < 1 || sim.n > SIM_MAX_RANKS) {
        snprintf(report->error, sizeof(report->error), "%d ranks: 1..%d supported", sim.n,
                 SIM_MAX_RANKS);
        return false;
    }
    sim.ranks = calloc((size_t)sim.n, sizeof(*sim.ranks));
    if (sim.ranks == NULL) {
        snprintf(report->error, sizeof(report->error), "out of memory");
        return false;
    }
    ok = sim_build(&sim) && sim_link(&sim) && sim_execute(&sim);
    free(sim.cand);
    for (int r = 0; r < sim.n; r++) {
        struct sim_rank *rk = &sim.ranks[r];
        for (int p = 0; p < SIM_MAX_PARTS; p++) {
            free(rk->bufs[p][ALG_BUF_SCRATCH]);
        }
        free(rk->steps);
        free(rk->part);
        free(rk->state);
        free(rk->waiting);
        free(rk->dep_first);
        free(rk->dep_list);
        free(rk->partner);
        free(rk->rfirst);
        free(rk->rlist);
        free(rk->inflight);
        free(rk->flight_pos);
    }
    free(sim.ranks);
    return ok;
}
