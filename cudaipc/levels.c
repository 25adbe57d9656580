/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ring and tree schedules between a device team's GPUs, as levels (levels.h). Pure: the
 * leader's thread turns a schedule into kernel tasks (tasks.c) and its waits into gates
 * (ownstream.c); test_levels runs every GPU's schedule in memory and checks each conflicting
 * pair of accesses is ordered by the waits.
 */
#include "levels.h"

#include <string.h>

#include "algorithms/tree.h"
#include "base/check.h"
#include "cudaipc.h"
#include "kernels/kernels.h"

struct lv_builder {
    struct cipc_levels *out;
    size_t count, elem_size;
    int n, rank;
    bool overflow;
};

static struct cipc_lref
lv_ref(int rank, enum cipc_lbuf buf, uint64_t off, bool pre)
{
    return (struct cipc_lref){.rank = (int8_t)rank, .buf = (uint8_t)buf, .pre = pre, .off = off};
}

static void
lv_task(struct lv_builder *b, int level, const struct cipc_lref *srcs, int nsrc,
        struct cipc_lref dst, uint64_t count, bool post)
{
    struct cipc_levels *out = b->out;

    if (level >= CIPC_MAX_LEVELS) {
        b->overflow = true;
        return;
    }
    /* The level exists even where its chunk is empty: other GPUs may wait for it. */
    if (level >= out->nlevels) {
        out->nlevels = level + 1;
    }
    if (count == 0) {
        return;
    }
    if (out->ntasks == CIPC_LEVEL_TASKS) {
        b->overflow = true;
        return;
    }
    struct cipc_ltask *t = &out->tasks[out->ntasks++];
    *t = (struct cipc_ltask){.level = (uint8_t)level, .nsrc = (uint8_t)nsrc, .post = post,
                             .dst = dst, .count = count};
    memcpy(t->src, srcs, (size_t)nsrc * sizeof(*srcs));
}

static void
lv_dep(struct lv_builder *b, int level, int rank, int done)
{
    struct cipc_levels *out = b->out;

    if (out->ndeps == CIPC_LEVEL_DEPS || level >= CIPC_MAX_LEVELS || done >= level) {
        b->overflow = true; /* a dep on an equal or later level could deadlock: refused */
        return;
    }
    out->deps[out->ndeps++] =
        (struct cipc_ldep){.level = (uint8_t)level, .rank = (int8_t)rank, .done = (uint8_t)done};
}

/* Units [*lo, *lo + *len) of part `part` of `parts` (cipc_part_range's aligned parts). */
static void
lv_part(const struct lv_builder *b, size_t units, int part, int parts, uint64_t *lo,
        uint64_t *len)
{
    size_t first, last;

    cipc_part_range(units, b->elem_size, part, parts, &first, &last);
    *lo = first;
    *len = last - first;
}

/* Pipeline chunks of the chain and the trees: one per CIPC_LEVEL_CHUNK_BYTES, at most
 * CIPC_LEVEL_CHUNKS. */
static int
lv_chunks(const struct lv_builder *b)
{
    size_t bytes = b->count * b->elem_size;
    size_t chunks = (bytes + CIPC_LEVEL_CHUNK_BYTES - 1) / CIPC_LEVEL_CHUNK_BYTES;

    return chunks < 1 ? 1 : chunks > CIPC_LEVEL_CHUNKS ? CIPC_LEVEL_CHUNKS : (int)chunks;
}

static void
lv_ring_allreduce(struct lv_builder *b)
{
    const int n = b->n, g = b->rank, prev = alg_mod(g - 1, n);

    /* Reduce-scatter: after level s, this GPU's output holds chunk (g - s - 1)'s partial of
     * s + 2 inputs; the last is the sum. */
    for (int s = 0; s <= n - 2; s++) {
        uint64_t lo, len;
        lv_part(b, b->count, alg_mod(g - s - 1, n), n, &lo, &len);
        struct cipc_lref srcs[2] = {
            s == 0 ? lv_ref(prev, CIPC_LSEND, lo, true) : lv_ref(prev, CIPC_LRECV, lo, false),
            lv_ref(g, CIPC_LSEND, lo, true)};
        lv_task(b, s, srcs, 2, lv_ref(g, CIPC_LRECV, lo, false), len, s == n - 2);
        if (s > 0) {
            lv_dep(b, s, prev, s - 1);
        }
    }
    /* All-gather: chunk (g - t), which the predecessor finished at the level before. It
     * overwrites what the successor read at its level t (its partial of that chunk, or at
     * t = 0, in place, its input): the waits around the ring order that already, level L
     * here after level L - (n - 1) = t of the successor. */
    for (int t = 0; t <= n - 2; t++) {
        const int level = n - 1 + t;
        uint64_t lo, len;
        lv_part(b, b->count, alg_mod(g - t, n), n, &lo, &len);
        struct cipc_lref src = lv_ref(prev, CIPC_LRECV, lo, false);
        lv_task(b, level, &src, 1, lv_ref(g, CIPC_LRECV, lo, false), len, false);
        lv_dep(b, level, prev, level - 1);
    }
}

