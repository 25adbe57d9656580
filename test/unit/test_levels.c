/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cudaipc/levels.c: the ring and tree schedules between a device team's GPUs. For every
 * schedule at 2..16 GPUs, every root, in place and not, at even and uneven counts, this
 *   - builds every GPU's levels and checks they fit;
 *   - checks that every two accesses of one byte, one a write, by different levels (or by
 *     different tasks of one level, which run at once) are ordered by the waits and each
 *     GPU's order of its own levels: a GPU never reads what is not written yet, nor
 *     overwrites what another has still to read;
 *   - runs the levels in a random order the waits allow, over values that count how often
 *     each input was pre-scaled and each result post-divided, and compares the outputs with
 *     the collective's;
 *   - counts the units that cross each GPU's links (read by it from another's buffer, or
 *     read from its buffers by another) and holds them to the textbook algorithm's.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudaipc/levels.h"

#define MAXN 16
#define NODES (MAXN * CIPC_MAX_LEVELS)

/* A unit's value: the sum of inputs, each input r's unit i being (r + 1) * 1000003 + i,
 * pre-scaled by r + 2 where marked; posts counts the post-divides applied. */
struct val {
    int64_t sum;
    int posts;
    int pres; /* pre-scales applied, summed over the inputs in it */
};

struct sim {
    enum cipc_algo algo;
    enum alg_coll coll;
    size_t count; /* units of the call */
    int n, root;
    bool in_place;
    struct cipc_levels lv[MAXN];
    /* Per rank: where its send and receive buffers start in mem, and their sizes. */
    size_t send_at[MAXN], recv_at[MAXN], send_units[MAXN], recv_units[MAXN];
    struct val *mem;
    size_t mem_units;
    uint8_t *reach; /* NODES x NODES: node a happens before node b */
};

static size_t
node(int rank, int level)
{
    return (size_t)rank * CIPC_MAX_LEVELS + (size_t)level;
}

static size_t
addr(const struct sim *s, const struct cipc_lref *r)
{
    size_t base = r->buf == CIPC_LSEND ? s->send_at[r->rank] : s->recv_at[r->rank];
    size_t units = r->buf == CIPC_LSEND ? s->send_units[r->rank] : s->recv_units[r->rank];
    cr_assert(units > 0, "a task touches rank %d's unused %s buffer", r->rank,
              r->buf == CIPC_LSEND ? "send" : "receive");
    cr_assert(r->off <= units, "offset %llu past rank %d's buffer of %zu",
              (unsigned long long)r->off, r->rank, units);
    return base + r->off;
}

static void
sim_layout(struct sim *s)
{
    size_t at = 0;

    for (int r = 0; r < s->n; r++) {
        bool root = r == s->root;
        switch (s->coll) {
        case ALG_COLL_ALLREDUCE:
            s->recv_units[r] = s->send_units[r] = s->count;
            break;
        case ALG_COLL_ALLGATHER:
            s->send_units[r] = s->count;
            s->recv_units[r] = s->count * (size_t)s->n;
            break;
        default: /* broadcast */
            s->send_units[r] = root ? s->count : 0;
            s->recv_units[r] = s->count;
            break;
        }
        s->recv_at[r] = at;
        at += s->recv_units[r];
        if (s->in_place && s->send_units[r] > 0) {
            s->send_at[r] = s->recv_at[r] + (s->coll == ALG_COLL_ALLGATHER ? (size_t)r * s->count : 0);
        } else {
            s->send_at[r] = at;
            at += s->send_units[r];
        }
    }
    s->mem_units = at;
    s->mem = calloc(at + 1, sizeof(*s->mem));
    cr_assert_not_null(s->mem);
    for (int r = 0; r < s->n; r++) {
        for (size_t i = 0; i < s->send_units[r]; i++) {
            s->mem[s->send_at[r] + i] = (struct val){(int64_t)(r + 1) * 1000003 + (int64_t)i, 0, 0};
        }
    }
}

