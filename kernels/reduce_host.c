/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reduce and copy on host memory, for the executor (engine/exec.c) and the simulator, plus
 * the element conversions and scalar helpers that kernels.h exports.
 *
 * kr_reduce_host turns (op kind, flags, b or not) into one of a few loop shapes and calls the
 * datatype's kr_reduce_<type>, in which each shape is one plain loop over reduce_ops.h that GCC
 * vectorizes. The library ships as one binary for every x86-64, so each kr_reduce_<type> is
 * compiled three times (target_clones) and the dynamic loader binds the best one at startup:
 * x86-64-v4 (AVX-512 with BW for byte and word lanes), x86-64-v3 (AVX2) or the SSE2 baseline.
 * On v3 and v4 every loop vectorizes except the 64-bit integer divisions (x86 has no SIMD
 * integer division); the baseline also leaves float16 and fp8 (no per-lane shifts before AVX2)
 * and 64-bit max, min and product scalar. float16 has a hand-written AVX2 + F16C loop, chosen
 * at run time, which replaces its v3 and v4 clones (see kr_reduce_f16_avx2).
 * kr_copy_host_stream copies large buffers with non-temporal stores of the widest vector the
 * CPU has, chosen at each call.
 */

/*
 * Two code-generation choices that must not depend on the build's flags:
 * - fp-contract=off: results are those of the element operations, each rounded; a product
 *   feeding a sum must not become an FMA, which GNU C allows by default and v3/v4 provide.
 * - no-trapping-math: kr_reduce_host masks every floating-point exception (kr_fenv_enter), so
 *   no operation can trap, and GCC may if-convert the float conversions of the narrow types'
 *   selects. With trapping math assumed, those loops stay scalar. Values are unaffected.
 */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#else
#pragma GCC optimize("fp-contract=off", "no-trapping-math")
#endif

#include "kernels.h"

#include <assert.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "reduce_ops.h"

#if defined(__x86_64__) && !defined(__clang__)
#define KR_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KR_CLONES
#endif

/* --- loop shapes ---------------------------------------------------------------------------- */

/* What one call computes per element, with pre and post already resolved from kind and flags.
 * A sum with pre on b alone runs as KR_SHAPE_SUM_PRE1 with a and b swapped: sums commute (but
 * for which payload a float sum of two NaNs keeps, which no GPU result fixes either). */
enum kr_shape {
    KR_SHAPE_COPY,     /* dst = a */
    KR_SHAPE_SUM,      /* dst = a + b */
    KR_SHAPE_PROD,     /* dst = a * b */
    KR_SHAPE_MAX,      /* dst = max(a, b) */
    KR_SHAPE_MIN,      /* dst = min(a, b) */
    KR_SHAPE_SUM_PRE1, /* dst = pre(a) + b */
    KR_SHAPE_SUM_PRE2, /* dst = pre(a) + pre(b) */
    KR_SHAPE_SUM_POST, /* dst = post(a + b) */
    KR_SHAPE_PRE,      /* dst = pre(a) */
    KR_SHAPE_POST,     /* dst = post(a) */
};

static enum kr_shape
kr_shape_of(enum kr_op_kind kind, bool binary, unsigned flags, bool *swap_out)
{
    bool pre_a = kind == KR_PREMULSUM && (flags & KR_PRE_A);
    bool pre_b = kind == KR_PREMULSUM && binary && (flags & KR_PRE_B);
    bool post = kind == KR_SUMPOSTDIV && (flags & KR_POST);

    *swap_out = pre_b && !pre_a;
    if (!binary) {
        return pre_a ? KR_SHAPE_PRE : post ? KR_SHAPE_POST : KR_SHAPE_COPY;
    }
    switch (kind) {
    case KR_PROD:
        return KR_SHAPE_PROD;
    case KR_MAX:
        return KR_SHAPE_MAX;
    case KR_MIN:
        return KR_SHAPE_MIN;
    case KR_SUM:
    case KR_PREMULSUM:
    case KR_SUMPOSTDIV:
        break;
    }
    if (pre_a && pre_b) {
        return KR_SHAPE_SUM_PRE2;
    }
    if (pre_a || pre_b) {
        return KR_SHAPE_SUM_PRE1;
    }
    return post ? KR_SHAPE_SUM_POST : KR_SHAPE_SUM;
}

