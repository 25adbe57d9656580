/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Binary trees: the rank math (declared in tree.h, shared with tree_scatter.c and dbtree.c),
 * and the pipelined tree broadcast and reduce. Scatter and gather are in tree_scatter.c.
 *
 * The tree is NCCL's in-order binary tree over positions 0..n-1. Position 0 is the root and
 * has one child, the largest power of two below n. A position v > 0 whose lowest set bit is b
 * has the left child v - b/2 and the right child v + b/2, or, where that is n or more, the
 * first of v + b/4, v + b/8, ... below n; leaves are the odd positions. Its parent is the one
 * of v - b and v + b whose lowest set bit is 2b, or v - b where v + b >= n. In-order: every
 * subtree is a contiguous range of positions: [v - b + 1, min(v + b - 1, n - 1)], and [0, n)
 * for the root. Depth is ceil(log2 n); no power of two is needed.
 *
 *   n = 7             n = 12
 *     0                   0
 *     |                   |
 *     4                   8
 *    / \               /     \
 *   2   6             4       10
 *  / \  |           /   \    /  \
 * 1   3 5          2     6  9   11
 *                 / \   / \
 *                1   3 5   7
 *
 * A root other than 0 is rotated in: position v is real rank (v + root) mod n. With n = 7
 * and root 5, the left drawing becomes the one below; the subtree of rank 2 holds positions
 * 1..6, real ranks 6, 0, 1, 2, 3, 4: a range that wraps past n - 1 (tree_scatter.c copes).
 *
 *     5        position 0
 *     |
 *     2        position 4
 *    / \
 *   0   4      positions 2, 6
 *  / \  |
 * 6   1 3      positions 1, 3, 5
 *
 * Broadcast: the root sends each chunk of chunk_bytes to its child; every other rank receives
 * chunk c from its parent straight into recvbuff and forwards it to its children, so chunk c
 * moves down while c + 1 arrives. Each rank sends count bytes per child: the root count, an
 * interior rank up to 2 count, a leaf nothing. depth + nchunks - 1 steps.
 *
 * Reduce: up the same tree, chunked. A rank receives chunk c of each child's partial result
 * into a scratch slot, adds it to its own input (pre-multiplied by its own scalar: ALG_PRE_A),
 * and sends the sum to its parent; the root sums into recvbuff, and its last addition of each
 * element is the final one (ALG_POST). Non-roots accumulate in scratch, since they have no
 * recvbuff; a leaf sends its input as is, or, when the op pre-multiplies, scales it into
 * scratch first and sends that. Scratch is `slots` groups of chunks (accumulator and one slot
 * per child), reused round robin: a group's receives wait until its last use was sent. Each
 * rank but the root sends count bytes. Any count: chunks split evenly and may be empty only
 * when count is 0, which builds nothing.
 */
#include "tree.h"

#include <stdlib.h>

void
alg_tree_vlinks(int v, int n, int *parent_out, int children_out[2], int *nchildren_out)
{
    int nchildren = 0, parent = -1;

    children_out[0] = children_out[1] = -1;
    if (v == 0) {
        int top = 1;
        while (top < n) {
            top <<= 1;
        }
        if (n > 1) {
            children_out[nchildren++] = top >> 1;
        }
    } else {
        const int low = v & -v;
        parent = (v & (low << 1)) ? v - low : v + low;
        if (parent >= n) {
            parent = v - low;
        }
        if (low > 1) {
            children_out[nchildren++] = v - low / 2;
            for (int half = low / 2; half > 0; half /= 2) {
                if (v + half < n) {
                    children_out[nchildren++] = v + half;
                    break;
                }
            }
        }
    }
    *parent_out = parent;
    *nchildren_out = nchildren;
}

void
alg_tree_vrange(int v, int n, int *first_out, int *size_out)
{
    if (v == 0) {
        *first_out = 0;
        *size_out = n;
        return;
    }
    const int low = v & -v;
    const int last = v + low - 1 < n - 1 ? v + low - 1 : n - 1;
    *first_out = v - low + 1;
    *size_out = last - (v - low + 1) + 1;
}

void
alg_tree_links(int rank, int nranks, int root, int *parent_out, int children_out[2],
               int *nchildren_out)
{
    int parent;

    alg_tree_vlinks(alg_mod(rank - root, nranks), nranks, &parent, children_out,
                    nchildren_out);
    *parent_out = parent < 0 ? -1 : alg_mod(parent + root, nranks);
    for (int k = 0; k < *nchildren_out; k++) {
        children_out[k] = alg_mod(children_out[k] + root, nranks);
    }
}

int
alg_tree_depth(int nranks)
{
    int depth = 0;

    while ((1 << depth) < nranks) {
        depth++;
    }
    return depth;
}

ncclResult_t
alg_tree_broadcast(const struct alg_args *args, struct alg_sched *sched)
{
    const bool is_root = args->rank == args->root;
    int parent, child[2], nchild;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    alg_tree_links(args->rank, args->nranks, args->root, &parent, child, &nchild);
    if (is_root) { /* skipped by the executor in place */
        size_t bytes = alg_bytes(args, args->count);
        alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, bytes),
                 alg_range_make(ALG_BUF_SEND, 0, bytes), 0, -1, -1);
    }
    const int nchunks = alg_tree_nchunks(args, args->count);
    for (int c = 0; c < nchunks && (nchild > 0 || !is_root); c++) {
        struct alg_range chunk = alg_tree_chunk(args, is_root ? ALG_BUF_SEND : ALG_BUF_RECV, 0,
                                                args->count, c, nchunks);
        int rx = is_root ? -1 : alg_recv(sched, parent, chunk, -1, -1);
        for (int k = 0; k < nchild; k++) {
            alg_send(sched, child[k], chunk, rx, -1);
        }
    }
    return alg_sched_finish(sched);
}