/* reach = the transitive closure of: level l - 1 before level l of a GPU, and each dep. */
static void
sim_order(struct sim *s)
{
    s->reach = calloc((size_t)NODES * NODES, 1);
    cr_assert_not_null(s->reach);
    for (int pass = 0; pass < 2 * NODES; pass++) {
        bool changed = false;
        for (int g = 0; g < s->n; g++) {
            for (int l = 0; l < s->lv[g].nlevels; l++) {
                size_t b = node(g, l);
                size_t preds[CIPC_LEVEL_DEPS + 1];
                int np = 0;
                if (l > 0) {
                    preds[np++] = node(g, l - 1);
                }
                for (int d = 0; d < s->lv[g].ndeps; d++) {
                    const struct cipc_ldep *dep = &s->lv[g].deps[d];
                    if (dep->level == l) {
                        preds[np++] = node(dep->rank, dep->done);
                    }
                }
                for (int p = 0; p < np; p++) {
                    uint8_t *into = &s->reach[b * NODES], *from = &s->reach[preds[p] * NODES];
                    if (!into[preds[p]]) {
                        into[preds[p]] = 1;
                        changed = true;
                    }
                    for (size_t x = 0; x < NODES; x++) {
                        if (from[x] && !into[x]) {
                            into[x] = 1;
                            changed = true;
                        }
                    }
                }
            }
        }
        if (!changed) {
            return;
        }
    }
}

static bool
before(const struct sim *s, size_t a, size_t b)
{
    return s->reach[b * NODES + a] != 0;
}

static bool
overlap(size_t a, size_t alen, size_t b, size_t blen)
{
    return a < b + blen && b < a + alen;
}

/* A copy onto itself (an in-place own block), which tasks.c drops. */
static bool
noop(const struct sim *s, const struct cipc_ltask *t)
{
    return t->nsrc == 1 && addr(s, &t->src[0]) == addr(s, &t->dst);
}

/* Every conflicting pair of accesses by two tasks is ordered (or is one task in place). */
static void
sim_check_races(const struct sim *s, const char *what)
{
    for (int g = 0; g < s->n; g++) {
        for (int i = 0; i < s->lv[g].ntasks; i++) {
            const struct cipc_ltask *a = &s->lv[g].tasks[i];
            size_t na = node(g, a->level), aw = addr(s, &a->dst);
            for (int h = 0; h < s->n; h++) {
                for (int j = 0; j < s->lv[h].ntasks; j++) {
                    const struct cipc_ltask *b = &s->lv[h].tasks[j];
                    size_t nb = node(h, b->level);
                    if ((g == h && i == j) || noop(s, a) || noop(s, b) || before(s, na, nb) ||
                        before(s, nb, na)) {
                        continue;
                    }
                    /* a writes; b reads or writes the same units, unordered. */
                    size_t bw = addr(s, &b->dst);
                    cr_assert(!overlap(aw, a->count, bw, b->count),
                              "%s: rank %d level %d and rank %d level %d write the same units "
                              "unordered", what, g, a->level, h, b->level);
                    for (int k = 0; k < b->nsrc; k++) {
                        size_t br = addr(s, &b->src[k]);
                        cr_assert(!overlap(aw, a->count, br, b->count),
                                  "%s: rank %d level %d writes what rank %d level %d reads, "
                                  "unordered", what, g, a->level, h, b->level);
                    }
                }
            }
        }
    }
}

static uint64_t rng = 12345;

static uint32_t
next_rand(void)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static void
sim_run_task(struct sim *s, const struct cipc_ltask *t)
{
    struct val *tmp = calloc(t->count + 1, sizeof(*tmp));
    cr_assert_not_null(tmp);
    for (uint64_t i = 0; i < t->count; i++) {
        struct val acc = {0, 0, 0};
        for (int k = 0; k < t->nsrc; k++) {
            struct val v = s->mem[addr(s, &t->src[k]) + i];
            cr_assert(t->nsrc == 1 || v.posts == 0, "a reduction of a post-divided value");
            if (t->src[k].pre) {
                cr_assert_eq(v.pres, 0, "rank %d's input pre-scaled twice", t->src[k].rank);
                v.sum *= t->src[k].rank + 2;
                v.pres = 1;
            }
            acc.sum += v.sum;
            acc.pres += v.pres;
            acc.posts += v.posts;
        }
        acc.posts += t->post;
        tmp[i] = acc;
    }
    for (uint64_t i = 0; i < t->count; i++) {
        s->mem[addr(s, &t->dst) + i] = tmp[i];
    }
    free(tmp);
}

