/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Tree scatter and gather over the binary tree of tree.c (drawing there): every subtree is a
 * contiguous range of tree positions, so a subtree's blocks cross each tree edge in ONE
 * message, log2 n messages deep instead of the n - 1 a direct root would send.
 *
 * Scatter: a non-root receives its whole subtree's blocks from its parent into scratch (in
 * position order), copies its own block to recvbuff and sends each child its child's
 * sub-range; a leaf receives its one block straight into recvbuff. Gather is the mirror: a
 * rank copies its own block into its place in scratch, receives each child's range next to
 * it and sends the whole range up; a leaf sends its sendbuff as is. Each rank sends count
 * elements for every rank below it (scatter) or in its subtree (gather); the root sends
 * (n - 1) count in scatter, nothing in gather.
 *
 * Position v is real rank (v + root) mod n, and block r sits at r * count in the root's
 * buffer, so a child's range of positions is one range of the root's buffer unless it wraps
 * past rank n - 1. Then the root stages it: scatter copies the two pieces into scratch in
 * position order and sends that; gather receives into scratch and copies the two pieces out.
 * With root 0 nothing wraps. In place at the root the own-block copy is skipped by the
 * executor (same address). Blocks are count elements each, so any count works; count 0
 * builds nothing.
 */
#include "tree.h"

/* Position range of rank's subtree, and the positions of rank and its children. */
struct tree_span {
    int v, first, size;
    int parent, nchild, child[2];    /* real ranks */
    int child_first[2], child_size[2]; /* positions */
};

static void
tree_span_get(const struct alg_args *args, struct tree_span *span)
{
    const int n = args->nranks;

    span->v = alg_mod(args->rank - args->root, n);
    alg_tree_vrange(span->v, n, &span->first, &span->size);
    alg_tree_links(args->rank, n, args->root, &span->parent, span->child, &span->nchild);
    for (int k = 0; k < span->nchild; k++) {
        alg_tree_vrange(alg_mod(span->child[k] - args->root, n), n, &span->child_first[k],
                        &span->child_size[k]);
    }
}

/* The blocks of child k's subtree in the root's buffer `buf`: one range, or, when they wrap
 * past rank n - 1, the range up to the end of the buffer and *wrap_out from its start (of
 * length 0 when nothing wraps). */
static struct alg_range
tree_child_blocks(const struct alg_args *args, const struct tree_span *span, int k,
                  enum alg_buf buf, struct alg_range *wrap_out)
{
    const size_t block = alg_bytes(args, args->count);
    const int n = args->nranks, size = span->child_size[k];
    const int start = alg_mod(span->child_first[k] + args->root, n);
    const int head = start + size <= n ? size : n - start;

    *wrap_out = alg_range_make(buf, 0, (size_t)(size - head) * block);
    return alg_range_make(buf, (size_t)start * block, (size_t)head * block);
}

/* Child k's blocks in the scratch of a rank that is not the root: its subtree's blocks, in
 * position order. */
static struct alg_range
tree_child_scratch(const struct alg_args *args, const struct tree_span *span, int k)
{
    const size_t block = alg_bytes(args, args->count);

    return alg_range_make(ALG_BUF_SCRATCH, (size_t)(span->child_first[k] - span->first) * block,
                          (size_t)span->child_size[k] * block);
}

ncclResult_t
alg_tree_scatter(const struct alg_args *args, struct alg_sched *sched)
{
    const size_t block = alg_bytes(args, args->count);
    struct tree_span s;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    tree_span_get(args, &s);
    if (args->rank == args->root) {
        alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, block),
                 alg_range_make(ALG_BUF_SEND, (size_t)args->root * block, block), 0, -1, -1);
        size_t staged = 0;
        for (int k = 0; k < s.nchild; k++) {
            struct alg_range wrap, head = tree_child_blocks(args, &s, k, ALG_BUF_SEND, &wrap);
            if (wrap.len == 0) {
                alg_send(sched, s.child[k], head, -1, -1);
                continue;
            }
            int c0 = alg_copy(sched, alg_range_make(ALG_BUF_SCRATCH, staged, head.len), head, 0,
                              -1, -1);
            int c1 = alg_copy(sched,
                              alg_range_make(ALG_BUF_SCRATCH, staged + head.len, wrap.len),
                              wrap, 0, -1, -1);
            alg_send(sched, s.child[k],
                     alg_range_make(ALG_BUF_SCRATCH, staged, head.len + wrap.len), c0, c1);
            staged += head.len + wrap.len;
        }
        sched->scratch_bytes = staged;
        return alg_sched_finish(sched);
    }
    if (s.nchild == 0) {
        alg_recv(sched, s.parent, alg_range_make(ALG_BUF_RECV, 0, block), -1, -1);
        return alg_sched_finish(sched);
    }
    sched->scratch_bytes = (size_t)s.size * block;
    int rx = alg_recv(sched, s.parent, alg_range_make(ALG_BUF_SCRATCH, 0, sched->scratch_bytes),
                      -1, -1);
    alg_copy(sched, alg_range_make(ALG_BUF_RECV, 0, block),
             alg_range_make(ALG_BUF_SCRATCH, (size_t)(s.v - s.first) * block, block), 0, rx,
             -1);
    for (int k = 0; k < s.nchild; k++) {
        alg_send(sched, s.child[k], tree_child_scratch(args, &s, k), rx, -1);
    }
    return alg_sched_finish(sched);
}

