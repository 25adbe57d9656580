/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hierarchical all-gather: every block crosses to each other host once, and there the rank
 * that received it hands it to its host mates, so a host's ranks use their links to the
 * network in parallel and the host's own links for the rest.
 *
 * Rank s at place i of its host sends its block to each mate and to its counterpart on every
 * other host (the rank at place i mod m there, m that host's ranks: hosts.h). A counterpart
 * puts the block in place in RECV and passes it on to each of its mates; the others take it
 * from their counterpart. Of a buffer of S = n * count elements, S (H - 1) crosses between H
 * hosts (a flat ring: about S per host boundary it crosses, H of them), and a rank sends its
 * block H - 1 times across and (m - 1) times at home, plus (m - 1) times each block it passes
 * on. Without args->hosts every rank is on one host: each sends its block to every other.
 *
 * Blocks are cut into chunks of at most chunk_bytes and everything runs once per chunk,
 * chunk-major, in rank order of the blocks, which is how the two sides of every pair agree
 * on the order of their messages. Receives go straight to their place in RECV and wait for
 * nothing, passing a chunk on waits for its receive; no scratch. Our own block is sent from
 * SEND (in place, that is its place in RECV).
 */
#include "alg.h"
#include "hosts.h"

/* Chunk [first, first + len) of block `block` of RECV. */
static struct alg_range
hier_ag_chunk(const struct alg_args *args, int block, size_t first, size_t len)
{
    return alg_range_make(ALG_BUF_RECV, alg_bytes(args, (size_t)block * args->count + first),
                          alg_bytes(args, len));
}

ncclResult_t
alg_hier_allgather(const struct alg_args *args, struct alg_sched *sched)
{
    struct alg_host_map map;

    if (args->count == 0 || !alg_host_map_init(&map, args, sched)) {
        return alg_sched_finish(sched);
    }
    const int n = args->nranks, me = args->rank;
    const size_t bytes = alg_bytes(args, args->count);
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)me * bytes, bytes),
             alg_range_make(ALG_BUF_SEND, 0, bytes), 0, -1, -1);

    const int nchunks = alg_nchunks(args, args->count);
    for (int c = 0; c < nchunks && n > 1; c++) {
        size_t first, len;
        alg_block(args->count, nchunks, c, &first, &len);
        for (int s = 0; s < n; s++) {
            const int host = alg_host_of(&map, s);
            struct alg_range chunk = hier_ag_chunk(args, s, first, len);
            if (s == me) {
                struct alg_range own = alg_range_make(ALG_BUF_SEND, alg_bytes(args, first),
                                                      alg_bytes(args, len));
                alg_host_send_to_mates(sched, &map, own, -1);
                for (int h = 0; h < map.nhosts; h++) {
                    if (h != map.host) {
                        alg_send(sched, alg_host_counterpart(&map, me, h), own, -1, -1);
                    }
                }
            } else if (host == map.host) {
                alg_recv(sched, s, chunk, -1, -1);
            } else if (alg_host_counterpart(&map, s, map.host) == me) {
                alg_host_send_to_mates(sched, &map, chunk, alg_recv(sched, s, chunk, -1, -1));
            } else {
                alg_recv(sched, alg_host_counterpart(&map, s, map.host), chunk, -1, -1);
            }
        }
    }
    alg_host_map_free(&map);
    return alg_sched_finish(sched);
}

/* Our block to m - 1 mates and H - 1 hosts; each block we are counterpart for, m - 1 times. */
size_t
alg_hier_allgather_bytes(const struct alg_args *args)
{
    struct alg_host_map map;

    if (!alg_host_map_init(&map, args, NULL)) {
        return 0;
    }
    const size_t m = (size_t)alg_host_size(&map, map.host);
    size_t blocks = m - 1 + (size_t)map.nhosts - 1;
    for (int s = 0; s < args->nranks; s++) {
        if (alg_host_of(&map, s) != map.host &&
            alg_host_counterpart(&map, s, map.host) == args->rank) {
            blocks += m - 1;
        }
    }
    alg_host_map_free(&map);
    return alg_bytes(args, blocks * args->count);
}

/* Alike on every rank: the emptiest host's ranks take in the most from the network, (n - m)/m
 * blocks each, and pass each on to their m - 1 mates; the fullest host's ranks send the most
 * at home. */
void
alg_hier_allgather_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double n = args->nranks, block = (double)alg_bytes(args, args->count);
    const struct alg_host_shape shape = alg_host_shape(args);

    cost_out->steps = (shape.widest - 1) * n / shape.widest;
    cost_out->bytes = cost_out->steps * block;
    cost_out->net_steps = shape.nhosts - 1;
    cost_out->net_bytes = shape.across * block;
    cost_out->reduce_bytes = 0;
}
