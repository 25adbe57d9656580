/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Every row of the algorithm table (alg_table), run in the in-memory simulator (test/sim)
 * against the reference (test/sim/reference.h), so an algorithm added to select.c is tested
 * here with no further work. One Test per collective loops over that collective's rows:
 *   nranks 1..17; counts 0, 1, n-1, n+1, 1001 and 4099, with chunk_bytes 1 MiB, 1 MiB, 4 (one
 *   element), 6 (not a whole number of elements), 1000 and 256 (so every pipeline runs many
 *   chunks); every root for n <= 9, roots 0, 1, n/2, n-1 and one drawn at random above; in
 *   and out of place where the collective has an in-place form (per rank, as the executor
 *   decides it: a broadcast is in place at its root only);
 *   SUM, PREMULSUM and SUMPOSTDIV for reductions, PROD, MAX and MIN on count 1001; slots 1
 *   and 4; a seed per case for the simulator's random order (two for counts n+1 and 1001,
 *   eight for n+1 at n = 5, 8, 13).
 * Each case checks: the run completes (no deadlock, no race, no out-of-range or NULL-buffer
 * access, messages pair up), every allocation holds the reference result with its guards
 * and inputs intact, bytes_sent[r] == row->bytes_sent(args) for every rank, and row->cost()
 * is finite and non-negative. SEND and RECV rows run as a ring exchange in one group per
 * rank: r sends to r+1 (a SEND row) and receives from r-1 (a RECV row), every pairing.
 * A failing row stops at its first failure, which is printed with everything needed to
 * reproduce it (row, n, count, root, in place, op, chunk, slots, seed); the other rows go on.
 * ALG_TEST_ROW=<name> restricts the sweeps to rows of that name.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/alg.h"
#include "sim/reference.h"
#include "sim/sim.h"

#define LARGE_COUNT 4099

struct run {
    const struct alg_algorithm *row;
    const struct alg_algorithm *recv_row; /* the ring exchange's RECV row */
    struct ref_case c;
    size_t chunk_bytes;
    int slots;
    unsigned seed;
};

static int
describe(const struct run *u, char *buf, size_t len)
{
    return snprintf(buf, len,
                    "%s %s%s%s n=%d count=%zu root=%d in_place=%d op=%s chunk_bytes=%zu "
                    "slots=%d seed=%u: ",
                    ref_coll_name(u->row->coll), u->row->name, u->recv_row ? "+recv " : "",
                    u->recv_row ? u->recv_row->name : "", u->c.nranks, u->c.count, u->c.root,
                    u->c.in_place, ref_kind_name(u->c.kind), u->chunk_bytes, u->slots,
                    u->seed);
}

/* A row's cost must be usable by the cost model. */
static bool
cost_ok(const struct alg_algorithm *row, const struct alg_args *args, char *msg, size_t len)
{
    struct alg_cost cost = {-1, -1, -1, 0, 0, false};
    row->cost(args, &cost);
    if (!isfinite(cost.steps) || !isfinite(cost.bytes) || !isfinite(cost.reduce_bytes) ||
        !isfinite(cost.net_steps) || !isfinite(cost.net_bytes) || cost.steps < 0 ||
        cost.bytes < 0 || cost.reduce_bytes < 0 || cost.net_steps < 0 || cost.net_bytes < 0) {
        snprintf(msg, len, "rank %d: cost() gives steps %g bytes %g reduce_bytes %g net_steps %g "
                 "net_bytes %g", args->rank, cost.steps, cost.bytes, cost.reduce_bytes,
                 cost.net_steps, cost.net_bytes);
        return false;
    }
    return true;
}

