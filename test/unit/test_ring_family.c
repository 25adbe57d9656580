/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The ring family beyond all-reduce: ring all-gather, ring reduce-scatter, chain broadcast
 * and chain reduce, run in the in-memory simulator (test/sim) for every rank count 1..17,
 * counts around n and beyond, every root, in and out of place, several seeds. Results are
 * checked against a reference computed here; bytes sent against each row's textbook figure.
 * Int32 data keeps results exact, so a pre-multiply or post-divide applied twice (or never)
 * shows. Buffers a rank does not use are NULL, so touching one crashes the test.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/alg.h"
#include "sim/reference.h"
#include "sim/sim.h"

#define MAXR 17

static const enum kr_op_kind kinds[] = {KR_SUM, KR_PREMULSUM, KR_SUMPOSTDIV};

/* One case: collective, shape, op, pipeline parameters, seed. */
struct rf_case {
    enum alg_coll coll;
    alg_builder_t build;
    size_t (*bytes)(const struct alg_args *args);
    int n;
    size_t count;
    int root;
    bool in_place;
    enum kr_op_kind kind;
    size_t chunk_bytes;
    int slots;
    unsigned seed;
};

static int32_t
rf_input(int rank, size_t i)
{
    return (int32_t)((i * 7 + (size_t)rank * 13) % 101) - 50;
}

static int32_t
rf_scalar(int rank)
{
    return rank + 2;
}

/* The contribution of `rank`'s input element i to a reduction under kind. */
static int32_t
rf_contrib(enum kr_op_kind kind, int rank, size_t i)
{
    return kind == KR_PREMULSUM ? rf_scalar(rank) * rf_input(rank, i) : rf_input(rank, i);
}

static void
rf_run(const struct rf_case *k)
{
    const int n = k->n;
    const size_t count = k->count, nc = (size_t)n * count;
    const bool reduces = k->coll == ALG_COLL_REDUCE || k->coll == ALG_COLL_REDUCESCATTER;
    const enum kr_op_kind kind = reduces ? k->kind : KR_SUM;
    void *send[64] = {0}, *recv[64] = {0}, *alloc[64] = {0};
    struct kr_redop redops[64];
    size_t send_bytes[64] = {0}, recv_bytes[64] = {0};
    size_t send_elems = 0, recv_elems = 0;

    switch (k->coll) {
    case ALG_COLL_ALLGATHER:
        send_elems = count, recv_elems = nc;
        break;
    case ALG_COLL_REDUCESCATTER:
        send_elems = nc, recv_elems = count;
        break;
    default: /* broadcast, reduce */
        send_elems = count, recv_elems = count;
        break;
    }

    for (int r = 0; r < n; r++) {
        int32_t scalar = rf_scalar(r);
        redops[r] = (struct kr_redop){.kind = kind, .type = ncclInt32, .divisor = (uint64_t)n};
        memcpy(redops[r].scalar, &scalar, sizeof(scalar));

        bool has_send = k->coll != ALG_COLL_BROADCAST || r == k->root;
        bool has_recv = k->coll != ALG_COLL_REDUCE || r == k->root;
        /* One allocation holding recv (the larger side in place) with a guard element. */
        size_t elems = (send_elems > recv_elems ? send_elems : recv_elems) + 1;
        if (k->in_place && has_send && has_recv) {
            int32_t *buf = calloc(elems, sizeof(int32_t));
            alloc[r] = buf;
            if (k->coll == ALG_COLL_ALLGATHER) {
                recv[r] = buf, send[r] = buf + (size_t)r * count;
            } else if (k->coll == ALG_COLL_REDUCESCATTER) {
                send[r] = buf, recv[r] = buf + (size_t)r * count;
            } else {
                send[r] = recv[r] = buf;
            }
        } else {
            send[r] = has_send ? calloc(send_elems + 1, sizeof(int32_t)) : NULL;
            recv[r] = has_recv ? calloc(recv_elems + 1, sizeof(int32_t)) : NULL;
        }
        send_bytes[r] = has_send ? send_elems * sizeof(int32_t) : 0;
        recv_bytes[r] = has_recv ? recv_elems * sizeof(int32_t) : 0;
        for (size_t i = 0; has_send && i < send_elems; i++) {
            ((int32_t *)send[r])[i] = rf_input(r, i);
        }
    }

    struct sim_op op = {
        .build = k->build,
        .args = {.coll = k->coll, .count = count, .elem_size = 4, .nranks = n, .root = k->root,
                 .in_place = k->in_place, .chunk_bytes = k->chunk_bytes, .slots = k->slots,
                 .prescale = kind == KR_PREMULSUM},
        .redops = redops, .send = send, .recv = recv, .seed = k->seed,
        .send_bytes = send_bytes, .recv_bytes = recv_bytes};
    struct sim_report report;
    bool ok = sim_run(&op, &report);
    cr_assert(ok, "coll=%d n=%d count=%zu root=%d in_place=%d kind=%d chunk=%zu slots=%d: %s",
              k->coll, n, count, k->root, k->in_place, kind, k->chunk_bytes, k->slots,
              report.error);

    for (int r = 0; r < n; r++) {
        const int32_t *out = recv[r];
        for (size_t i = 0; out != NULL && i < recv_elems; i++) {
            int32_t expect = 0;
            switch (k->coll) {
            case ALG_COLL_ALLGATHER:
                expect = rf_input((int)(i / count), i % count);
                break;
            case ALG_COLL_BROADCAST:
                expect = rf_input(k->root, i);
                break;
            default: /* reduce, reducescatter: the sum over ranks of element i of block r */
                for (int q = 0; q < n; q++) {
                    size_t at = k->coll == ALG_COLL_REDUCESCATTER ? (size_t)r * count + i : i;
                    expect += rf_contrib(kind, q, at);
                }
                if (kind == KR_SUMPOSTDIV) {
                    expect /= n;
                }
                break;
            }
            cr_assert_eq(out[i], expect,
                         "coll=%d n=%d count=%zu root=%d in_place=%d kind=%d rank %d elem %zu:"
                         " %d != %d", k->coll, n, count, k->root, k->in_place, kind, r, i,
                         out[i], expect);
        }
        struct alg_args args = op.args;
        args.rank = r;
        cr_assert_eq(report.bytes_sent[r], k->bytes(&args),
                     "coll=%d n=%d count=%zu root=%d rank %d sent %zu, textbook %zu", k->coll,
                     n, count, k->root, r, report.bytes_sent[r], k->bytes(&args));
    }
    for (int r = 0; r < n; r++) {
        if (alloc[r] != NULL) {
            free(alloc[r]);
        } else {
            free(send[r]);
            free(recv[r]);
        }
    }
}

