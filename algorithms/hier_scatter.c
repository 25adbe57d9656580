/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hierarchical scatter and gather: every block crosses between hosts once, and the blocks of
 * one host cross together, in one message.
 *
 * On every host but the root's one rank enters: the root's counterpart there (hosts.h).
 * Scatter: the root sends each other host's blocks, in place order, to that host's entry (the
 * hosts in order from the root's, round), then each of its own mates its block. An entry
 * receives its host's blocks into scratch, copies its own to RECV and sends each mate its
 * block from there (alone on its host, it receives straight into RECV); every other rank
 * receives its block from its host's entry, or at home from the root. Gather is the mirror:
 * a rank sends its block to its host's entry (at home, to the root), an entry gathers its own
 * and its mates' blocks in scratch and sends them to the root in one message.
 *
 * The blocks of a host lie at its ranks' places in the root's buffer: one range where the
 * host's ranks are consecutive (hosts as runs of ranks), which the root sends from (gathers
 * into) as is; elsewhere the root stages them in scratch, block by block.
 *
 * Of the n blocks, the n - m of the other hosts cross once (m: the root's host's ranks), in
 * H - 1 messages where a direct scatter sends n - m. The root sends (n - 1) count elements in
 * scatter, an entry (m_h - 1) count; in gather an entry sends m_h count, every other rank but
 * the root count. Each pair of ranks exchanges at most one message. Blocks are count elements
 * each; any root and layout; count 0 builds nothing. Without args->hosts every rank is on
 * the root's host, and this is direct.c's scatter (gather).
 */
#include "alg.h"
#include "hosts.h"

/* Where this rank stands: the host map, and the one rank it takes its block from (scatter) or
 * gives it to (gather): its host's entry, at home the root, and the root for an entry alone
 * on its host; -1 at the root and at an entry with mates, which deal in hosts' blocks. */
struct hier_scatter_place {
    struct alg_host_map map;
    int home;     /* the root's host */
    int upstream;
};

/* false (sched marked out of memory) if the host map cannot be made. */
static bool
hier_scatter_place(const struct alg_args *args, struct alg_sched *sched,
                   struct hier_scatter_place *p)
{
    if (!alg_host_map_init(&p->map, args, sched)) {
        return false;
    }
    p->home = alg_host_of(&p->map, args->root);
    const int entry = p->map.host == p->home
                          ? args->root
                          : alg_host_counterpart(&p->map, args->root, p->map.host);
    if (args->rank == args->root) {
        p->upstream = -1;
    } else if (args->rank != entry) {
        p->upstream = entry;
    } else {
        p->upstream = alg_host_size(&p->map, p->map.host) == 1 ? args->root : -1;
    }
    return true;
}

/* Host h's blocks in the root's buffer `buf`, in place order: one range if h's ranks are
 * consecutive, else an empty range (the root stages them). */
static struct alg_range
hier_host_blocks(const struct alg_args *args, const struct alg_host_map *map, int h,
                 enum alg_buf buf)
{
    const size_t block = alg_bytes(args, args->count);

    if (!alg_host_consecutive(map, h)) {
        return alg_range_make(buf, 0, 0);
    }
    return alg_range_make(buf, (size_t)alg_host_rank(map, h, 0) * block,
                          (size_t)alg_host_size(map, h) * block);
}

/* Block i (rank i's) of the root's buffer `buf`. */
static struct alg_range
hier_block(const struct alg_args *args, enum alg_buf buf, int i)
{
    const size_t block = alg_bytes(args, args->count);

    return alg_range_make(buf, (size_t)i * block, block);
}