/* Runs one case; false with the reason in msg. */
static bool
run_one(const struct run *u, char *msg, size_t len)
{
    const int n = u->c.nranks;
    struct ref_data *d = malloc(sizeof(*d));
    struct sim_part(*parts)[2] = calloc(SIM_MAX_RANKS, sizeof(*parts));
    const struct sim_part *pp[SIM_MAX_RANKS];
    int np[SIM_MAX_RANKS];
    struct sim_report report;
    int at = describe(u, msg, len);
    char *why = msg + at;
    size_t whylen = len - (size_t)at;
    bool ok = false;

    cr_assert(d && parts && ref_setup(&u->c, d), "out of memory");
    const struct alg_args base = {
        .coll = u->row->coll, .count = u->c.count, .elem_size = 4, .nranks = n,
        .root = u->c.root, .chunk_bytes = u->chunk_bytes, .slots = u->slots,
        .prescale = ref_coll_reduces(u->c.coll) && u->c.kind == KR_PREMULSUM};
    for (int r = 0; r < n; r++) {
        struct alg_args args = base;
        args.rank = r;
        if (u->recv_row) {
            args.coll = ALG_COLL_SEND;
            args.root = alg_mod(r + 1, n);
            parts[r][0] = (struct sim_part){u->row->build, args, d->send[r], NULL,
                                            d->send_bytes[r], 0};
            args.coll = ALG_COLL_RECV;
            args.root = alg_mod(r - 1, n);
            parts[r][1] = (struct sim_part){u->recv_row->build, args, NULL, d->recv[r], 0,
                                            d->recv_bytes[r]};
            np[r] = 2;
        } else {
            args.in_place = d->in_place[r];
            parts[r][0] = (struct sim_part){u->row->build, args, d->send[r], d->recv[r],
                                            d->send_bytes[r], d->recv_bytes[r]};
            np[r] = 1;
        }
        pp[r] = parts[r];
    }
    struct sim_op op = {.args = base, .redops = d->redops, .seed = u->seed, .nparts = np,
                        .parts = pp};
    if (!sim_run(&op, &report)) {
        snprintf(why, whylen, "%s", report.error);
        goto out;
    }
    for (int r = 0; r < n; r++) {
        size_t want = 0;
        for (int p = 0; p < np[r]; p++) {
            const struct alg_algorithm *row = p ? u->recv_row : u->row;
            want += row->bytes_sent(&parts[r][p].args);
            if (!cost_ok(row, &parts[r][p].args, why, whylen)) {
                goto out;
            }
        }
        if (report.bytes_sent[r] != want) {
            snprintf(why, whylen, "rank %d sent %zu bytes, bytes_sent() says %zu", r,
                     report.bytes_sent[r], want);
            goto out;
        }
    }
    ok = ref_check(d, why, whylen);
out:
    ref_free(d);
    free(d);
    free(parts);
    return ok;
}

/* Small deterministic hash for per-case seeds. */
static unsigned
mix(unsigned h, unsigned v)
{
    h ^= v + 0x9e3779b9u + (h << 6) + (h >> 2);
    return h;
}

struct sweep {
    int runs;
    char msg[2048];
};

/* The whole sweep for one row (and RECV row for the exchange); false at the first failure. */
static bool
sweep_row(const struct alg_algorithm *row, const struct alg_algorithm *recv_row, int row_index,
          struct sweep *sw)
{
    const enum alg_coll coll = row->coll;
    const bool rooted = ref_coll_rooted(coll), reduces = ref_coll_reduces(coll);

