/* SPDX-License-Identifier: Apache-2.0 */
/*
 * One collective run in the simulator and checked against a reference computed here, for
 * the unit tests of the algorithm files (test_direct.c, test_pairwise.c, test_recdbl.c,
 * test_rabenseifner.c, test_bruck.c). Buffers follow alg.h's layouts exactly: a buffer a rank
 * does not use is NULL, in place aliases as NCCL does, the simulator checks every step's
 * range against its buffer's size, and every buffer is fenced by guard elements that must
 * come back untouched. Int32 data keeps results exact, so a PreMulSum
 * scale or integer-average divide applied twice or not at all shows. Each rank's traffic
 * must equal the row's textbook figure.
 */
#ifndef TEST_UNIT_COLL_CHECK_H
#define TEST_UNIT_COLL_CHECK_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/alg.h"
#include "sim/sim.h"

#define CC_GUARD ((int32_t)0x7eadbeef)
#define CC_MAX_RANKS 64

struct cc_case {
    alg_builder_t build;
    size_t (*bytes)(const struct alg_args *args);
    void (*cost)(const struct alg_args *args, struct alg_cost *cost_out);
    enum alg_coll coll;
    int n;
    size_t count;
    int root;
    bool in_place;
    enum kr_op_kind kind;
    size_t chunk_bytes;
    int slots;
    unsigned seed;
    const struct alg_hosts *hosts; /* NULL: one host */
};

/* A buffer of len elements with one guard element either side; returns the first element. */
static int32_t *
cc_alloc(size_t len)
{
    int32_t *raw = malloc((len + 2) * sizeof(int32_t));
    raw[0] = CC_GUARD;
    raw[len + 1] = CC_GUARD;
    for (size_t i = 1; i <= len; i++) {
        raw[i] = -12345;
    }
    return raw + 1;
}

static void
cc_guard_check(const int32_t *buf, size_t len, const char *what, int r)
{
    cr_assert(buf[-1] == CC_GUARD && buf[len] == CC_GUARD, "%s buffer of rank %d: guard hit",
              what, r);
}

static int32_t
cc_input(int r, size_t i, unsigned seed)
{
    return (int32_t)((i * 7 + (size_t)r * 13 + seed % 11) % 101) - 50;
}