/* The root: each other host's blocks to its entry, then each mate's. */
static void
hier_scatter_root(const struct alg_args *args, struct alg_sched *sched,
                  const struct alg_host_map *map, int home)
{
    const size_t block = alg_bytes(args, args->count);
    size_t staged = 0;

    for (int k = 1; k < map->nhosts; k++) {
        const int h = (home + k) % map->nhosts, m = alg_host_size(map, h);
        const int entry = alg_host_counterpart(map, args->root, h);
        struct alg_range blocks = hier_host_blocks(args, map, h, ALG_BUF_SEND);
        if (blocks.len > 0) {
            alg_send(sched, entry, blocks, -1, -1);
            continue;
        }
        /* Staged block by block; each copy after the one before, so the send waits for all. */
        int copied = -1;
        for (int j = 0; j < m; j++) {
            copied = alg_copy(sched, alg_range_make(ALG_BUF_SCRATCH, staged + j * block, block),
                              hier_block(args, ALG_BUF_SEND, alg_host_rank(map, h, j)), 0,
                              copied, -1);
        }
        alg_send(sched, entry, alg_range_make(ALG_BUF_SCRATCH, staged, (size_t)m * block),
                 copied, -1);
        staged += (size_t)m * block;
    }
    sched->scratch_bytes = staged;
    for (int j = 0; j < alg_host_size(map, home); j++) {
        const int mate = alg_host_rank(map, home, j);
        if (mate != args->root) {
            alg_send(sched, mate, hier_block(args, ALG_BUF_SEND, mate), -1, -1);
        }
    }
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, block),
             hier_block(args, ALG_BUF_SEND, args->root), 0, -1, -1);
}

/* An entry with mates: its host's blocks from the root, its own kept, the others handed on. */
static void
hier_scatter_entry(const struct alg_args *args, struct alg_sched *sched,
                   const struct alg_host_map *map)
{
    const size_t block = alg_bytes(args, args->count);
    const int m = alg_host_size(map, map->host);

    sched->scratch_bytes = (size_t)m * block;
    int rx = alg_recv(sched, args->root, alg_range_make(ALG_BUF_SCRATCH, 0, (size_t)m * block),
                      -1, -1);
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, block),
             alg_range_make(ALG_BUF_SCRATCH, (size_t)map->local * block, block), 0, rx, -1);
    for (int j = 0; j < m; j++) {
        if (j != map->local) {
            alg_send(sched, alg_host_rank(map, map->host, j),
                     alg_range_make(ALG_BUF_SCRATCH, (size_t)j * block, block), rx, -1);
        }
    }
}

/* The root: each other host's blocks from its entry, then each mate's. */
static void
hier_gather_root(const struct alg_args *args, struct alg_sched *sched,
                 const struct alg_host_map *map, int home)
{
    const size_t block = alg_bytes(args, args->count);
    size_t staged = 0;

    for (int k = 1; k < map->nhosts; k++) {
        const int h = (home + k) % map->nhosts, m = alg_host_size(map, h);
        const int entry = alg_host_counterpart(map, args->root, h);
        struct alg_range blocks = hier_host_blocks(args, map, h, ALG_BUF_RECV);
        if (blocks.len > 0) {
            alg_recv(sched, entry, blocks, -1, -1);
            continue;
        }
        int rx = alg_recv(sched, entry,
                          alg_range_make(ALG_BUF_SCRATCH, staged, (size_t)m * block), -1, -1);
        for (int j = 0; j < m; j++) {
            alg_copy(sched, hier_block(args, ALG_BUF_RECV, alg_host_rank(map, h, j)),
                     alg_range_make(ALG_BUF_SCRATCH, staged + j * block, block), 0, rx, -1);
        }
        staged += (size_t)m * block;
    }
    sched->scratch_bytes = staged;
    for (int j = 0; j < alg_host_size(map, home); j++) {
        const int mate = alg_host_rank(map, home, j);
        if (mate != args->root) {
            alg_recv(sched, mate, hier_block(args, ALG_BUF_RECV, mate), -1, -1);
        }
    }
    alg_copy(sched, hier_block(args, ALG_BUF_RECV, args->root),
             alg_range_make(ALG_BUF_SEND, 0, block), 0, -1, -1);
}

/* An entry with mates: its own block and theirs, to the root in one message. A send waits for
 * two steps, so the receives follow each other, each posted when the one before it has
 * arrived, and the send waits for the last. */