/* Runs every level once its GPU's previous level and its deps ran, in a random order. */
static void
sim_run(struct sim *s)
{
    int next[MAXN] = {0};
    bool ran[NODES] = {false};

    for (;;) {
        int ready[MAXN], nready = 0;
        for (int g = 0; g < s->n; g++) {
            if (next[g] >= s->lv[g].nlevels) {
                continue;
            }
            bool ok = true;
            for (int d = 0; d < s->lv[g].ndeps; d++) {
                const struct cipc_ldep *dep = &s->lv[g].deps[d];
                ok &= dep->level != next[g] || ran[node(dep->rank, dep->done)];
            }
            if (ok) {
                ready[nready++] = g;
            }
        }
        if (nready == 0) {
            break;
        }
        int g = ready[next_rand() % (uint32_t)nready];
        for (int i = 0; i < s->lv[g].ntasks; i++) {
            if (s->lv[g].tasks[i].level == next[g]) {
                sim_run_task(s, &s->lv[g].tasks[i]);
            }
        }
        ran[node(g, next[g]++)] = true;
    }
    for (int g = 0; g < s->n; g++) {
        cr_assert_eq(next[g], s->lv[g].nlevels, "rank %d stopped at level %d of %d: a wait "
                     "for a level that never runs", g, next[g], s->lv[g].nlevels);
    }
}

static struct val
input(int r, size_t i, bool pre)
{
    int64_t x = (int64_t)(r + 1) * 1000003 + (int64_t)i;
    return (struct val){pre ? x * (r + 2) : x, 0, pre};
}

static void
sim_check_results(const struct sim *s, const char *what)
{
    for (int g = 0; g < s->n; g++) {
        for (size_t i = 0; i < s->recv_units[g]; i++) {
            struct val want = {0, 0, 0}, got = s->mem[s->recv_at[g] + i];
            if (s->coll == ALG_COLL_ALLREDUCE) {
                for (int r = 0; r < s->n; r++) {
                    want.sum += input(r, i, true).sum;
                }
                want.pres = s->n;
                want.posts = 1;
            } else if (s->coll == ALG_COLL_ALLGATHER) {
                want = input((int)(i / s->count), i % s->count, false);
            } else {
                want = input(s->root, i, false);
            }
            cr_assert(got.sum == want.sum && got.posts == want.posts && got.pres == want.pres,
                      "%s: rank %d's unit %zu is %lld (%d pre, %d post), not %lld (%d, %d)",
                      what, g, i, (long long)got.sum, got.pres, got.posts, (long long)want.sum,
                      want.pres, want.posts);
        }
    }
}

/* The most units crossing one GPU's links, the larger of in and out. */
static uint64_t
sim_traffic(const struct sim *s)
{
    uint64_t in[MAXN] = {0}, out[MAXN] = {0}, most = 0;

    for (int g = 0; g < s->n; g++) {
        for (int i = 0; i < s->lv[g].ntasks; i++) {
            const struct cipc_ltask *t = &s->lv[g].tasks[i];
            for (int k = 0; k < t->nsrc; k++) {
                if (t->src[k].rank != g) {
                    in[g] += t->count;
                    out[t->src[k].rank] += t->count;
                }
            }
            cr_assert_eq(t->dst.rank, g, "a GPU writes another's buffer (levels pull)");
        }
    }
    for (int g = 0; g < s->n; g++) {
        most = in[g] > most ? in[g] : most;
        most = out[g] > most ? out[g] : most;
    }
    return most;
}

