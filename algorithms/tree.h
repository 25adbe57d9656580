/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Binary-tree rank math shared by the tree builders (tree.c, tree_scatter.c) and the double
 * binary tree (dbtree.c), the chunking helpers their pipelines use, and the reduce up a tree
 * that tree.c and hier_tree.c share. Pure functions; the drawings and the layout's definition
 * are in tree.c.
 */
#ifndef ALG_TREE_H
#define ALG_TREE_H

#include "alg.h"

/* Links of position v in the in-order binary tree over positions 0..n-1 rooted at 0 (no
 * rotation). *parent_out is -1 at the root; children_out[0..*nchildren_out) hold the children,
 * lower position first, and unused entries are -1. Requires 0 <= v < n. */
void alg_tree_vlinks(int v, int n, int *parent_out, int children_out[2], int *nchildren_out);

/* The subtree of position v is the contiguous position range [*first_out, *first_out +
 * *size_out); v itself lies inside it, not necessarily first. */
void alg_tree_vrange(int v, int n, int *first_out, int *size_out);

/* Links of real rank `rank` in the tree rooted at `root`: position v = (rank - root) mod n,
 * real rank = (v + root) mod n. Outputs are real ranks, as for alg_tree_vlinks. */
void alg_tree_links(int rank, int nranks, int root, int *parent_out, int children_out[2],
                    int *nchildren_out);

/* The most children a rank has in any tree reduce_up serves (hier_tree.c: two hosts and a
 * host mate). */
#define ALG_TREE_MAX_CHILDREN 3

/* The pipelined reduce up a tree (tree.c's, and hier_tree.c's over its tree of hosts): this
 * rank's parent (-1 at the root) and its nchild <= ALG_TREE_MAX_CHILDREN children. Requires
 * count > 0 and a root with a child. */
ncclResult_t alg_tree_reduce_up(const struct alg_args *args, struct alg_sched *sched, int parent,
                                const int *children, int nchild);

/* Longest root-to-leaf path, in edges: ceil(log2 n), 0 for n = 1. */
int alg_tree_depth(int nranks);

/* Links of `rank` in tree 0 or 1 of the double binary tree (dbtree.c): real ranks, parent -1
 * at that tree's root. */
void alg_dbtree_links(int tree, int rank, int nranks, int *parent_out, int children_out[2],
                      int *nchildren_out);

/* Pipeline chunks for `elems` elements: enough that none exceeds chunk_bytes (at least one
 * element each); 0 for no elements. */
static inline int
alg_tree_nchunks(const struct alg_args *args, size_t elems)
{
    size_t chunk = args->chunk_bytes / args->elem_size;

    chunk = chunk > 0 ? chunk : 1;
    return (int)((elems + chunk - 1) / chunk);
}

/* Chunk c of nchunks of elements [first, first + elems), as a byte range of buf. */
static inline struct alg_range
alg_tree_chunk(const struct alg_args *args, enum alg_buf buf, size_t first, size_t elems,
               int c, int nchunks)
{
    size_t chunk_first, chunk_len;

    alg_block(elems, nchunks, c, &chunk_first, &chunk_len);
    return alg_range_make(buf, (first + chunk_first) * args->elem_size,
                          chunk_len * args->elem_size);
}

#endif
