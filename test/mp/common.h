/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Helpers for the multi-process test programs in test/mp/, which tools/launcher starts as N
 * local ranks (RANK, WORLD_SIZE, NCCL_COMM_ID in the environment). A program here is a plain
 * consumer of libnccl.so.2: it includes the genuine nccl.h and this header, and nothing of the
 * library's internals, so the element conversions below (half, bfloat16, fp8) are written
 * again here, from the formats' definitions, rather than borrowed from kernels/.
 *
 * What is here: the world (rank, size, one communicator), check macros that name the failing
 * call with its result and ncclGetLastError text, a barrier, a deterministic hash for data
 * generators, element size/name/load/store per datatype, and a small all-reduce self-check
 * that programs other than allreduce.c use to prove a communicator still works.
 * Every function is static inline: each program is a single translation unit.
 */
#ifndef MP_COMMON_H
#define MP_COMMON_H

#include <nccl.h>

#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* This process's rank in the launcher's world, for message prefixes; -1 before mp_world_init. */
static int mp_rank_id = -1;
/* Checks that failed without ending the program (MP_EXPECT). */
static int mp_failures;

/* One line on stderr, written at once so that ranks' lines do not interleave. */
static inline void
mp_vreport(const char *file, int line, const char *fmt, va_list ap)
{
    char text[1024];
    int len = snprintf(text, sizeof(text), "rank %d: %s:%d: ", mp_rank_id, file, line);

    if (len >= 0 && (size_t)len < sizeof(text)) {
        vsnprintf(text + len, sizeof(text) - (size_t)len, fmt, ap);
    }
    len = (int)strlen(text);
    if ((size_t)len == sizeof(text) - 1) {
        len--;
    }
    text[len++] = '\n';
    if (write(STDERR_FILENO, text, (size_t)len) < 0) {
        /* nowhere left to say it */
    }
}

static inline void __attribute__((format(printf, 3, 4)))
mp_report(const char *file, int line, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    mp_vreport(file, line, fmt, ap);
    va_end(ap);
}

static inline const char *
mp_last_error(ncclComm_t comm)
{
    const char *text = ncclGetLastError(comm);

    return text != NULL ? text : "(null)";
}

static inline void __attribute__((noreturn))
mp_die_nccl(const char *file, int line, const char *expr, ncclResult_t res, ncclComm_t comm)
{
    mp_report(file, line, "%s failed: %s (%d); last error: \"%s\"", expr,
              ncclGetErrorString(res), (int)res, mp_last_error(comm));
    exit(1);
}

/* Ends the program (exit 1) unless `call` returns ncclSuccess; comm selects the error text. */
#define MP_CHECK_COMM(comm, call)                                                             \
    do {                                                                                      \
        ncclResult_t mp_res_ = (call);                                                        \
        if (mp_res_ != ncclSuccess) {                                                         \
            mp_die_nccl(__FILE__, __LINE__, #call, mp_res_, (comm));                          \
        }                                                                                     \
    } while (0)
#define MP_CHECK(call) MP_CHECK_COMM(NULL, call)

/* Ends the program unless cond holds. */
#define MP_ASSERT(cond, ...)                                                                  \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            mp_report(__FILE__, __LINE__, "assertion '%s' failed", #cond);                    \
            mp_report(__FILE__, __LINE__, __VA_ARGS__);                                       \
            exit(1);                                                                          \
        }                                                                                     \
    } while (0)

/* Counts a failure in mp_failures and goes on. */
#define MP_EXPECT(cond, ...)                                                                  \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            mp_report(__FILE__, __LINE__, __VA_ARGS__);                                       \
            mp_failures++;                                                                    \
        }                                                                                     \
    } while (0)

/* --- the world ---------------------------------------------------------------------------- */

struct mp_world {
    int rank;
    int nranks;
    ncclComm_t comm;
};

/* An integer environment variable; `fallback` when unset, exit 1 when malformed. */
static inline long
mp_env_long(const char *name, long fallback)
{
    const char *text = getenv(name);
    char *end;
    long value;

    if (text == NULL || text[0] == '\0') {
        return fallback;
    }
    value = strtol(text, &end, 10);
    if (*end != '\0') {
        fprintf(stderr, "%s=%s is not an integer\n", name, text);
        exit(1);
    }
    return value;
}