/*
 * kr_reduce_<type>: one loop per shape, each vectorized for every clone's ISA. No restrict:
 * dst may equal a or b, and GCC's run-time alias check sends equal pointers down the vector
 * path too (only a partial overlap, which the contract excludes, runs the scalar loop).
 */
#define KR_LOOP(EXPR)                                                                           \
    for (size_t i = 0; i < n; i++) {                                                            \
        dst[i] = (EXPR);                                                                        \
    }                                                                                           \
    break

#define KR_DEFINE_REDUCE(N, T)                                                                  \
    KR_CLONES static void                                                                       \
    kr_reduce_##N(void *dst_, const void *a_, const void *b_, size_t n,                         \
                  const struct kr_redop *op, enum kr_shape shape)                               \
    {                                                                                           \
        T *dst = dst_;                                                                          \
        const T *a = a_, *b = b_;                                                               \
        uint64_t d = op->divisor;                                                               \
        T scalar;                                                                               \
        memcpy(&scalar, op->scalar, sizeof(scalar));                                            \
        __typeof__(kr_premul_scalar_##N(scalar)) s = kr_premul_scalar_##N(scalar);              \
        switch (shape) {                                                                        \
        case KR_SHAPE_SUM:                                                                      \
            KR_LOOP(kr_sum_##N(a[i], b[i]));                                                    \
        case KR_SHAPE_PROD:                                                                     \
            KR_LOOP(kr_prod_##N(a[i], b[i]));                                                   \
        case KR_SHAPE_MAX:                                                                      \
            KR_LOOP(kr_max_##N(a[i], b[i]));                                                    \
        case KR_SHAPE_MIN:                                                                      \
            KR_LOOP(kr_min_##N(a[i], b[i]));                                                    \
        case KR_SHAPE_SUM_PRE1:                                                                 \
            KR_LOOP(kr_sum_##N(kr_premul_##N(a[i], s), b[i]));                                  \
        case KR_SHAPE_SUM_PRE2:                                                                 \
            KR_LOOP(kr_sum_##N(kr_premul_##N(a[i], s), kr_premul_##N(b[i], s)));                \
        case KR_SHAPE_SUM_POST:                                                                 \
            KR_LOOP(kr_postdiv_##N(kr_sum_##N(a[i], b[i]), d));                                 \
        case KR_SHAPE_PRE:                                                                      \
            KR_LOOP(kr_premul_##N(a[i], s));                                                    \
        case KR_SHAPE_POST:                                                                     \
            KR_LOOP(kr_postdiv_##N(a[i], d));                                                   \
        case KR_SHAPE_COPY:                                                                     \
            break;                                                                              \
        }                                                                                       \
    }

KR_DEFINE_REDUCE(i8, int8_t)
KR_DEFINE_REDUCE(u8, uint8_t)
KR_DEFINE_REDUCE(i32, int32_t)
KR_DEFINE_REDUCE(u32, uint32_t)
KR_DEFINE_REDUCE(i64, int64_t)
KR_DEFINE_REDUCE(u64, uint64_t)
KR_DEFINE_REDUCE(f16, uint16_t)
KR_DEFINE_REDUCE(f32, float)
KR_DEFINE_REDUCE(f64, double)
KR_DEFINE_REDUCE(bf16, uint16_t)
KR_DEFINE_REDUCE(e4m3, uint8_t)
KR_DEFINE_REDUCE(e5m2, uint8_t)
#undef KR_DEFINE_REDUCE
#undef KR_LOOP

typedef void (*kr_reduce_fn)(void *dst, const void *a, const void *b, size_t n,
                             const struct kr_redop *op, enum kr_shape shape);

/*
 * float16 on AVX2 with F16C (every x86-64-v3 CPU), which kr_reduce_host prefers to the clones
 * above. The clones vectorize reduce_ops.h's integer conversions, some thirty instructions per
 * element in and out: a half sum in L1/L2 ran at 0.6 GB/s (v3 clone) and 2.0 GB/s (v4 clone)
 * on a 2.8 GHz Xeon (Ice Lake) where this path runs at 7-12 GB/s (tools/bench/kernel_perf).
 * A conversion here is one instruction per eight elements, with the same bits: vcvtps2ph with
 * an immediate rounding mode rounds to nearest even whatever MXCSR says, keeps subnormals and
 * overflows to infinity, as kr_f32_to_f16 does; a NaN comes out with its sign and payload,
 * which the store replaces by the canonical 0x7fff. The float operations between are the
 * same IEEE operations, each intermediate rounded to float16 as the scalar operations round
 * it (test_kernels.c compares the two on every half). bfloat16 has no such path: the same
 * loop with shifts for conversions ran no faster than its v3 clone (5.1 against 5.0 GB/s,
 * medians) and at half the speed of its v4 clone (11 GB/s).
 */
#if defined(__x86_64__)
#define KR_AVX2_F16C __attribute__((target("avx2,f16c")))
#define KR_AVX2_INLINE KR_AVX2_F16C static inline __attribute__((always_inline))

KR_AVX2_INLINE __m256
kr_v8_load_f16(const uint16_t *p)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* The eight halves, NaNs as they came out of vcvtps2ph. */
KR_AVX2_INLINE __m128i
kr_v8_bits_f16(__m256 x)
{
    return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

KR_AVX2_INLINE void
kr_v8_store_f16(uint16_t *p, __m256 x)
{
    __m128i h = kr_v8_bits_f16(x);
    __m128i nan = _mm_cmpgt_epi16(_mm_and_si128(h, _mm_set1_epi16(0x7fff)),
                                  _mm_set1_epi16(0x7c00));
    _mm_storeu_si128((__m128i *)p, _mm_blendv_epi8(h, _mm_set1_epi16(0x7fff), nan));
}

/* Rounds to float16 and back: a NaN stays a NaN, which is all the final store needs. */
KR_AVX2_INLINE __m256
kr_v8_round_f16(__m256 x)
{
    return _mm256_cvtph_ps(kr_v8_bits_f16(x));
}

/* kr_max_f32 and kr_min_f32, lane by lane. */
KR_AVX2_INLINE __m256
kr_v8_max(__m256 a, __m256 b)
{
    __m256 r = _mm256_blendv_ps(b, a, _mm256_cmp_ps(a, b, _CMP_GT_OQ));
    r = _mm256_blendv_ps(r, a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(r, _mm256_and_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
}

KR_AVX2_INLINE __m256
kr_v8_min(__m256 a, __m256 b)
{
    __m256 r = _mm256_blendv_ps(b, a, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
    r = _mm256_blendv_ps(r, a, _mm256_cmp_ps(b, b, _CMP_UNORD_Q));
    return _mm256_blendv_ps(r, _mm256_or_ps(a, b), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
}

/* A case of kr_reduce_<type>_avx2's switch: kr_v8_loop_<type> inlined with shape S. */
#define KR_V8_CASE(N, S)                                                                        \
    case S:                                                                                     \
        kr_v8_loop_##N(dst, a, b, n, s, d, S);                                                  \
        break

/*
 * kr_reduce_<type>_avx2: each shape's loop is kr_v8_loop_<type> inlined with a constant shape,
 * so the switch inside folds away. The last n % 8 elements go through the same code on copies
 * padded with zeros (which no lane's result depends on but its own).
 */
#define KR_DEFINE_REDUCE_AVX2(N)                                                                \
    KR_AVX2_INLINE void                                                                         \
    kr_v8_step_##N(uint16_t *dst, const uint16_t *a, const uint16_t *b, __m256 s, __m256 d,     \
                   enum kr_shape shape)                                                         \
    {                                                                                           \
        __m256 x = kr_v8_load_##N(a);                                                           \
        switch (shape) {                                                                        \
        case KR_SHAPE_SUM:                                                                      \
            x = _mm256_add_ps(x, kr_v8_load_##N(b));                                            \
            break;                                                                              \
        case KR_SHAPE_PROD:                                                                     \
            x = _mm256_mul_ps(x, kr_v8_load_##N(b));                                            \
            break;                                                                              \
        case KR_SHAPE_MAX:                                                                      \
            x = kr_v8_max(x, kr_v8_load_##N(b));                                                \
            break;                                                                              \
        case KR_SHAPE_MIN:                                                                      \
            x = kr_v8_min(x, kr_v8_load_##N(b));                                                \
            break;                                                                              \
        case KR_SHAPE_SUM_PRE1:                                                                 \
            x = _mm256_add_ps(kr_v8_round_##N(_mm256_mul_ps(x, s)), kr_v8_load_##N(b));         \
            break;                                                                              \
        case KR_SHAPE_SUM_PRE2:                                                                 \
            x = _mm256_add_ps(kr_v8_round_##N(_mm256_mul_ps(x, s)),                             \
                              kr_v8_round_##N(_mm256_mul_ps(kr_v8_load_##N(b), s)));            \
            break;                                                                              \
        case KR_SHAPE_SUM_POST:                                                                 \
            x = _mm256_div_ps(kr_v8_round_##N(_mm256_add_ps(x, kr_v8_load_##N(b))), d);         \
            break;                                                                              \
        case KR_SHAPE_PRE:                                                                      \
            x = _mm256_mul_ps(x, s);                                                            \
            break;                                                                              \
        case KR_SHAPE_POST:                                                                     \
            x = _mm256_div_ps(x, d);                                                            \
            break;                                                                              \
        case KR_SHAPE_COPY:                                                                     \
            break;                                                                              \
        }                                                                                       \
        kr_v8_store_##N(dst, x);                                                                \
    }                                                                                           \
    KR_AVX2_INLINE void                                                                         \
    kr_v8_loop_##N(uint16_t *dst, const uint16_t *a, const uint16_t *b, size_t n, __m256 s,     \
                   __m256 d, enum kr_shape shape)                                               \
    {                                                                                           \
        bool binary = shape != KR_SHAPE_PRE && shape != KR_SHAPE_POST;                          \
        size_t i = 0;                                                                           \
        for (; i + 8 <= n; i += 8) {                                                            \
            kr_v8_step_##N(dst + i, a + i, binary ? b + i : NULL, s, d, shape);                 \
        }                                                                                       \
        if (i < n) {                                                                            \
            uint16_t ta[8] = {0}, tb[8] = {0}, td[8];                                           \
            memcpy(ta, a + i, (n - i) * 2);                                                     \
            if (binary) {                                                                       \
                memcpy(tb, b + i, (n - i) * 2);                                                 \
            }                                                                                   \
            kr_v8_step_##N(td, ta, tb, s, d, shape);                                            \
            memcpy(dst + i, td, (n - i) * 2);                                                   \
        }                                                                                       \
    }                                                                                           \
    KR_AVX2_F16C static void                                                                    \
    kr_reduce_##N##_avx2(void *dst_, const void *a_, const void *b_, size_t n,                  \
                         const struct kr_redop *op, enum kr_shape shape)                        \
    {                                                                                           \
        uint16_t *dst = dst_;                                                                   \
        const uint16_t *a = a_, *b = b_;                                                        \
        uint16_t scalar;                                                                        \
        memcpy(&scalar, op->scalar, sizeof(scalar));                                            \
        __m256 s = _mm256_set1_ps(kr_premul_scalar_##N(scalar));                                \
        __m256 d = _mm256_set1_ps((float)op->divisor);                                          \
        switch (shape) {                                                                        \
        KR_V8_CASE(N, KR_SHAPE_SUM);                                                            \
        KR_V8_CASE(N, KR_SHAPE_PROD);                                                           \
        KR_V8_CASE(N, KR_SHAPE_MAX);                                                            \
        KR_V8_CASE(N, KR_SHAPE_MIN);                                                            \
        KR_V8_CASE(N, KR_SHAPE_SUM_PRE1);                                                       \
        KR_V8_CASE(N, KR_SHAPE_SUM_PRE2);                                                       \
        KR_V8_CASE(N, KR_SHAPE_SUM_POST);                                                       \
        KR_V8_CASE(N, KR_SHAPE_PRE);                                                            \
        KR_V8_CASE(N, KR_SHAPE_POST);                                                           \
        case KR_SHAPE_COPY:                                                                     \
            break;                                                                              \
        }                                                                                       \
    }

KR_DEFINE_REDUCE_AVX2(f16)
#undef KR_DEFINE_REDUCE_AVX2
#undef KR_V8_CASE

/* The reduce of `type`, if it has a hand-written path that this CPU runs; else NULL. */
static kr_reduce_fn
kr_reduce_fast(ncclDataType_t type)
{
    if (type == ncclFloat16 && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("f16c")) {
        return kr_reduce_f16_avx2;
    }
    return NULL;
}
#else
static kr_reduce_fn
kr_reduce_fast(ncclDataType_t type)
{
    (void)type;
    return NULL;
}
#endif

static const kr_reduce_fn kr_reduce_by_type[ncclNumTypes] = {
    [ncclInt8] = kr_reduce_i8,           [ncclUint8] = kr_reduce_u8,
    [ncclInt32] = kr_reduce_i32,         [ncclUint32] = kr_reduce_u32,
    [ncclInt64] = kr_reduce_i64,         [ncclUint64] = kr_reduce_u64,
    [ncclFloat16] = kr_reduce_f16,       [ncclFloat32] = kr_reduce_f32,
    [ncclFloat64] = kr_reduce_f64,       [ncclBfloat16] = kr_reduce_bf16,
    [ncclFloat8e4m3] = kr_reduce_e4m3,   [ncclFloat8e5m2] = kr_reduce_e5m2,
};

/* --- floating-point environment ------------------------------------------------------------- */

/*
 * The loops need IEEE defaults: round to nearest even, subnormals kept, as on the GPU. A caller
 * may have changed them: programs linked with -ffast-math set flush-to-zero at startup, and so
 * does PyTorch's set_flush_denormal; either would flush bfloat16, float and double subnormals.
 * The SSE control register is per thread, so set the defaults for the call, restore after.
 */
#define KR_MXCSR_DEFAULT 0x1f80u /* all exceptions masked, nearest, no FTZ/DAZ */
#define KR_MXCSR_FLAGS 0x3fu     /* sticky exception flags, not part of the mode */

static unsigned
kr_fenv_enter(void)
{
#if defined(__x86_64__)
    unsigned saved = _mm_getcsr();
    if ((saved & ~KR_MXCSR_FLAGS) != KR_MXCSR_DEFAULT) {
        _mm_setcsr(KR_MXCSR_DEFAULT);
    }
    return saved;
#else
    return 0;
#endif
}

static void
kr_fenv_leave(unsigned saved)
{
#if defined(__x86_64__)
    if ((saved & ~KR_MXCSR_FLAGS) != KR_MXCSR_DEFAULT) {
        _mm_setcsr(saved);
    }
#else
    (void)saved;
#endif
}

/* --- reduce and copy ------------------------------------------------------------------------ */

void
kr_reduce_host(void *dst, const void *a, const void *b, size_t count,
               const struct kr_redop *op, unsigned flags)
{
    size_t size = kr_type_size(op->type);
    bool swap;
    enum kr_shape shape = kr_shape_of(op->kind, b != NULL, flags, &swap);

    assert(size != 0);
    assert(op->kind != KR_SUMPOSTDIV || op->divisor >= 1);
    /* The vectorizer may peel to align on the element size: a lesser alignment would fault. */
    assert((((uintptr_t)dst | (uintptr_t)a | (uintptr_t)b) & (size - 1)) == 0);
    if (count == 0) {
        return;
    }
    if (shape == KR_SHAPE_COPY) {
        kr_copy_host(dst, a, count * size);
        return;
    }
    if (swap) {
        const void *t = a;
        a = b;
        b = t;
    }
    unsigned env = kr_fenv_enter();
    kr_reduce_fn fast = kr_reduce_fast(op->type);
    (fast ? fast : kr_reduce_by_type[op->type])(dst, a, b, count, op, shape);
    kr_fenv_leave(env);
}

void
kr_copy_host(void *dst, const void *src, size_t bytes)
{
    /* memcpy may not be handed the same buffer twice; an in-place copy has nothing to do. */
    if (dst != src && bytes != 0) {
        memcpy(dst, src, bytes);
    }
}

/*
 * KR_STREAM_MIN_BYTES (kernels.h), the destination size from which to stream. Non-temporal stores
 * skip the read of each destination line that a plain store makes (write-allocate) but send every
 * line to memory, so they lose while the destination still sits in L2 and win from about its size
 * up. glibc's memcpy turns to them only above 3/4 of the shared L3 (36 MiB here). Measured with
 * tools/bench/kernel_perf (GB/s, medians of 5; 2.8 GHz Xeon, Ice Lake, L2 1.25 MiB, L3 48 MiB;
 * built with every size streamed; the machine shared, figures within about 10%):
 *
 *   bytes   hot: memcpy  stream   cold: memcpy  stream
 *   4 KiB         90.2    11.8           5.1     7.3
 *   256 KiB       37.3    18.3           5.4     8.2
 *   1 MiB         13.8    17.4           5.4     8.0
 *   4 MiB         12.1    14.9           5.4     7.9
 *   16 MiB         5.7     8.5           5.4     7.9
 *   64 MiB         8.5     7.6           9.3     8.8   (glibc streams too)
 *   256 MiB        8.4     8.0           8.7     8.6
 *
 * "hot" copies the same buffers again and again, "cold" a new slice of 256 MiB pools each
 * time. A second run put 256 KiB hot at 40 against 17 and 1 MiB at 12 against 15.6: the
 * crossover lies between, hence 1 MiB. Define KR_STREAM_MIN_BYTES at build time to change it.
 */
#if defined(__x86_64__)
/*
 * Whole 64-byte lines of dst (aligned) from src (any alignment), with non-temporal stores: the
 * lines go to memory through the write-combining buffers without being read into the cache
 * first, and without evicting what the cache holds. One clone per vector width; the caller
 * fences.
 */
__attribute__((target("avx512f"))) static void
kr_stream_lines_avx512(uint8_t *d, const uint8_t *s, size_t lines)
{
    for (size_t i = 0; i < lines; i++) {
        _mm512_stream_si512((void *)(d + 64 * i), _mm512_loadu_si512(s + 64 * i));
    }
}

__attribute__((target("avx2"))) static void
kr_stream_lines_avx2(uint8_t *d, const uint8_t *s, size_t lines)
{
    for (size_t i = 0; i < lines; i++) {
        const __m256i *from = (const __m256i *)(s + 64 * i);
        __m256i *to = (__m256i *)(d + 64 * i);
        _mm256_stream_si256(to, _mm256_loadu_si256(from));
        _mm256_stream_si256(to + 1, _mm256_loadu_si256(from + 1));
    }
}

static void
kr_stream_lines_sse2(uint8_t *d, const uint8_t *s, size_t lines)
{
    for (size_t i = 0; i < lines; i++) {
        const __m128i *from = (const __m128i *)(s + 64 * i);
        __m128i *to = (__m128i *)(d + 64 * i);
        for (int k = 0; k < 4; k++) {
            _mm_stream_si128(to + k, _mm_loadu_si128(from + k));
        }
    }
}
#endif

void
kr_copy_host_stream(void *dst, const void *src, size_t bytes)
{
#if defined(__x86_64__)
    if (dst != src && bytes >= 64) {
        uint8_t *d = dst;
        const uint8_t *s = src;
        /* memcpy the bytes before dst's first line boundary and after its last one. */
        size_t head = (size_t)(-(uintptr_t)d & 63u);
        size_t lines = (bytes - head) / 64;
        size_t tail = (bytes - head) % 64;

        memcpy(d, s, head);
        memcpy(d + head + 64 * lines, s + head + 64 * lines, tail);
        if (__builtin_cpu_supports("avx512f")) {
            kr_stream_lines_avx512(d + head, s + head, lines);
        } else if (__builtin_cpu_supports("avx2")) {
            kr_stream_lines_avx2(d + head, s + head, lines);
        } else {
            kr_stream_lines_sse2(d + head, s + head, lines);
        }
        /* Non-temporal stores are weakly ordered: fence them before anything the caller
         * stores next (a completion flag, a message), as a memcpy's stores would be. */
        _mm_sfence();
        return;
    }
#endif
    kr_copy_host(dst, src, bytes);
}

/* --- scalars -------------------------------------------------------------------------------- */

/* One element of any datatype, as the scalar helpers read and write it. */
union kr_elem {
    int8_t i8;
    uint8_t u8;
    int32_t i32;
    uint32_t u32;
    int64_t i64;
    uint64_t u64;
    uint16_t u16; /* float16, bfloat16 */
    float f32;
    double f64;
};

/*
 * A double rounded to float with round-to-odd: an inexact result gets an odd last bit. Rounding
 * that float again to nearest-even in a format at least two bits narrower (float16, bfloat16,
 * fp8) gives the double's correctly rounded value, where plain double -> float -> format could
 * round twice the wrong way (a value just above a halfway point landing on it).
 */
static float
kr_f32_round_odd(double v)
{
    float f = (float)v;
    uint32_t u = kr_f32_bits(f);

    if ((double)f != v && v == v && (u & 1u) == 0) {
        /* Step one unit toward v: in magnitude away from zero if v is the larger, else back
         * (infinity steps back to the largest finite float). */
        double mag_v = v < 0 ? -v : v;
        double mag_f = f < 0 ? -(double)f : (double)f;
        u = mag_v > mag_f ? u + 1u : u - 1u;
        f = kr_f32_from_bits(u);
    }
    return f;
}

/* Truncates toward zero and saturates to [lo, hi]; NaN gives 0. */
static int64_t
kr_double_to_int(double v, double lo, double hi)
{
    if (v != v) {
        return 0;
    }
    v = v < lo ? lo : v > hi ? hi : v;
    return (int64_t)v;
}

void
kr_scalar_from_double(ncclDataType_t type, double value, uint8_t out[8])
{
    union kr_elem v = {.u64 = 0};
    unsigned env = kr_fenv_enter();

    switch (type) {
    case ncclInt8:
        v.i8 = (int8_t)kr_double_to_int(value, INT8_MIN, INT8_MAX);
        break;
    case ncclUint8:
        v.u8 = (uint8_t)kr_double_to_int(value, 0, UINT8_MAX);
        break;
    case ncclInt32:
        v.i32 = (int32_t)kr_double_to_int(value, INT32_MIN, INT32_MAX);
        break;
    case ncclUint32:
        v.u32 = (uint32_t)kr_double_to_int(value, 0, UINT32_MAX);
        break;
    case ncclInt64:
        /* INT64_MAX is not a double: 2^63 and beyond saturate before the conversion. */
        v.i64 = value >= 0x1p63 ? INT64_MAX : kr_double_to_int(value, -0x1p63, 0x1p63);
        break;
    case ncclUint64:
        v.u64 = value >= 0x1p64 ? UINT64_MAX : value > 0 ? (uint64_t)value : 0;
        break;
    case ncclFloat16:
        v.u16 = kr_f32_to_f16(kr_f32_round_odd(value));
        break;
    case ncclFloat32:
        v.f32 = (float)value;
        break;
    case ncclFloat64:
        v.f64 = value;
        break;
    case ncclBfloat16:
        v.u16 = kr_f32_to_bf16(kr_f32_round_odd(value));
        break;
    case ncclFloat8e4m3:
        v.u8 = kr_f32_to_e4m3(kr_f32_round_odd(value));
        break;
    case ncclFloat8e5m2:
        v.u8 = kr_f32_to_e5m2(kr_f32_round_odd(value));
        break;
    default:
        assert(!"kr_scalar_from_double: invalid datatype");
    }
    kr_fenv_leave(env);
    memcpy(out, &v, 8);
}

double
kr_scalar_to_double(ncclDataType_t type, const void *elem)
{
    union kr_elem v;

    memcpy(&v, elem, kr_type_size(type));
    switch (type) {
    case ncclInt8:
        return v.i8;
    case ncclUint8:
        return v.u8;
    case ncclInt32:
        return v.i32;
    case ncclUint32:
        return v.u32;
    case ncclInt64:
        return (double)v.i64;
    case ncclUint64:
        return (double)v.u64;
    case ncclFloat16:
        return kr_f16_to_f32(v.u16);
    case ncclFloat32:
        return v.f32;
    case ncclFloat64:
        return v.f64;
    case ncclBfloat16:
        return kr_bf16_to_f32(v.u16);
    case ncclFloat8e4m3:
        return kr_e4m3_to_f32(v.u8);
    case ncclFloat8e5m2:
        return kr_e5m2_to_f32(v.u8);
    default:
        assert(!"kr_scalar_to_double: invalid datatype");
        return 0;
    }
}
