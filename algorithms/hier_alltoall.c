/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hierarchical all-to-all: a rank's blocks for another host cross together, in one message to
 * its counterpart there (hosts.h), which hands each of its mates theirs.
 *
 * Rank r at place p of host h sends its counterpart on every other host H a bundle of its
 * blocks for H's ranks, in place order; it sends each mate its own block directly. It receives
 * a bundle from every rank s of another host whose counterpart on h it is (s's place mod
 * h's ranks): of the block for each rank of h, it keeps its own (RECV block s) and passes each
 * mate theirs. A mate takes from r first r's own block, then the blocks r passes on, in the
 * order of their sources' ranks, which is how both sides of a pair agree on the order of
 * their messages. Every block crosses between hosts once, a rank sends H - 1 messages across
 * where pairwise sends one per rank of another host, and (m - 1) n / m blocks at home for
 * m ranks on its host.
 *
 * A bundle lies in SEND as one range where H's ranks are consecutive (hosts as runs of ranks)
 * and goes as is; elsewhere it is staged in scratch, block by block. In place (SEND == RECV)
 * a rank first copies all of SEND to scratch and sends from there, and every write to RECV
 * waits for that copy. Blocks are count elements each; count 0 builds nothing. Without
 * args->hosts every rank is on one host and each sends every other its block directly.
 */
#include "alg.h"
#include "hosts.h"

/* Where this rank's schedule reads its blocks from, and what every write to RECV waits for. */
struct hier_a2a_source {
    enum alg_buf buf; /* SEND, or in place SCRATCH, each block at its rank's place */
    int ready;        /* the in-place copy, -1 when reading SEND itself */
};

/* Block `i` of the source (the block for rank i). */
static struct alg_range
hier_a2a_block(const struct alg_args *args, const struct hier_a2a_source *src, int i)
{
    const size_t block = alg_bytes(args, args->count);

    return alg_range_make(src->buf, (size_t)i * block, block);
}

/* Whether rank s, of a host other than rank r's, sends its bundle for r's host to r. */
static bool
hier_a2a_sends_to(const struct alg_host_map *map, int s, int r)
{
    const int h = alg_host_of(map, r);

    return alg_host_of(map, s) != h && alg_host_counterpart(map, s, h) == r;
}

/* Sends our bundle for host `host` to our counterpart there; stages in scratch from *staged. */
static void
hier_a2a_send_bundle(const struct alg_args *args, struct alg_sched *sched,
                     const struct alg_host_map *map, const struct hier_a2a_source *src, int host,
                     size_t *staged)
{
    const size_t block = alg_bytes(args, args->count);
    const int m = alg_host_size(map, host), to = alg_host_counterpart(map, args->rank, host);

    if (alg_host_consecutive(map, host)) {
        struct alg_range bundle = hier_a2a_block(args, src, alg_host_rank(map, host, 0));
        bundle.len = (size_t)m * block;
        alg_send(sched, to, bundle, src->ready, -1);
        return;
    }
    int copied = src->ready; /* each copy after the one before: the send waits for them all */
    for (int j = 0; j < m; j++) {
        copied = alg_copy(sched, alg_range_make(ALG_BUF_SCRATCH, *staged + j * block, block),
                          hier_a2a_block(args, src, alg_host_rank(map, host, j)), 0, copied, -1);
    }
    alg_send(sched, to, alg_range_make(ALG_BUF_SCRATCH, *staged, (size_t)m * block), copied, -1);
    *staged += (size_t)m * block;
}

ncclResult_t
alg_hier_alltoall(const struct alg_args *args, struct alg_sched *sched)
{
    const int n = args->nranks, me = args->rank;
    const size_t block = alg_bytes(args, args->count);
    struct alg_host_map map;

    if (args->count == 0 || !alg_host_map_init(&map, args, sched)) {
        return alg_sched_finish(sched);
    }
    const int h = map.host, m = alg_host_size(&map, h);
    struct hier_a2a_source src = {ALG_BUF_SEND, -1};
    size_t staged = 0;
    if (args->in_place && n > 1) {
        src.buf = ALG_BUF_SCRATCH;
        src.ready = alg_copy(sched, alg_range_make(ALG_BUF_SCRATCH, 0, (size_t)n * block),
                             alg_range_make(ALG_BUF_SEND, 0, (size_t)n * block), 0, -1, -1);
        staged = (size_t)n * block;
    }
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)me * block, block),
             alg_range_make(ALG_BUF_SEND, (size_t)me * block, block), 0, -1, -1);
    for (int k = 1; k < map.nhosts; k++) {
        hier_a2a_send_bundle(args, sched, &map, &src, (h + k) % map.nhosts, &staged);
    }
    for (int j = 0; j < m; j++) {
        const int mate = alg_host_rank(&map, h, j);
        if (mate != me) {
            alg_send(sched, mate, hier_a2a_block(args, &src, mate), src.ready, -1);
        }
    }
    /* The bundles for us, each kept in scratch and handed on from there. */
    for (int s = 0; s < n; s++) {
        if (!hier_a2a_sends_to(&map, s, me)) {
            continue;
        }
        const struct alg_range bundle =
            alg_range_make(ALG_BUF_SCRATCH, staged, (size_t)m * block);
        int rx = alg_recv(sched, s, bundle, -1, -1);
        for (int j = 0; j < m; j++) {
            const struct alg_range piece =
                alg_range_make(ALG_BUF_SCRATCH, staged + j * block, block);
            if (j == map.local) {
                alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)s * block, block), piece, 0,
                         rx, src.ready);
            } else {
                alg_send(sched, alg_host_rank(&map, h, j), piece, rx, -1);
            }
        }
        staged += (size_t)m * block;
    }
    /* From each mate: its own block, then those it hands on, by their sources' ranks. */
    for (int j = 0; j < m; j++) {
        const int mate = alg_host_rank(&map, h, j);
        if (mate == me) {
            continue;
        }
        alg_recv(sched, mate, alg_range_make(ALG_BUF_RECV, (size_t)mate * block, block),
                 src.ready, -1);
        for (int s = 0; s < n; s++) {
            if (hier_a2a_sends_to(&map, s, mate)) {
                alg_recv(sched, mate, alg_range_make(ALG_BUF_RECV, (size_t)s * block, block),
                         src.ready, -1);
            }
        }
    }
    sched->scratch_bytes = staged;
    alg_host_map_free(&map);
    return alg_sched_finish(sched);
}