static void
check_schedule(enum cipc_algo algo, enum alg_coll coll, size_t count, size_t elem_size, int n,
               int root, bool in_place)
{
    struct sim *s = calloc(1, sizeof(*s));
    char what[160];

    cr_assert_not_null(s);
    snprintf(what, sizeof(what), "%s of collective %d, %zu units of %zu bytes, %d GPUs, root %d%s",
             cipc_algo_name(algo), (int)coll, count, elem_size, n, root,
             in_place ? ", in place" : "");
    *s = (struct sim){.algo = algo, .coll = coll, .count = count, .n = n, .root = root,
                      .in_place = in_place};
    for (int g = 0; g < n; g++) {
        cr_assert_eq(cipc_levels_build(algo, coll, count, elem_size, n, g, root, &s->lv[g]),
                     ncclSuccess, "%s: rank %d", what, g);
        cr_assert(s->lv[g].nlevels >= 1 && s->lv[g].nlevels <= CIPC_MAX_LEVELS);
        cr_assert_eq(cipc_levels_count(algo, coll, count, elem_size, n, g, root),
                     s->lv[g].nlevels);
        for (int i = 1; i < s->lv[g].ntasks; i++) {
            cr_assert(s->lv[g].tasks[i].level >= s->lv[g].tasks[i - 1].level,
                      "%s: rank %d's tasks do not ascend by level", what, g);
        }
        for (int d = 0; d < s->lv[g].ndeps; d++) {
            const struct cipc_ldep *dep = &s->lv[g].deps[d];
            cr_assert(dep->rank >= 0 && dep->rank < n && dep->rank != g && dep->done < dep->level,
                      "%s: rank %d waits for rank %d's level %d at level %d", what, g,
                      dep->rank, dep->done, dep->level);
        }
    }
    sim_layout(s);
    sim_order(s);
    sim_check_races(s, what);
    sim_run(s);
    sim_check_results(s, what);
    /* The textbook bound, exact where the parts are even (counts of whole granules). */
    uint64_t most = sim_traffic(s), bound;
    if (coll == ALG_COLL_ALLREDUCE) {
        bound = algo == CIPC_ALGO_RING ? 2 * (uint64_t)(n - 1) * count / (uint64_t)n : 3 * count;
    } else if (coll == ALG_COLL_ALLGATHER) {
        bound = (uint64_t)(n - 1) * count;
    } else {
        bound = algo == CIPC_ALGO_RING ? count : 2 * count;
    }
    size_t granule = 256 / elem_size;
    if (count % ((size_t)n * granule * CIPC_LEVEL_CHUNKS) == 0) {
        cr_assert_leq(most, bound, "%s: %llu units through one GPU, more than %llu", what,
                      (unsigned long long)most, (unsigned long long)bound);
    }
    free(s->reach);
    free(s->mem);
    free(s);
}

static const int sizes[] = {2, 3, 4, 5, 7, 8, 9, 16};
#define NSIZES (sizeof(sizes) / sizeof(sizes[0]))

Test(levels, ring_allreduce_every_size_in_and_out_of_place)
{
    const size_t counts[] = {0, 1, 63, 1000, 16 * 64 * 8 * 9, 77777};

    for (size_t i = 0; i < NSIZES; i++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            check_schedule(CIPC_ALGO_RING, ALG_COLL_ALLREDUCE, counts[c], 4, sizes[i], 0, false);
            check_schedule(CIPC_ALGO_RING, ALG_COLL_ALLREDUCE, counts[c], 4, sizes[i], 0, true);
        }
    }
}

Test(levels, tree_allreduce_every_size_in_and_out_of_place)
{
    /* Units of 256 bytes: pipelines of 1 to 8 chunks in little memory. */
    const size_t counts[] = {1, 1000, 3 << 12, (4 << 12) + 17, 8 << 12};

    for (size_t i = 0; i < NSIZES; i++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            check_schedule(CIPC_ALGO_TREE, ALG_COLL_ALLREDUCE, counts[c], 256, sizes[i], 0,
                           false);
            check_schedule(CIPC_ALGO_TREE, ALG_COLL_ALLREDUCE, counts[c], 256, sizes[i], 0,
                           true);
        }
    }
}

Test(levels, ring_allgather_every_size_in_and_out_of_place)
{
    const size_t counts[] = {1, 300, 4096 * 9};

    for (size_t i = 0; i < NSIZES; i++) {
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            check_schedule(CIPC_ALGO_RING, ALG_COLL_ALLGATHER, counts[c], 1, sizes[i], 0, false);
            check_schedule(CIPC_ALGO_RING, ALG_COLL_ALLGATHER, counts[c], 1, sizes[i], 0, true);
        }
    }
}

Test(levels, chain_and_tree_broadcast_every_root)
{
    /* Units of 256 bytes, as above. */
    const size_t counts[] = {5, (5 << 12) + 3, 16 << 12};

    for (size_t i = 0; i < NSIZES; i++) {
        for (int root = 0; root < sizes[i]; root++) {
            for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
                for (int in_place = 0; in_place < 2; in_place++) {
                    check_schedule(CIPC_ALGO_RING, ALG_COLL_BROADCAST, counts[c], 256,
                                   sizes[i], root, in_place);
                    check_schedule(CIPC_ALGO_TREE, ALG_COLL_BROADCAST, counts[c], 256,
                                   sizes[i], root, in_place);
                }
            }
        }
    }
}