/* Every n 1..17, counts {0, 1, n-1, n, n+1, odd, ~1000}, every root for rooted collectives,
 * in and out of place, every op kind for reductions, two pipeline shapes. */
static void
rf_sweep(enum alg_coll coll, alg_builder_t build, size_t (*bytes)(const struct alg_args *))
{
    const bool rooted = coll == ALG_COLL_BROADCAST || coll == ALG_COLL_REDUCE;
    const bool reduces = coll == ALG_COLL_REDUCE || coll == ALG_COLL_REDUCESCATTER;
    unsigned seed = 1;

    for (int n = 1; n <= MAXR; n++) {
        const size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n, (size_t)n + 1, 37, 1003};
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            /* Big counts on many ranks: a few roots keep the run short. */
            const int root_step = counts[c] > 100 && n > 5 ? n / 3 + 1 : 1;
            for (int root = 0; root < (rooted ? n : 1); root += root_step) {
                for (int ip = 0; ip < 2; ip++) {
                    for (size_t k = 0; k < (reduces ? 3u : 1u); k++) {
                        struct rf_case one = {coll, build, bytes, n, counts[c], root, ip,
                                              kinds[k], counts[c] > 100 ? 1024 : 8,
                                              (int)(seed % 3) + 1, seed};
                        rf_run(&one);
                        seed++;
                    }
                }
            }
        }
    }
}

/* Many interleavings of small shapes, with tiny chunks (0: one element) and one slot. */
static void
rf_seeds(enum alg_coll coll, alg_builder_t build, size_t (*bytes)(const struct alg_args *))
{
    for (unsigned seed = 1; seed <= 60; seed++) {
        int n = 2 + (int)(seed % 6);
        struct rf_case one = {coll, build, bytes, n, 23 + seed % 5, (int)(seed * 7) % n,
                              seed & 1, kinds[seed % 3], 4 * (seed / 3 % 3), 1, seed};
        rf_run(&one);
    }
}

Test(ring_allgather, every_shape)
{
    rf_sweep(ALG_COLL_ALLGATHER, alg_ring_allgather, alg_ring_allgather_bytes);
}

Test(ring_allgather, many_interleavings)
{
    rf_seeds(ALG_COLL_ALLGATHER, alg_ring_allgather, alg_ring_allgather_bytes);
}

Test(ring_reducescatter, every_shape)
{
    rf_sweep(ALG_COLL_REDUCESCATTER, alg_ring_reducescatter, alg_ring_reducescatter_bytes);
}

