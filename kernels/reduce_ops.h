/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Element operations of every reduction, written once for the host loops (reduce_host.c) and
 * the CUDA kernels, so that both compute bit-identical results. Included by reduce_host.c, the
 * .cu kernels and the unit tests; nothing here is exported.
 *
 * Integers wrap (signed math is done in unsigned, C leaves signed overflow undefined). float
 * and double use plain IEEE arithmetic. The low-precision types (float16, bfloat16, fp8 e4m3
 * and e5m2) are kept as their bits; each operation widens to float, computes once, and rounds
 * back to nearest-even, which is the correctly rounded result CUDA's __hadd/__hmul give (float
 * carries more than twice their precision, so the double rounding is innocuous).
 *
 * Every function is free of data-dependent branches (selects and shifts, no jumps and no
 * tables) so that the host loops vectorize. The conversions are integer arithmetic plus exact
 * int-to-float conversions, so they do not depend on the rounding mode or flush-to-zero.
 */
#ifndef KR_REDUCE_OPS_H
#define KR_REDUCE_OPS_H

#include <stdint.h>
#include <string.h>

/* Always inlined: a loop vectorizes only if every call in it is inlined, and a type's loops
 * share one function, big enough for GCC's inlining limits to stop plain `inline` halfway. */
#ifdef __CUDACC__
#define KR_OP_FN static __forceinline__ __host__ __device__
#else
#define KR_OP_FN static inline __attribute__((always_inline))
#endif

/* --- bit casts ------------------------------------------------------------------------------ */

KR_OP_FN uint32_t
kr_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

KR_OP_FN float
kr_f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

KR_OP_FN uint64_t
kr_f64_bits(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof(u));
    return u;
}

KR_OP_FN double
kr_f64_from_bits(uint64_t u)
{
    double d;
    memcpy(&d, &u, sizeof(d));
    return d;
}

/* --- conversions ---------------------------------------------------------------------------- */

/*
 * The element conversions, one definition each for the loops, the kernels, the scalar helpers
 * of reduce_host.c and test_kernels.c, with CUDA's rounding: round to nearest even
 * (subnormals included); float16 and bfloat16 overflow to infinity; fp8 saturates as
 * __NV_SATFINITE does, infinities included (e4m3 to +-448, e5m2 to +-57344). A NaN becomes
 * CUDA's canonical NaN, sign dropped: 0x7fff for float16 and bfloat16, 0x7f for both fp8
 * formats. Widening is exact.
 */

/*
 * Rounds the magnitude of a finite float, given as its bits `ax` (sign cleared), to nearest-even
 * in a binary format with `m` stored mantissa bits and exponent bias `bias`. Returns the
 * result's magnitude bits (exponent field << m | mantissa); a value past the format's range
 * comes back as a code past its largest finite one, which the caller clamps.
 *
 * One formula serves normal and subnormal results. The significand, with its implicit bit, is
 * shifted right by 23 - m, plus the distance below the smallest normal exponent when the result
 * is subnormal. For a normal result the quotient q still holds the implicit bit, so adding it
 * to (exponent - 1) << m gives the right code, and a carry out of the mantissa bumps the
 * exponent; a subnormal that rounds up to 2^m lands exactly on the smallest normal code.
 */
KR_OP_FN uint32_t
kr_round_bits(uint32_t ax, int m, int bias)
{
    int32_t e = (int32_t)(ax >> 23);
    /* A float subnormal has exponent 1 and no implicit bit. */
    uint32_t mant = (ax & 0x7fffffu) | (e != 0 ? 0x800000u : 0u);
    e = e != 0 ? e : 1;
    int32_t et = e - 127 + bias;            /* the target's biased exponent */
    int32_t shift = 23 - m + (et < 1 ? 1 - et : 0);
    shift = shift < 31 ? shift : 31;        /* beyond 24 everything rounds to zero anyway */
    uint32_t q = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1u);
    uint32_t halfway = 1u << (shift - 1);
    q += (uint32_t)(rem > halfway) | ((uint32_t)(rem == halfway) & q);
    return ((uint32_t)(et > 1 ? et : 1) - 1u) * (1u << m) + q;
}