/* Reads RANK and WORLD_SIZE (a lone process without them is rank 0 of 1). */
static inline void
mp_world_env(struct mp_world *world)
{
    world->rank = (int)mp_env_long("RANK", 0);
    world->nranks = (int)mp_env_long("WORLD_SIZE", 1);
    world->comm = NULL;
    mp_rank_id = world->rank;
    MP_ASSERT(world->nranks >= 1 && world->rank >= 0 && world->rank < world->nranks,
              "RANK=%d WORLD_SIZE=%d", world->rank, world->nranks);
}

/* A communicator over all ranks, as an NCCL program started by a launcher makes one: every
 * rank calls ncclGetUniqueId (equal ids, since NCCL_COMM_ID is set), then ncclCommInitRank. */
static inline ncclComm_t
mp_comm_create(const struct mp_world *world)
{
    ncclUniqueId id;
    ncclComm_t comm = NULL;

    MP_CHECK(ncclGetUniqueId(&id));
    MP_CHECK(ncclCommInitRank(&comm, world->nranks, id, world->rank));
    MP_ASSERT(comm != NULL, "ncclCommInitRank succeeded but returned a NULL communicator");
    return comm;
}

static inline void
mp_world_init(struct mp_world *world)
{
    mp_world_env(world);
    world->comm = mp_comm_create(world);
}

static inline double
mp_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Polls ncclCommGetAsyncError until it is not ncclInProgress (at most `seconds`); returns the
 * last state seen. */
