/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Hierarchical broadcast and reduce: a binary tree between hosts, a chain inside each,
 * pipelined.
 *
 * On every host one rank enters: the root's counterpart there (hosts.h; on the root's host the
 * root itself). The entries form NCCL's in-order binary tree over the hosts, numbered from the
 * root's host (tree.h), so the data crosses each of H - 1 tree edges once, S bytes in all per
 * host boundary crossed, never more. Inside a host the entry heads a chain through its mates
 * in place order from its own place round. A rank's parent is its chain predecessor, or (an
 * entry) its parent host's entry; its children are its chain successor and (an entry) its
 * child hosts' entries: at most three, one of them at home. Without args->hosts it is the
 * chain from the root round, as chain.c's.
 *
 * Broadcast: chunks of at most chunk_bytes follow each other down the tree, each received
 * straight into RECV and forwarded from there; the root copies SEND to its RECV (skipped in
 * place) and sends from SEND. Each rank sends count elements per child.
 *
 * Reduce: the same tree upward, through tree.c's pipelined reduce (alg_tree_reduce_up) with
 * up to three children: each rank adds its children's partial sums to its own input and sends
 * the sum to its parent; the root sums into RECV. Each rank but the root sends count elements.
 */
#include "alg.h"
#include "hosts.h"
#include "tree.h"

struct hier_tree_links {
    int parent; /* -1 at the root */
    int children[ALG_TREE_MAX_CHILDREN];
    int nchildren;
};

/* Our links; false (sched, if any, marked out of memory) if the host map cannot be made. */
static bool
hier_tree_links(const struct alg_args *args, struct alg_sched *sched,
                struct hier_tree_links *links)
{
    struct alg_host_map map;

    if (!alg_host_map_init(&map, args, sched)) {
        return false;
    }
    const int nh = map.nhosts, home = alg_host_of(&map, args->root);
    const int m = alg_host_size(&map, map.host);
    const int entry = alg_host_counterpart(&map, args->root, map.host);
    const int q = alg_mod(map.local - map.place[entry], m); /* our place in the host's chain */

    *links = (struct hier_tree_links){.parent = -1};
    if (q == 0) {
        int parent, child[2], nchild;
        alg_tree_vlinks(alg_mod(map.host - home, nh), nh, &parent, child, &nchild);
        if (parent >= 0) {
            links->parent = alg_host_counterpart(&map, args->root, (parent + home) % nh);
        }
        for (int k = 0; k < nchild; k++) {
            links->children[links->nchildren++] =
                alg_host_counterpart(&map, args->root, (child[k] + home) % nh);
        }
    } else {
        links->parent = alg_host_rank(&map, map.host, (map.place[entry] + q - 1) % m);
    }
    if (q + 1 < m) {
        links->children[links->nchildren++] =
            alg_host_rank(&map, map.host, (map.place[entry] + q + 1) % m);
    }
    alg_host_map_free(&map);
    return true;
}

ncclResult_t
alg_hier_broadcast(const struct alg_args *args, struct alg_sched *sched)
{
    const bool is_root = args->rank == args->root;
    struct hier_tree_links links;

    if (args->count == 0 || !hier_tree_links(args, sched, &links)) {
        return alg_sched_finish(sched);
    }
    if (is_root) {
        const size_t bytes = alg_bytes(args, args->count);
        alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, bytes),
                 alg_range_make(ALG_BUF_SEND, 0, bytes), 0, -1, -1);
    }
    const int nchunks = alg_nchunks(args, args->count);
    for (int c = 0; c < nchunks && (links.nchildren > 0 || !is_root); c++) {
        struct alg_range chunk = alg_tree_chunk(args, is_root ? ALG_BUF_SEND : ALG_BUF_RECV, 0,
                                                args->count, c, nchunks);
        int rx = is_root ? -1 : alg_recv(sched, links.parent, chunk, -1, -1);
        for (int k = 0; k < links.nchildren; k++) {
            alg_send(sched, links.children[k], chunk, rx, -1);
        }
    }
    return alg_sched_finish(sched);
}

size_t
alg_hier_broadcast_bytes(const struct alg_args *args)
{
    struct hier_tree_links links;

    if (!hier_tree_links(args, NULL, &links)) {
        return 0;
    }
    return alg_bytes(args, args->count) * (size_t)links.nchildren;
}

/* A pipeline paced by the network: nchunks + (tree depth between hosts) - 1 chunk times there,
 * an entry sending each chunk to up to two hosts in turn (a message each, as tree.c counts);
 * the chains at home add their fill, one chunk time a hop, on the fullest host. */
void
alg_hier_broadcast_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const struct alg_host_shape shape = alg_host_shape(args);
    const double nchunks = args->count > 0 ? alg_nchunks(args, args->count) : 0;
    const double chunk = nchunks > 0 ? (double)alg_bytes(args, args->count) / nchunks : 0;
    const double depth = alg_tree_depth((int)shape.nhosts), hops = shape.widest - 1;
    const double fanout = shape.nhosts > 2 ? 2 : 1;

    cost_out->net_steps = nchunks > 0 && depth > 0 ? (nchunks + depth - 1) * fanout : 0;
    cost_out->net_bytes = cost_out->net_steps * chunk;
    cost_out->steps = nchunks > 0 && depth == 0 && hops > 0 ? nchunks + hops - 1 : hops;
    cost_out->bytes = cost_out->steps * chunk;
    cost_out->reduce_bytes = 0;
    cost_out->chunked = true;
}

ncclResult_t
alg_hier_reduce(const struct alg_args *args, struct alg_sched *sched)
{
    struct hier_tree_links links;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (args->nranks == 1) {
        return alg_reduce_alone(args, sched);
    }
    if (!hier_tree_links(args, sched, &links)) {
        return alg_sched_finish(sched);
    }
    return alg_tree_reduce_up(args, sched, links.parent, links.children, links.nchildren);
}

size_t
alg_hier_reduce_bytes(const struct alg_args *args)
{
    return alg_tree_reduce_bytes(args); /* each rank but the root sends count, as up any tree */
}

/* As the broadcast's pipeline, upward: an entry receives and reduces up to two hosts' chunks
 * and its mate's each chunk time. */
void
alg_hier_reduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    alg_hier_broadcast_cost(args, cost_out);
    cost_out->reduce_bytes = cost_out->net_bytes + cost_out->bytes;
}