static void
hier_gather_entry(const struct alg_args *args, struct alg_sched *sched,
                  const struct alg_host_map *map)
{
    const size_t block = alg_bytes(args, args->count);
    const int m = alg_host_size(map, map->host);

    sched->scratch_bytes = (size_t)m * block;
    int last = alg_copy(sched, alg_range_make(ALG_BUF_SCRATCH, (size_t)map->local * block, block),
                        alg_range_make(ALG_BUF_SEND, 0, block), 0, -1, -1);
    for (int j = 0; j < m; j++) {
        if (j != map->local) {
            last = alg_recv(sched, alg_host_rank(map, map->host, j),
                            alg_range_make(ALG_BUF_SCRATCH, (size_t)j * block, block), last, -1);
        }
    }
    alg_send(sched, args->root, alg_range_make(ALG_BUF_SCRATCH, 0, (size_t)m * block), last, -1);
}

/* This rank's part of the scatter or (gathering) the gather. */
static ncclResult_t
hier_rooted(const struct alg_args *args, struct alg_sched *sched, bool gathering)
{
    const size_t block = alg_bytes(args, args->count);
    struct hier_scatter_place p;

    if (args->count == 0 || !hier_scatter_place(args, sched, &p)) {
        return alg_sched_finish(sched);
    }
    if (args->rank == args->root) {
        (gathering ? hier_gather_root : hier_scatter_root)(args, sched, &p.map, p.home);
    } else if (p.upstream >= 0 && gathering) {
        alg_send(sched, p.upstream, alg_range_make(ALG_BUF_SEND, 0, block), -1, -1);
    } else if (p.upstream >= 0) {
        alg_recv(sched, p.upstream, alg_range_make(ALG_BUF_RECV, 0, block), -1, -1);
    } else {
        (gathering ? hier_gather_entry : hier_scatter_entry)(args, sched, &p.map);
    }
    alg_host_map_free(&p.map);
    return alg_sched_finish(sched);
}

ncclResult_t
alg_hier_scatter(const struct alg_args *args, struct alg_sched *sched)
{
    return hier_rooted(args, sched, false);
}

ncclResult_t
alg_hier_gather(const struct alg_args *args, struct alg_sched *sched)
{
    return hier_rooted(args, sched, true);
}

/* Blocks this rank sends: every one but its own at the root, its mates' at an entry with
 * mates; in gather (gathering) its own, or all of its host's at an entry with mates. */
static size_t
hier_scatter_blocks_sent(const struct alg_args *args, bool gathering)
{
    struct hier_scatter_place p;
    size_t blocks;

    if (!hier_scatter_place(args, NULL, &p)) {
        return 0;
    }
    const size_t m = (size_t)alg_host_size(&p.map, p.map.host);
    if (args->rank == args->root) {
        blocks = gathering ? 0 : (size_t)args->nranks - 1;
    } else if (p.upstream >= 0) {
        blocks = gathering ? 1 : 0;
    } else {
        blocks = gathering ? m : m - 1;
    }
    alg_host_map_free(&p.map);
    return blocks;
}

size_t
alg_hier_scatter_bytes(const struct alg_args *args)
{
    return alg_bytes(args, args->count) * hier_scatter_blocks_sent(args, false);
}

/* The root's link to the network carries the other hosts' blocks, a message per host; then
 * the fullest host's entry (or the root) hands its mates their blocks at home, one by one.
 * Alike on every rank: it depends on the layout and the root. */
void
alg_hier_scatter_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const struct alg_host_shape shape = alg_host_shape(args);
    const double block = (double)alg_bytes(args, args->count);
    const double home = alg_host_ranks_with(args, args->root);

    *cost_out = (struct alg_cost){.net_steps = shape.nhosts - 1,
                                  .net_bytes = (args->nranks - home) * block,
                                  .steps = shape.widest - 1,
                                  .bytes = (shape.widest - 1) * block};
}

size_t
alg_hier_gather_bytes(const struct alg_args *args)
{
    return alg_bytes(args, args->count) * hier_scatter_blocks_sent(args, true);
}

/* The scatter's path backwards. */
void
alg_hier_gather_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    alg_hier_scatter_cost(args, cost_out);
}
