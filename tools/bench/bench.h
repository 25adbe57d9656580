/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The nccl-tests compatible benchmark: what a collective file provides (struct bench_coll),
 * what the harness hands it (struct bench_ctx), and the data generator both use (data.c).
 *
 * One binary, nccl_perf, runs the collective its name asks for (all_reduce_perf,
 * all_gather_perf, ... are symlinks to it) or the one given by --coll. harness.c owns the
 * command line, the ranks, the buffers, the timing and the output; a collective file such as
 * all_reduce.c only says how many elements a size means, how its inputs are filled, what it
 * must produce, how bandwidth is counted, and which NCCL call runs it. Adding a collective
 * is one file and one row in the table at the top of harness.c.
 */

#ifndef NCCLSHIM_BENCH_H
#define NCCLSHIM_BENCH_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Reductions in nccl-tests' order and spelling (-o); NONE is for collectives that move data. */
enum bench_op {
    BENCH_OP_SUM,
    BENCH_OP_PROD,
    BENCH_OP_MAX,
    BENCH_OP_MIN,
    BENCH_OP_AVG,
    BENCH_OP_MULSUM, /* ncclRedOpCreatePreMulSum with 1 on even ranks and 2 on odd ones */
    BENCH_OP_COUNT,
    BENCH_OP_NONE = BENCH_OP_COUNT,
};

/* A data type as nccl-tests names it (-d). */
struct bench_type {
    ncclDataType_t type;
    const char *name;
    size_t size;
};

/* Every type in the order of `-d all`. */
extern const struct bench_type bench_types[];
extern const int bench_ntypes;

/* The type called name (nccl-tests' spelling), or NULL. */
const struct bench_type *bench_type_find(const char *name);

/*
 * The values of one (type, reduction, rank count): a pure function of (rank, element index),
 * small integers whose exact result is representable in the type whatever order the
 * reduction runs in (see data.c). Filled by bench_data_init; holds no pointers.
 */
struct bench_data {
    ncclDataType_t type;
    enum bench_op op;
    int nranks;
    size_t size;        /* bytes per element */
    int kind;           /* data.c's DATA_KIND_*: signed, unsigned or floating */
    int mode;           /* data.c's DATA_MODE_*: how values are drawn */
    int64_t lo, hi;     /* range of drawn values */
    int slots;          /* picked values: at most this many ranks put in hi per element */
    int table_span;     /* half, bfloat16, fp8: encodings of -span..span are tabulated */
    uint16_t table[2 * 2048 + 1];
};

/* Prepares the generator for type, op (BENCH_OP_NONE for data movement) and nranks. */
void bench_data_init(struct bench_data *data, ncclDataType_t type, enum bench_op op,
                     int nranks);

/* Writes rank's inputs for elements index0 .. index0 + count - 1 to buf. */
void bench_data_fill(const struct bench_data *data, void *buf, size_t count, int rank,
                     size_t index0);

/* Writes the reduction over all ranks of elements index0 .. index0 + count - 1 to buf. */
void bench_data_reduce(const struct bench_data *data, void *buf, size_t count, size_t index0);

/*
 * Counts the elements of got that differ from expected: bit for bit, except for avg on
 * floating types, where NCCL may scale before or after summing; that is allowed 3 units in
 * the last place, as nccl-tests allows avg a tolerance.
 */
int64_t bench_data_check(const struct bench_data *data, const void *got, const void *expected,
                         size_t count);

/* The PreMulSum scalar of rank, in the data type: 1 on even ranks, 2 on odd, as nccl-tests. */
void bench_data_scalar(const struct bench_data *data, int rank, uint64_t *scalar_out);

/* Element counts of one test size, per rank, as nccl-tests' getCollByteCount. */
struct bench_counts {
    size_t send;         /* elements the send buffer holds */
    size_t recv;         /* elements the receive buffer holds */
    size_t param;        /* the count argument of the NCCL call */
    size_t send_inplace; /* in place, the input is at recvbuf + rank * send_inplace */
    size_t recv_inplace; /* in place, the output is at recvbuf + rank * recv_inplace */
};

/* What a collective's functions see: one rank, one size, one type and op. Owned by harness. */
struct bench_ctx {
    int rank;
    int nranks;
    int root;                       /* -1 for collectives without a root */
    ncclComm_t comm;
    cudaStream_t stream;            /* NULL: buffers are host memory */
    ncclDataType_t type;
    ncclRedOp_t op;                 /* built in, or the PreMulSum op made for mulsum */
    struct bench_counts counts;     /* for the size being measured */
    const struct bench_data *data;  /* the generator for (type, op, nranks) */
};

/* One collective; a file defines one of these and nothing else that is not static. */
struct bench_coll {
    const char *name;  /* "all_reduce": run as all_reduce_perf, or with --coll all_reduce */
    bool reduces;      /* takes -o; else the redop column reads "none" */
    bool rooted;       /* takes -r; else the root column reads -1 */
    /* In place is timed but not checked (#wrong reads N/A), as nccl-tests does for sendrecv:
     * sending and receiving through one buffer races by definition. */
    bool in_place_unchecked;
    /* Element counts for a size of count elements (bytes / element size). */
    void (*counts)(size_t count, int nranks, struct bench_counts *out);
    /* algbw = alg_bytes / time and busbw = algbw * bus_factor, as nccl-tests' getBw. */
    double (*alg_bytes)(size_t count, size_t elt_size, int nranks);
    double (*bus_factor)(int nranks);
    /* Writes this rank's input (counts.send elements) to input. */
    void (*fill)(const struct bench_ctx *ctx, void *input);
    /* Writes what this rank's output must hold to expected; returns its element count. */
    size_t (*expect)(const struct bench_ctx *ctx, void *expected);
    /* Runs the collective once; host buffers, so it is complete when it returns. */
    ncclResult_t (*run)(const struct bench_ctx *ctx, const void *send, void *recv);
};

/* Shared descriptor pieces (shapes.c). One buffer of count elements; gathered (send a block,
 * receive n; in place at block `rank`) and scattered (send n blocks, receive one; in place
 * at block `rank`) shapes; bus factors 1 and (n-1)/n; each rank filling its own input. */
void bench_counts_one_buffer(size_t count, int nranks, struct bench_counts *out);
void bench_counts_gathered(size_t count, int nranks, struct bench_counts *out);
void bench_counts_scattered(size_t count, int nranks, struct bench_counts *out);
double bench_alg_bytes_one_buffer(size_t count, size_t elt_size, int nranks);
double bench_alg_bytes_per_rank(size_t count, size_t elt_size, int nranks);
double bench_bus_factor_one(int nranks);
double bench_bus_factor_ring(int nranks);
void bench_fill_own(const struct bench_ctx *ctx, void *input);

extern const struct bench_coll bench_all_reduce;
extern const struct bench_coll bench_all_gather;
extern const struct bench_coll bench_reduce_scatter;
extern const struct bench_coll bench_broadcast;
extern const struct bench_coll bench_reduce;
extern const struct bench_coll bench_alltoall;
extern const struct bench_coll bench_gather;
extern const struct bench_coll bench_scatter;
extern const struct bench_coll bench_sendrecv;

#endif /* NCCLSHIM_BENCH_H */
