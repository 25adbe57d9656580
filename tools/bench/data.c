/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Benchmark data: the values each rank puts in, the result a collective must produce and
 * the comparison, for every NCCL data type and reduction. Called by harness.c and by the
 * collective files; nothing here talks to NCCL.
 *
 * A value is a small integer, a pure function of (rank, element index), stored in the data
 * type. The ranges are chosen so that the result is exact whatever order the library
 * reduces in: for a sum, if the absolute values of all contributions add up to at most the
 * largest integer the type holds exactly (2048 for half, 256 for bfloat16, 16 for f8e4m3,
 * 8 for f8e5m2, 2^20 by choice for wider types), every partial sum is such an integer too.
 *   sum, avg, mulsum  values in [-span, span] (avg and unsigned types: [0, span]) with
 *                     span = bound / (sum of the rank weights: 1 each, or the PreMulSum
 *                     scalars 1 and 2); when span would be 0, "picked": element i gets 1
 *                     from i mod (slots + 1) of the ranks and 0 from the others.
 *   avg, floating     NCCL may scale each input by a rounded 1/n before summing, so only
 *                     two ranks per element put in a value, in [1, bound / 2], the others
 *                     0: the result is then off by a few units in the last place at most.
 *   prod              picked too, 2 or 1, so that the product is a power of two the type
 *                     holds (at most 2^6 for int8, 2^8 for f8e4m3, 2^15 for half).
 *   min, max, none    anything in [-bound, bound]; none uses all bits of integer types.
 * Expected results are computed in int64 without overflow, then stored in the type; only
 * avg on floating types rounds, and bench_data_check allows it DATA_AVG_UNITS units.
 */

#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { DATA_KIND_SIGNED, DATA_KIND_UNSIGNED, DATA_KIND_FLOAT };
enum { DATA_MODE_RANGE, DATA_MODE_BITS, DATA_MODE_PICK, DATA_MODE_PAIR };

/* Values are generated and reduced this many elements at a time, in int64 on the stack. */
#define DATA_CHUNK 512
#define DATA_WIDE_BOUND (1 << 20)
/* Two scaled terms and their sum each round once, the scale too, the expected value once. */
#define DATA_AVG_UNITS 3

const struct bench_type bench_types[] = {
    { ncclInt8, "int8", 1 },
    { ncclUint8, "uint8", 1 },
    { ncclInt32, "int32", 4 },
    { ncclUint32, "uint32", 4 },
    { ncclInt64, "int64", 8 },
    { ncclUint64, "uint64", 8 },
    { ncclFloat16, "half", 2 },
    { ncclFloat32, "float", 4 },
    { ncclFloat64, "double", 8 },
    { ncclBfloat16, "bfloat16", 2 },
    { ncclFloat8e4m3, "f8e4m3", 1 },
    { ncclFloat8e5m2, "f8e5m2", 1 },
};
const int bench_ntypes = (int)(sizeof(bench_types) / sizeof(bench_types[0]));

/* What the generator needs of a type: its largest exact integer and its largest exact 2^k. */
struct data_type_info {
    int kind;
    int64_t bound;
    int pow2_max;
    int ebits, mbits; /* floating layout; fp8 e4m3 is the "fn" variant: no inf, 448 max */
};

static struct data_type_info
data_type_info(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8: return (struct data_type_info){ DATA_KIND_SIGNED, 127, 6, 0, 0 };
    case ncclUint8: return (struct data_type_info){ DATA_KIND_UNSIGNED, 255, 7, 0, 0 };
    case ncclInt32:
    case ncclInt64: return (struct data_type_info){ DATA_KIND_SIGNED, DATA_WIDE_BOUND, 30, 0, 0 };
    case ncclUint32:
    case ncclUint64:
        return (struct data_type_info){ DATA_KIND_UNSIGNED, DATA_WIDE_BOUND, 31, 0, 0 };
    case ncclFloat16: return (struct data_type_info){ DATA_KIND_FLOAT, 2048, 15, 5, 10 };
    case ncclFloat32:
        return (struct data_type_info){ DATA_KIND_FLOAT, DATA_WIDE_BOUND, 62, 8, 23 };
    case ncclFloat64:
        return (struct data_type_info){ DATA_KIND_FLOAT, DATA_WIDE_BOUND, 62, 11, 52 };
    case ncclBfloat16: return (struct data_type_info){ DATA_KIND_FLOAT, 256, 62, 8, 7 };
    case ncclFloat8e4m3: return (struct data_type_info){ DATA_KIND_FLOAT, 16, 8, 4, 3 };
    case ncclFloat8e5m2: return (struct data_type_info){ DATA_KIND_FLOAT, 8, 15, 5, 2 };
    default: return (struct data_type_info){ DATA_KIND_SIGNED, 1, 0, 0, 0 };
    }
}

