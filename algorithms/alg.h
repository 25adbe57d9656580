/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Schedules: what an algorithm produces. A builder is a pure function from (collective, count,
 * element size, rank, nranks, root, in-place, chunk) to an ordered list of steps: send a byte
 * range to a peer, receive a byte range from a peer, reduce two ranges into a third, copy.
 * Each step names the earlier steps it waits for. No I/O, no UCX, no CUDA: the executor
 * (engine/exec.c) runs schedules on the transport and kernels, and tests run them in
 * memory.
 *
 * Message matching is positional: the k-th send from rank a to rank b in a's schedule pairs
 * with the k-th receive from a in b's schedule, and both must have the same length. Builders
 * keep that order; the executor numbers messages that way to form tags.
 */
#ifndef ALG_ALG_H
#define ALG_ALG_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The buffers a step may address. SCRATCH is allocated by the executor, sched->scratch_bytes. */
enum alg_buf {
    ALG_BUF_SEND,
    ALG_BUF_RECV,
    ALG_BUF_SCRATCH,
    ALG_BUF_COUNT
};

struct alg_range {
    uint8_t buf; /* enum alg_buf */
    size_t off;  /* bytes */
    size_t len;  /* bytes */
};

enum alg_step_kind {
    ALG_STEP_SEND,   /* src[0] -> peer */
    ALG_STEP_RECV,   /* peer -> dst */
    ALG_STEP_REDUCE, /* dst = src[0] op src[1] */
    ALG_STEP_COPY,   /* dst = src[0], with the op's pre/post when flagged */
};

/* Reduce/copy flags: which operands are this rank's own raw input (the op's pre-multiply
 * applies; each rank scales only its own input, with its own scalar) and whether this is an
 * element's last reduction (the op's post-divide applies). */
enum alg_flags {
    ALG_PRE_A = 1u << 0,
    ALG_PRE_B = 1u << 1,
    ALG_POST = 1u << 2,
};

#define ALG_MAX_DEPS 3

struct alg_step {
    uint8_t kind; /* enum alg_step_kind */
    uint8_t flags;
    uint8_t ndeps;
    int peer;
    struct alg_range dst;
    struct alg_range src[2];
    int deps[ALG_MAX_DEPS];
};

struct alg_sched {
    struct alg_step *steps;
    int nsteps;
    int capacity;
    size_t scratch_bytes;
    bool out_of_memory; /* sticky: builders append unchecked, alg_sched_finish reports it */
};

/*
 * The collectives a schedule can serve, with NCCL's buffer layouts. `count` is the count the
 * NCCL call takes, E the element size, n the number of ranks. SEND and RECV are the user's
 * buffers; a buffer a rank does not use may be NULL and must not be touched.
 *   ALLREDUCE      SEND count, RECV count. In place: SEND == RECV.
 *   BROADCAST      SEND count at the root only, RECV count everywhere. In place: at the root.
 *   REDUCE         SEND count everywhere, RECV count at the root only.
 *   ALLGATHER      SEND count, RECV n*count (rank i's block at i*count).
 *                  In place: SEND == RECV + rank*count.
 *   REDUCESCATTER  SEND n*count (block i goes to rank i), RECV count.
 *                  In place: RECV == SEND + rank*count.
 *   ALLTOALL       SEND n*count (block j goes to rank j), RECV n*count (block i from rank i).
 *                  In place: SEND == RECV (each block is overwritten by the one coming back).
 *   GATHER         SEND count everywhere, RECV n*count at the root only.
 *                  In place: at the root, SEND == RECV + root*count.
 *   SCATTER        SEND n*count at the root only, RECV count everywhere.
 *                  In place: at the root, RECV == SEND + root*count.
 *   SEND, RECV     one message of count elements to / from `root` (the peer).
 *   BARRIER        internal: no data; every rank waits for every other.
 * In place, SEND and RECV ranges alias as stated; a copy whose source and destination are the
 * same address is skipped by the executor, so builders may emit "copy own block" uniformly.
 */
enum alg_coll {
    ALG_COLL_ALLREDUCE,
    ALG_COLL_BROADCAST,
    ALG_COLL_REDUCE,
    ALG_COLL_ALLGATHER,
    ALG_COLL_REDUCESCATTER,
    ALG_COLL_ALLTOALL,
    ALG_COLL_GATHER,
    ALG_COLL_SCATTER,
    ALG_COLL_SEND,
    ALG_COLL_RECV,
    ALG_COLL_BARRIER,
    ALG_COLL_COUNT
};