static void
lv_ring_allgather(struct lv_builder *b)
{
    const int n = b->n, g = b->rank, prev = alg_mod(g - 1, n);
    const uint64_t block = b->count;
    struct cipc_lref own = lv_ref(g, CIPC_LSEND, 0, false);

    lv_task(b, 0, &own, 1, lv_ref(g, CIPC_LRECV, (uint64_t)g * block, false), block, false);
    for (int t = 0; t <= n - 2; t++) {
        const int j = alg_mod(g - t - 1, n);
        struct cipc_lref src = t == 0 ? lv_ref(prev, CIPC_LSEND, 0, false)
                                      : lv_ref(prev, CIPC_LRECV, (uint64_t)j * block, false);
        lv_task(b, t, &src, 1, lv_ref(g, CIPC_LRECV, (uint64_t)j * block, false), block, false);
        if (t > 0) {
            lv_dep(b, t, prev, t - 1);
        }
    }
}

/* Broadcast from root down `parent` links (a chain, or the tree): a node at depth d >= 1
 * copies chunk k at level k + d - 1 from its parent (the root's input where that is the
 * root), after its parent's copy of it. */
static void
lv_broadcast(struct lv_builder *b, int root, int parent, int depth)
{
    const int g = b->rank, chunks = lv_chunks(b);

    if (g == root) {
        struct cipc_lref src = lv_ref(g, CIPC_LSEND, 0, false);
        lv_task(b, 0, &src, 1, lv_ref(g, CIPC_LRECV, 0, false), b->count, false);
        return;
    }
    for (int k = 0; k < chunks; k++) {
        const int level = k + depth - 1;
        uint64_t lo, len;
        lv_part(b, b->count, k, chunks, &lo, &len);
        struct cipc_lref src = lv_ref(parent, parent == root ? CIPC_LSEND : CIPC_LRECV, lo,
                                      false);
        lv_task(b, level, &src, 1, lv_ref(g, CIPC_LRECV, lo, false), len, false);
        if (parent != root) {
            lv_dep(b, level, parent, level - 1);
        }
    }
}

/* Depth of rank in the tree of tree.h over n ranks rooted at root. */
static int
lv_tree_depth(int rank, int n, int root)
{
    int depth = 0, children[2], nchildren, parent;

    for (int r = rank; r != root; r = parent, depth++) {
        alg_tree_links(r, n, root, &parent, children, &nchildren);
    }
    return depth;
}

/* Height of rank's subtree: 0 for a leaf. */
static int
lv_tree_height(int rank, int n, int root)
{
    int children[2], nchildren, parent, height = 0;

    alg_tree_links(rank, n, root, &parent, children, &nchildren);
    for (int c = 0; c < nchildren; c++) {
        int h = 1 + lv_tree_height(children[c], n, root);
        height = h > height ? h : height;
    }
    return height;
}