size_t
alg_hier_alltoall_bytes(const struct alg_args *args)
{
    struct alg_host_map map;
    size_t blocks;

    if (!alg_host_map_init(&map, args, NULL)) {
        return 0;
    }
    const int m = alg_host_size(&map, map.host);
    /* Every block but our own leaves us once; we also pass on m - 1 of each bundle's m. */
    blocks = (size_t)args->nranks - 1;
    for (int s = 0; s < args->nranks; s++) {
        blocks += hier_a2a_sends_to(&map, s, args->rank) ? (size_t)m - 1 : 0;
    }
    alg_host_map_free(&map);
    return alg_bytes(args, args->count) * blocks;
}

/* A rank of the emptiest host moves its n - m blocks across, in H - 1 messages; one of the
 * fullest sends (m - 1) n / m blocks at home, one by one. Alike on every rank. */
void
alg_hier_alltoall_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double n = args->nranks, block = (double)alg_bytes(args, args->count);
    const struct alg_host_shape shape = alg_host_shape(args);

    cost_out->net_steps = shape.nhosts - 1;
    cost_out->net_bytes = (n - shape.narrowest) * block;
    cost_out->steps = (shape.widest - 1) * n / shape.widest;
    cost_out->bytes = cost_out->steps * block;
    cost_out->reduce_bytes = 0;
}