const struct bench_type *
bench_type_find(const char *name)
{
    for (int i = 0; i < bench_ntypes; i++) {
        if (strcmp(bench_types[i].name, name) == 0)
            return &bench_types[i];
    }
    return NULL;
}

static size_t
data_type_size(ncclDataType_t type)
{
    for (int i = 0; i < bench_ntypes; i++) {
        if (bench_types[i].type == type)
            return bench_types[i].size;
    }
    return 1;
}

/*
 * Rounds x to nearest-even in a small binary floating format of ebits exponent and mbits
 * mantissa bits (half, bfloat16, fp8) and returns its encoding, from the bits of the double.
 * Saturates at the largest finite value, as NCCL's fp8 conversions do; values here never
 * get that far, nor are they NaN.
 */
static uint32_t
data_small_float_encode(double x, int ebits, int mbits, bool fn)
{
    union { double d; uint64_t u; } in = { .d = x };
    uint32_t sign = (uint32_t)(in.u >> 63) << (ebits + mbits);
    uint32_t max_bits = fn ? ((((1u << ebits) - 1) << mbits) | ((1u << mbits) - 2))
                           : (((1u << ebits) - 1) << mbits) - 1;
    uint64_t mant = (in.u & ((1ull << 52) - 1)) | (1ull << 52); /* with its implicit bit */
    int exp = (int)((in.u >> 52) & 0x7ff) - 1023 + (1 << (ebits - 1)) - 1; /* rebiased */
    int shift = 52 - mbits;
    uint64_t q, rest, half;
    uint32_t bits;

    if ((in.u << 1) == 0)
        return sign;
    if (exp < 1) {
        shift += 1 - exp; /* subnormal: fewer significant bits, at the smallest scale */
        exp = 1;
    }
    if (shift > 62)
        return sign;
    q = mant >> shift;
    rest = mant & ((1ull << shift) - 1);
    half = 1ull << (shift - 1);
    q += rest > half || (rest == half && (q & 1));
    /* q holds the implicit bit: it lands in the exponent field, and so does a carry. */
    bits = (uint32_t)q + ((uint32_t)(exp - 1) << mbits);
    return sign | (bits > max_bits ? max_bits : bits);
}

static bool
data_is_small_float(ncclDataType_t type)
{
    return type == ncclFloat16 || type == ncclBfloat16 || type == ncclFloat8e4m3 ||
           type == ncclFloat8e5m2;
}

/* Stores x, rounded, in element k of buf. */
static void
data_store_double(const struct bench_data *d, void *buf, size_t k, double x)
{
    struct data_type_info info = data_type_info(d->type);
    uint32_t bits;

    switch (d->type) {
    case ncclFloat32: ((float *)buf)[k] = (float)x; return;
    case ncclFloat64: ((double *)buf)[k] = x; return;
    default: break;
    }
    bits = data_small_float_encode(x, info.ebits, info.mbits, d->type == ncclFloat8e4m3);
    if (d->size == 2)
        ((uint16_t *)buf)[k] = (uint16_t)bits;
    else
        ((uint8_t *)buf)[k] = (uint8_t)bits;
}

/* Stores the integers v[0..n-1] in elements k0.. of buf; exact for every value drawn here. */
static void
data_store(const struct bench_data *d, void *buf, size_t k0, const int64_t *v, size_t n)
{
    switch (d->type) {
    case ncclInt8:
    case ncclUint8:
        for (size_t k = 0; k < n; k++)
            ((uint8_t *)buf)[k0 + k] = (uint8_t)v[k];
        return;
    case ncclInt32:
    case ncclUint32:
        for (size_t k = 0; k < n; k++)
            ((uint32_t *)buf)[k0 + k] = (uint32_t)v[k];
        return;
    case ncclInt64:
    case ncclUint64:
        for (size_t k = 0; k < n; k++)
            ((uint64_t *)buf)[k0 + k] = (uint64_t)v[k];
        return;
    case ncclFloat32:
        for (size_t k = 0; k < n; k++)
            ((float *)buf)[k0 + k] = (float)v[k];
        return;
    case ncclFloat64:
        for (size_t k = 0; k < n; k++)
            ((double *)buf)[k0 + k] = (double)v[k];
        return;
    default:
        break;
    }
    /* half, bfloat16, fp8: the table, else (large powers of two) the exact encoder */
    for (size_t k = 0; k < n; k++) {
        uint32_t bits;

        if (v[k] >= -d->table_span && v[k] <= d->table_span)
            bits = d->table[v[k] + d->table_span];
        else
            bits = data_small_float_encode((double)v[k], data_type_info(d->type).ebits,
                                           data_type_info(d->type).mbits,
                                           d->type == ncclFloat8e4m3);
        if (d->size == 2)
            ((uint16_t *)buf)[k0 + k] = (uint16_t)bits;
        else
            ((uint8_t *)buf)[k0 + k] = (uint8_t)bits;
    }
}