/* Which ranks share a host, for the schedules that keep traffic inside a host where they can:
 * host_of[r] in [0, nhosts), hosts numbered in the order of their lowest rank; widest and
 * narrowest count the ranks of the fullest and emptiest host. */
struct alg_hosts {
    int nhosts;
    int widest;
    int narrowest;
    int block; /* B where host h holds ranks h*B .. h*B+B-1 (equal runs in rank order), else 0 */
    const int *host_of;
};

/* What a builder sees of an operation. */
struct alg_args {
    enum alg_coll coll;
    size_t count;      /* elements, as the NCCL call counts them */
    size_t elem_size;  /* bytes per element */
    int rank;
    int nranks;
    int root;
    bool in_place;
    size_t chunk_bytes; /* pipeline chunk; builders round it to whole elements */
    size_t chunk_min_bytes; /* the smallest chunk alg_select_chunk may choose; 0: 4 KiB */
    int slots;          /* scratch chunks a rank may receive ahead of its reductions: a hint;
                           a builder raises it to what it needs to stay free of deadlock */
    bool prescale;      /* the op pre-multiplies inputs (PreMulSum, float Avg): raw input must
                           be scaled by its owner before it is sent */
    const struct alg_hosts *hosts; /* NULL: every rank on one host (or nothing known) */
};

/* alg_hosts.block of a layout (hosts.c): B where host h holds ranks h*B .. h*B+B-1 for every
 * h, else 0. */
int alg_hosts_block(const int *host_of, int nranks, int nhosts);

/* Whether args' ranks run on more than one host. */
static inline bool
alg_hosts_span(const struct alg_args *args)
{
    return args->hosts != NULL && args->hosts->nhosts > 1;
}

typedef ncclResult_t (*alg_builder_t)(const struct alg_args *args, struct alg_sched *sched);

/* Schedule building. Each append returns the new step's index; deps of -1 mean "none".
 * Allocation failure is remembered and reported by alg_sched_finish. */
void alg_sched_init(struct alg_sched *sched);
void alg_sched_free(struct alg_sched *sched);
/* Empties a schedule for the next build, keeping its steps' storage. */
void alg_sched_reset(struct alg_sched *sched);
ncclResult_t alg_sched_finish(struct alg_sched *sched);

int alg_send(struct alg_sched *sched, int peer, struct alg_range src, int dep0, int dep1);
int alg_recv(struct alg_sched *sched, int peer, struct alg_range dst, int dep0, int dep1);
int alg_reduce(struct alg_sched *sched, struct alg_range dst, struct alg_range a,
               struct alg_range b, unsigned flags, int dep0, int dep1, int dep2);
int alg_copy(struct alg_sched *sched, struct alg_range dst, struct alg_range src,
             unsigned flags, int dep0, int dep1);

static inline struct alg_range
alg_range_make(enum alg_buf buf, size_t off, size_t len)
{
    struct alg_range r = {(uint8_t)buf, off, len};
    return r;
}

/*
 * Scratch for pipelined reductions: `count` slots of `bytes`, taken in turn by the receives
 * of alg_recv_reduce, so that scratch stays bounded however many pieces a schedule has. A
 * receive into a slot waits for the reduction that last read it.
 */
struct alg_slots {
    int count;
    size_t base;         /* where in SCRATCH the first slot starts: 0 unless set */
    size_t bytes;        /* of one slot */
    int *user;           /* per slot: the reduction that last read it, -1 for none */
    unsigned long taken; /* receives so far: the next one takes slot taken % count */
};

/* count slots (one if count < 1) of `bytes` each, none read yet; the builder sets
 * sched->scratch_bytes. false, the schedule marked out of memory, if the bookkeeping cannot
 * be allocated. alg_slots_free frees it. */
bool alg_slots_init(struct alg_slots *slots, struct alg_sched *sched, int count, size_t bytes);
void alg_slots_free(struct alg_slots *slots);
/* Takes the next slot for len bytes: its index (user[] holds the step that last used it, which
 * whatever writes the slot must wait for; set it to the new last user) and *range_out. */
int alg_slot_take(struct alg_slots *slots, size_t len, struct alg_range *range_out);
/* Receives dst.len bytes from peer into the next slot, then dst = a op slot with `flags`,
 * waiting for the receive, dep0 and dep1. Returns the reduction. */