KR_OP_FN float
kr_f16_to_f32(uint16_t h)
{
    uint32_t em = h & 0x7fffu; /* exponent and mantissa */
    /* Rebias the exponent from 15 to 127, and infinity and NaN (exponent 31) to 255. */
    uint32_t r = (em << 13) + (em >= 0x7c00u ? 224u << 23 : 112u << 23);
    /* A subnormal (or zero) is its mantissa times 2^-24: convert the mantissa, which is exact,
     * and lower the exponent by 24. */
    uint32_t sub = kr_f32_bits((float)(int32_t)em) - (em != 0 ? 24u << 23 : 0u);
    r = em < 0x0400u ? sub : r;
    return kr_f32_from_bits(r | (uint32_t)(h & 0x8000u) << 16);
}

/* Round to nearest even; overflow gives infinity; NaN gives CUDA's canonical 0x7fff. */
KR_OP_FN uint16_t
kr_f32_to_f16(float f)
{
    uint32_t x = kr_f32_bits(f);
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r = kr_round_bits(ax, 10, 15);
    r = r < 0x7c00u ? r : 0x7c00u;
    r |= (x >> 16) & 0x8000u;
    return (uint16_t)(ax > 0x7f800000u ? 0x7fffu : r);
}

/* bfloat16 is the top half of a float. */
KR_OP_FN float
kr_bf16_to_f32(uint16_t b)
{
    return kr_f32_from_bits((uint32_t)b << 16);
}

/* Round to nearest even; overflow gives infinity; NaN gives CUDA's canonical 0x7fff. */
KR_OP_FN uint16_t
kr_f32_to_bf16(float f)
{
    uint32_t x = kr_f32_bits(f);
    /* Adding 0x7fff, plus one when the kept part is odd, carries into bit 16 exactly when the
     * dropped half is above the halfway point, or at it with an odd kept part; a carry out of
     * the mantissa bumps the exponent, up to infinity. */
    uint32_t r = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)((x & 0x7fffffffu) > 0x7f800000u ? 0x7fffu : r);
}

/* e4m3: bias 7, no infinity, 0x7f and 0xff are NaN, largest finite 0x7e = 448. */
KR_OP_FN float
kr_e4m3_to_f32(uint8_t v)
{
    uint32_t em = v & 0x7fu;
    uint32_t r = (em << 20) + (120u << 23); /* rebias 7 -> 127 */
    /* Subnormals and zero as in kr_f16_to_f32: the mantissa times 2^-9. */
    uint32_t sub = kr_f32_bits((float)(int32_t)em) - (em != 0 ? 9u << 23 : 0u);
    r = (em < 0x08u ? sub : r) | (uint32_t)(v & 0x80u) << 24;
    return kr_f32_from_bits(em == 0x7fu ? 0x7fffffffu : r);
}

/* Round to nearest even, saturating as __NV_SATFINITE: magnitudes beyond 448, infinities
 * included, become +-448. NaN gives 0x7f, as CUDA's conversion does. */
KR_OP_FN uint8_t
kr_f32_to_e4m3(float f)
{
    uint32_t x = kr_f32_bits(f);
    uint32_t ax = x & 0x7fffffffu;
    /* Clamping to 448 before rounding is exactly saturation: everything above rounds to it. */
    uint32_t r = kr_round_bits(ax < 0x43e00000u ? ax : 0x43e00000u, 3, 7);
    r |= (x >> 24) & 0x80u;
    return (uint8_t)(ax > 0x7f800000u ? 0x7fu : r);
}

/* e5m2 is IEEE-like with bias 15: the top byte of a float16. */
KR_OP_FN float
kr_e5m2_to_f32(uint8_t v)
{
    return kr_f16_to_f32((uint16_t)(v << 8));
}

/* Round to nearest even, saturating as __NV_SATFINITE: magnitudes beyond 57344, infinities
 * included, become +-57344 (0x7b). NaN gives 0x7f, as CUDA's conversion does. */
KR_OP_FN uint8_t
kr_f32_to_e5m2(float f)
{
    uint32_t x = kr_f32_bits(f);
    uint32_t ax = x & 0x7fffffffu;
    uint32_t r = kr_round_bits(ax < 0x47600000u ? ax : 0x47600000u, 2, 15);
    r |= (x >> 24) & 0x80u;
    return (uint8_t)(ax > 0x7f800000u ? 0x7fu : r);
}