void
bench_data_init(struct bench_data *d, ncclDataType_t type, enum bench_op op, int nranks)
{
    struct data_type_info info = data_type_info(type);
    bool negative = info.kind != DATA_KIND_UNSIGNED;
    int64_t weight, span;

    memset(d, 0, sizeof(*d));
    d->type = type;
    d->op = op;
    d->nranks = nranks;
    d->size = data_type_size(type);
    d->kind = info.kind;
    switch (op) {
    case BENCH_OP_NONE:
        d->mode = info.kind == DATA_KIND_FLOAT ? DATA_MODE_RANGE : DATA_MODE_BITS;
        d->lo = -info.bound;
        d->hi = info.bound;
        break;
    case BENCH_OP_MIN:
    case BENCH_OP_MAX:
        d->mode = DATA_MODE_RANGE;
        d->lo = negative ? -info.bound : 0;
        d->hi = info.bound;
        break;
    case BENCH_OP_PROD:
        d->mode = DATA_MODE_PICK;
        d->lo = 1;
        d->hi = 2;
        d->slots = info.pow2_max < nranks ? info.pow2_max : nranks;
        break;
    case BENCH_OP_AVG:
        if (info.kind == DATA_KIND_FLOAT) {
            d->mode = DATA_MODE_PAIR;
            d->lo = 1;
            d->hi = info.bound / 2;
            break;
        }
        /* fall through - integer avg is the sum divided, exact like the sum */
    default: /* sum, avg, mulsum */
        /* Sum of the weights: nranks, or with the PreMulSum scalars 1 + 2 + 1 + 2 ... */
        weight = op == BENCH_OP_MULSUM ? nranks + nranks / 2 : nranks;
        span = info.bound / weight;
        if (span >= 1) {
            d->mode = DATA_MODE_RANGE;
            d->lo = negative && op != BENCH_OP_AVG ? -span : 0;
            d->hi = span;
        } else {
            d->mode = DATA_MODE_PICK;
            d->lo = 0;
            d->hi = 1;
            d->slots = (int)(info.bound / (op == BENCH_OP_MULSUM ? 2 : 1));
            d->slots = d->slots < nranks ? d->slots : nranks;
        }
        break;
    }
    if (data_is_small_float(type)) {
        d->table_span = (int)info.bound;
        for (int v = -d->table_span; v <= d->table_span; v++)
            d->table[v + d->table_span] = (uint16_t)data_small_float_encode(
                v, info.ebits, info.mbits, type == ncclFloat8e4m3);
    }
}

/* A 32-bit mix of (index, rank): cheap, and vectorized by the compiler in the loops below. */
static inline uint32_t
data_hash(uint32_t index, uint32_t rank)
{
    uint32_t x = index * 0x9E3779B1u + rank * 0x85EBCA77u;

    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    x *= 0x297A2D39u;
    x ^= x >> 15;
    return x;
}

/* The values of rank for elements index0 .. index0 + n - 1. */
static void
data_generate(const struct bench_data *d, int rank, size_t index0, size_t n, int64_t *v)
{
    /* Locals, so that stores through v need not reload them. */
    const int64_t lo = d->lo, hi = d->hi;
    const uint64_t range = (uint64_t)(hi - lo + 1);
    const uint32_t r = (uint32_t)rank, i0 = (uint32_t)index0;
    const int nr = d->nranks, slots = d->slots;
    int j = (int)((index0 + (size_t)rank) % (size_t)nr);
    int picked = (int)(index0 % (size_t)(slots + 1));

    switch (d->mode) {
    case DATA_MODE_RANGE:
        for (size_t k = 0; k < n; k++)
            v[k] = lo + (int64_t)(((uint64_t)data_hash(i0 + (uint32_t)k, r) * range) >> 32);
        return;
    case DATA_MODE_BITS:
        for (size_t k = 0; k < n; k++) {
            uint32_t h = data_hash(i0 + (uint32_t)k, r);

            v[k] = (int64_t)((uint64_t)h << 32 | data_hash(h, r + 0x6A09E667u));
        }
        return;
    case DATA_MODE_PICK:
        /* Element i takes hi from the i mod (slots + 1) ranks with (i + r) mod n below that
         * number, lo from the others; counters stand in for the divisions. */
        for (size_t k = 0; k < n; k++) {
            v[k] = j < picked ? hi : lo;
            j = j + 1 == nr ? 0 : j + 1;
            picked = picked == slots ? 0 : picked + 1;
        }
        return;
    case DATA_MODE_PAIR:
        /* Element i takes a value from the two ranks with (i + r) mod n < 2, 0 elsewhere. */
        for (size_t k = 0; k < n; k++) {
            int64_t x = lo + (int64_t)(((uint64_t)data_hash(i0 + (uint32_t)k, r) * range) >> 32);

            v[k] = j < 2 ? x : 0;
            j = j + 1 == nr ? 0 : j + 1;
        }
        return;
    default:
        return;
    }
}