Test(levels, only_the_families_it_has)
{
    cr_assert(cipc_levels_serve(CIPC_ALGO_DIRECT, ALG_COLL_REDUCESCATTER));
    cr_assert_not(cipc_levels_serve(CIPC_ALGO_RING, ALG_COLL_REDUCESCATTER));
    cr_assert_not(cipc_levels_serve(CIPC_ALGO_TREE, ALG_COLL_ALLGATHER));
    cr_assert_eq(cipc_levels_count(CIPC_ALGO_RING, ALG_COLL_REDUCE, 100, 4, 8, 0, 0), 1);
    cr_assert_eq(cipc_levels_count(CIPC_ALGO_DIRECT, ALG_COLL_ALLREDUCE, 100, 4, 8, 0, 0), 1);
    cr_assert_eq(cipc_levels_count(CIPC_ALGO_RING, ALG_COLL_ALLREDUCE, 1 << 20, 4, 8, 3, 0), 14);
}

Test(levels, most_levels_is_the_deepest_gpus)
{
    const size_t counts[] = {0, 1, 3 << 12, 16 << 12};
    const enum alg_coll colls[] = {ALG_COLL_ALLREDUCE, ALG_COLL_ALLGATHER, ALG_COLL_BROADCAST};

    for (int a = CIPC_ALGO_RING; a <= CIPC_ALGO_TREE; a++) {
        for (size_t c = 0; c < 3; c++) {
            for (size_t i = 0; i < NSIZES; i++) {
                for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
                    if (!cipc_levels_serve((enum cipc_algo)a, colls[c])) {
                        continue;
                    }
                    int most = 0;
                    for (int g = 0; g < sizes[i]; g++) {
                        int l = cipc_levels_count((enum cipc_algo)a, colls[c], counts[k], 256,
                                                  sizes[i], g, 0);
                        most = l > most ? l : most;
                    }
                    cr_assert_eq(cipc_levels_most((enum cipc_algo)a, colls[c], counts[k], 256,
                                                  sizes[i]),
                                 most, "%s of collective %d at %d GPUs",
                                 cipc_algo_name((enum cipc_algo)a), colls[c], sizes[i]);
                }
            }
        }
    }
}

/* NCCL_ALGO and NCCLSHIM_ALGO choose among the schedules: direct parts when neither filters
 * the collective, the family they name otherwise, the cost model between two. */
Test(levels, the_policy_chooses)
{
    struct alg_policy policy;

    cr_assert_eq(alg_policy_parse(NULL, NULL, &policy), ncclSuccess);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_ALLREDUCE, 1 << 24, 4, 8), CIPC_ALGO_DIRECT);
    cr_assert_eq(alg_policy_parse("Ring", NULL, &policy), ncclSuccess);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_ALLREDUCE, 1 << 24, 4, 8), CIPC_ALGO_RING);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_BROADCAST, 100, 1, 8), CIPC_ALGO_RING);
    /* No ring reduce-scatter between GPUs: direct parts. */
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_REDUCESCATTER, 100, 4, 8),
                 CIPC_ALGO_DIRECT);
    cr_assert_eq(alg_policy_parse("Tree", NULL, &policy), ncclSuccess);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_ALLREDUCE, 100, 4, 8), CIPC_ALGO_TREE);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_BROADCAST, 100, 4, 8), CIPC_ALGO_TREE);
    cr_assert_eq(alg_policy_parse(NULL, "allreduce:ring", &policy), ncclSuccess);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_ALLREDUCE, 100, 4, 8), CIPC_ALGO_RING);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_BROADCAST, 100, 4, 8), CIPC_ALGO_DIRECT);
    /* Every family we have is no filter. */
    cr_assert_eq(alg_policy_parse("Ring,Tree", NULL, &policy), ncclSuccess);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_ALLREDUCE, 64, 4, 16), CIPC_ALGO_DIRECT);
    /* A ring and a tree: the tree's fewer levels for a small message, the ring's bytes for a
     * large one. */
    cr_assert_eq(alg_policy_parse(NULL, "ring,dbtree", &policy), ncclSuccess);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_ALLREDUCE, 64, 4, 16), CIPC_ALGO_TREE);
    cr_assert_eq(cipc_algo_choose(&policy, ALG_COLL_ALLREDUCE, 1 << 26, 4, 16), CIPC_ALGO_RING);
}
