/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Double binary tree all-reduce, as NCCL does it: the buffer is cut in two halves (the first
 * holds the extra element of an odd count), half t is reduced up tree t and broadcast back
 * down the same tree, both halves at once and pipelined in chunks of chunk_bytes.
 *
 * Tree 0 is the in-order binary tree of tree.c with position = rank (root 0); its leaves are
 * the odd ranks, its interior the even ones. Tree 1 is the same tree over relabelled ranks:
 * mirrored (position n - 1 - rank) when n is even, shifted by one (position rank - 1 mod n)
 * when n is odd. Either way an even rank lands on an odd position, so every interior rank of
 * tree 0 except rank 0 is a leaf of tree 1 (with odd n, rank 0 may be interior in both):
 *
 *   n = 6, tree 0       tree 1 (mirror)
 *       0                   5
 *       |                   |
 *       4                   1
 *      / \                 / \
 *     2   5               3   0
 *    / \                 / \
 *   1   3               4   2
 *
 * So each rank is interior, forwarding two children's worth, in about one tree only, and its
 * links carry about half the buffer per direction. For n = 2 both trees are the one edge,
 * for n = 1 the result is a scaled copy.
 *
 * Per chunk c of half t: receive the children's partial sums into scratch slots, add our own
 * input (ALG_PRE_A: our own scalar) into recvbuff, send that partial to the parent, receive
 * the final value from the parent into recvbuff (after the partial left: same bytes), send
 * it to the children. The root's last addition is final (ALG_POST), so the post-divide runs
 * once per element and everyone else receives post'ed values. A leaf sends its input as is,
 * or, when the op pre-multiplies, scales it into recvbuff first. In place recvbuff is
 * sendbuff, which only our own first reduction reads. Scratch: `slots` groups of one chunk
 * per child per tree, reused round robin after the group's last reduction.
 *
 * Bytes each rank sends: in each tree, half_t to its parent (unless root) plus half_t per
 * child. Depth ceil(log2 n) each way; 2 depth + nchunks - 1 stages.
 */
#include "tree.h"

#include <stdlib.h>

void
alg_dbtree_links(int tree, int rank, int nranks, int *parent_out, int children_out[2],
                 int *nchildren_out)
{
    const bool mirror = nranks % 2 == 0;
    int parent;

    if (tree == 0) {
        alg_tree_vlinks(rank, nranks, parent_out, children_out, nchildren_out);
        return;
    }
    /* Both relabellings are their own inverse up to direction: map in, build, map out. */
    int pos = mirror ? nranks - 1 - rank : alg_mod(rank - 1, nranks);
    alg_tree_vlinks(pos, nranks, &parent, children_out, nchildren_out);
    *parent_out = parent < 0 ? -1 : mirror ? nranks - 1 - parent : alg_mod(parent + 1, nranks);
    for (int k = 0; k < *nchildren_out; k++) {
        int p = children_out[k];
        children_out[k] = mirror ? nranks - 1 - p : alg_mod(p + 1, nranks);
    }
}