static void
lv_tree_allreduce(struct lv_builder *b)
{
    const int n = b->n, g = b->rank, chunks = lv_chunks(b);
    const int height = lv_tree_height(g, n, 0), top = lv_tree_height(0, n, 0);
    const int down = chunks + top - 1; /* the first level of the way down */
    int children[2], nchildren, parent, child_height[2];

    alg_tree_links(g, n, 0, &parent, children, &nchildren);
    for (int c = 0; c < nchildren; c++) {
        child_height[c] = lv_tree_height(children[c], n, 0);
    }
    /* Up: chunk k at level k + height - 1, this input and the children's partials (a leaf's
     * partial is its input) into this output; the root's is the sum. */
    for (int k = 0; k < chunks && height > 0; k++) {
        const int level = k + height - 1;
        uint64_t lo, len;
        struct cipc_lref srcs[3];
        int nsrc = 0;
        lv_part(b, b->count, k, chunks, &lo, &len);
        srcs[nsrc++] = lv_ref(g, CIPC_LSEND, lo, true);
        for (int c = 0; c < nchildren; c++) {
            const int h = child_height[c];
            srcs[nsrc++] = h == 0 ? lv_ref(children[c], CIPC_LSEND, lo, true)
                                  : lv_ref(children[c], CIPC_LRECV, lo, false);
            if (h > 0) {
                lv_dep(b, level, children[c], k + h - 1);
            }
        }
        lv_task(b, level, srcs, nsrc, lv_ref(g, CIPC_LRECV, lo, false), len, g == 0);
    }
    /* Down: chunk k at level down + k + depth - 1 from the parent's output, once the parent
     * has it (the root: its last level up for k). Waiting for the parent also orders this
     * overwrite of the partial after the parent read it. */
    if (g == 0) {
        return;
    }
    const int depth = lv_tree_depth(g, n, 0);
    for (int k = 0; k < chunks; k++) {
        const int level = down + k + depth - 1;
        uint64_t lo, len;
        lv_part(b, b->count, k, chunks, &lo, &len);
        struct cipc_lref src = lv_ref(parent, CIPC_LRECV, lo, false);
        lv_task(b, level, &src, 1, lv_ref(g, CIPC_LRECV, lo, false), len, false);
        lv_dep(b, level, parent, parent == 0 ? k + top - 1 : level - 1);
    }
}

bool
cipc_levels_serve(enum cipc_algo algo, enum alg_coll coll)
{
    switch (algo) {
    case CIPC_ALGO_DIRECT:
        return true;
    case CIPC_ALGO_RING:
        return coll == ALG_COLL_ALLREDUCE || coll == ALG_COLL_ALLGATHER ||
               coll == ALG_COLL_BROADCAST;
    case CIPC_ALGO_TREE:
        return coll == ALG_COLL_ALLREDUCE || coll == ALG_COLL_BROADCAST;
    default:
        return false;
    }
}

void
cipc_part_range(size_t count, size_t elem_size, int part, int nparts, size_t *lo, size_t *hi)
{
    const size_t granule = 256 / elem_size; /* element sizes are powers of two up to 8 */
    size_t granules = (count + granule - 1) / granule;
    size_t each = (granules + (size_t)nparts - 1) / (size_t)nparts;
    size_t first = (size_t)part * each * granule, last = first + each * granule;

    *lo = first < count ? first : count;
    *hi = last < count ? last : count;
}

bool
cipc_reduces(enum alg_coll coll)
{
    return coll == ALG_COLL_ALLREDUCE || coll == ALG_COLL_REDUCE ||
           coll == ALG_COLL_REDUCESCATTER;
}

const char *
cipc_algo_name(enum cipc_algo algo)
{
    static const char *const names[CIPC_ALGOS] = {"direct", "ring", "tree"};
    return algo >= 0 && algo < CIPC_ALGOS ? names[algo] : "?";
}

ncclResult_t
cipc_levels_build(enum cipc_algo algo, enum alg_coll coll, size_t count, size_t elem_size,
                  int n, int rank, int root, struct cipc_levels *out)
{
    struct lv_builder b = {.out = out, .count = count, .elem_size = elem_size, .n = n,
                           .rank = rank};

    memset(out, 0, offsetof(struct cipc_levels, tasks));
    out->ndeps = 0;
    if (algo == CIPC_ALGO_DIRECT || !cipc_levels_serve(algo, coll) || n < 2 || rank < 0 ||
        rank >= n || n > CIPC_MAX_RANKS) {
        WARN("cudaipc: no %s schedule of collective %d at rank %d of %d", cipc_algo_name(algo),
             (int)coll, rank, n);
        return ncclInternalError;
    }
    if (coll == ALG_COLL_ALLREDUCE) {
        if (algo == CIPC_ALGO_RING) {
            lv_ring_allreduce(&b);
        } else {
            lv_tree_allreduce(&b);
        }
    } else if (coll == ALG_COLL_ALLGATHER) {
        lv_ring_allgather(&b);
    } else if (algo == CIPC_ALGO_RING) {
        const int depth = alg_mod(rank - root, n);
        lv_broadcast(&b, root, alg_mod(rank - 1, n), depth);
    } else {
        int parent, children[2], nchildren;
        alg_tree_links(rank, n, root, &parent, children, &nchildren);
        lv_broadcast(&b, root, parent, lv_tree_depth(rank, n, root));
    }
    if (b.overflow) {
        WARN("cudaipc: the %s schedule of collective %d at rank %d of %d does not fit in %d "
             "levels, %d tasks and %d waits", cipc_algo_name(algo), (int)coll, rank, n,
             CIPC_MAX_LEVELS, CIPC_LEVEL_TASKS, CIPC_LEVEL_DEPS);
        return ncclInternalError;
    }
    /* A GPU with nothing to do still runs one (empty) level. */
    out->nlevels = out->nlevels > 0 ? out->nlevels : 1;
    return ncclSuccess;
}

