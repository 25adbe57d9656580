/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclAllReduce through the real libnccl.so.2, on N ranks started by tools/launcher: every
 * datatype x every reduction (sum, prod, max, min, avg, and a PreMulSum made per call with
 * ncclRedOpCreatePreMulSum from a host-immediate scalar, then ncclRedOpDestroy) x counts
 * {0, 1, n-1, n+1, 1000, 65537, 2^20+3} x in place and out of place, each element checked
 * against a reference computed here.
 *
 * The data make every expected value exact whatever order the library reduces in, so the
 * check compares bytes. Element i of a case uses pattern hash(i) mod 251: rank r's input is
 * in[r][pattern], and the expected output ref[pattern], computed once per (type, op) from all
 * ranks' inputs. Hashing (not i mod 251) makes a block written at the wrong offset show.
 *   - sum, avg, PreMulSum on floating types: every rank's term (its input, or its input
 *     multiplied by its scalar and rounded to the type, as NCCL's pre-multiply does) is j/4
 *     for a small integer j chosen so that any partial sum over the ranks is representable
 *     (|j| <= 2^(p)/n with p the type's precision), so no sum ever rounds. For a pre-multiply
 *     the input is searched among the type's values near term/scalar. avg's scalar is NCCL's:
 *     1.0/n for double, else 1.0/n rounded to float and then to the type. Each rank's PreMulSum
 *     scalar differs: NCCL applies a rank's scalar to that rank's input only.
 *   - prod: +-1, +-2^(+-1) (floating) or +-1..3 (integers; +-1..2 in 8 bits) on the first six
 *     ranks, +-1 on the others, and now and then one 0: products are exact, never overflow.
 *   - max, min: any finite values of the whole type range (no NaN, no -0).
 *   - integers: sums bounded by the type's range; avg is the sum divided by n, truncated
 *     toward zero, as NCCL's integer average is.
 * Out of place, the send buffer must come back unchanged and the receive buffer is poisoned
 * first; in both, 64 bytes past the last element must stay untouched. Buffers start 0, 1 or 2
 * elements past an aligned address, so vector code meets unaligned data.
 *
 * Usage: allreduce [-q] [-m MAXCOUNT] [-u] [-v]. -q is the quick subset run under
 * AddressSanitizer (counts up to 65537, still several pipeline chunks); -m drops larger
 * counts; -u gives every rank the same PreMulSum scalar (to tell a scalar applied on the wrong
 * rank from other faults); -v prints every case. Rank 0 prints one summary line; the exit
 * status is 1 on this rank if any of its checks failed.
 */
#include "common.h"

#include <unistd.h>

enum ar_op { AR_SUM, AR_PROD, AR_MAX, AR_MIN, AR_AVG, AR_PREMULSUM, AR_NOPS };

static const char *const ar_op_names[AR_NOPS] = {"sum", "prod", "max", "min", "avg",
                                                 "premulsum"};
static const ncclRedOp_t ar_builtin_ops[AR_NOPS] = {ncclSum, ncclProd, ncclMax, ncclMin,
                                                    ncclAvg, ncclSum};

#define AR_NPAT 251      /* patterns per (type, op); prime */
#define AR_GUARD 64      /* bytes past the last element that must stay untouched */
#define AR_MAX_OFFSET 2  /* buffers start 0..2 elements past malloc's alignment */
#define AR_SHOW 3        /* wrong elements printed per case */
#define AR_Q 0.25        /* the quantum of floating sums */

/* Each rank's PreMulSum scalar: exact in every floating type, fp8 included. */
static const double ar_float_scalars[8] = {2, 0.5, -1, 1.5, 0.25, 3, -0.5, 1.25};
static const int ar_sint_scalars[8] = {2, -1, 3, 1, -2, 1, 2, -3};
static const int ar_uint_scalars[8] = {2, 1, 3, 1, 2, 1, 2, 3};

/* Everything one (type, op) pair needs: this rank's inputs and the expected outputs. */
struct ar_tables {
    ncclDataType_t type;
    enum ar_op op;
    size_t size;
    uint8_t in[AR_NPAT * 8];  /* this rank's input element per pattern */
    uint8_t ref[AR_NPAT * 8]; /* the expected output element per pattern */
    uint8_t scalar[8];        /* this rank's PreMulSum scalar, one element of type */
};

struct ar_run {
    struct mp_world world;
    bool quick;
    bool verbose;
    bool same_scalar; /* -u: every rank's PreMulSum scalar is rank 0's */
    size_t max_count;
    uint8_t *send_base;
    uint8_t *recv_base;
    int cases;
    int failed_cases;
};

/* --- integer data ------------------------------------------------------------------------- */

typedef __int128 ar_wide_t;

static ar_wide_t
ar_int_max(ncclDataType_t type)
{
    int bits = (int)mp_type_size(type) * 8;

    return mp_type_is_signed(type) ? ((ar_wide_t)1 << (bits - 1)) - 1
                                   : ((ar_wide_t)1 << bits) - 1;
}

static ar_wide_t
ar_int_scalar(ncclDataType_t type, int rank)
{
    return mp_type_is_signed(type) ? ar_sint_scalars[rank % 8] : ar_uint_scalars[rank % 8];
}

/* A value in [-bound, bound] (signed) or [0, bound] from the hash h. */
static ar_wide_t
ar_int_bounded(ncclDataType_t type, uint64_t h, ar_wide_t bound)
{
    if (mp_type_is_signed(type)) {
        return (ar_wide_t)(h % (uint64_t)(2 * bound + 1)) - bound;
    }
    return (ar_wide_t)((unsigned __int128)h % (unsigned __int128)(bound + 1));
}

static ar_wide_t
ar_int_input(ncclDataType_t type, enum ar_op op, int nranks, int rank, int pat, uint64_t h)
{
    ar_wide_t max = ar_int_max(type);

    switch (op) {
    case AR_SUM:
    case AR_AVG:
        return ar_int_bounded(type, h, max / nranks);
    case AR_PREMULSUM:
        return ar_int_bounded(type, h, max / (3 * nranks));
    case AR_PROD: {
        int kinds = mp_type_size(type) == 1 ? 2 : 3;
        ar_wide_t f = rank < 6 ? 1 + (ar_wide_t)(h % kinds) : 1;
        if (pat % 37 == 5 && rank == (pat / 37) % nranks) {
            return 0;
        }
        return mp_type_is_signed(type) && (h >> 20) & 1 ? -f : f;
    }
    default: { /* max, min: the whole range */
        uint8_t elem[8];
        mp_store_int(type, elem, h);
        uint64_t v = mp_load_int(type, elem);
        return mp_type_is_signed(type) ? (ar_wide_t)(int64_t)v : (ar_wide_t)v;
    }
    }
}

static void
ar_int_tables(struct ar_tables *tb, int nranks, int me, uint64_t seed, bool same_scalar)
{
    ncclDataType_t type = tb->type;

    for (int p = 0; p < AR_NPAT; p++) {
        ar_wide_t acc = 0;
        for (int r = 0; r < nranks; r++) {
            uint64_t h = mp_hash4(seed, (uint64_t)type << 8 | tb->op, (uint64_t)r, (uint64_t)p);
            ar_wide_t v = ar_int_input(type, tb->op, nranks, r, p, h);
            if (r == me) {
                mp_store_int(type, tb->in + p * tb->size, (uint64_t)v);
            }
            if (tb->op == AR_PREMULSUM) {
                v *= ar_int_scalar(type, same_scalar ? 0 : r);
            }
            if (r == 0) {
                acc = v;
            } else if (tb->op == AR_PROD) {
                acc *= v;
            } else if (tb->op == AR_MAX) {
                acc = v > acc ? v : acc;
            } else if (tb->op == AR_MIN) {
                acc = v < acc ? v : acc;
            } else {
                acc += v;
            }
        }
        if (tb->op == AR_AVG) {
            acc /= nranks; /* truncates toward zero, as NCCL's integer average does */
        }
        mp_store_int(type, tb->ref + p * tb->size, (uint64_t)acc);
    }
    mp_store_int(type, tb->scalar, (uint64_t)ar_int_scalar(type, same_scalar ? 0 : me));
}

/* --- floating data ------------------------------------------------------------------------ */

/* The largest |j| rank r's term j/4 may have so that the n terms always add up exactly in the
 * type: the sum stays within 2^precision quanta. With more ranks than that, the first
 * 2^precision ranks carry +-1 quantum and the others 0. */
static int
ar_float_term_bound(ncclDataType_t type, int nranks, int rank)
{
    int precision = mp_type_mant_bits(type) + 1;
    long cap = precision > 20 ? 1L << 20 : 1L << precision;

    if (cap < nranks) {
        return rank < cap ? 1 : 0;
    }
    return (int)(cap / nranks);
}

/* The value `steps` representable values away from x in magnitude (same sign). */
static double
ar_float_step(ncclDataType_t type, double x, int steps)
{
    size_t size = mp_type_size(type);
    uint64_t bits = 0;
    uint64_t sign = 1ull << (8 * size - 1);
    uint8_t elem[8];

    mp_store(type, elem, x);
    memcpy(&bits, elem, size);
    uint64_t mag = bits & ~sign;
    if (steps < 0 && mag < (uint64_t)-steps) {
        return NAN;
    }
    bits = (bits & sign) | (mag + (uint64_t)(int64_t)steps);
    memcpy(elem, &bits, size);
    return mp_load(type, elem);
}

/* An input x of `type` whose pre-multiply by s, rounded to the type, is t; false if none lies
 * near t / s. */
static bool
ar_float_premul_input(ncclDataType_t type, double s, double t, double *x_out)
{
    double x0 = mp_round(type, t / s);

    if (t == 0.0) {
        *x_out = 0.0;
        return true;
    }
    for (int k = 0; k <= 6; k++) {
        double x = ar_float_step(type, x0, k % 2 ? (k + 1) / 2 : -k / 2);
        if (isfinite(x) && x != 0.0 && mp_round(type, x * s) == t) {
            *x_out = x;
            return true;
        }
    }
    return false;
}

/* Any finite value of the type, not -0, from the hash h. */
static double
ar_float_any(ncclDataType_t type, uint64_t h)
{
    uint8_t elem[8];

    for (;;) {
        memcpy(elem, &h, sizeof(elem));
        double x = mp_load(type, elem);
        if (isfinite(x) && !(x == 0.0 && signbit(x))) {
            return x;
        }
        h = mp_hash(h);
    }
}

/* NCCL's ncclAvg scalar for floating types (hostToDevRedOp): 1.0/n for double; for the others
 * 1.0/n rounded to float, then to the type. */
static double
ar_float_avg_scalar(ncclDataType_t type, int nranks)
{
    if (type == ncclFloat64) {
        return 1.0 / nranks;
    }
    return mp_round(type, (double)(float)(1.0 / nranks));
}

/* Rank r's input x and the term it contributes to the reduction (x pre-multiplied, for avg
 * and PreMulSum). */
static void
ar_float_input(ncclDataType_t type, enum ar_op op, int nranks, int rank, int pat, uint64_t h,
               double scalar, double *x_out, double *term_out)
{
    int bound = ar_float_term_bound(type, nranks, rank);
    int j = (int)(h % (uint64_t)(2 * bound + 1)) - bound;
    switch (op) {
    case AR_SUM:
        *x_out = *term_out = j * AR_Q;
        return;
    case AR_PROD: {
        double f = rank < 6 ? ldexp(1.0, (int)(h % 3) - 1) : 1.0;
        if (pat % 37 == 5 && rank == (pat / 37) % nranks) {
            f = 0.0;
        }
        *x_out = *term_out = (h >> 20) & 1 ? -f : f;
        return;
    }
    case AR_MAX:
    case AR_MIN:
        *x_out = *term_out = ar_float_any(type, h);
        return;
    default: {
        double s = op == AR_AVG ? ar_float_avg_scalar(type, nranks) : scalar;
        /* From j toward 0 until an input exists (j = 0 always has one: x = 0). */
        for (;; j -= j > 0 ? 1 : -1) {
            if (ar_float_premul_input(type, s, j * AR_Q, x_out)) {
                *term_out = mp_round(type, *x_out * s);
                return;
            }
        }
    }
    }
}

static void
ar_float_tables(struct ar_tables *tb, int nranks, int me, uint64_t seed, bool same_scalar)
{
    ncclDataType_t type = tb->type;

    for (int p = 0; p < AR_NPAT; p++) {
        double acc = 0.0;
        for (int r = 0; r < nranks; r++) {
            uint64_t h = mp_hash4(seed, (uint64_t)type << 8 | tb->op, (uint64_t)r, (uint64_t)p);
            double x, term;
            ar_float_input(type, tb->op, nranks, r, p, h,
                           ar_float_scalars[same_scalar ? 0 : r % 8], &x, &term);
            if (r == me) {
                mp_store(type, tb->in + p * tb->size, x);
            }
            /* Starting from rank 0's term keeps the sign of an all -0 sum, as IEEE does. */
            if (r == 0) {
                acc = term;
            } else if (tb->op == AR_PROD) {
                acc *= term;
            } else if (tb->op == AR_MAX) {
                acc = term > acc ? term : acc;
            } else if (tb->op == AR_MIN) {
                acc = term < acc ? term : acc;
            } else {
                acc += term;
            }
        }
        MP_ASSERT(mp_round(type, acc) == acc || isnan(acc),
                  "reference %g is not exact in %s", acc, mp_type_name(type));
        mp_store(type, tb->ref + p * tb->size, acc);
    }
    mp_store(type, tb->scalar, ar_float_scalars[same_scalar ? 0 : me % 8]);
}

/* --- the cases ---------------------------------------------------------------------------- */

static inline int
ar_pattern(size_t i, uint64_t salt)
{
    return (int)(mp_hash(i ^ salt) % AR_NPAT);
}

static void
ar_fill(uint8_t *buf, size_t count, const struct ar_tables *tb, uint64_t salt)
{
    for (size_t i = 0; i < count; i++) {
        memcpy(buf + i * tb->size, tb->in + ar_pattern(i, salt) * tb->size, tb->size);
    }
}

/* Elements of buf[0..count) that differ from table[pattern]; the first few are printed. */
static long
ar_compare(const uint8_t *buf, size_t count, const uint8_t *table, const struct ar_tables *tb,
           uint64_t salt, const char *what, const char *name)
{
    long wrong = 0;

    for (size_t i = 0; i < count; i++) {
        const uint8_t *want = table + ar_pattern(i, salt) * tb->size;
        if (memcmp(buf + i * tb->size, want, tb->size) != 0 && wrong++ < AR_SHOW) {
            mp_report(__FILE__, __LINE__, "%s: %s element %zu: got %.9g, expected %.9g",
                      name, what, i, mp_load(tb->type, buf + i * tb->size),
                      mp_load(tb->type, want));
        }
    }
    return wrong;
}

static long
ar_guard_check(const uint8_t *guard, const char *what, const char *name)
{
    for (int i = 0; i < AR_GUARD; i++) {
        if (guard[i] != 0xee) {
            mp_report(__FILE__, __LINE__, "%s: %s written past its end (byte %d is 0x%02x)",
                      name, what, i, guard[i]);
            return 1;
        }
    }
    return 0;
}

/* One ncclAllReduce; returns true if every check passed. */
static bool
ar_case_run(struct ar_run *run, const struct ar_tables *tb, size_t count, bool in_place)
{
    ncclComm_t comm = run->world.comm;
    size_t size = tb->size;
    size_t bytes = count * size;
    uint64_t salt = mp_hash4(tb->type, tb->op, count, in_place);
    uint8_t *send = run->send_base + (size_t)(run->cases % (AR_MAX_OFFSET + 1)) * size;
    uint8_t *recv = in_place ? send
                             : run->recv_base + (size_t)((run->cases + 1) % (AR_MAX_OFFSET + 1))
                                                    * size;
    ncclRedOp_t op = ar_builtin_ops[tb->op];
    char name[96];
    long wrong = 0;

    snprintf(name, sizeof(name), "%s %s count %zu %s", mp_type_name(tb->type),
             ar_op_names[tb->op], count, in_place ? "in place" : "out of place");
    ar_fill(send, count, tb, salt);
    memset(send + bytes, 0xee, AR_GUARD);
    if (!in_place) {
        memset(recv, 0xcd, bytes);
        memset(recv + bytes, 0xee, AR_GUARD);
    }
    if (tb->op == AR_PREMULSUM) {
        /* Host-immediate: the library must have read the scalar before create returns. */
        uint8_t scalar[8];
        memcpy(scalar, tb->scalar, sizeof(scalar));
        MP_CHECK_COMM(comm, ncclRedOpCreatePreMulSum(&op, scalar, tb->type,
                                                     ncclScalarHostImmediate, comm));
        memset(scalar, 0x5a, sizeof(scalar));
        MP_EXPECT(op >= ncclNumOps, "%s: ncclRedOpCreatePreMulSum gave op %d, a built-in",
                  name, (int)op);
    }
    MP_CHECK_COMM(comm, ncclAllReduce(send, recv, count, tb->type, op, comm, NULL));
    if (tb->op == AR_PREMULSUM) {
        MP_CHECK_COMM(comm, ncclRedOpDestroy(op, comm));
    }

    wrong += ar_compare(recv, count, tb->ref, tb, salt, "result", name);
    wrong += ar_guard_check(recv + bytes, "receive buffer", name);
    if (!in_place) {
        wrong += ar_compare(send, count, tb->in, tb, salt, "send buffer changed:", name);
        wrong += ar_guard_check(send + bytes, "send buffer", name);
    }
    run->cases++;
    if (wrong > 0) {
        mp_report(__FILE__, __LINE__, "FAIL %s: %ld wrong", name, wrong);
        run->failed_cases++;
    } else if (run->verbose && run->world.rank == 0) {
        printf("ok %s\n", name);
    }
    return wrong == 0;
}

static void
ar_tables_build(struct ar_tables *tb, const struct ar_run *run, ncclDataType_t type,
                enum ar_op op)
{
    memset(tb, 0, sizeof(*tb));
    tb->type = type;
    tb->op = op;
    tb->size = mp_type_size(type);
    if (mp_type_is_float(type)) {
        ar_float_tables(tb, run->world.nranks, run->world.rank, 0x5eed, run->same_scalar);
    } else {
        ar_int_tables(tb, run->world.nranks, run->world.rank, 0x5eed, run->same_scalar);
    }
}

/* The counts of a run, without repeats, in increasing order; returns how many. */
static int
ar_counts(const struct ar_run *run, size_t *counts)
{
    size_t n = (size_t)run->world.nranks;
    size_t all[] = {0, 1, n - 1, n + 1, 1000, 65537, (1u << 20) + 3};
    int ncounts = 0;

    for (size_t k = 0; k < sizeof(all) / sizeof(all[0]); k++) {
        bool seen = false;
        for (int m = 0; m < ncounts; m++) {
            seen = seen || counts[m] == all[k];
        }
        if (!seen && all[k] <= run->max_count) {
            counts[ncounts++] = all[k];
        }
    }
    return ncounts;
}

static void
ar_usage(const char *prog)
{
    fprintf(stderr, "usage: %s [-q] [-m MAXCOUNT] [-u] [-v]\n", prog);
    exit(2);
}

int
main(int argc, char **argv)
{
    struct ar_run run = {.max_count = (1u << 20) + 3};
    size_t counts[8];
    int ncounts, opt, total_failed;
    double start = mp_now();

    while ((opt = getopt(argc, argv, "qm:uv")) != -1) {
        switch (opt) {
        case 'q':
            run.quick = true;
            break;
        case 'm':
            run.max_count = strtoull(optarg, NULL, 10);
            break;
        case 'u':
            run.same_scalar = true;
            break;
        case 'v':
            run.verbose = true;
            break;
        default:
            ar_usage(argv[0]);
        }
    }
    if (optind != argc) {
        ar_usage(argv[0]);
    }
    if (run.quick && run.max_count > 65537) {
        run.max_count = 65537;
    }
    mp_world_init(&run.world);
    ncounts = ar_counts(&run, counts);

    size_t buf_bytes = (counts[ncounts - 1] + AR_MAX_OFFSET) * 8 + AR_GUARD;
    run.send_base = malloc(buf_bytes);
    run.recv_base = malloc(buf_bytes);
    MP_ASSERT(run.send_base != NULL && run.recv_base != NULL, "out of memory: 2 x %zu bytes",
              buf_bytes);

    for (int t = 0; t < MP_NTYPES; t++) {
        for (int op = 0; op < AR_NOPS; op++) {
            struct ar_tables tb;
            ar_tables_build(&tb, &run, mp_all_types[t], (enum ar_op)op);
            for (int c = 0; c < ncounts; c++) {
                ar_case_run(&run, &tb, counts[c], false);
                ar_case_run(&run, &tb, counts[c], true);
            }
        }
    }

    /* Every rank's verdict, so that rank 0's line speaks for the whole run. */
    total_failed = run.failed_cases;
    MP_CHECK_COMM(run.world.comm, ncclAllReduce(&total_failed, &total_failed, 1, ncclInt32,
                                                ncclSum, run.world.comm, NULL));
    MP_CHECK_COMM(run.world.comm, ncclCommDestroy(run.world.comm));
    free(run.send_base);
    free(run.recv_base);
    if (run.world.rank == 0) {
        printf("allreduce: %d ranks, %d cases per rank (%d types x %d ops x %d counts x 2), "
               "%d failed on all ranks, %.1f s\n", run.world.nranks, run.cases, MP_NTYPES,
               AR_NOPS, ncounts, total_failed, mp_now() - start);
    }
    return run.failed_cases == 0 && total_failed == 0 ? 0 : 1;
}