static inline ncclResult_t
mp_comm_wait(ncclComm_t comm, double seconds)
{
    double deadline = mp_now() + seconds;
    ncclResult_t state = ncclInProgress;

    for (;;) {
        ncclResult_t res = ncclCommGetAsyncError(comm, &state);
        if (res != ncclSuccess) {
            return res;
        }
        if (state != ncclInProgress || mp_now() > deadline) {
            return state;
        }
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* Every rank of comm waits here for all the others (an all-reduce of one int). */
static inline void
mp_barrier(ncclComm_t comm, int nranks)
{
    int one = 1;

    MP_CHECK_COMM(comm, ncclAllReduce(&one, &one, 1, ncclInt32, ncclSum, comm, NULL));
    MP_ASSERT(one == nranks, "barrier all-reduce gave %d, expected %d", one, nranks);
}

/* --- deterministic data ------------------------------------------------------------------- */

/* splitmix64's finalizer: a well-mixed 64-bit function of x. */
static inline uint64_t
mp_hash(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A hash of several small values, for "the value of rank r, pattern p, in case c". */
static inline uint64_t
mp_hash4(uint64_t a, uint64_t b, uint64_t c, uint64_t d)
{
    return mp_hash(mp_hash(mp_hash(mp_hash(a) ^ b) ^ c) ^ d);
}

/* --- datatypes ---------------------------------------------------------------------------- */

static const ncclDataType_t mp_all_types[] = {
    ncclInt8,    ncclUint8,   ncclInt32,    ncclUint32,     ncclInt64,      ncclUint64,
    ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2,
};
#define MP_NTYPES ((int)(sizeof(mp_all_types) / sizeof(mp_all_types[0])))

static inline size_t
mp_type_size(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2:
        return 1;
    case ncclFloat16: case ncclBfloat16:
        return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32:
        return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64:
        return 8;
    default:
        return 0;
    }
}

/* The names nccl-tests prints. */
static inline const char *
mp_type_name(ncclDataType_t type)
{
    switch (type) {
    case ncclInt8: return "int8";
    case ncclUint8: return "uint8";
    case ncclInt32: return "int32";
    case ncclUint32: return "uint32";
    case ncclInt64: return "int64";
    case ncclUint64: return "uint64";
    case ncclFloat16: return "half";
    case ncclFloat32: return "float";
    case ncclFloat64: return "double";
    case ncclBfloat16: return "bfloat16";
    case ncclFloat8e4m3: return "f8e4m3";
    case ncclFloat8e5m2: return "f8e5m2";
    default: return "?";
    }
}

static inline bool
mp_type_is_float(ncclDataType_t type)
{
    return type == ncclFloat16 || type == ncclFloat32 || type == ncclFloat64 ||
           type == ncclBfloat16 || type == ncclFloat8e4m3 || type == ncclFloat8e5m2;
}

static inline bool
mp_type_is_signed(ncclDataType_t type)
{
    return type == ncclInt8 || type == ncclInt32 || type == ncclInt64 || mp_type_is_float(type);
}

/* Explicit significand bits of a floating type (the precision is one more). */
static inline int
mp_type_mant_bits(ncclDataType_t type)
{
    switch (type) {
    case ncclFloat16: return 10;
    case ncclFloat32: return 23;
    case ncclFloat64: return 52;
    case ncclBfloat16: return 7;
    case ncclFloat8e4m3: return 3;
    case ncclFloat8e5m2: return 2;
    default: return 0;
    }
}

/*
 * The small floating formats, as their definitions give them: IEEE-like sign, exponent and
 * significand with subnormals. float16, bfloat16 and e5m2 have infinities; e4m3 (the "fn"
 * variant CUDA's __nv_fp8_e4m3 is) has none, its only NaN is S.1111.111 and its largest value
 * 448. Conversions to fp8 saturate to the largest finite value, as CUDA's __NV_SATFINITE does;
 * float16 and bfloat16 overflow to infinity as IEEE rounding says.
 */
struct mp_fp_format {
    int ebits;
    int mbits;
    int bias;
    bool has_inf;
    bool saturate;
};

static inline const struct mp_fp_format *
mp_fp_format_of(ncclDataType_t type)
{
    static const struct mp_fp_format half = {5, 10, 15, true, false};
    static const struct mp_fp_format bf16 = {8, 7, 127, true, false};
    static const struct mp_fp_format e4m3 = {4, 3, 7, false, true};
    static const struct mp_fp_format e5m2 = {5, 2, 15, true, true};

    switch (type) {
    case ncclFloat16: return &half;
    case ncclBfloat16: return &bf16;
    case ncclFloat8e4m3: return &e4m3;
    case ncclFloat8e5m2: return &e5m2;
    default: return NULL;
    }
}

static inline uint32_t
mp_fp_max_bits(const struct mp_fp_format *f)
{
    uint32_t emax = (1u << f->ebits) - 1;

    if (f->has_inf) {
        return ((emax - 1) << f->mbits) | ((1u << f->mbits) - 1);
    }
    return (emax << f->mbits) | ((1u << f->mbits) - 2); /* e4m3: all ones is NaN */
}

static inline double
mp_fp_decode(const struct mp_fp_format *f, uint32_t bits)
{
    uint32_t emask = (1u << f->ebits) - 1;
    uint32_t mmask = (1u << f->mbits) - 1;
    int exp = (int)((bits >> f->mbits) & emask);
    uint32_t man = bits & mmask;
    double sign = (bits >> (f->ebits + f->mbits)) & 1 ? -1.0 : 1.0;

    if (f->has_inf && (uint32_t)exp == emask) {
        return man == 0 ? sign * INFINITY : NAN;
    }
    if (!f->has_inf && (uint32_t)exp == emask && man == mmask) {
        return NAN;
    }
    if (exp == 0) {
        return sign * ldexp((double)man, 1 - f->bias - f->mbits);
    }
    return sign * ldexp((double)(man | (mmask + 1)), exp - f->bias - f->mbits);
}

/* Rounds x to the format, to nearest with ties to even, and returns its bits. */
static inline uint32_t
mp_fp_encode(const struct mp_fp_format *f, double x)
{
    uint32_t sign = signbit(x) ? 1u << (f->ebits + f->mbits) : 0;
    uint32_t inf_bits = ((1u << f->ebits) - 1) << f->mbits;
    uint32_t max_bits = mp_fp_max_bits(f);
    double max = mp_fp_decode(f, max_bits);
    int emin = 1 - f->bias;
    double a = fabs(x);
    double r;
    int e;

    if (isnan(x)) {
        return sign | inf_bits | (f->has_inf ? 1u << (f->mbits - 1) : (1u << f->mbits) - 1);
    }
    if (isinf(a)) {
        return sign | (f->saturate || !f->has_inf ? max_bits : inf_bits);
    }
    if (a == 0.0) {
        return sign;
    }
    /* The quantum of a's binade (or of the subnormals); division by it is exact. */
    frexp(a, &e);
    e = e - 1 < emin ? emin : e - 1;
    r = nearbyint(ldexp(a, f->mbits - e));
    r = ldexp(r, e - f->mbits);
    if (r > max) {
        return sign | (f->saturate || !f->has_inf ? max_bits : inf_bits);
    }
    if (r == 0.0) {
        return sign;
    }
    frexp(r, &e); /* rounding may have carried into the next binade */
    if (e - 1 < emin) {
        return sign | (uint32_t)ldexp(r, f->mbits - emin);
    }
    return sign | (uint32_t)(e - 1 + f->bias) << f->mbits |
           ((uint32_t)ldexp(r, f->mbits - (e - 1)) & ((1u << f->mbits) - 1));
}

static inline float
mp_half_to_float(uint16_t h)
{
    return (float)mp_fp_decode(mp_fp_format_of(ncclFloat16), h);
}

static inline uint16_t
mp_float_to_half(float x)
{
    return (uint16_t)mp_fp_encode(mp_fp_format_of(ncclFloat16), x);
}

static inline float
mp_bf16_to_float(uint16_t b)
{
    uint32_t bits = (uint32_t)b << 16;
    float x;

    memcpy(&x, &bits, sizeof(x));
    return x;
}

static inline uint16_t
mp_float_to_bf16(float x)
{
    return (uint16_t)mp_fp_encode(mp_fp_format_of(ncclBfloat16), x);
}

/* Reads one element of `type` at p as a double (integers beyond 2^53 lose their low bits:
 * use mp_load_int for exact integer comparisons). */
static inline double
mp_load(ncclDataType_t type, const void *p)
{
    union {
        int8_t i8; uint8_t u8; int32_t i32; uint32_t u32; int64_t i64; uint64_t u64;
        uint16_t u16; float f32; double f64;
    } v;

    memcpy(&v, p, mp_type_size(type));
    switch (type) {
    case ncclInt8: return v.i8;
    case ncclUint8: return v.u8;
    case ncclInt32: return v.i32;
    case ncclUint32: return v.u32;
    case ncclInt64: return (double)v.i64;
    case ncclUint64: return (double)v.u64;
    case ncclFloat32: return v.f32;
    case ncclFloat64: return v.f64;
    case ncclFloat16: case ncclBfloat16:
        return mp_fp_decode(mp_fp_format_of(type), v.u16);
    case ncclFloat8e4m3: case ncclFloat8e5m2:
        return mp_fp_decode(mp_fp_format_of(type), v.u8);
    default: return NAN;
    }
}

/* Stores x into one element of `type` at p: floating types round to nearest even (fp8
 * saturates), integers truncate toward zero. */
static inline void
mp_store(ncclDataType_t type, void *p, double x)
{
    union {
        int8_t i8; uint8_t u8; int32_t i32; uint32_t u32; int64_t i64; uint64_t u64;
        uint16_t u16; float f32; double f64;
    } v;

    switch (type) {
    case ncclInt8: v.i8 = (int8_t)x; break;
    case ncclUint8: v.u8 = (uint8_t)x; break;
    case ncclInt32: v.i32 = (int32_t)x; break;
    case ncclUint32: v.u32 = (uint32_t)x; break;
    case ncclInt64: v.i64 = (int64_t)x; break;
    case ncclUint64: v.u64 = (uint64_t)x; break;
    case ncclFloat32: v.f32 = (float)x; break;
    case ncclFloat64: v.f64 = x; break;
    case ncclFloat16: case ncclBfloat16:
        v.u16 = (uint16_t)mp_fp_encode(mp_fp_format_of(type), x);
        break;
    case ncclFloat8e4m3: case ncclFloat8e5m2:
        v.u8 = (uint8_t)mp_fp_encode(mp_fp_format_of(type), x);
        break;
    default: return;
    }
    memcpy(p, &v, mp_type_size(type));
}

/* x rounded to `type` and back: the value an element of that type holds. */
static inline double
mp_round(ncclDataType_t type, double x)
{
    uint8_t elem[8];

    mp_store(type, elem, x);
    return mp_load(type, elem);
}

/* An integer element, sign-extended (signed types) or zero-extended, as 64 bits. */
static inline uint64_t
mp_load_int(ncclDataType_t type, const void *p)
{
    union { int8_t i8; uint8_t u8; int32_t i32; uint32_t u32; uint64_t u64; } v;

    memcpy(&v, p, mp_type_size(type));
    switch (type) {
    case ncclInt8: return (uint64_t)(int64_t)v.i8;
    case ncclUint8: return v.u8;
    case ncclInt32: return (uint64_t)(int64_t)v.i32;
    case ncclUint32: return v.u32;
    default: return v.u64;
    }
}

/* Stores the low bits of x into one integer element (two's complement wrap-around). */
static inline void
mp_store_int(ncclDataType_t type, void *p, uint64_t x)
{
    /* Little-endian: the low bytes of x are the element. */
    memcpy(p, &x, mp_type_size(type));
}

/* --- a quick all-reduce self-check -------------------------------------------------------- */

/* Rank r's element i in mp_allreduce_check: 0, 1 or 2 (0 or 1 for e5m2), so that any sum over
 * up to 8 ranks is exact in every type, in any order. */
static inline int
mp_small_value(ncclDataType_t type, int rank, size_t i, uint64_t seed)
{
    uint64_t h = mp_hash4(seed, (uint64_t)rank, i, (uint64_t)type);

    return (int)(h % (type == ncclFloat8e5m2 ? 2 : 3));
}

/*
 * One sum all-reduce of `count` elements of `type` on comm (in place or not), checked on every
 * element; a communicator created non-blocking may answer ncclInProgress, then this waits for
 * it. Returns the number of wrong elements (their first few are printed), or -1 if the call
 * failed (printed too). Requires nranks <= 8 for exactness in fp8.
 */
static inline long
mp_allreduce_check(ncclComm_t comm, int rank, int nranks, ncclDataType_t type, size_t count,
                   bool in_place, uint64_t seed)
{
    size_t size = mp_type_size(type);
    uint8_t *send = malloc(count * size + 1);
    uint8_t *recv = in_place ? send : malloc(count * size + 1);
    ncclResult_t res;
    long wrong = 0;

    MP_ASSERT(send != NULL && recv != NULL, "out of memory for %zu elements", count);
    for (size_t i = 0; i < count; i++) {
        mp_store(type, send + i * size, mp_small_value(type, rank, i, seed));
    }
    if (!in_place) {
        memset(recv, 0xcd, count * size);
    }
    res = ncclAllReduce(send, recv, count, type, ncclSum, comm, NULL);
    if (res == ncclInProgress) {
        res = mp_comm_wait(comm, 60.0);
    }
    if (res != ncclSuccess) {
        mp_report(__FILE__, __LINE__, "ncclAllReduce(%zu x %s, sum) failed: %s; last error: "
                  "\"%s\"", count, mp_type_name(type), ncclGetErrorString(res),
                  mp_last_error(comm));
        wrong = -1;
        goto out;
    }
    for (size_t i = 0; i < count; i++) {
        int expected = 0;
        for (int r = 0; r < nranks; r++) {
            expected += mp_small_value(type, r, i, seed);
        }
        double got = mp_load(type, recv + i * size);
        if (got != expected && wrong++ < 5) {
            mp_report(__FILE__, __LINE__, "all-reduce %zu x %s, element %zu: got %g, "
                      "expected %d", count, mp_type_name(type), i, got, expected);
        }
    }
out:
    if (!in_place) {
        free(recv);
    }
    free(send);
    return wrong;
}

#endif