static void
cc_check(const struct cc_case *c)
{
    const int n = c->n;
    const size_t count = c->count, nc = (size_t)n * count;
    void *send[CC_MAX_RANKS], *recv[CC_MAX_RANKS];
    int32_t *in[CC_MAX_RANKS], *expect[CC_MAX_RANKS], *alloc_s[CC_MAX_RANKS];
    int32_t *alloc_r[CC_MAX_RANKS];
    size_t slen[CC_MAX_RANKS], rlen[CC_MAX_RANKS];
    struct kr_redop redops[CC_MAX_RANKS];
    const bool reduces = c->coll == ALG_COLL_ALLREDUCE;

    for (int r = 0; r < n; r++) {
        int32_t scalar = r + 2;
        redops[r] = (struct kr_redop){.kind = c->kind, .type = ncclInt32,
                                      .divisor = (uint64_t)n};
        memcpy(redops[r].scalar, &scalar, sizeof(scalar));
        /* Layouts from alg.h: send and receive lengths, 0 for a buffer this rank lacks. */
        slen[r] = count;
        rlen[r] = count;
        switch (c->coll) {
        case ALG_COLL_ALLGATHER:
            rlen[r] = nc;
            break;
        case ALG_COLL_ALLTOALL:
            slen[r] = rlen[r] = nc;
            break;
        case ALG_COLL_GATHER:
            rlen[r] = r == c->root ? nc : 0;
            break;
        case ALG_COLL_SCATTER:
            slen[r] = r == c->root ? nc : 0;
            break;
        default:
            break;
        }
        in[r] = malloc((slen[r] + 1) * sizeof(int32_t));
        for (size_t i = 0; i < slen[r]; i++) {
            in[r][i] = cc_input(r, i, c->seed);
        }
        alloc_s[r] = slen[r] ? cc_alloc(slen[r]) : NULL;
        alloc_r[r] = rlen[r] ? cc_alloc(rlen[r]) : NULL;
        send[r] = alloc_s[r];
        recv[r] = alloc_r[r];
        if (c->in_place) {
            switch (c->coll) {
            case ALG_COLL_ALLREDUCE:
            case ALG_COLL_ALLTOALL:
                send[r] = recv[r];
                break;
            case ALG_COLL_ALLGATHER:
                send[r] = alloc_r[r] + (size_t)r * count;
                break;
            case ALG_COLL_GATHER:
                if (r == c->root) {
                    send[r] = alloc_r[r] + (size_t)r * count;
                }
                break;
            case ALG_COLL_SCATTER:
                if (r == c->root) {
                    recv[r] = alloc_s[r] + (size_t)r * count;
                }
                break;
            default:
                break;
            }
        }
        if (send[r] != NULL) {
            memcpy(send[r], in[r], slen[r] * sizeof(int32_t));
        }
    }

    /* The reference. */
    for (int r = 0; r < n; r++) {
        expect[r] = rlen[r] ? calloc(rlen[r], sizeof(int32_t)) : NULL;
        for (size_t i = 0; i < rlen[r]; i++) {
            const size_t j = i / (count ? count : 1), e = i % (count ? count : 1);
            switch (c->coll) {
            case ALG_COLL_ALLREDUCE: {
                int32_t sum = 0;
                for (int q = 0; q < n; q++) {
                    sum += c->kind == KR_PREMULSUM ? (q + 2) * in[q][i] : in[q][i];
                }
                expect[r][i] = c->kind == KR_SUMPOSTDIV ? sum / n : sum;
                break;
            }
            case ALG_COLL_ALLGATHER:
            case ALG_COLL_GATHER:
                expect[r][i] = in[j][e];
                break;
            case ALG_COLL_ALLTOALL:
                expect[r][i] = in[j][(size_t)r * count + e];
                break;
            case ALG_COLL_SCATTER:
                expect[r][i] = in[c->root][(size_t)r * count + i];
                break;
            default:
                cr_assert_fail("collective %d has no reference here", c->coll);
            }
        }
    }

    size_t send_bytes[CC_MAX_RANKS], recv_bytes[CC_MAX_RANKS];
    for (int r = 0; r < n; r++) {
        send_bytes[r] = slen[r] * sizeof(int32_t);
        recv_bytes[r] = rlen[r] * sizeof(int32_t);
    }
    struct sim_op op = {
        .build = c->build, .send_bytes = send_bytes, .recv_bytes = recv_bytes,
        .args = {.coll = c->coll, .count = count, .elem_size = 4, .nranks = n,
                 .root = c->root, .in_place = c->in_place, .chunk_bytes = c->chunk_bytes,
                 .slots = c->slots, .prescale = reduces && c->kind == KR_PREMULSUM,
                 .hosts = c->hosts},
        .redops = redops, .send = send, .recv = recv, .seed = c->seed};
    struct sim_report report;
    bool ok = sim_run(&op, &report);
    cr_assert(ok, "coll %d n=%d count=%zu root=%d in_place=%d kind=%d chunk=%zu: %s", c->coll,
              n, count, c->root, c->in_place, c->kind, c->chunk_bytes, report.error);

    for (int r = 0; r < n; r++) {
        const int32_t *out = recv[r];
        for (size_t i = 0; i < rlen[r]; i++) {
            cr_assert_eq(out[i], expect[r][i],
                         "coll %d n=%d count=%zu root=%d in_place=%d kind=%d rank %d elem %zu: "
                         "%d != %d (seed %u)",
                         c->coll, n, count, c->root, c->in_place, c->kind, r, i, out[i],
                         expect[r][i], c->seed);
        }
        if (alloc_s[r] != NULL) {
            cc_guard_check(alloc_s[r], slen[r], "send", r);
        }
        if (alloc_r[r] != NULL) {
            cc_guard_check(alloc_r[r], rlen[r], "recv", r);
        }
        /* Out of place, the input stays as it was. */
        if (!c->in_place && alloc_s[r] != NULL) {
            cr_assert(memcmp(alloc_s[r], in[r], slen[r] * sizeof(int32_t)) == 0,
                      "coll %d n=%d count=%zu: rank %d's input changed", c->coll, n, count, r);
        }
        struct alg_args args = op.args;
        args.rank = r;
        cr_assert_eq(report.bytes_sent[r], c->bytes(&args),
                     "coll %d n=%d count=%zu root=%d chunk=%zu: rank %d sent %zu, textbook %zu",
                     c->coll, n, count, c->root, c->chunk_bytes, r, report.bytes_sent[r],
                     c->bytes(&args));
        struct alg_cost cost;
        c->cost(&args, &cost);
        cr_assert(cost.steps >= 0 && cost.bytes >= 0 && cost.reduce_bytes >= 0);
    }
    for (int r = 0; r < n; r++) {
        free(in[r]);
        free(expect[r]);
        free(alloc_s[r] ? alloc_s[r] - 1 : NULL);
        free(alloc_r[r] ? alloc_r[r] - 1 : NULL);
    }
}