size_t
alg_tree_broadcast_bytes(const struct alg_args *args)
{
    int parent, child[2], nchild;

    alg_tree_links(args->rank, args->nranks, args->root, &parent, child, &nchild);
    return alg_bytes(args, args->count) * (size_t)nchild;
}

/* A pipeline of depth + nchunks - 1 stages. An interior rank handles a chunk per child in
 * turn, so a stage is fanout messages on its CPU, each with its own overhead, not one: at
 * 4 ranks across hosts (broadcast, 8 B, five interleaved rounds) the tree's middle rank made
 * it 40 us a call against the chain's 33, where counting a stage once had picked the tree. */
static void
tree_pipeline_cost(const struct alg_args *args, size_t elems, int depth, double fanout,
                   struct alg_cost *cost_out)
{
    const int nchunks = alg_tree_nchunks(args, elems);
    const double chunk = nchunks > 0 ? (double)alg_bytes(args, elems) / nchunks : 0;
    const double stages = nchunks > 0 && depth > 0 ? depth + nchunks - 1 : 0;

    cost_out->steps = stages * fanout;
    cost_out->bytes = stages * chunk * fanout;
    cost_out->reduce_bytes = 0;
    cost_out->chunked = true;
}

void
alg_tree_broadcast_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    tree_pipeline_cost(args, args->count, alg_tree_depth(args->nranks),
                       args->nranks > 2 ? 2 : 1, cost_out);
}

ncclResult_t
alg_tree_reduce_up(const struct alg_args *args, struct alg_sched *sched, int parent,
                   const int *children, int nchild)
{
    const bool is_root = args->rank == args->root;
    const size_t count = args->count;

    /* Scratch: `slots` groups of [accumulator (non-roots that compute)] [one per child]. */
    const int nchunks = alg_tree_nchunks(args, count);
    const size_t chunk_bytes = alg_bytes(args, (count + (size_t)nchunks - 1) / (size_t)nchunks);
    int slots = args->slots > 0 ? args->slots : 1;
    slots = slots < nchunks ? slots : nchunks;
    const int acc_slots = !is_root && (nchild > 0 || args->prescale) ? 1 : 0;
    const int group = acc_slots + nchild;
    sched->scratch_bytes = (size_t)slots * (size_t)group * chunk_bytes;

    /* group_free[g]: the step after which group g may be overwritten (its last use). */
    int *group_free = malloc((size_t)slots * sizeof(int));
    if (group_free == NULL) {
        sched->out_of_memory = true;
        return alg_sched_finish(sched);
    }
    for (int g = 0; g < slots; g++) {
        group_free[g] = -1;
    }
    for (int c = 0; c < nchunks; c++) {
        const int g = c % slots;
        struct alg_range own = alg_tree_chunk(args, ALG_BUF_SEND, 0, count, c, nchunks);
        struct alg_range acc = own, in[ALG_TREE_MAX_CHILDREN];
        if (is_root) {
            acc = alg_tree_chunk(args, ALG_BUF_RECV, 0, count, c, nchunks);
        } else if (acc_slots) {
            acc = alg_range_make(ALG_BUF_SCRATCH, (size_t)g * group * chunk_bytes, own.len);
        }
        int rx[ALG_TREE_MAX_CHILDREN], last = -1;
        for (int k = 0; k < nchild; k++) {
            size_t off = ((size_t)g * group + acc_slots + k) * chunk_bytes;
            in[k] = alg_range_make(ALG_BUF_SCRATCH, off, own.len);
            rx[k] = alg_recv(sched, children[k], in[k], group_free[g], -1);
        }
        if (nchild == 0 && acc_slots) {
            last = alg_copy(sched, acc, own, ALG_PRE_A, group_free[g], -1);
        }
        /* Our own input, scaled, joins the first child's sum; the root's last addition of
         * each element is the final one. */
        for (int k = 0; k < nchild; k++) {
            unsigned post = is_root && k == nchild - 1 ? ALG_POST : 0;
            last = k == 0 ? alg_reduce(sched, acc, own, in[0], ALG_PRE_A | post, rx[0],
                                       group_free[g], -1)
                          : alg_reduce(sched, acc, acc, in[k], post, last, rx[k], -1);
        }
        group_free[g] = is_root ? last : alg_send(sched, parent, acc, last, -1);
    }
    free(group_free);
    return alg_sched_finish(sched);
}

ncclResult_t
alg_tree_reduce(const struct alg_args *args, struct alg_sched *sched)
{
    int parent, child[2], nchild;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    if (args->nranks == 1) {
        return alg_reduce_alone(args, sched);
    }
    alg_tree_links(args->rank, args->nranks, args->root, &parent, child, &nchild);
    return alg_tree_reduce_up(args, sched, parent, child, nchild);
}

size_t
alg_tree_reduce_bytes(const struct alg_args *args)
{
    return args->rank == args->root ? 0 : alg_bytes(args, args->count);
}

void
alg_tree_reduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const double fanout = args->nranks > 2 ? 2 : 1;

    /* The critical path receives from two children per stage and reduces both. */
    tree_pipeline_cost(args, args->count, alg_tree_depth(args->nranks), fanout, cost_out);
    cost_out->reduce_bytes = cost_out->bytes;
}
