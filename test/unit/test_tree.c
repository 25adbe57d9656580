/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The binary-tree family (algorithms/tree.c, tree_scatter.c, dbtree.c): the tree math checked
 * exhaustively for n <= 64 and every root, then every builder run in the simulator for n =
 * 1..17, counts around n, odd and ~1000, every root, in and out of place, several seeds,
 * against a reference computed here; bytes sent against the row's textbook figure. Buffers a
 * rank does not use are NULL, so touching one crashes; a guard element after each buffer and
 * an untouched out-of-place input catch stray writes. Int32 data keeps results exact.
 */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "algorithms/alg.h"
#include "algorithms/tree.h"
#include "sim/sim.h"

#define GUARD ((int32_t)0x5a5a5a5a)

/* --- tree math ----------------------------------------------------------------------------- */

/* Checks one tree given by links(): a spanning tree rooted at `root`, consistent links, at
 * most two children, depth at most `max_depth`; returns its depth. */
typedef void (*links_fn)(int rank, int n, int arg, int *parent, int child[2], int *nchild);

static void
links_rooted(int rank, int n, int root, int *parent, int child[2], int *nchild)
{
    alg_tree_links(rank, n, root, parent, child, nchild);
}

static void
links_db0(int rank, int n, int arg, int *parent, int child[2], int *nchild)
{
    (void)arg;
    alg_dbtree_links(0, rank, n, parent, child, nchild);
}

static void
links_db1(int rank, int n, int arg, int *parent, int child[2], int *nchild)
{
    (void)arg;
    alg_dbtree_links(1, rank, n, parent, child, nchild);
}

static int
check_tree(links_fn links, int n, int arg, bool *interior_out)
{
    int parent[64], child[64][2], nchild[64], root = -1, maxdepth = 0;

    for (int r = 0; r < n; r++) {
        links(r, n, arg, &parent[r], child[r], &nchild[r]);
        cr_assert(nchild[r] >= 0 && nchild[r] <= 2, "n=%d rank %d: %d children", n, r,
                  nchild[r]);
        interior_out[r] = nchild[r] > 0;
        if (parent[r] < 0) {
            cr_assert_eq(root, -1, "n=%d: two roots %d and %d", n, root, r);
            root = r;
        } else {
            cr_assert(parent[r] < n && parent[r] != r, "n=%d rank %d: parent %d", n, r,
                      parent[r]);
        }
    }
    cr_assert(root >= 0, "n=%d: no root", n);
    for (int r = 0; r < n; r++) {
        /* Each child names us as parent; each non-root appears as exactly one child. */
        for (int k = 0; k < nchild[r]; k++) {
            cr_assert_eq(parent[child[r][k]], r, "n=%d: %d's child %d has parent %d", n, r,
                         child[r][k], parent[child[r][k]]);
        }
        int seen = 0;
        for (int p = 0; p < n; p++) {
            for (int k = 0; k < nchild[p]; k++) {
                seen += child[p][k] == r;
            }
        }
        cr_assert_eq(seen, r == root ? 0 : 1, "n=%d rank %d is a child %d times", n, r, seen);
        /* Walking up reaches the root within n steps: no cycles. */
        int d = 0;
        for (int x = r; x != root; x = parent[x]) {
            cr_assert(++d < n, "n=%d: rank %d never reaches the root", n, r);
        }
        maxdepth = d > maxdepth ? d : maxdepth;
    }
    return maxdepth;
}

Test(tree_math, links_ranges_and_depth_for_every_n_and_root)
{
    bool interior[64];

    for (int n = 1; n <= 64; n++) {
        for (int root = 0; root < n; root++) {
            int depth = check_tree(links_rooted, n, root, interior);
            cr_assert_eq(depth, alg_tree_depth(n), "n=%d root %d: depth %d", n, root, depth);
            int parent, child[2], nchild;
            alg_tree_links(root, n, root, &parent, child, &nchild);
            cr_assert_eq(parent, -1, "n=%d: root %d has parent %d", n, root, parent);
        }
        /* Subtree ranges: contiguous position ranges containing v, equal to the union of
         * v and its children's ranges. */
        for (int v = 0; v < n; v++) {
            int first, size, parent, child[2], nchild, total = 1;
            alg_tree_vrange(v, n, &first, &size);
            alg_tree_vlinks(v, n, &parent, child, &nchild);
            cr_assert(first >= 0 && size >= 1 && first + size <= n && first <= v &&
                          v < first + size,
                      "n=%d v=%d: range [%d, +%d)", n, v, first, size);
            int lo = v, hi = v + 1;
            for (int k = 0; k < nchild; k++) {
                int cf, cs;
                alg_tree_vrange(child[k], n, &cf, &cs);
                cr_assert(cf >= first && cf + cs <= first + size, "n=%d v=%d child %d", n, v,
                          child[k]);
                lo = cf < lo ? cf : lo;
                hi = cf + cs > hi ? cf + cs : hi;
                total += cs;
            }
            cr_assert(total == size && lo == first && hi == first + size,
                      "n=%d v=%d: children do not tile [%d, +%d)", n, v, first, size);
            if (nchild == 2) {
                int f0, s0, f1, s1;
                alg_tree_vrange(child[0], n, &f0, &s0);
                alg_tree_vrange(child[1], n, &f1, &s1);
                cr_assert(f0 + s0 <= f1, "n=%d v=%d: children overlap", n, v);
            }
        }
    }
}

