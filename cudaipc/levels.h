/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Ring and tree schedules between the GPUs of a device team, as levels (levels.c).
 *
 * With one rank per GPU (the usual layout), each GPU's leader runs its share of an operation
 * on its rank's own stream (ownstream.c). Direct parts do it in one level: every GPU reads its
 * part of every input over peer mappings. A ring or a tree does it in a sequence of levels:
 * at each level a GPU's kernel pulls a chunk from a neighbour's buffer (reducing it into its
 * own), after the neighbour finished the level that wrote it. So the schedules of the
 * algorithm table's families run between the GPUs, with no scratch: partial sums live in the
 * outputs, which the user's buffers provide.
 *
 *   ring all-reduce  reduce-scatter then all-gather around the ring of ranks, n - 1 levels
 *                    each; chunk (g - s - 1) mod n at reduce-scatter level s, GPU g adding
 *                    its input to the partial its predecessor left in its output
 *   ring all-gather  n - 1 levels: block (g - t - 1) mod n from the predecessor
 *   chain broadcast  the ring from the root, pipelined in up to 8 chunks
 *   tree broadcast   down the binary tree of tree.h rooted at the root, pipelined the same way
 *   tree all-reduce  up the tree rooted at rank 0 (each node adds its children's partials to
 *                    its input, in its output), then down it; pipelined the same way
 *
 * A level waits (deps) for levels of other GPUs: those that wrote what it reads, and, where
 * it overwrites what another GPU reads (an all-reduce's partials, in-place inputs), those
 * that read it. Every dep names a lower level, and every GPU runs its levels in order, so
 * the waits cannot form a cycle. Every other collective has no ring or tree here (reduce and
 * reduce-scatter would need scratch on the GPUs): direct parts, which move what those do.
 *
 * Units: elements for reductions, bytes for copies (elem_size 1).
 */
#ifndef CIPC_LEVELS_H
#define CIPC_LEVELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nccl.h>

#include "algorithms/alg.h"

/* The most levels of one GPU's schedule (a kr_dev_from launch and a wait each). */
#define CIPC_MAX_LEVELS 32
#define CIPC_LEVEL_TASKS 48
#define CIPC_LEVEL_DEPS 96
/* Pipeline chunks of the chain and the trees, at most, and the least bytes of one. */
#define CIPC_LEVEL_CHUNKS 8
#define CIPC_LEVEL_CHUNK_BYTES ((size_t)1 << 20)

/* How a device team's GPUs share an operation. */
enum cipc_algo {
    CIPC_ALGO_DIRECT, /* one level: direct parts (tasks.h) */
    CIPC_ALGO_RING,
    CIPC_ALGO_TREE,
    CIPC_ALGOS
};

enum cipc_lbuf { CIPC_LSEND, CIPC_LRECV };

/* A place in one rank's buffer. */
struct cipc_lref {
    int8_t rank;
    uint8_t buf;  /* enum cipc_lbuf */
    uint8_t pre;  /* as an operand: the rank's own input, which takes its PreMulSum scalar */
    uint64_t off; /* units from the buffer's first */
};

/* dst = src[0] op src[1] op ... (a copy: one operand), count units, at one level. */
struct cipc_ltask {
    uint8_t level;
    uint8_t nsrc;
    uint8_t post; /* the element's last reduction: SumPostDiv's divide */
    struct cipc_lref src[3];
    struct cipc_lref dst;
    uint64_t count;
};

/* Level `level` of this GPU waits until `rank`'s GPU has run its level `done`. */
struct cipc_ldep {
    uint8_t level;
    int8_t rank;
    uint8_t done;
};

/* One GPU's schedule: tasks and deps in ascending level. */
struct cipc_levels {
    int nlevels;
    int ntasks;
    struct cipc_ltask tasks[CIPC_LEVEL_TASKS];
    int ndeps;
    struct cipc_ldep deps[CIPC_LEVEL_DEPS];
};

/* Whether algo has a schedule here for coll (DIRECT: every collective). */
bool cipc_levels_serve(enum cipc_algo algo, enum alg_coll coll);
/* The schedule of rank's GPU (one rank per GPU, n of them) for coll of count units of
 * elem_size bytes each (copies: bytes, elem_size 1) rooted at root, under algo, which must
 * serve coll, with n >= 2. ncclInternalError with a WARN where it does not fit. */
ncclResult_t cipc_levels_build(enum cipc_algo algo, enum alg_coll coll, size_t count,
                               size_t elem_size, int n, int rank, int root,
                               struct cipc_levels *out);
/* Its number of levels (what the rank's stream enqueues), 1 for DIRECT. */
int cipc_levels_count(enum cipc_algo algo, enum alg_coll coll, size_t count, size_t elem_size,
                      int n, int rank, int root);
/* The most levels any GPU runs (what the cost model counts). */
int cipc_levels_most(enum cipc_algo algo, enum alg_coll coll, size_t count, size_t elem_size,
                     int n);
/* The schedule for coll of count units of elem_size bytes (as above) over n GPUs, one rank
 * each: among those the policy allows (DIRECT where NCCL_ALGO and NCCLSHIM_ALGO leave coll
 * alone, RING and TREE where they allow a row of that family) and serve coll, the one whose
 * levels and busiest GPU's bytes cost least; DIRECT where none does. */
enum cipc_algo cipc_algo_choose(const struct alg_policy *policy, enum alg_coll coll,
                                size_t count, size_t elem_size, int n);
/* The units a schedule counts an operation of count elements of type in: elements for
 * reductions, bytes for copies. */
void cipc_levels_units(enum alg_coll coll, size_t count, ncclDataType_t type, size_t *units_out,
                       size_t *unit_bytes_out);
/* NCCL_ALGO's name of a family ("ring", "tree"), or "direct". */
const char *cipc_algo_name(enum cipc_algo algo);

/* What the GPUs' schedules share, direct parts and levels alike. */
/* Whether coll reduces (all-reduce, reduce, reduce-scatter): a reduction kernel; else copies. */
bool cipc_reduces(enum alg_coll coll);
/* Elements [*lo, *hi) of part `part` of `nparts` of count elements of elem_size bytes: equal
 * runs of 256-byte granules (vector loads stay aligned, GPUs write apart). */
void cipc_part_range(size_t count, size_t elem_size, int part, int nparts, size_t *lo,
                     size_t *hi);

#endif