/* Counts around n: 0, 1, n-1, n, n+1, an odd one, about a thousand. */
static size_t
cc_count(int n, int which)
{
    static const size_t fixed[] = {0, 1, 0, 0, 0, 37, 1001};
    switch (which) {
    case 2:
        return (size_t)(n - 1);
    case 3:
        return (size_t)n;
    case 4:
        return (size_t)n + 1;
    default:
        return fixed[which];
    }
}

#define CC_NCOUNTS 7

/* Every n in 1..17, count, root (when `rooted`), in and out of place, op kinds when the
 * collective reduces, two chunk sizes. */
static inline int
cc_sweep(alg_builder_t build, size_t (*bytes)(const struct alg_args *),
         void (*cost)(const struct alg_args *, struct alg_cost *), enum alg_coll coll,
         bool rooted, bool reduces)
{
    static const enum kr_op_kind kinds[] = {KR_SUM, KR_PREMULSUM, KR_SUMPOSTDIV};
    int runs = 0;

    for (int n = 1; n <= 17; n++) {
        for (int w = 0; w < CC_NCOUNTS; w++) {
            for (int root = 0; root < (rooted ? n : 1); root++) {
                for (int k = 0; k < (reduces ? 3 : 2); k++) {
                    for (int ip = 0; ip < 2; ip++) {
                        struct cc_case c = {
                            .build = build, .bytes = bytes, .cost = cost, .coll = coll,
                            .n = n, .count = cc_count(n, w), .root = root, .in_place = ip,
                            /* Data movement with a PreMulSum op must not scale anything. */
                            .kind = kinds[k], .chunk_bytes = (w + k) % 2 ? 64 : 12,
                            .slots = 1 + (n + w) % 3,
                            .seed = (unsigned)(n * 7919 + w * 131 + root * 17 + k * 3 + ip)};
                        cc_check(&c);
                        runs++;
                    }
                }
            }
        }
    }
    return runs;
}

/* An all-reduce builder with one or two slots and chunks of 0 (no chunking), 1, 4, 8 and
 * 4096 bytes, for n 1..12 and every op kind, in and out of place. */
static inline void
cc_allreduce_chunk_sweep(alg_builder_t build, size_t (*bytes)(const struct alg_args *),
                         void (*cost)(const struct alg_args *, struct alg_cost *))
{
    static const size_t chunks[] = {0, 1, 4, 8, 4096};
    static const enum kr_op_kind kinds[] = {KR_SUM, KR_PREMULSUM, KR_SUMPOSTDIV};

    for (int n = 1; n <= 12; n++) {
        for (size_t i = 0; i < sizeof(chunks) / sizeof(chunks[0]); i++) {
            for (int k = 0; k < 3; k++) {
                struct cc_case c = {.build = build, .bytes = bytes, .cost = cost,
                                    .coll = ALG_COLL_ALLREDUCE, .n = n, .count = 29,
                                    .in_place = (n + k) & 1, .kind = kinds[k],
                                    .chunk_bytes = chunks[i], .slots = 1 + (int)i % 2,
                                    .seed = (unsigned)(n * 31 + (int)i * 7 + k)};
                cc_check(&c);
            }
        }
    }
}

/* 150 seeded interleavings of small cases of `coll` (count_base + seed % count_spread
 * elements), alternating PreMulSum and integer average. */
static inline void
cc_interleavings(alg_builder_t build, size_t (*bytes)(const struct alg_args *),
                 void (*cost)(const struct alg_args *, struct alg_cost *), enum alg_coll coll,
                 size_t count_base, unsigned count_spread)
{
    for (unsigned seed = 1; seed <= 150; seed++) {
        struct cc_case c = {.build = build, .bytes = bytes, .cost = cost, .coll = coll,
                            .n = 2 + (int)seed % 12, .count = count_base + seed % count_spread,
                            .in_place = seed & 1,
                            .kind = seed % 3 == 0 ? KR_PREMULSUM : KR_SUMPOSTDIV,
                            .chunk_bytes = 32, .slots = 2, .seed = seed};
        cc_check(&c);
    }
}

#endif