Test(tree_math, double_tree_is_complementary)
{
    bool in0[64], in1[64];

    for (int n = 1; n <= 64; n++) {
        int d0 = check_tree(links_db0, n, 0, in0), d1 = check_tree(links_db1, n, 0, in1);
        cr_assert(d0 <= alg_tree_depth(n) && d1 <= alg_tree_depth(n), "n=%d", n);
        for (int r = 1; r < n; r++) {
            cr_assert(!(in0[r] && in1[r]), "n=%d: rank %d interior in both trees", n, r);
        }
        if (n % 2 == 0) {
            cr_assert(!(in0[0] && in1[0]), "n=%d: rank 0 interior in both trees", n);
        }
    }
}

/* --- the builders in the simulator --------------------------------------------------------- */

static int32_t
datum(int rank, size_t i)
{
    return (int32_t)((i * 7 + (size_t)rank * 13) % 101) - 50;
}

static int32_t *
alloc_guarded(size_t elems)
{
    int32_t *p = malloc((elems + 1) * sizeof(int32_t));
    for (size_t i = 0; i <= elems; i++) {
        p[i] = GUARD;
    }
    return p;
}

struct tree_case {
    enum alg_coll coll;
    alg_builder_t build;
    size_t (*bytes)(const struct alg_args *args);
};

/* Runs one collective on n ranks and checks results, guards, inputs and bytes sent. */
static void
check_coll(const struct tree_case *tc, int n, size_t count, int root, bool in_place,
           enum kr_op_kind kind, size_t chunk_bytes, int slots, unsigned seed)
{
    void *send[64], *recv[64];
    int32_t *alloc_send[64], *alloc_recv[64], *orig_send[64];
    size_t send_elems[64], recv_elems[64];
    struct kr_redop redops[64];
    const bool rooted = tc->coll != ALG_COLL_ALLREDUCE;
    const size_t nc = (size_t)n * count;
    int32_t *sum = calloc(count + 1, sizeof(int32_t));