    for (int n = 1; n <= 17; n++) {
        const size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n + 1, 1001, LARGE_COUNT};
        const size_t chunks[] = {1 << 20, 1 << 20, 4, 6, 1000, 256};
        const int ncounts = coll == ALG_COLL_BARRIER ? 1 : 6;
        for (int ci = 0; ci < ncounts; ci++) {
            bool dup = false;
            for (int k = 0; k < ci; k++) {
                dup = dup || counts[k] == counts[ci];
            }
            if (dup) {
                continue;
            }
            int roots[SIM_MAX_RANKS], nroots = 0;
            if (!rooted) {
                roots[nroots++] = 0;
            } else if (n <= 9) {
                for (int r = 0; r < n; r++) {
                    roots[nroots++] = r;
                }
            } else {
                const int pick[] = {0, 1, n / 2, n - 1,
                                    (int)(mix((unsigned)row_index, (unsigned)(n * 31 + ci)) %
                                          (unsigned)n)};
                for (int k = 0; k < 5; k++) {
                    bool seen = false;
                    for (int j = 0; j < nroots; j++) {
                        seen = seen || roots[j] == pick[k];
                    }
                    if (!seen) {
                        roots[nroots++] = pick[k];
                    }
                }
            }
            enum kr_op_kind kinds[6] = {KR_SUM};
            int nkinds = 1;
            if (reduces) {
                kinds[nkinds++] = KR_PREMULSUM;
                kinds[nkinds++] = KR_SUMPOSTDIV;
                if (counts[ci] == 1001) {
                    kinds[nkinds++] = KR_PROD;
                    kinds[nkinds++] = KR_MAX;
                    kinds[nkinds++] = KR_MIN;
                }
            }
            const int nplaces = ref_coll_has_in_place(coll) ? 2 : 1;
            /* A few rank counts get many interleavings. */
            const bool many = (n == 5 || n == 8 || n == 13) && counts[ci] == (size_t)n + 1;
            const bool more = counts[ci] == (size_t)n + 1 || counts[ci] == 1001;
            const int nseeds = many ? 8 : more ? 2 : 1;
            for (int ri = 0; ri < nroots; ri++) {
                for (int ip = 0; ip < nplaces; ip++) {
                    for (int ki = 0; ki < nkinds; ki++) {
                        for (int si = 0; si < 2; si++) {
                            /* Both slot counts for SUM; one, alternating, for the others. */
                            if (ki > 0 && si != (ki + ip + ri) % 2) {
                                continue;
                            }
                            for (int seed = 0; seed < nseeds; seed++) {
                                struct run u = {
                                    .row = row, .recv_row = recv_row,
                                    .c = {.coll = coll, .nranks = n, .count = counts[ci],
                                          .root = roots[ri], .in_place = ip == 1,
                                          .kind = kinds[ki]},
                                    .chunk_bytes = chunks[ci], .slots = si ? 4 : 1};
                                unsigned h = mix((unsigned)row_index + 1, (unsigned)n);
                                h = mix(h, (unsigned)ci), h = mix(h, (unsigned)roots[ri]);
                                h = mix(h, (unsigned)(ip * 64 + ki * 8 + si));
                                u.seed = mix(h, (unsigned)seed) | 1;
                                sw->runs++;
                                if (!run_one(&u, sw->msg, sizeof(sw->msg))) {
                                    return false;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    return true;
}

/* Every row of one collective; a failure names the row and the case, the rest still run. */
static void
test_collective(enum alg_coll coll)
{
    int nrows, tested = 0, failed = 0, runs = 0;
    const struct alg_algorithm *table = alg_table(&nrows);
    struct sweep *sw = calloc(1, sizeof(*sw));

    cr_assert(sw != NULL);
    /* ALG_TEST_ROW=name runs only the rows of that name (when debugging one algorithm). */
    const char *only = getenv("ALG_TEST_ROW");
    for (int i = 0; i < nrows; i++) {
        if (table[i].coll != coll || (only && strcmp(only, table[i].name) != 0)) {
            continue;
        }
        /* The exchange pairs each SEND row with each RECV row. */
        for (int j = 0; j < nrows; j++) {
            const struct alg_algorithm *recv_row = NULL;
            if (coll == ALG_COLL_SEND) {
                if (table[j].coll != ALG_COLL_RECV) {
                    continue;
                }
                recv_row = &table[j];
            } else if (j > 0) {
                break;
            }
            tested++;
            sw->runs = 0;
            if (!sweep_row(&table[i], recv_row, i, sw)) {
                cr_log_error("FAIL %s", sw->msg);
                failed++;
            } else {
                cr_log_info("ok %s %s%s%s: %d cases", ref_coll_name(coll), table[i].name,
                            recv_row ? "+recv " : "", recv_row ? recv_row->name : "",
                            sw->runs);
            }
            runs += sw->runs;
        }
    }
    free(sw);
    if (tested == 0) {
        cr_skip_test("no %s row in the table yet", ref_coll_name(coll));
    }
    cr_assert_eq(failed, 0, "%d of %d %s rows failed (messages above)", failed, tested,
                 ref_coll_name(coll));
}

Test(algorithms, allreduce)
{
    test_collective(ALG_COLL_ALLREDUCE);
}

Test(algorithms, broadcast)
{
    test_collective(ALG_COLL_BROADCAST);
}

Test(algorithms, reduce)
{
    test_collective(ALG_COLL_REDUCE);
}

Test(algorithms, allgather)
{
    test_collective(ALG_COLL_ALLGATHER);
}

Test(algorithms, reducescatter)
{
    test_collective(ALG_COLL_REDUCESCATTER);
}

Test(algorithms, alltoall)
{
    test_collective(ALG_COLL_ALLTOALL);
}

Test(algorithms, gather)
{
    test_collective(ALG_COLL_GATHER);
}

Test(algorithms, scatter)
{
    test_collective(ALG_COLL_SCATTER);
}

Test(algorithms, send_recv)
{
    test_collective(ALG_COLL_SEND);
}

Test(algorithms, barrier)
{
    test_collective(ALG_COLL_BARRIER);
}


/* Every row has a RECV partner and vice versa, names are set, and costs stay finite for
 * counts far beyond what the sweeps simulate. */
Test(algorithms, table_rows_are_complete_and_costs_finite)
{
    int nrows;
    const struct alg_algorithm *table = alg_table(&nrows);
    bool has[ALG_COLL_COUNT] = {false};
    const size_t counts[] = {0, 1, 1000, (size_t)1 << 20, (size_t)1 << 31};

    for (int i = 0; i < nrows; i++) {
        const struct alg_algorithm *row = &table[i];
        cr_assert(row->name && row->nccl && row->build && row->bytes_sent && row->cost,
                  "row %d is missing a field", i);
        cr_assert(row->coll < ALG_COLL_COUNT, "row %s: collective %d", row->name, row->coll);
        has[row->coll] = true;
        for (int n = 1; n <= 64; n++) {
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                for (int r = 0; r < n; r++) {
                    struct alg_args args = {.coll = row->coll, .count = counts[c],
                                            .elem_size = 4, .rank = r, .nranks = n,
                                            .root = (r * 7 + 3) % n, .chunk_bytes = 1 << 17,
                                            .slots = 4};
                    char msg[256];
                    cr_assert(cost_ok(row, &args, msg, sizeof(msg)), "%s %s n=%d count=%zu: %s",
                              ref_coll_name(row->coll), row->name, n, counts[c], msg);
                }
            }
        }
    }
    cr_assert_eq(has[ALG_COLL_SEND], has[ALG_COLL_RECV],
                 "the table has a SEND row without a RECV row or the reverse");
}

/* The checks themselves: each of these broken schedules must be refused, with its reason. */
static ncclResult_t
broken_deadlock(const struct alg_args *a, struct alg_sched *s)
{
    /* Everyone receives before sending: with rendezvous sends, a cycle. */
    struct alg_range r = alg_range_make(ALG_BUF_RECV, 0, 4);
    int rx = alg_recv(s, alg_mod(a->rank - 1, a->nranks), r, -1, -1);
    alg_send(s, alg_mod(a->rank + 1, a->nranks), r, rx, -1);
    return alg_sched_finish(s);
}

static ncclResult_t
broken_race(const struct alg_args *a, struct alg_sched *s)
{
    /* Forwards a buffer while receiving into it. */
    struct alg_range r = alg_range_make(ALG_BUF_RECV, 0, 4);
    alg_recv(s, alg_mod(a->rank - 1, a->nranks), r, -1, -1);
    alg_send(s, alg_mod(a->rank + 1, a->nranks), r, -1, -1);
    return alg_sched_finish(s);
}

static ncclResult_t
broken_lengths(const struct alg_args *a, struct alg_sched *s)
{
    alg_recv(s, alg_mod(a->rank - 1, a->nranks), alg_range_make(ALG_BUF_RECV, 0, 4), -1, -1);
    alg_send(s, alg_mod(a->rank + 1, a->nranks), alg_range_make(ALG_BUF_SEND, 0, 8), -1, -1);
    return alg_sched_finish(s);
}

static ncclResult_t
broken_bounds(const struct alg_args *a, struct alg_sched *s)
{
    size_t bytes = alg_bytes(a, a->count);
    alg_copy(s, alg_range_make(ALG_BUF_RECV, 4, bytes), alg_range_make(ALG_BUF_SEND, 0, bytes),
             0, -1, -1);
    return alg_sched_finish(s);
}

static ncclResult_t
broken_null(const struct alg_args *a, struct alg_sched *s)
{
    /* Every rank copies its SEND buffer, which only a broadcast's root has. */
    size_t bytes = alg_bytes(a, a->count);
    alg_copy(s, alg_range_make(ALG_BUF_RECV, 0, bytes), alg_range_make(ALG_BUF_SEND, 0, bytes),
             0, -1, -1);
    return alg_sched_finish(s);
}

static void
expect_refused(alg_builder_t build, enum alg_coll coll, int root, const char *reason)
{
    struct ref_case c = {.coll = coll, .nranks = 3, .count = 2, .root = root};
    struct ref_data *d = malloc(sizeof(*d));
    struct sim_report report;

    cr_assert(d && ref_setup(&c, d));
    struct sim_op op = {.build = build,
                        .args = {.coll = coll, .count = 2, .elem_size = 4, .nranks = 3,
                                 .root = root, .chunk_bytes = 64, .slots = 1},
                        .redops = d->redops, .send = d->send, .recv = d->recv, .seed = 7,
                        .send_bytes = d->send_bytes, .recv_bytes = d->recv_bytes};
    cr_assert_not(sim_run(&op, &report), "a broken schedule ran: expected %s", reason);
    cr_assert(strstr(report.error, reason) && strstr(report.error, "seed 7"),
              "expected \"%s\" and the seed, got: %s", reason, report.error);
    ref_free(d);
    free(d);
}

Test(simulator, refuses_broken_schedules)
{
    expect_refused(broken_deadlock, ALG_COLL_ALLREDUCE, 0, "deadlock");
    expect_refused(broken_race, ALG_COLL_ALLREDUCE, 0, "races with");
    expect_refused(broken_lengths, ALG_COLL_ALLREDUCE, 0, "which expects");
    expect_refused(broken_bounds, ALG_COLL_ALLREDUCE, 0, "lies outside");
    /* Broadcast: ranks but the root have no SEND buffer. */
    expect_refused(broken_null, ALG_COLL_BROADCAST, 1, "does not have (NULL)");
}

/* The reference refuses untouched output, a changed input and a written guard. */
Test(reference, catches_poison_inputs_and_guards)
{
    struct ref_case c = {.coll = ALG_COLL_ALLGATHER, .nranks = 4, .count = 5, .in_place = true};
    struct ref_data *d = malloc(sizeof(*d));
    char err[512];

    cr_assert(d && ref_setup(&c, d));
    cr_assert_not(ref_check(d, err, sizeof(err)));
    cr_assert(strstr(err, "never written"), "%s", err);
    for (int r = 0; r < c.nranks; r++) {
        struct ref_alloc *a = &d->ranks[r].alloc[0];
        memcpy(a->base, a->expect, a->bytes);
    }
    cr_assert(ref_check(d, err, sizeof(err)), "%s", err);
    d->ranks[2].alloc[0].base[d->ranks[2].alloc[0].bytes] ^= 1;
    cr_assert_not(ref_check(d, err, sizeof(err)));
    cr_assert(strstr(err, "guard byte 1 after"), "%s", err);
    ref_free(d);

    c = (struct ref_case){.coll = ALG_COLL_REDUCESCATTER, .nranks = 3, .count = 4};
    cr_assert(ref_setup(&c, d));
    for (int r = 0; r < c.nranks; r++) {
        struct ref_alloc *a = &d->ranks[r].alloc[1];
        memcpy(a->base, a->expect, a->bytes);
    }
    cr_assert(ref_check(d, err, sizeof(err)), "%s", err);
    ((int32_t *)d->send[1])[3] += 1;
    cr_assert_not(ref_check(d, err, sizeof(err)));
    cr_assert(strstr(err, "rank 1 SEND buffer element 3 (input, must be unchanged)"), "%s", err);
    ref_free(d);
    free(d);
}