int alg_recv_reduce(struct alg_sched *sched, struct alg_slots *slots, int peer,
                    struct alg_range dst, struct alg_range a, unsigned flags, int dep0, int dep1);

/* The whole schedule of a reduction on a single rank: RECV = SEND over args->count elements
 * (> 0), pre-multiplied and post-divided as the op asks. */
ncclResult_t alg_reduce_alone(const struct alg_args *args, struct alg_sched *sched);

/* Splits `count` elements into n blocks as evenly as possible: the first count % n blocks
 * hold one extra element. Block i starts at element *first_out and holds *len_out. */
static inline void
alg_block(size_t count, int n, int i, size_t *first_out, size_t *len_out)
{
    size_t base = count / (size_t)n, extra = count % (size_t)n, idx = (size_t)i;
    *first_out = idx * base + (idx < extra ? idx : extra);
    *len_out = base + (idx < extra ? 1 : 0);
}

/* The chunks that `elems` elements cut into so that each holds at most args->chunk_bytes and
 * at least one element. */
static inline int
alg_nchunks(const struct alg_args *args, size_t elems)
{
    size_t chunk_elems = args->chunk_bytes / args->elem_size;

    chunk_elems = chunk_elems > 0 ? chunk_elems : 1;
    return (int)((elems + chunk_elems - 1) / chunk_elems);
}

/* Non-negative modulo, for rank arithmetic around a ring. */
static inline int
alg_mod(int a, int n)
{
    int r = a % n;
    return r < 0 ? r + n : r;
}

struct alg_cost;

/* Builders, one per (algorithm, collective), and each row's traffic and cost. */
#define ALG_DECLARE(name)                                                                    \
    ncclResult_t alg_##name(const struct alg_args *args, struct alg_sched *sched);           \
    size_t alg_##name##_bytes(const struct alg_args *args);                                  \
    void alg_##name##_cost(const struct alg_args *args, struct alg_cost *cost_out)

ALG_DECLARE(ring_allreduce);         /* ring.c */
ALG_DECLARE(dissemination_barrier);  /* barrier.c */
ALG_DECLARE(ring_allgather);         /* ring_allgather.c */
ALG_DECLARE(ring_reducescatter);     /* ring_reducescatter.c */
ALG_DECLARE(chain_broadcast);        /* chain.c: pipelined chain rooted anywhere */
ALG_DECLARE(chain_reduce);           /* chain.c */
ALG_DECLARE(tree_broadcast);         /* tree.c: binary tree, any root */
ALG_DECLARE(tree_reduce);            /* tree.c */
ALG_DECLARE(tree_scatter);           /* tree.c: one message per subtree */
ALG_DECLARE(tree_gather);            /* tree.c */
ALG_DECLARE(dbtree_allreduce);       /* dbtree.c: NCCL's double binary tree */
ALG_DECLARE(recdbl_allreduce);       /* recdbl.c: recursive doubling */
ALG_DECLARE(recdbl_allgather);       /* recdbl.c */
ALG_DECLARE(rabenseifner_allreduce); /* rabenseifner.c: halving-doubling */
ALG_DECLARE(bruck_allgather);        /* bruck.c */
ALG_DECLARE(pairwise_alltoall);      /* pairwise.c */
ALG_DECLARE(direct_scatter);         /* direct.c: root talks to every rank */
ALG_DECLARE(direct_gather);          /* direct.c */
ALG_DECLARE(direct_send);            /* direct.c: ncclSend, one message */
ALG_DECLARE(direct_recv);            /* direct.c: ncclRecv */
ALG_DECLARE(hier_allreduce);         /* hier.c: inside each host, then between hosts */
ALG_DECLARE(hier_allgather);         /* hier_allgather.c */
ALG_DECLARE(hier_reducescatter);     /* hier_reducescatter.c */
ALG_DECLARE(hier_broadcast);         /* hier_tree.c: a tree of hosts, chains inside */
ALG_DECLARE(hier_reduce);            /* hier_tree.c */
ALG_DECLARE(hier_scatter);           /* hier_scatter.c: a message per host, then inside */
ALG_DECLARE(hier_gather);            /* hier_scatter.c */
ALG_DECLARE(hier_alltoall);          /* hier_alltoall.c: a message per host, handed on */

/* For communicator management (direct.c): every member sends SEND[0, bytes) to each other
 * member and receives member i's into RECV[i * bytes, (i + 1) * bytes). Members are ranks of
 * the communicator the schedule runs on (members == NULL: all nmembers ranks); we are
 * member `me`. Our own block is not copied. */