int
cipc_levels_count(enum cipc_algo algo, enum alg_coll coll, size_t count, size_t elem_size,
                  int n, int rank, int root)
{
    struct cipc_levels levels;

    if (algo == CIPC_ALGO_DIRECT || !cipc_levels_serve(algo, coll) || n < 2 ||
        cipc_levels_build(algo, coll, count, elem_size, n, rank, root, &levels) != ncclSuccess) {
        return 1;
    }
    return levels.nlevels;
}

void
cipc_levels_units(enum alg_coll coll, size_t count, ncclDataType_t type, size_t *units_out,
                  size_t *unit_bytes_out)
{
    size_t es = kr_type_size(type);

    *units_out = cipc_reduces(coll) ? count : count * es;
    *unit_bytes_out = cipc_reduces(coll) ? es : 1;
}

int
cipc_levels_most(enum cipc_algo algo, enum alg_coll coll, size_t count, size_t elem_size, int n)
{
    const struct lv_builder b = {.count = count, .elem_size = elem_size, .n = n};
    const int chunks = lv_chunks(&b), depth = alg_tree_depth(n);

    if (algo == CIPC_ALGO_DIRECT || !cipc_levels_serve(algo, coll) || n < 2) {
        return 1;
    }
    switch (coll) {
    case ALG_COLL_ALLREDUCE:
        return algo == CIPC_ALGO_RING ? 2 * (n - 1) : 2 * chunks + 2 * depth - 2;
    case ALG_COLL_ALLGATHER:
        return n - 1;
    default: /* broadcast: the last of the chain, or the deepest leaf */
        return chunks + (algo == CIPC_ALGO_RING ? n - 1 : depth) - 1;
    }
}

/* The cost model's estimates for a level (a launch, a stream write and a turn of the
 * leader's thread) and a byte through the busiest GPU's links: guesses, not yet measured on
 * a GPU. They only rank the schedules a policy leaves: direct parts, one level with a ring's
 * bytes, beat both whenever allowed. */
#define CIPC_LEVEL_SECONDS 10e-6
#define CIPC_LINK_BYTES_PER_SECOND 200e9

/* Bytes through the busiest GPU: the textbook algorithm's, for `bytes` of input per rank. */
static double
cipc_algo_traffic(enum cipc_algo algo, enum alg_coll coll, double bytes, int n)
{
    switch (coll) {
    case ALG_COLL_ALLREDUCE:
        return algo == CIPC_ALGO_TREE ? 3 * bytes : 2.0 * (n - 1) / n * bytes;
    case ALG_COLL_ALLGATHER:
        return (n - 1) * bytes;
    default:
        return algo == CIPC_ALGO_TREE ? 2 * bytes : bytes;
    }
}

enum cipc_algo
cipc_algo_choose(const struct alg_policy *policy, enum alg_coll coll, size_t count,
                 size_t elem_size, int n)
{
    static const char *const families[CIPC_ALGOS] = {NULL, "ring", "tree"};
    enum cipc_algo best = CIPC_ALGO_DIRECT;
    double best_time = -1;

    for (int a = 0; a < CIPC_ALGOS; a++) {
        enum cipc_algo algo = (enum cipc_algo)a;
        bool allowed = algo == CIPC_ALGO_DIRECT ? alg_policy_unfiltered(policy, coll)
                                                : alg_policy_allows_family(policy, coll,
                                                                           families[a]);
        if (!allowed || !cipc_levels_serve(algo, coll) || (algo != CIPC_ALGO_DIRECT && n < 2)) {
            continue;
        }
        double time = cipc_levels_most(algo, coll, count, elem_size, n) * CIPC_LEVEL_SECONDS +
                      cipc_algo_traffic(algo, coll, (double)count * (double)elem_size, n) /
                          CIPC_LINK_BYTES_PER_SECOND;
        if (best_time < 0 || time < best_time) {
            best = algo;
            best_time = time;
        }
    }
    return best;
}