    for (int r = 0; r < n; r++) {
        int32_t scalar = r + 2;
        redops[r] = (struct kr_redop){.kind = kind, .type = ncclInt32, .divisor = (uint64_t)n};
        memcpy(redops[r].scalar, &scalar, sizeof(scalar));
        for (size_t i = 0; i < count; i++) {
            sum[i] += kind == KR_PREMULSUM ? scalar * datum(r, i) : datum(r, i);
        }
        const bool is_root = r == root;
        switch (tc->coll) {
        case ALG_COLL_BROADCAST:
            send_elems[r] = is_root ? count : 0;
            recv_elems[r] = count;
            break;
        case ALG_COLL_REDUCE:
            send_elems[r] = count;
            recv_elems[r] = is_root ? count : 0;
            break;
        case ALG_COLL_SCATTER:
            send_elems[r] = is_root ? nc : 0;
            recv_elems[r] = count;
            break;
        case ALG_COLL_GATHER:
            send_elems[r] = count;
            recv_elems[r] = is_root ? nc : 0;
            break;
        default:
            send_elems[r] = recv_elems[r] = count;
        }
        alloc_send[r] = alloc_recv[r] = orig_send[r] = NULL;
        send[r] = recv[r] = NULL;
        if (send_elems[r] > 0 || (count == 0 && (!rooted || is_root))) {
            alloc_send[r] = alloc_guarded(send_elems[r]);
            for (size_t i = 0; i < send_elems[r]; i++) {
                /* A scatter root's block j is what rank j should get. */
                alloc_send[r][i] = tc->coll == ALG_COLL_SCATTER ? datum((int)(i / count) + 64,
                                                                         i % count)
                                                                 : datum(r, i);
            }
            orig_send[r] = malloc((send_elems[r] + 1) * sizeof(int32_t));
            memcpy(orig_send[r], alloc_send[r], send_elems[r] * sizeof(int32_t));
            send[r] = alloc_send[r];
        }
        if (recv_elems[r] > 0 || (count == 0 && (!rooted || is_root))) {
            alloc_recv[r] = alloc_guarded(recv_elems[r]);
            recv[r] = alloc_recv[r];
        }
    }
    for (size_t i = 0; kind == KR_SUMPOSTDIV && i < count; i++) {
        sum[i] /= n;
    }
    /* In place, per alg.h. */
    if (in_place) {
        switch (tc->coll) {
        case ALG_COLL_BROADCAST:
        case ALG_COLL_REDUCE:
            recv[root] = send[root];
            break;
        case ALG_COLL_SCATTER:
            recv[root] = (int32_t *)send[root] + (size_t)root * count;
            break;
        case ALG_COLL_GATHER:
            memcpy(alloc_recv[root] + (size_t)root * count, alloc_send[root],
                   count * sizeof(int32_t));
            send[root] = alloc_recv[root] + (size_t)root * count;
            break;
        default:
            for (int r = 0; r < n; r++) {
                recv[r] = send[r];
            }
        }
    }

    struct sim_op op = {
        .build = tc->build,
        .args = {.coll = tc->coll, .count = count, .elem_size = 4, .nranks = n, .root = root,
                 .in_place = in_place, .chunk_bytes = chunk_bytes, .slots = slots,
                 .prescale = kind == KR_PREMULSUM},
        .redops = redops, .send = send, .recv = recv, .seed = seed};
    struct sim_report report;
    bool ok = sim_run(&op, &report);
    cr_assert(ok, "coll %d n=%d count=%zu root=%d in_place=%d kind=%d chunk=%zu: %s",
              tc->coll, n, count, root, in_place, kind, chunk_bytes, report.error);

    for (int r = 0; r < n; r++) {
        const int32_t *out = recv[r];
        const bool is_root = r == root;
        for (size_t i = 0; i < count; i++) {
            int32_t want = 0, got = 0;
            bool check = true;
            switch (tc->coll) {
            case ALG_COLL_BROADCAST:
                want = datum(root, i), got = out[i];
                break;
            case ALG_COLL_REDUCE:
                check = is_root, want = sum[i], got = is_root ? out[i] : 0;
                break;
            case ALG_COLL_SCATTER:
                want = datum(r + 64, i), got = out[i];
                break;
            case ALG_COLL_GATHER:
                /* The root holds every rank's block; check them all from the root. */
                check = is_root;
                for (int j = 0; is_root && j < n; j++) {
                    cr_assert_eq(out[(size_t)j * count + i], datum(j, i),
                                 "gather n=%d count=%zu root=%d block %d elem %zu", n, count,
                                 root, j, i);
                }
                break;
            default:
                want = sum[i], got = out[i];
            }
            cr_assert(!check || want == got,
                      "coll %d n=%d count=%zu root=%d in_place=%d kind=%d rank %d elem %zu: "
                      "%d != %d (seed %u)",
                      tc->coll, n, count, root, in_place, kind, r, i, got, want, seed);
        }
        if (alloc_recv[r] != NULL) {
            cr_assert_eq(alloc_recv[r][recv_elems[r]], GUARD, "coll %d n=%d rank %d: guard",
                         tc->coll, n, r);
        }
        if (alloc_send[r] != NULL) {
            cr_assert_eq(alloc_send[r][send_elems[r]], GUARD, "coll %d n=%d rank %d: guard",
                         tc->coll, n, r);
        }
        if (!in_place && alloc_send[r] != NULL) {
            cr_assert(memcmp(alloc_send[r], orig_send[r], send_elems[r] * 4) == 0,
                      "coll %d n=%d count=%zu rank %d: input changed", tc->coll, n, count, r);
        }
        struct alg_args args = op.args;
        args.rank = r;
        cr_assert_eq(report.bytes_sent[r], tc->bytes(&args),
                     "coll %d n=%d count=%zu root=%d rank %d: sent %zu, textbook %zu",
                     tc->coll, n, count, root, r, report.bytes_sent[r], tc->bytes(&args));
    }
    for (int r = 0; r < n; r++) {
        free(alloc_send[r]);
        free(alloc_recv[r]);
        free(orig_send[r]);
    }
    free(sum);
}