void
bench_data_fill(const struct bench_data *d, void *buf, size_t count, int rank, size_t index0)
{
    int64_t v[DATA_CHUNK];

    for (size_t k = 0; k < count; k += DATA_CHUNK) {
        size_t n = count - k < DATA_CHUNK ? count - k : DATA_CHUNK;

        data_generate(d, rank, index0 + k, n, v);
        data_store(d, buf, k, v, n);
    }
}

void
bench_data_reduce(const struct bench_data *d, void *buf, size_t count, size_t index0)
{
    int64_t acc[DATA_CHUNK], v[DATA_CHUNK];

    for (size_t k = 0; k < count; k += DATA_CHUNK) {
        size_t n = count - k < DATA_CHUNK ? count - k : DATA_CHUNK;

        data_generate(d, 0, index0 + k, n, acc);
        for (int r = 1; r < d->nranks; r++) {
            const int64_t scale = d->op == BENCH_OP_MULSUM ? 1 + (r & 1) : 1;

            data_generate(d, r, index0 + k, n, v);
            switch (d->op) {
            case BENCH_OP_PROD:
                for (size_t e = 0; e < n; e++)
                    acc[e] *= v[e];
                break;
            case BENCH_OP_MAX:
                for (size_t e = 0; e < n; e++)
                    acc[e] = v[e] > acc[e] ? v[e] : acc[e];
                break;
            case BENCH_OP_MIN:
                for (size_t e = 0; e < n; e++)
                    acc[e] = v[e] < acc[e] ? v[e] : acc[e];
                break;
            default: /* sum, avg, mulsum (rank 0's scalar is 1) */
                for (size_t e = 0; e < n; e++)
                    acc[e] += scale * v[e];
                break;
            }
        }
        if (d->op != BENCH_OP_AVG) {
            data_store(d, buf, k, acc, n);
        } else if (d->kind != DATA_KIND_FLOAT) {
            for (size_t e = 0; e < n; e++)
                acc[e] /= d->nranks; /* as NCCL: the sum, divided; values are not negative */
            data_store(d, buf, k, acc, n);
        } else {
            for (size_t e = 0; e < n; e++)
                data_store_double(d, buf, k + e, (double)acc[e] / d->nranks);
        }
    }
}

/* Element k of buf as an unsigned integer of the element's width. */
static uint64_t
data_load_bits(const struct bench_data *d, const void *buf, size_t k)
{
    switch (d->size) {
    case 1: return ((const uint8_t *)buf)[k];
    case 2: return ((const uint16_t *)buf)[k];
    case 4: return ((const uint32_t *)buf)[k];
    default: return ((const uint64_t *)buf)[k];
    }
}

int64_t
bench_data_check(const struct bench_data *d, const void *got, const void *expected,
                 size_t count)
{
    const char *g = got, *x = expected;
    int64_t wrong = 0;

    if (d->op == BENCH_OP_AVG && d->kind == DATA_KIND_FLOAT) {
        /* Results are not negative, and the encodings of non-negative floating values are
         * in the order of the values, one unit in the last place apart: compare as integers.
         * A negative or NaN result is far away. */
        for (size_t k = 0; k < count; k++) {
            uint64_t a = data_load_bits(d, got, k), b = data_load_bits(d, expected, k);

            wrong += (a > b ? a - b : b - a) > DATA_AVG_UNITS;
        }
        return wrong;
    }
    if (memcmp(got, expected, count * d->size) == 0)
        return 0;
    for (size_t k = 0; k < count; k++)
        wrong += memcmp(g + k * d->size, x + k * d->size, d->size) != 0;
    return wrong;
}

void
bench_data_scalar(const struct bench_data *d, int rank, uint64_t *scalar_out)
{
    int64_t v = 1 + (rank & 1);

    *scalar_out = 0;
    data_store(d, scalar_out, 0, &v, 1);
}