void alg_exchange_all(struct alg_sched *sched, const int *members, int nmembers, int me,
                      size_t bytes);

/* The bytes of element range [first, first + len) of count elements, for builders. */
static inline size_t
alg_bytes(const struct alg_args *args, size_t elems)
{
    return elems * args->elem_size;
}

/* What an algorithm costs one rank, for the cost model: messages in sequence on its critical
 * path, bytes it sends (or receives, whichever is on the critical path), and bytes it
 * reduces; of the messages and bytes, those between hosts apart (net_). Estimated time =
 * steps * alpha + bytes * beta + net_steps * alpha_net + net_bytes * beta_net +
 * reduce_bytes * gamma. A row that does not know hosts leaves net_ at 0; where its ranks
 * span hosts the model then charges all its messages at the network's price. */
struct alg_cost {
    double steps;
    double bytes;
    double reduce_bytes;
    double net_steps;
    double net_bytes;
    /* The steps count chunk times (a pipeline's fill and drain), so the cost depends on
     * args->chunk_bytes: alg_select_chunk weighs such a row at each chunk size. */
    bool chunked;
};

/* One row of the algorithm table (select.c). */
struct alg_algorithm {
    const char *name;  /* what NCCLSHIM_ALGO names; lower case */
    const char *nccl;  /* the NCCL_ALGO family it answers to: "ring" or "tree" */
    enum alg_coll coll;
    alg_builder_t build;
    /* The textbook number of bytes this rank sends for args; the simulator checks every
     * schedule against it. */
    size_t (*bytes_sent)(const struct alg_args *args);
    void (*cost)(const struct alg_args *args, struct alg_cost *cost_out);
    bool host_aware; /* its cost tells the messages between hosts apart (net_) */
};

/* Which rows the user allows, per collective (a bit per table row), from NCCL_ALGO and
 * NCCLSHIM_ALGO (policy.c). A filter that leaves a collective with no row is ignored for that
 * collective, so NCCLSHIM_ALGO=bruck still lets all-reduce run. */
struct alg_policy {
    uint64_t allowed[ALG_COLL_COUNT];
};

/* The machine's costs: seconds per message, per byte moved, per byte reduced; per message
 * and byte between hosts. */
struct alg_cost_params {
    double alpha;
    double beta;
    double gamma;
    double alpha_net;
    double beta_net;
};

/* Parses NCCL_ALGO (families: "Ring", "Tree,Ring", "^Tree", "allreduce:tree;broadcast:ring")
 * and NCCLSHIM_ALGO (the same syntax over our row names: "rabenseifner",
 * "allgather:bruck;^recdbl"); either may be NULL. Names are case-insensitive; NCCL algorithm
 * names we do not have (NVLS, CollNet, PAT, ...) are ignored. ncclInvalidArgument with a WARN
 * for a collective or algorithm name that means nothing. */
ncclResult_t alg_policy_parse(const char *nccl_algo, const char *shim_algo,
                              struct alg_policy *policy_out);

/* For choices outside the table (a device team's schedules between GPUs, cudaipc/levels.h):
 * whether some row of coll that the policy allows is of NCCL_ALGO family `family` ("ring",
 * "tree"); whether it allows every row of coll (neither variable filters it). */
bool alg_policy_allows_family(const struct alg_policy *policy, enum alg_coll coll,
                              const char *family);
bool alg_policy_unfiltered(const struct alg_policy *policy, enum alg_coll coll);

/* The allowed row for args->coll with the least estimated time, or NULL if none serves it.
 * *estimate_out (may be NULL) gets its estimated seconds. */
const struct alg_algorithm *alg_select(const struct alg_args *args,
                                       const struct alg_policy *policy,
                                       const struct alg_cost_params *params,
                                       double *estimate_out);
/* The pipeline chunk for algorithm alg on args: the classic optimum sqrt((steps - 1) beta B /
 * alpha) chunks, clamped to [4 KiB, args->chunk_bytes], so small messages are not cut up
 * and large ones keep every link busy; for a row whose cost counts its chunks (chunked), the
 * size from args->chunk_bytes down, halving, that the model weighs least. */
size_t alg_select_chunk(const struct alg_algorithm *alg, const struct alg_args *args,
                        const struct alg_cost_params *params);
/* The table, for tests that iterate every algorithm. */
const struct alg_algorithm *alg_table(int *count_out);

#endif