ncclResult_t
alg_dbtree_allreduce(const struct alg_args *args, struct alg_sched *sched)
{
    const size_t count = args->count;
    int parent[2], child[2][2], nchild[2];
    size_t half_first[2], half_len[2];

    if (count == 0) {
        return alg_sched_finish(sched);
    }
    if (args->nranks == 1) {
        return alg_reduce_alone(args, sched);
    }
    for (int t = 0; t < 2; t++) {
        alg_dbtree_links(t, args->rank, args->nranks, &parent[t], child[t], &nchild[t]);
        alg_block(count, 2, t, &half_first[t], &half_len[t]);
    }

    /* Both halves use half 0's chunk count (it is the larger); half 1 may have empty chunks,
     * which every rank skips alike. */
    const int nchunks = alg_tree_nchunks(args, half_len[0]);
    const size_t chunk_bytes =
        alg_bytes(args, (half_len[0] + (size_t)nchunks - 1) / (size_t)nchunks);
    int slots = args->slots > 0 ? args->slots : 1;
    slots = slots < nchunks ? slots : nchunks;
    const size_t tree_base[2] = {0, (size_t)slots * (size_t)nchild[0] * chunk_bytes};
    sched->scratch_bytes = (size_t)slots * (size_t)(nchild[0] + nchild[1]) * chunk_bytes;

    /* group_free[t * slots + g]: the last reduction that read tree t's slot group g. */
    int *group_free = malloc(2 * (size_t)slots * sizeof(int));
    if (group_free == NULL) {
        sched->out_of_memory = true;
        return alg_sched_finish(sched);
    }
    for (int i = 0; i < 2 * slots; i++) {
        group_free[i] = -1;
    }
    for (int c = 0; c < nchunks; c++) {
        for (int t = 0; t < 2; t++) {
            struct alg_range own =
                alg_tree_chunk(args, ALG_BUF_SEND, half_first[t], half_len[t], c, nchunks);
            struct alg_range out =
                alg_tree_chunk(args, ALG_BUF_RECV, half_first[t], half_len[t], c, nchunks);
            const bool is_root = parent[t] < 0;
            int *free_g = &group_free[t * slots + c % slots];
            int rx[2] = {-1, -1}, last = -1, fin;
            struct alg_range in[2];

            if (own.len == 0) {
                continue;
            }
            for (int k = 0; k < nchild[t]; k++) {
                size_t off = tree_base[t] + ((size_t)(c % slots) * nchild[t] + k) * chunk_bytes;
                in[k] = alg_range_make(ALG_BUF_SCRATCH, off, own.len);
                rx[k] = alg_recv(sched, child[t][k], in[k], *free_g, -1);
            }
            struct alg_range up = own;
            if (nchild[t] > 0) {
                unsigned post = is_root && nchild[t] == 1 ? ALG_POST : 0;
                last = alg_reduce(sched, out, own, in[0], ALG_PRE_A | post, rx[0], -1, -1);
                if (nchild[t] == 2) {
                    last = alg_reduce(sched, out, out, in[1], is_root ? ALG_POST : 0, last,
                                      rx[1], -1);
                }
                *free_g = last;
                up = out;
            } else if (args->prescale) {
                last = alg_copy(sched, out, own, ALG_PRE_A, -1, -1);
                up = out;
            }
            if (is_root) {
                fin = last;
            } else {
                int tx = alg_send(sched, parent[t], up, last, -1);
                fin = alg_recv(sched, parent[t], out, tx, -1);
            }
            for (int k = 0; k < nchild[t]; k++) {
                alg_send(sched, child[t][k], out, fin, -1);
            }
        }
    }
    free(group_free);
    return alg_sched_finish(sched);
}

size_t
alg_dbtree_allreduce_bytes(const struct alg_args *args)
{
    size_t bytes = 0;

    if (args->nranks == 1) {
        return 0;
    }
    for (int t = 0; t < 2; t++) {
        int parent, child[2], nchild;
        size_t first, len;
        alg_dbtree_links(t, args->rank, args->nranks, &parent, child, &nchild);
        alg_block(args->count, 2, t, &first, &len);
        bytes += alg_bytes(args, len) * (size_t)(nchild + (parent >= 0 ? 1 : 0));
    }
    return bytes;
}

/* 2 depth + nchunks - 1 stages. Per chunk index a rank sends four chunks of a half (up and
 * twice down in the tree where it is interior, up in the other) and receives four, and
 * reduces two (where it is interior). */
void
alg_dbtree_allreduce_cost(const struct alg_args *args, struct alg_cost *cost_out)
{
    size_t first, half;
    alg_block(args->count, 2, 0, &first, &half);
    const int nchunks = alg_tree_nchunks(args, half);
    const int depth = alg_tree_depth(args->nranks);
    const double chunk = nchunks > 0 ? (double)alg_bytes(args, half) / nchunks : 0;
    const double stages = nchunks > 0 && depth > 0 ? 2 * depth + nchunks - 1 : 0;

    cost_out->steps = stages;
    cost_out->bytes = stages * chunk * 4;
    cost_out->reduce_bytes = stages * chunk * 2;
    cost_out->chunked = true;
}