static const struct tree_case cases[] = {
    {ALG_COLL_BROADCAST, alg_tree_broadcast, alg_tree_broadcast_bytes},
    {ALG_COLL_REDUCE, alg_tree_reduce, alg_tree_reduce_bytes},
    {ALG_COLL_SCATTER, alg_tree_scatter, alg_tree_scatter_bytes},
    {ALG_COLL_GATHER, alg_tree_gather, alg_tree_gather_bytes},
    {ALG_COLL_ALLREDUCE, alg_dbtree_allreduce, alg_dbtree_allreduce_bytes},
};

static const enum kr_op_kind kinds[] = {KR_SUM, KR_PREMULSUM, KR_SUMPOSTDIV};

/* Every rank count 1..17, counts around n, every root, both placements, all three ops. */
static void
sweep(const struct tree_case *tc)
{
    for (int n = 1; n <= 17; n++) {
        const size_t counts[] = {0, 1, (size_t)n - 1, (size_t)n, (size_t)n + 1, 2 * (size_t)n + 3,
                                 37, 1001};
        const int roots = tc->coll == ALG_COLL_ALLREDUCE ? 1 : n;
        for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
            for (int root = 0; root < roots; root++) {
                for (int in_place = 0; in_place < 2; in_place++) {
                    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
                        /* Small chunks for pipelining; big counts get a coarser chunk so
                         * the sweep stays quick. */
                        size_t chunk = counts[c] > 100 ? 256 : 12;
                        unsigned seed = (unsigned)(n * 100003 + c * 1009 + root * 31 +
                                                   in_place * 7 + k + 1);
                        check_coll(tc, n, counts[c], root, in_place, kinds[k], chunk,
                                   1 + (int)(seed % 3), seed);
                    }
                }
            }
        }
    }
}

Test(tree_broadcast, every_n_count_root_placement_op, .timeout = 600)
{
    sweep(&cases[0]);
}

Test(tree_reduce, every_n_count_root_placement_op, .timeout = 600)
{
    sweep(&cases[1]);
}

Test(tree_scatter, every_n_count_root_placement, .timeout = 600)
{
    sweep(&cases[2]);
}

Test(tree_gather, every_n_count_root_placement, .timeout = 600)
{
    sweep(&cases[3]);
}

Test(dbtree_allreduce, every_n_count_placement_op, .timeout = 600)
{
    sweep(&cases[4]);
}

/* One slot, one-element chunks (and a chunk smaller than an element): the tightest pipeline
 * still progresses under rendezvous sends. */
Test(tree_family, one_slot_tiny_chunks)
{
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        for (int n = 2; n <= 9; n++) {
            for (int root = 0; root < n; root += 3) {
                check_coll(&cases[t], n, 23, root, false, KR_SUMPOSTDIV, 4, 1, (unsigned)n);
                check_coll(&cases[t], n, 23, root, true, KR_PREMULSUM, 1, 1, (unsigned)n + 5);
            }
        }
    }
}

Test(tree_family, many_interleavings)
{
    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        for (unsigned seed = 1; seed <= 60; seed++) {
            int n = 3 + (int)(seed % 11);
            check_coll(&cases[t], n, 50 + seed, (int)(seed % (unsigned)n), seed & 1,
                       kinds[seed % 3], 16, 1 + (int)(seed % 2), seed);
        }
    }
}

/* Deeper trees, up to the simulator's 64 ranks: around powers of two, a few roots. */
Test(tree_family, large_rank_counts, .timeout = 600)
{
    const int ns[] = {31, 32, 33, 63, 64};

    for (size_t t = 0; t < sizeof(cases) / sizeof(cases[0]); t++) {
        for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
            const int n = ns[i];
            const int roots[] = {0, 1, n / 2, n - 1};
            const size_t counts[] = {(size_t)n - 1, 2 * (size_t)n + 1};
            for (size_t ri = 0; ri < 4; ri++) {
                for (size_t c = 0; c < 2; c++) {
                    unsigned seed = (unsigned)(t * 1000 + i * 100 + ri * 10 + c + 1);
                    check_coll(&cases[t], n, counts[c], roots[ri], c == 1,
                               kinds[(ri + c) % 3], 32, 2, seed);
                }
            }
        }
    }
}