size_t
alg_tree_scatter_bytes(const struct alg_args *args)
{
    int first, size;

    alg_tree_vrange(alg_mod(args->rank - args->root, args->nranks), args->nranks, &first,
                    &size);
    return alg_bytes(args, args->count) * (size_t)(size - 1);
}

/* Of a position's children (in the tree over n positions), the one with the larger subtree. */
static int
tree_larger_child(int n, const int child[2], int nchild)
{
    int first, size0, size1 = 0;

    alg_tree_vrange(child[0], n, &first, &size0);
    if (nchild == 2) {
        alg_tree_vrange(child[1], n, &first, &size1);
    }
    return size1 > size0 ? child[1] : child[0];
}

/* Store and forward down the longest path: each rank on it sends its subtree's blocks but its
 * own, a message per child in turn, once all of them have arrived. From the root that is all
 * n - 1 blocks to its one child, then about half of them, a quarter, ...: about 2n blocks
 * and two messages a level, where a direct root sends n - 1 blocks in n - 1 messages. */
void
alg_tree_scatter_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    const int n = args->nranks;
    double steps = 0, blocks = 0;

    for (int v = 0;;) {
        int parent, child[2], nchild, first, size;
        alg_tree_vlinks(v, n, &parent, child, &nchild);
        if (nchild == 0) {
            break;
        }
        alg_tree_vrange(v, n, &first, &size);
        steps += nchild;
        blocks += size - 1;
        v = tree_larger_child(n, child, nchild);
    }
    cost_out->steps = steps;
    cost_out->bytes = blocks * (double)alg_bytes(args, args->count);
    cost_out->reduce_bytes = 0;
}

ncclResult_t
alg_tree_gather(const struct alg_args *args, struct alg_sched *sched)
{
    const size_t block = alg_bytes(args, args->count);
    struct tree_span s;

    if (args->count == 0) {
        return alg_sched_finish(sched);
    }
    tree_span_get(args, &s);
    if (args->rank == args->root) {
        alg_copy(sched, alg_range_make(ALG_BUF_RECV, (size_t)args->root * block, block),
                 alg_range_make(ALG_BUF_SEND, 0, block), 0, -1, -1);
        size_t staged = 0;
        for (int k = 0; k < s.nchild; k++) {
            struct alg_range wrap, head = tree_child_blocks(args, &s, k, ALG_BUF_RECV, &wrap);
            if (wrap.len == 0) {
                alg_recv(sched, s.child[k], head, -1, -1);
                continue;
            }
            int rx = alg_recv(sched, s.child[k],
                              alg_range_make(ALG_BUF_SCRATCH, staged, head.len + wrap.len), -1,
                              -1);
            alg_copy(sched, head, alg_range_make(ALG_BUF_SCRATCH, staged, head.len), 0, rx, -1);
            alg_copy(sched, wrap, alg_range_make(ALG_BUF_SCRATCH, staged + head.len, wrap.len),
                     0, rx, -1);
            staged += head.len + wrap.len;
        }
        sched->scratch_bytes = staged;
        return alg_sched_finish(sched);
    }
    if (s.nchild == 0) {
        alg_send(sched, s.parent, alg_range_make(ALG_BUF_SEND, 0, block), -1, -1);
        return alg_sched_finish(sched);
    }
    sched->scratch_bytes = (size_t)s.size * block;
    int rx[2] = {-1, -1};
    for (int k = 0; k < s.nchild; k++) {
        rx[k] = alg_recv(sched, s.child[k], tree_child_scratch(args, &s, k), -1, -1);
    }
    /* A send waits on two steps: chain the own-block copy after the first receive. */
    int cp = alg_copy(sched,
                      alg_range_make(ALG_BUF_SCRATCH, (size_t)(s.v - s.first) * block, block),
                      alg_range_make(ALG_BUF_SEND, 0, block), 0, rx[0], -1);
    alg_send(sched, s.parent, alg_range_make(ALG_BUF_SCRATCH, 0, sched->scratch_bytes), cp,
             rx[1]);
    return alg_sched_finish(sched);
}

size_t
alg_tree_gather_bytes(const struct alg_args *args)
{
    int first, size;

    if (args->rank == args->root) {
        return 0;
    }
    alg_tree_vrange(alg_mod(args->rank - args->root, args->nranks), args->nranks, &first,
                    &size);
    return alg_bytes(args, args->count) * (size_t)size;
}

void
alg_tree_gather_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    alg_tree_scatter_cost(args, cost_out);
}