/*
 * The operations. For each type <t>, kr_sum_<t>, kr_prod_<t>, kr_max_<t> and kr_min_<t> combine
 * two elements; kr_premul_<t>(x, scalar) is PreMulSum's pre-operation, kr_postdiv_<t>(x,
 * divisor) SumPostDiv's post-operation. The scalar is passed as kr_premul_scalar_<t> returns
 * it, computed once per call: the element itself, widened to float for the narrow types (left
 * inside the loop, that widening's selects can defeat the vectorizer).
 */

/* --- integer operations --------------------------------------------------------------------- */

/*
 * Sum, product and PreMulSum's pre-multiplication wrap around: they are computed in the
 * unsigned type of the same width (8-bit operands are promoted to int, whose range holds any
 * product of two of them). Max and min compare as the type is signed or not.
 */
#define KR_INT_OPS(N, T, U)                                                                     \
    KR_OP_FN T                                                                                  \
    kr_sum_##N(T a, T b)                                                                        \
    {                                                                                           \
        return (T)((U)a + (U)b);                                                                \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_prod_##N(T a, T b)                                                                       \
    {                                                                                           \
        return (T)(U)((U)a * (U)b);                                                             \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_max_##N(T a, T b)                                                                        \
    {                                                                                           \
        return a > b ? a : b;                                                                   \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_min_##N(T a, T b)                                                                        \
    {                                                                                           \
        return a < b ? a : b;                                                                   \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_premul_scalar_##N(T scalar)                                                              \
    {                                                                                           \
        return scalar;                                                                          \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_premul_##N(T a, T scalar)                                                                \
    {                                                                                           \
        return kr_prod_##N(a, scalar);                                                          \
    }

KR_INT_OPS(i8, int8_t, uint8_t)
KR_INT_OPS(u8, uint8_t, uint8_t)
KR_INT_OPS(i32, int32_t, uint32_t)
KR_INT_OPS(u32, uint32_t, uint32_t)
KR_INT_OPS(i64, int64_t, uint64_t)
KR_INT_OPS(u64, uint64_t, uint64_t)
#undef KR_INT_OPS

/*
 * SumPostDiv's post-division, truncating toward zero as C does (and NCCL's ncclAvg on integers).
 * divisor >= 1. The 8- and 32-bit forms divide in float and double, which vectorizes where an
 * integer division does not, and is exact: a non-integer quotient x / d is at least 1/d away
 * from the next integer, while for |x| <= 2^w the rounding error is at most 2^(w - p) / d, p the
 * precision (w = 8, p = 24 in float; w = 32, p = 53 in double), so truncation never crosses an
 * integer. A divisor too large to convert exactly exceeds every |x| and gives 0 as it should.
 */
KR_OP_FN int8_t
kr_postdiv_i8(int8_t x, uint64_t divisor)
{
    return (int8_t)((float)x / (float)divisor);
}

KR_OP_FN uint8_t
kr_postdiv_u8(uint8_t x, uint64_t divisor)
{
    return (uint8_t)((float)x / (float)divisor);
}

KR_OP_FN int32_t
kr_postdiv_i32(int32_t x, uint64_t divisor)
{
    return (int32_t)((double)x / (double)divisor);
}

KR_OP_FN uint32_t
kr_postdiv_u32(uint32_t x, uint64_t divisor)
{
    return (uint32_t)((double)x / (double)divisor);
}

KR_OP_FN int64_t
kr_postdiv_i64(int64_t x, uint64_t divisor)
{
    /* Divide the magnitude so that any divisor, even one above INT64_MAX, works. */
    uint64_t mag = x < 0 ? 0u - (uint64_t)x : (uint64_t)x;
    uint64_t q = mag / divisor;
    return (int64_t)(x < 0 ? 0u - q : q);
}

KR_OP_FN uint64_t
kr_postdiv_u64(uint64_t x, uint64_t divisor)
{
    return x / divisor;
}

/* --- floating-point operations -------------------------------------------------------------- */

/*
 * Max and min are IEEE 754-2019 maximumNumber/minimumNumber, as CUDA's fmaxf/fminf and
 * __hmax/__hmin: a NaN loses to a number, and +0 > -0 (combining the bits of equal operands),
 * so the result does not depend on which rank's value came first.
 */
KR_OP_FN float
kr_max_f32(float a, float b)
{
    float r = a > b ? a : b;
    r = b != b ? a : r;
    return a == b ? kr_f32_from_bits(kr_f32_bits(a) & kr_f32_bits(b)) : r;
}

KR_OP_FN float
kr_min_f32(float a, float b)
{
    float r = a < b ? a : b;
    r = b != b ? a : r;
    return a == b ? kr_f32_from_bits(kr_f32_bits(a) | kr_f32_bits(b)) : r;
}

KR_OP_FN double
kr_max_f64(double a, double b)
{
    double r = a > b ? a : b;
    r = b != b ? a : r;
    return a == b ? kr_f64_from_bits(kr_f64_bits(a) & kr_f64_bits(b)) : r;
}

KR_OP_FN double
kr_min_f64(double a, double b)
{
    double r = a < b ? a : b;
    r = b != b ? a : r;
    return a == b ? kr_f64_from_bits(kr_f64_bits(a) | kr_f64_bits(b)) : r;
}

KR_OP_FN float
kr_sum_f32(float a, float b)
{
    return a + b;
}

KR_OP_FN float
kr_prod_f32(float a, float b)
{
    return a * b;
}

KR_OP_FN float
kr_premul_scalar_f32(float scalar)
{
    return scalar;
}

KR_OP_FN float
kr_premul_f32(float a, float scalar)
{
    return a * scalar;
}

KR_OP_FN float
kr_postdiv_f32(float x, uint64_t divisor)
{
    return x / (float)divisor;
}

KR_OP_FN double
kr_sum_f64(double a, double b)
{
    return a + b;
}

KR_OP_FN double
kr_prod_f64(double a, double b)
{
    return a * b;
}

KR_OP_FN double
kr_premul_scalar_f64(double scalar)
{
    return scalar;
}

KR_OP_FN double
kr_premul_f64(double a, double scalar)
{
    return a * scalar;
}

KR_OP_FN double
kr_postdiv_f64(double x, uint64_t divisor)
{
    return x / (double)divisor;
}

/*
 * The low-precision types: widen, apply the float operation once, round back. Max and min
 * return one of the operands' values, so only a NaN pair changes bits (to the canonical NaN).
 */
#define KR_NARROW_FLOAT_OPS(N, T)                                                               \
    KR_OP_FN T                                                                                  \
    kr_sum_##N(T a, T b)                                                                        \
    {                                                                                           \
        return kr_f32_to_##N(kr_##N##_to_f32(a) + kr_##N##_to_f32(b));                          \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_prod_##N(T a, T b)                                                                       \
    {                                                                                           \
        return kr_f32_to_##N(kr_##N##_to_f32(a) * kr_##N##_to_f32(b));                          \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_max_##N(T a, T b)                                                                        \
    {                                                                                           \
        return kr_f32_to_##N(kr_max_f32(kr_##N##_to_f32(a), kr_##N##_to_f32(b)));               \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_min_##N(T a, T b)                                                                        \
    {                                                                                           \
        return kr_f32_to_##N(kr_min_f32(kr_##N##_to_f32(a), kr_##N##_to_f32(b)));               \
    }                                                                                           \
    KR_OP_FN float                                                                              \
    kr_premul_scalar_##N(T scalar)                                                              \
    {                                                                                           \
        return kr_##N##_to_f32(scalar);                                                         \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_premul_##N(T a, float scalar)                                                            \
    {                                                                                           \
        return kr_f32_to_##N(kr_##N##_to_f32(a) * scalar);                                      \
    }                                                                                           \
    KR_OP_FN T                                                                                  \
    kr_postdiv_##N(T x, uint64_t divisor)                                                       \
    {                                                                                           \
        return kr_f32_to_##N(kr_##N##_to_f32(x) / (float)divisor);                              \
    }

KR_NARROW_FLOAT_OPS(f16, uint16_t)
KR_NARROW_FLOAT_OPS(bf16, uint16_t)
KR_NARROW_FLOAT_OPS(e4m3, uint8_t)
KR_NARROW_FLOAT_OPS(e5m2, uint8_t)
#undef KR_NARROW_FLOAT_OPS

#endif
