/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Exact reduction data for the multi-process tests (allreduce.c, collectives.c): for one
 * (type, op, rank count), AR_NPAT patterns, each with this rank's input element and the
 * element every reduction over all ranks must produce, bit for bit, whatever order the library
 * reduces in. How the values are chosen (sums that never round, pre-multiplies that land on
 * exact terms, products of powers of two, min/max over the whole range) is described at the
 * top of allreduce.c. A program maps element i to a pattern with a hash, so a block at the
 * wrong offset shows. Every function is static inline: each program is one translation unit.
 */
#ifndef MP_REDUCE_DATA_H
#define MP_REDUCE_DATA_H

#include "common.h"

enum ar_op { AR_SUM, AR_PROD, AR_MAX, AR_MIN, AR_AVG, AR_PREMULSUM, AR_NOPS };

static const char *const ar_op_names[AR_NOPS] = {"sum", "prod", "max", "min", "avg",
                                                 "premulsum"};
static const ncclRedOp_t ar_builtin_ops[AR_NOPS] = {ncclSum, ncclProd, ncclMax, ncclMin,
                                                    ncclAvg, ncclSum};


#define AR_NPAT 251      /* patterns per (type, op); prime */
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


/* --- integer data ------------------------------------------------------------------------- */

typedef __int128 ar_wide_t;

static inline ar_wide_t
ar_int_max(ncclDataType_t type)
{
    int bits = (int)mp_type_size(type) * 8;

    return mp_type_is_signed(type) ? ((ar_wide_t)1 << (bits - 1)) - 1
                                   : ((ar_wide_t)1 << bits) - 1;
}

static inline ar_wide_t
ar_int_scalar(ncclDataType_t type, int rank)
{
    return mp_type_is_signed(type) ? ar_sint_scalars[rank % 8] : ar_uint_scalars[rank % 8];
}

/* A value in [-bound, bound] (signed) or [0, bound] from the hash h. */
static inline ar_wide_t
ar_int_bounded(ncclDataType_t type, uint64_t h, ar_wide_t bound)
{
    if (mp_type_is_signed(type)) {
        return (ar_wide_t)(h % (uint64_t)(2 * bound + 1)) - bound;
    }
    return (ar_wide_t)((unsigned __int128)h % (unsigned __int128)(bound + 1));
}

static inline ar_wide_t
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

static inline void
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
static inline int
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
static inline double
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
static inline bool
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
static inline double
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
static inline double
ar_float_avg_scalar(ncclDataType_t type, int nranks)
{
    if (type == ncclFloat64) {
        return 1.0 / nranks;
    }
    return mp_round(type, (double)(float)(1.0 / nranks));
}

/* Rank r's input x and the term it contributes to the reduction (x pre-multiplied, for avg
 * and PreMulSum). */
static inline void
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

static inline void
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


/* Fills tb for (type, op) on rank `rank` of nranks: its inputs and the expected reductions.
 * same_scalar gives every rank rank 0's PreMulSum scalar. */
static inline void
ar_tables_build(struct ar_tables *tb, int nranks, int rank, ncclDataType_t type, enum ar_op op,
                bool same_scalar)
{
    memset(tb, 0, sizeof(*tb));
    tb->type = type;
    tb->op = op;
    tb->size = mp_type_size(type);
    if (mp_type_is_float(type)) {
        ar_float_tables(tb, nranks, rank, 0x5eed, same_scalar);
    } else {
        ar_int_tables(tb, nranks, rank, 0x5eed, same_scalar);
    }
}


#endif