Test(ring_reducescatter, many_interleavings)
{
    rf_seeds(ALG_COLL_REDUCESCATTER, alg_ring_reducescatter, alg_ring_reducescatter_bytes);
}

Test(chain_broadcast, every_shape)
{
    rf_sweep(ALG_COLL_BROADCAST, alg_chain_broadcast, alg_chain_broadcast_bytes);
}

Test(chain_broadcast, many_interleavings)
{
    rf_seeds(ALG_COLL_BROADCAST, alg_chain_broadcast, alg_chain_broadcast_bytes);
}

Test(chain_reduce, every_shape)
{
    rf_sweep(ALG_COLL_REDUCE, alg_chain_reduce, alg_chain_reduce_bytes);
}

Test(chain_reduce, many_interleavings)
{
    rf_seeds(ALG_COLL_REDUCE, alg_chain_reduce, alg_chain_reduce_bytes);
}

/* Again through the shared reference (test/sim/reference.h), which also checks that inputs
 * are left untouched, guards intact and every output element written, over every op kind. */
static void
rf_reference(enum alg_coll coll, alg_builder_t build, size_t (*bytes)(const struct alg_args *))
{
    const enum kr_op_kind all[] = {KR_SUM, KR_PROD, KR_MAX, KR_MIN, KR_PREMULSUM,
                                   KR_SUMPOSTDIV};
    unsigned seed = 77;

    for (int n = 1; n <= MAXR; n++) {
        const size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n + 1, 29, 998};
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            for (int root = 0; root < (ref_coll_rooted(coll) ? n : 1); root += 1 + n / 4) {
                for (size_t k = 0; k < (ref_coll_reduces(coll) ? 6u : 1u); k++) {
                    struct ref_case rc = {coll, n, counts[c], root, (seed & 1) != 0, all[k]};
                    struct ref_data d;
                    char err[512];
                    cr_assert(ref_setup(&rc, &d));
                    struct sim_op op = {
                        .build = build,
                        .args = {.coll = coll, .count = counts[c], .elem_size = 4,
                                 .nranks = n, .root = root, .in_place = rc.in_place,
                                 .chunk_bytes = 64, .slots = (int)(seed % 4),
                                 .prescale = ref_coll_reduces(coll) && all[k] == KR_PREMULSUM},
                        .redops = d.redops, .send = d.send, .recv = d.recv, .seed = seed++,
                        .send_bytes = d.send_bytes, .recv_bytes = d.recv_bytes};
                    struct sim_report report;
                    cr_assert(sim_run(&op, &report), "%s n=%d count=%zu root=%d %s: %s",
                              ref_coll_name(coll), n, counts[c], root, ref_kind_name(all[k]),
                              report.error);
                    cr_assert(ref_check(&d, err, sizeof(err)),
                              "%s n=%d count=%zu root=%d %s: %s", ref_coll_name(coll), n,
                              counts[c], root, ref_kind_name(all[k]), err);
                    for (int r = 0; r < n; r++) {
                        struct alg_args args = op.args;
                        args.rank = r;
                        cr_assert_eq(report.bytes_sent[r], bytes(&args));
                    }
                    ref_free(&d);
                }
            }
        }
    }
}

Test(ring_family, against_shared_reference)
{
    rf_reference(ALG_COLL_ALLGATHER, alg_ring_allgather, alg_ring_allgather_bytes);
    rf_reference(ALG_COLL_REDUCESCATTER, alg_ring_reducescatter, alg_ring_reducescatter_bytes);
    rf_reference(ALG_COLL_BROADCAST, alg_chain_broadcast, alg_chain_broadcast_bytes);
    rf_reference(ALG_COLL_REDUCE, alg_chain_reduce, alg_chain_reduce_bytes);
}

/* Scratch stays bounded by slots chunks however large the count. */
Test(ring_family, scratch_is_bounded)
{
    struct alg_args args = {.count = 1u << 20, .elem_size = 4, .nranks = 5, .rank = 2,
                            .root = 3, .chunk_bytes = 4096, .slots = 4, .prescale = true};
    const alg_builder_t builders[] = {alg_ring_reducescatter, alg_chain_reduce};
    const enum alg_coll colls[] = {ALG_COLL_REDUCESCATTER, ALG_COLL_REDUCE};

    for (int b = 0; b < 2; b++) {
        struct alg_sched sched;
        args.coll = colls[b];
        alg_sched_init(&sched);
        cr_assert_eq(builders[b](&args, &sched), ncclSuccess);
        cr_assert_leq(sched.scratch_bytes, 4u * 4096, "builder %d: %zu", b,
                      sched.scratch_bytes);
        alg_sched_free(&sched);
    }
}
