/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/: the datatype table, the element conversions and kr_reduce_host.
 *
 * The conversions under test are reduce_ops.h's, the very functions the loops and kernels inline;
 * every expected value comes from a reference written another way. Narrow formats are decoded from
 * their definition with ldexp and rounded with rint in double; that reference is itself checked
 * against GCC's _Float16 (an independent correctly rounded float16), against nearest-neighbour
 * distances for bfloat16 and against a brute-force search of all 256 codes for fp8. Conversions
 * are checked on every code, every halfway point between neighbours and one float unit either side
 * of it, the specials, and a sweep through the float bit patterns. kr_reduce_host is checked for
 * every datatype x op x flag set x b present or not x count x placement (aligned, off by one
 * element, dst == a, dst == b) against a scalar reference computed in double, with guard elements
 * around dst.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <xmmintrin.h>

#include "kernels/kernels.h"
#include "kernels/reduce_ops.h"

/* --- helpers -------------------------------------------------------------------------------- */

static uint32_t
f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof(u));
    return u;
}

static float
f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof(f));
    return f;
}

/* splitmix64: a seeded, reproducible stream of test data. */
static uint64_t
rng_next(uint64_t *state)
{
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* --- reference narrow formats --------------------------------------------------------------- */

struct ref_format {
    const char *name;
    int bits; /* storage width */
    int m;    /* stored mantissa bits */
    int bias;
    bool has_inf;     /* IEEE-like: the top exponent holds infinities and NaNs */
    bool saturate;    /* __NV_SATFINITE: overflow and infinities become the largest finite */
    uint32_t nan_out; /* the NaN a conversion produces (CUDA's canonical one) */
    double max;       /* the largest finite value, as the specifications state it */
};

static const struct ref_format ref_half = {"half", 16, 10, 15, true, false, 0x7fff, 65504};
static const struct ref_format ref_bf16 = {"bfloat16", 16, 7, 127, true, false, 0x7fff,
                                           0x1.fep127};
static const struct ref_format ref_e4m3 = {"e4m3", 8, 3, 7, false, true, 0x7f, 448};
static const struct ref_format ref_e5m2 = {"e5m2", 8, 2, 15, true, true, 0x7f, 57344};

static uint32_t
ref_sign_bit(const struct ref_format *fmt)
{
    return 1u << (fmt->bits - 1);
}

static uint32_t
ref_exp_max(const struct ref_format *fmt)
{
    return (1u << (fmt->bits - 1 - fmt->m)) - 1;
}

/* The value of a code, straight from the definition of the format. */
static double
ref_decode(const struct ref_format *fmt, uint32_t code)
{
    uint32_t mmask = (1u << fmt->m) - 1;
    uint32_t e = (code >> fmt->m) & ref_exp_max(fmt);
    uint32_t mant = code & mmask;
    double v;

    if (fmt->has_inf && e == ref_exp_max(fmt)) {
        v = mant != 0 ? NAN : INFINITY;
    } else if (!fmt->has_inf && e == ref_exp_max(fmt) && mant == mmask) {
        v = NAN; /* e4m3: S.1111.111 */
    } else if (e == 0) {
        v = ldexp(mant, 1 - fmt->bias - fmt->m);
    } else {
        v = ldexp(mant + (1u << fmt->m), (int)e - fmt->bias - fmt->m);
    }
    return (code & ref_sign_bit(fmt)) ? -v : v;
}

static uint32_t
ref_max_code(const struct ref_format *fmt)
{
    uint32_t mmask = (1u << fmt->m) - 1;
    return fmt->has_inf ? (ref_exp_max(fmt) - 1) << fmt->m | mmask
                        : ref_exp_max(fmt) << fmt->m | (mmask - 1);
}

/* The code of an exactly representable magnitude r >= 0. */
static uint32_t
ref_code_of(const struct ref_format *fmt, double r)
{
    double min_normal = ldexp(1, 1 - fmt->bias);
    if (r < min_normal) {
        return (uint32_t)(r / ldexp(1, 1 - fmt->bias - fmt->m));
    }
    int ex;
    frexp(r, &ex); /* r = f * 2^ex, f in [0.5, 1) */
    uint32_t mant = (uint32_t)(r / ldexp(1, ex - 1 - fmt->m)) - (1u << fmt->m);
    return (uint32_t)(ex - 1 + fmt->bias) << fmt->m | mant;
}

/* Round x to the format, nearest-even, by scaling to an integer multiple of the quantum of
 * x's binade and letting rint (round to nearest even) choose. */
static uint32_t
ref_encode(const struct ref_format *fmt, double x)
{
    if (isnan(x)) {
        return fmt->nan_out;
    }
    uint32_t sign = signbit(x) ? ref_sign_bit(fmt) : 0;
    double a = fabs(x);
    double max = fmt->max;
    uint32_t inf = ref_exp_max(fmt) << fmt->m;

    if (fmt->saturate && a > max) {
        a = max;
    }
    if (isinf(a)) {
        return sign | inf;
    }
    double quantum;
    if (a < ldexp(1, 1 - fmt->bias)) {
        quantum = ldexp(1, 1 - fmt->bias - fmt->m);
    } else {
        int ex;
        frexp(a, &ex);
        quantum = ldexp(1, ex - 1 - fmt->m);
    }
    double r = rint(a / quantum) * quantum;
    return sign | (r > max ? inf : ref_code_of(fmt, r));
}

/* Nearest representable by exhaustive search: of the finite codes with x's sign, the closest
 * to x (after saturation), the even code on a tie. For the 8-bit formats. */
static uint32_t
brute_encode(const struct ref_format *fmt, float x)
{
    if (isnan(x)) {
        return fmt->nan_out;
    }
    double max = fmt->max;
    double xd = x > max ? max : x < -max ? -max : x;
    uint32_t want_sign = signbit(x) ? ref_sign_bit(fmt) : 0;
    uint32_t best = UINT32_MAX;
    double best_dist = INFINITY;

    for (uint32_t code = 0; code < (1u << fmt->bits); code++) {
        double v = ref_decode(fmt, code);
        if ((code & ref_sign_bit(fmt)) != want_sign || !isfinite(v)) {
            continue;
        }
        double dist = fabs(xd - v);
        if (dist < best_dist || (dist == best_dist && (code & 1) == 0)) {
            best = code;
            best_dist = dist;
        }
    }
    return best;
}

/* bfloat16 from its two neighbours: truncation gives the one toward zero, the next code the
 * one away from it (past the largest finite, the would-be 2^128 that rounds to infinity). */
static uint16_t
neighbour_bf16(float f)
{
    if (isnan(f)) {
        return 0x7fff;
    }
    uint32_t u = f32_bits(f);
    uint16_t lo = (uint16_t)(u >> 16);
    if ((u & 0xffff) == 0) {
        return lo;
    }
    uint16_t hi = (uint16_t)(lo + 1);
    double vlo = fabs((double)f32_from_bits((uint32_t)lo << 16));
    double vhi = fabs((double)f32_from_bits((uint32_t)hi << 16));
    vhi = isinf(vhi) ? 0x1p128 : vhi;
    double d = fabs((double)f);
    double dlo = d - vlo, dhi = vhi - d;
    return dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1) ? hi : lo;
}

/* --- conversion inputs ---------------------------------------------------------------------- */

struct floats {
    float *v;
    size_t n, cap;
};

static void
floats_add(struct floats *fs, float f)
{
    if (fs->n == fs->cap) {
        fs->cap = fs->cap ? 2 * fs->cap : 4096;
        fs->v = realloc(fs->v, fs->cap * sizeof(float));
        cr_assert(fs->v != NULL);
    }
    fs->v[fs->n++] = f;
}

/* f and the floats one unit either side. */
static void
floats_add_around(struct floats *fs, double x)
{
    float f = (float)x;
    floats_add(fs, f);
    floats_add(fs, nextafterf(f, INFINITY));
    floats_add(fs, nextafterf(f, -INFINITY));
}

/*
 * The inputs on which a conversion to fmt can go wrong: every code's value, every halfway
 * point between neighbours of the same sign (up to the overflow threshold past the largest
 * finite), each with its float neighbours, the specials, and `sweep` float bit patterns spread
 * over all 2^32 by a golden-ratio stride.
 */
static struct floats
conversion_inputs(const struct ref_format *fmt, size_t sweep)
{
    struct floats fs = {0};
    uint32_t max = ref_max_code(fmt);

    for (uint32_t code = 0; code <= max; code++) {
        double v = ref_decode(fmt, code);
        double next = code < max ? ref_decode(fmt, code + 1)
                                 : v + ldexp(1, (int)(max >> fmt->m) - fmt->bias - fmt->m);
        floats_add_around(&fs, v);
        floats_add_around(&fs, -v);
        floats_add_around(&fs, (v + next) / 2);
        floats_add_around(&fs, -(v + next) / 2);
    }
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN,
                              f32_from_bits(0x7f800001), f32_from_bits(0xffc00001),
                              FLT_MAX, -FLT_MAX, FLT_MIN, -FLT_MIN, FLT_TRUE_MIN,
                              -FLT_TRUE_MIN, 1e30f, -1e30f, 1e-30f, 65504.0f, 65520.0f,
                              448.0f, 464.0f, 480.0f, 57344.0f, 61440.0f, 65536.0f};
    for (size_t i = 0; i < sizeof(specials) / sizeof(specials[0]); i++) {
        floats_add(&fs, specials[i]);
        floats_add(&fs, -specials[i]);
    }
    for (size_t i = 0; i < sweep; i++) {
        floats_add(&fs, f32_from_bits((uint32_t)(i * 0x9e3779b1u)));
    }
    return fs;
}

/* --- conversions ---------------------------------------------------------------------------- */

typedef float (*decode_fn)(uint32_t code);
typedef uint32_t (*encode_fn)(float f);

static float
dec_half(uint32_t c)
{
    return kr_f16_to_f32((uint16_t)c);
}

static float
dec_bf16(uint32_t c)
{
    return kr_bf16_to_f32((uint16_t)c);
}

static float
dec_e4m3(uint32_t c)
{
    return kr_e4m3_to_f32((uint8_t)c);
}

static float
dec_e5m2(uint32_t c)
{
    return kr_e5m2_to_f32((uint8_t)c);
}

static uint32_t
enc_half(float f)
{
    return kr_f32_to_f16(f);
}

static uint32_t
enc_bf16(float f)
{
    return kr_f32_to_bf16(f);
}

static uint32_t
enc_e4m3(float f)
{
    return kr_f32_to_e4m3(f);
}

static uint32_t
enc_e5m2(float f)
{
    return kr_f32_to_e5m2(f);
}

/* Every code decodes to its defined value (sign of zero included) and converts back to itself,
 * but for infinities, which saturate in fp8, and NaNs, which come back as the NaN. */
static void
check_decode_all(const struct ref_format *fmt, decode_fn dec, encode_fn enc)
{
    cr_assert_eq(ref_decode(fmt, ref_max_code(fmt)), fmt->max, "%s: largest finite", fmt->name);
    for (uint32_t code = 0; code < (1u << fmt->bits); code++) {
        double want = ref_decode(fmt, code);
        float got = dec(code);
        uint32_t back = enc(got);
        uint32_t want_back = isfinite(want) ? code : ref_encode(fmt, want);
        if (isnan(want)) {
            cr_assert(isnan(got), "%s 0x%x: decoded %a, want NaN", fmt->name, code, got);
        } else {
            cr_assert((double)got == want && !signbit(got) == !signbit(want),
                      "%s 0x%x: decoded %a, want %a", fmt->name, code, got, want);
        }
        cr_assert(back == want_back, "%s 0x%x: round trip gave 0x%x, want 0x%x", fmt->name,
                  code, back, want_back);
    }
}

static void
check_encode(const struct ref_format *fmt, encode_fn enc, const struct floats *fs)
{
    for (size_t i = 0; i < fs->n; i++) {
        uint32_t got = enc(fs->v[i]);
        uint32_t want = ref_encode(fmt, fs->v[i]);
        if (got != want) {
            cr_assert_fail("%s: %a (0x%08x) converted to 0x%x, want 0x%x", fmt->name,
                           fs->v[i], f32_bits(fs->v[i]), got, want);
        }
    }
}

Test(conversions, half_decodes_every_code_and_round_trips)
{
    check_decode_all(&ref_half, dec_half, enc_half);
    for (uint32_t code = 0; code < 0x10000; code++) {
        uint16_t h = (uint16_t)code;
        _Float16 x;
        memcpy(&x, &h, sizeof(x));
        float want = (float)x, got = kr_f16_to_f32(h);
        cr_assert(f32_bits(got) == f32_bits(want) || (isnan(got) && isnan(want)),
                  "half 0x%04x: %a, _Float16 says %a", code, got, want);
    }
}

Test(conversions, float_to_half_matches_float16_cast)
{
    struct floats fs = conversion_inputs(&ref_half, 1u << 22);

    for (size_t i = 0; i < fs.n; i++) {
        _Float16 x = (_Float16)fs.v[i];
        uint16_t want;
        memcpy(&want, &x, sizeof(want));
        uint16_t got = kr_f32_to_f16(fs.v[i]);
        bool nan = isnan(fs.v[i]);
        if (nan ? got != 0x7fff : got != want) {
            cr_assert_fail("half: %a (0x%08x) converted to 0x%04x, _Float16 says 0x%04x",
                           fs.v[i], f32_bits(fs.v[i]), got, want);
        }
        /* The reference the reduction tests rely on agrees with _Float16 too. */
        uint32_t ref = ref_encode(&ref_half, fs.v[i]);
        if (nan ? ref != 0x7fff : ref != want) {
            cr_assert_fail("reference half: %a gave 0x%04x, _Float16 says 0x%04x", fs.v[i],
                           ref, want);
        }
    }
    free(fs.v);
}

Test(conversions, bf16_decodes_every_code_and_rounds_to_nearest_even)
{
    check_decode_all(&ref_bf16, dec_bf16, enc_bf16);

    struct floats fs = conversion_inputs(&ref_bf16, 1u << 22);
    /* Every upper half with the lower halves where rounding decides. */
    const uint32_t lows[] = {0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff};
    for (uint32_t hi = 0; hi < 0x10000; hi++) {
        for (size_t k = 0; k < sizeof(lows) / sizeof(lows[0]); k++) {
            floats_add(&fs, f32_from_bits(hi << 16 | lows[k]));
        }
    }
    for (size_t i = 0; i < fs.n; i++) {
        uint16_t want = neighbour_bf16(fs.v[i]);
        uint16_t got = kr_f32_to_bf16(fs.v[i]);
        if (got != want || ref_encode(&ref_bf16, fs.v[i]) != want) {
            cr_assert_fail("bfloat16: %a (0x%08x) converted to 0x%04x, reference 0x%04x, "
                           "neighbours say 0x%04x", fs.v[i], f32_bits(fs.v[i]), got,
                           ref_encode(&ref_bf16, fs.v[i]), want);
        }
    }
    free(fs.v);
}

static void
check_fp8(const struct ref_format *fmt, decode_fn dec, encode_fn enc)
{
    check_decode_all(fmt, dec, enc);

    struct floats fs = conversion_inputs(fmt, 1u << 18);
    check_encode(fmt, enc, &fs);
    for (size_t i = 0; i < fs.n; i++) {
        uint32_t want = brute_encode(fmt, fs.v[i]);
        uint32_t ref = ref_encode(fmt, fs.v[i]);
        if (ref != want) {
            cr_assert_fail("%s: %a: reference 0x%x, brute force 0x%x", fmt->name, fs.v[i], ref,
                           want);
        }
    }
    free(fs.v);
}

Test(conversions, e4m3_matches_brute_force)
{
    check_fp8(&ref_e4m3, dec_e4m3, enc_e4m3);
}

Test(conversions, e5m2_matches_brute_force)
{
    check_fp8(&ref_e5m2, dec_e5m2, enc_e5m2);
}

/* Anchors from the formats' specifications and CUDA's conversions, so that a reference and an
 * implementation agreeing on a wrong reading of the formats would still fail. */
Test(conversions, known_values)
{
    cr_assert_eq(kr_f32_to_f16(1.0f), 0x3c00);
    cr_assert_eq(kr_f32_to_f16(65504.0f), 0x7bff);
    cr_assert_eq(kr_f32_to_f16(65519.996f), 0x7bff);
    cr_assert_eq(kr_f32_to_f16(65520.0f), 0x7c00);
    cr_assert_eq(kr_f32_to_f16(-INFINITY), 0xfc00);
    cr_assert_eq(kr_f32_to_f16(0x1p-24f), 0x0001);
    cr_assert_eq(kr_f32_to_f16(0x1p-25f), 0x0000);          /* tie to even: zero */
    cr_assert_eq(kr_f32_to_f16(0x1.8p-24f), 0x0002);        /* tie to even: two */
    cr_assert_eq(kr_f32_to_f16(-NAN), 0x7fff);
    cr_assert_eq(kr_f16_to_f32(0x0001), 0x1p-24f);
    cr_assert_eq(kr_f32_to_bf16(1.0f), 0x3f80);
    cr_assert_eq(kr_f32_to_bf16(f32_from_bits(0x3f808000)), 0x3f80); /* tie to even */
    cr_assert_eq(kr_f32_to_bf16(f32_from_bits(0x3f818000)), 0x3f82); /* tie to even */
    cr_assert_eq(kr_f32_to_bf16(FLT_MAX), 0x7f80);
    cr_assert_eq(kr_f32_to_bf16(NAN), 0x7fff);
    cr_assert_eq(kr_f32_to_e4m3(1.0f), 0x38);
    cr_assert_eq(kr_f32_to_e4m3(448.0f), 0x7e);
    cr_assert_eq(kr_f32_to_e4m3(464.0f), 0x7e);
    cr_assert_eq(kr_f32_to_e4m3(1e6f), 0x7e);
    cr_assert_eq(kr_f32_to_e4m3(INFINITY), 0x7e);
    cr_assert_eq(kr_f32_to_e4m3(-INFINITY), 0xfe);
    cr_assert_eq(kr_f32_to_e4m3(NAN), 0x7f);
    cr_assert_eq(kr_f32_to_e4m3(0x1p-9f), 0x01);
    cr_assert_eq(kr_f32_to_e4m3(0x1p-10f), 0x00);
    cr_assert_eq(kr_e4m3_to_f32(0x7e), 448.0f);
    cr_assert_eq(kr_e4m3_to_f32(0x08), 0x1p-6f);
    cr_assert(isnan(kr_e4m3_to_f32(0xff)));
    cr_assert_eq(kr_f32_to_e5m2(1.0f), 0x3c);
    cr_assert_eq(kr_f32_to_e5m2(57344.0f), 0x7b);
    cr_assert_eq(kr_f32_to_e5m2(61440.0f), 0x7b);
    cr_assert_eq(kr_f32_to_e5m2(INFINITY), 0x7b);
    cr_assert_eq(kr_f32_to_e5m2(-INFINITY), 0xfb);
    cr_assert_eq(kr_f32_to_e5m2(NAN), 0x7f);
    cr_assert_eq(kr_f32_to_e5m2(0x1p-16f), 0x01);
    cr_assert_eq(kr_e5m2_to_f32(0x7c), INFINITY);
    cr_assert(isnan(kr_e5m2_to_f32(0x7e)));
}

/* --- datatypes and scalars ------------------------------------------------------------------ */

Test(types, sizes_names_and_kinds)
{
    static const struct {
        ncclDataType_t type;
        size_t size;
        const char *name;
        bool is_float;
    } want[] = {
        {ncclInt8, 1, "int8", false},         {ncclUint8, 1, "uint8", false},
        {ncclInt32, 4, "int32", false},       {ncclUint32, 4, "uint32", false},
        {ncclInt64, 8, "int64", false},       {ncclUint64, 8, "uint64", false},
        {ncclFloat16, 2, "half", true},       {ncclFloat32, 4, "float", true},
        {ncclFloat64, 8, "double", true},     {ncclBfloat16, 2, "bfloat16", true},
        {ncclFloat8e4m3, 1, "f8e4m3", true},  {ncclFloat8e5m2, 1, "f8e5m2", true},
    };
    cr_assert_eq(sizeof(want) / sizeof(want[0]), ncclNumTypes);
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
        cr_assert_eq(kr_type_size(want[i].type), want[i].size, "type %d", want[i].type);
        cr_assert_str_eq(kr_type_name(want[i].type), want[i].name);
        cr_assert_eq(kr_type_is_float(want[i].type), want[i].is_float, "type %d",
                     want[i].type);
    }
    const int invalid[] = {-1, ncclNumTypes, 1000};
    for (size_t i = 0; i < sizeof(invalid) / sizeof(invalid[0]); i++) {
        ncclDataType_t t = (ncclDataType_t)invalid[i];
        cr_assert_eq(kr_type_size(t), 0);
        cr_assert_str_eq(kr_type_name(t), "?");
        cr_assert(!kr_type_is_float(t));
    }
}

static uint64_t
scalar_bits(ncclDataType_t type, double value)
{
    uint8_t out[8];
    uint64_t u;
    memset(out, 0xa5, sizeof(out));
    kr_scalar_from_double(type, value, out);
    memcpy(&u, out, sizeof(u));
    size_t size = kr_type_size(type);
    cr_assert(size == 8 || (u >> (8 * size)) == 0, "type %d: bytes past the element: %016lx",
              type, (unsigned long)u);
    return u;
}

Test(scalars, from_double_truncates_saturates_and_rounds_once)
{
    cr_assert_eq(scalar_bits(ncclInt8, 2.9), 2);
    cr_assert_eq(scalar_bits(ncclInt8, -2.9), 0xfe);
    cr_assert_eq(scalar_bits(ncclInt8, 300), 0x7f);
    cr_assert_eq(scalar_bits(ncclInt8, -300), 0x80);
    cr_assert_eq(scalar_bits(ncclUint8, -1), 0);
    cr_assert_eq(scalar_bits(ncclUint8, 255.5), 255);
    cr_assert_eq(scalar_bits(ncclInt32, NAN), 0);
    cr_assert_eq(scalar_bits(ncclInt32, -2147483648.0), 0x80000000u);
    cr_assert_eq(scalar_bits(ncclUint32, 4294967295.0), 0xffffffffu);
    cr_assert_eq(scalar_bits(ncclInt64, 1e19), (uint64_t)INT64_MAX);
    cr_assert_eq(scalar_bits(ncclInt64, -1e19), (uint64_t)INT64_MIN);
    cr_assert_eq(scalar_bits(ncclInt64, -7.5), (uint64_t)-7);
    cr_assert_eq(scalar_bits(ncclUint64, 1e20), UINT64_MAX);
    cr_assert_eq(scalar_bits(ncclUint64, 0x1p63), 0x8000000000000000ull);
    cr_assert_eq(scalar_bits(ncclFloat32, 0.1), f32_bits(0.1f));
    cr_assert_eq(scalar_bits(ncclFloat64, 0.1), 0x3fb999999999999aull);
    cr_assert_eq(scalar_bits(ncclFloat16, 1.0 / 3), 0x3555);
    /* Just above a halfway point, by less than a float unit: rounding the double to float
     * first would land on the halfway point and round to even, down. */
    cr_assert_eq(scalar_bits(ncclFloat16, 1 + 0x1p-11 + 0x1p-40), 0x3c01);
    cr_assert_eq(scalar_bits(ncclFloat16, 1 + 0x1p-11 - 0x1p-40), 0x3c00);
    cr_assert_eq(scalar_bits(ncclBfloat16, 1 + 0x1p-8 + 0x1p-40), 0x3f81);
    cr_assert_eq(scalar_bits(ncclFloat8e4m3, 1 + 0x1p-4 + 0x1p-40), 0x39);
    cr_assert_eq(scalar_bits(ncclFloat8e5m2, 1 + 0x1p-3 + 0x1p-40), 0x3d);
    cr_assert_eq(scalar_bits(ncclFloat8e4m3, 1e300), 0x7e);
    cr_assert_eq(scalar_bits(ncclFloat16, 1e300), 0x7c00);
    cr_assert_eq(scalar_bits(ncclFloat16, -1e-300), 0x8000);
    cr_assert_eq(scalar_bits(ncclBfloat16, NAN), 0x7fff);
}

Test(scalars, to_double_reads_every_type)
{
    const double values[] = {0.0, 1.0, -2.0, 96.0, 0.5, -0.25};
    for (int t = 0; t < ncclNumTypes; t++) {
        for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
            double v = values[i];
            bool is_unsigned = t == ncclUint8 || t == ncclUint32 || t == ncclUint64;
            if (!kr_type_is_float(t) && (v != (double)(int64_t)v || (is_unsigned && v < 0))) {
                continue; /* not a value of the type */
            }
            uint8_t elem[8];
            kr_scalar_from_double(t, v, elem);
            cr_assert_eq(kr_scalar_to_double(t, elem), v, "type %s value %g", kr_type_name(t),
                         v);
        }
    }
    uint64_t big = UINT64_MAX;
    cr_assert_eq(kr_scalar_to_double(ncclUint64, &big), 0x1p64);
    int8_t neg = -128;
    cr_assert_eq(kr_scalar_to_double(ncclInt8, &neg), -128.0);
}

/* --- reductions ------------------------------------------------------------------------------ */

enum ref_class { REF_SIGNED, REF_UNSIGNED, REF_F32, REF_F64, REF_NARROW };

struct ref_type {
    ncclDataType_t type;
    size_t size;
    enum ref_class cls;
    const struct ref_format *fmt; /* REF_NARROW only */
    double *decoded;              /* REF_NARROW: every code's value */
};

static struct ref_type
ref_type_of(ncclDataType_t type)
{
    struct ref_type rt = {.type = type, .size = kr_type_size(type)};
    switch (type) {
    case ncclInt8:
    case ncclInt32:
    case ncclInt64:
        rt.cls = REF_SIGNED;
        break;
    case ncclUint8:
    case ncclUint32:
    case ncclUint64:
        rt.cls = REF_UNSIGNED;
        break;
    case ncclFloat32:
        rt.cls = REF_F32;
        break;
    case ncclFloat64:
        rt.cls = REF_F64;
        break;
    default:
        rt.cls = REF_NARROW;
        rt.fmt = type == ncclFloat16    ? &ref_half
                 : type == ncclBfloat16 ? &ref_bf16
                 : type == ncclFloat8e4m3 ? &ref_e4m3
                                          : &ref_e5m2;
        rt.decoded = malloc(sizeof(double) << rt.fmt->bits);
        cr_assert(rt.decoded != NULL);
        for (uint32_t c = 0; c < (1u << rt.fmt->bits); c++) {
            rt.decoded[c] = ref_decode(rt.fmt, c);
        }
    }
    return rt;
}

static uint64_t
elem_get(const struct ref_type *rt, const void *buf, size_t i)
{
    uint64_t v = 0;
    memcpy(&v, (const char *)buf + i * rt->size, rt->size);
    return v;
}

static void
elem_put(const struct ref_type *rt, void *buf, size_t i, uint64_t v)
{
    memcpy((char *)buf + i * rt->size, &v, rt->size);
}

static int64_t
sign_extend(const struct ref_type *rt, uint64_t v)
{
    int shift = 64 - 8 * (int)rt->size;
    return (int64_t)(v << shift) >> shift;
}

static uint64_t
width_mask(const struct ref_type *rt)
{
    return rt->size == 8 ? UINT64_MAX : (1ull << (8 * rt->size)) - 1;
}

/* IEEE 754-2019 maximumNumber / minimumNumber: NaN loses, +0 > -0. */
static double
ref_max(double a, double b)
{
    if (isnan(a) || isnan(b)) {
        return isnan(a) ? b : a;
    }
    if (a == 0 && b == 0) {
        return signbit(a) && signbit(b) ? -0.0 : 0.0;
    }
    return a > b ? a : b;
}

static double
ref_min(double a, double b)
{
    if (isnan(a) || isnan(b)) {
        return isnan(a) ? b : a;
    }
    if (a == 0 && b == 0) {
        return signbit(a) || signbit(b) ? -0.0 : 0.0;
    }
    return a < b ? a : b;
}

static double
ref_to_double(const struct ref_type *rt, uint64_t bits)
{
    if (rt->cls == REF_F32) {
        return f32_from_bits((uint32_t)bits);
    }
    if (rt->cls == REF_NARROW) {
        return rt->decoded[bits];
    }
    double d;
    memcpy(&d, &bits, sizeof(d));
    return d;
}

/* A value computed in double, rounded once to the element type. */
static uint64_t
ref_from_double(const struct ref_type *rt, double v)
{
    if (rt->cls == REF_F32) {
        return f32_bits((float)v);
    }
    if (rt->cls == REF_NARROW) {
        return ref_encode(rt->fmt, v);
    }
    uint64_t u;
    memcpy(&u, &v, sizeof(u));
    return u;
}

/*
 * One operation on two elements (b unused for division). Integers: exact arithmetic in 64 or
 * 128 bits, truncated to the width. Floating types: in double, rounded once to the type, which
 * is the correctly rounded result (double holds a float or narrower product exactly, and has
 * more than twice float's precision for sums and quotients); double itself computes in double.
 */
enum ref_op { REF_ADD, REF_MUL, REF_MAX, REF_MIN, REF_DIV };

static uint64_t
ref_apply(const struct ref_type *rt, enum ref_op op, uint64_t a, uint64_t b, uint64_t divisor)
{
    uint64_t mask = width_mask(rt);

    if (rt->cls == REF_SIGNED || rt->cls == REF_UNSIGNED) {
        bool s = rt->cls == REF_SIGNED;
        switch (op) {
        case REF_ADD:
            return (a + b) & mask;
        case REF_MUL:
            return (a * b) & mask;
        case REF_MAX:
            return (s ? sign_extend(rt, a) > sign_extend(rt, b) : a > b) ? a : b;
        case REF_MIN:
            return (s ? sign_extend(rt, a) < sign_extend(rt, b) : a < b) ? a : b;
        case REF_DIV:
            if (s) {
                return (uint64_t)(int64_t)((__int128)sign_extend(rt, a) / (__int128)divisor) &
                       mask;
            }
            return a / divisor;
        }
    }
    double x = ref_to_double(rt, a), y = ref_to_double(rt, b), r = 0;
    switch (op) {
    case REF_ADD:
        r = x + y;
        break;
    case REF_MUL:
        r = x * y;
        break;
    case REF_MAX:
        r = ref_max(x, y);
        break;
    case REF_MIN:
        r = ref_min(x, y);
        break;
    case REF_DIV:
        r = x / (double)divisor;
        break;
    }
    return ref_from_double(rt, r);
}

/* The contract of kernels.h, read literally. */
static uint64_t
ref_reduce(const struct ref_type *rt, const struct kr_redop *op, unsigned flags, uint64_t a,
           const uint64_t *b, uint64_t scalar)
{
    static const enum ref_op combine[] = {
        [KR_SUM] = REF_ADD, [KR_PROD] = REF_MUL, [KR_MAX] = REF_MAX,
        [KR_MIN] = REF_MIN, [KR_PREMULSUM] = REF_ADD, [KR_SUMPOSTDIV] = REF_ADD,
    };
    bool premul = op->kind == KR_PREMULSUM;
    uint64_t r = premul && (flags & KR_PRE_A) ? ref_apply(rt, REF_MUL, a, scalar, 0) : a;

    if (b != NULL) {
        uint64_t y = premul && (flags & KR_PRE_B) ? ref_apply(rt, REF_MUL, *b, scalar, 0) : *b;
        r = ref_apply(rt, combine[op->kind], r, y, 0);
    }
    if (op->kind == KR_SUMPOSTDIV && (flags & KR_POST)) {
        r = ref_apply(rt, REF_DIV, r, 0, op->divisor);
    }
    return r;
}

/* Test data: integers are uniformly random bits; narrow codes too (every code, NaN and infinity
 * included), with zeros of both signs and the extremes made frequent; float and double mostly
 * values of moderate range, with zeros, infinities, NaNs, subnormals and raw bits mixed in. */
static uint64_t
random_elem(const struct ref_type *rt, uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    if (rt->cls == REF_SIGNED || rt->cls == REF_UNSIGNED) {
        return r & width_mask(rt);
    }
    if (rt->cls == REF_NARROW) {
        const struct ref_format *fmt = rt->fmt;
        uint32_t sign = (r & 8) ? ref_sign_bit(fmt) : 0;
        uint32_t special[] = {0, 1, ref_max_code(fmt), fmt->nan_out, ref_exp_max(fmt) << fmt->m};
        return (r & 3) == 0 ? sign | special[(r >> 8) % 5] : (r >> 16) & width_mask(rt);
    }
    static const double specials[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, 1.0, -1.0,
                                      DBL_MIN, -FLT_TRUE_MIN, FLT_TRUE_MIN, 3e-39, -3e-39};
    double v;
    switch (r & 7) {
    case 0:
        v = specials[(r >> 8) % (sizeof(specials) / sizeof(specials[0]))];
        break;
    case 1:
        return rt->cls == REF_F32 ? (uint32_t)(r >> 3) : r >> 3;
    default:
        v = ldexp((double)(r >> 40) / 0x1p24, (int)((r >> 8) % 41) - 20);
        v = (r & 8) ? -v : v;
    }
    return ref_from_double(rt, v);
}

/* A PreMulSum scalar: finite, in the range averaging and scaling use. */
static uint64_t
random_scalar(const struct ref_type *rt, uint64_t *rng)
{
    uint64_t r = rng_next(rng);
    if (rt->cls == REF_SIGNED || rt->cls == REF_UNSIGNED) {
        return r & width_mask(rt);
    }
    uint8_t out[8];
    uint64_t u = 0;
    kr_scalar_from_double(rt->type, ldexp(1 + (double)(r >> 11) / 0x1p53, (int)(r % 9) - 6),
                          out);
    memcpy(&u, out, rt->size);
    return u;
}

static bool
elem_same(const struct ref_type *rt, uint64_t got, uint64_t want)
{
    if (got == want) {
        return true;
    }
    /* float and double keep whatever NaN the CPU made; any NaN is right where one is due. */
    return (rt->cls == REF_F32 || rt->cls == REF_F64) && isnan(ref_to_double(rt, got)) &&
           isnan(ref_to_double(rt, want));
}

enum placement { PLACE_ALIGNED, PLACE_OFFSET, PLACE_DST_IS_A, PLACE_DST_IS_B };
static const char *const placement_names[] = {"aligned", "offset by one element", "dst == a",
                                              "dst == b"};
static const char *const kind_names[] = {"sum", "prod", "max", "min", "premulsum",
                                         "sumpostdiv"};

#define GUARD 4 /* elements checked on each side of dst */

static void
check_reduce(const struct ref_type *rt, enum kr_op_kind kind, unsigned flags, bool binary,
             size_t count, enum placement place, uint64_t seed)
{
    /* Integers also get divisors past their width; floating types, for which the quotient is
     * computed in float (see kernels.h), those an average uses. */
    static const uint64_t divisors[] = {1, 2, 3, 7, 8, 17, 1000, 65537, 0x7fffffff};
    size_t size = rt->size, slots = count + 2 * GUARD + 1;
    uint64_t rng = seed;
    struct kr_redop op = {.kind = kind, .type = rt->type};
    uint64_t scalar = random_scalar(rt, &rng);

    memcpy(op.scalar, &scalar, sizeof(op.scalar));
    bool integer = rt->cls == REF_SIGNED || rt->cls == REF_UNSIGNED;
    op.divisor = divisors[rng_next(&rng) % (integer ? 9 : 7)];
    if (integer && (rng_next(&rng) & 7) == 0) {
        const uint64_t big[] = {0x100000001ull, 0x8000000000000000ull, UINT64_MAX};
        op.divisor = big[rng_next(&rng) % 3];
    }

    /* 64-byte aligned buffers with GUARD slots before element 0 (plus one to misalign). */
    size_t shift = GUARD + (place == PLACE_OFFSET ? 1 : 0);
    char *abuf = aligned_alloc(64, (slots * size + 63) / 64 * 64);
    char *bbuf = aligned_alloc(64, (slots * size + 63) / 64 * 64);
    char *dbuf = aligned_alloc(64, (slots * size + 63) / 64 * 64);
    uint64_t *a0 = malloc((count + 1) * sizeof(uint64_t));
    uint64_t *b0 = malloc((count + 1) * sizeof(uint64_t));
    cr_assert(abuf && bbuf && dbuf && a0 && b0);

    char *a = abuf + shift * size, *b = bbuf + shift * size;
    char *dst = place == PLACE_DST_IS_A ? a : place == PLACE_DST_IS_B ? b : dbuf + shift * size;
    for (size_t i = 0; i < slots; i++) {
        elem_put(rt, dbuf, i, 0x5a5a5a5a5a5a5a5aull);
    }
    for (size_t i = 0; i < count; i++) {
        a0[i] = random_elem(rt, &rng);
        b0[i] = random_elem(rt, &rng);
        elem_put(rt, a, i, a0[i]);
        elem_put(rt, b, i, b0[i]);
    }

    kr_reduce_host(dst, a, binary ? b : NULL, count, &op, flags);

    for (size_t i = 0; i < count; i++) {
        uint64_t want = ref_reduce(rt, &op, flags, a0[i], binary ? &b0[i] : NULL, scalar);
        uint64_t got = elem_get(rt, dst, i);
        if (!elem_same(rt, got, want)) {
            cr_assert_fail("%s %s flags 0x%x %s count %zu %s (seed %llu): element %zu: a 0x%llx "
                           "b 0x%llx scalar 0x%llx divisor %llu: got 0x%llx, want 0x%llx",
                           kr_type_name(rt->type), kind_names[kind], flags,
                           binary ? "a,b" : "a only", count, placement_names[place],
                           (unsigned long long)seed, i, (unsigned long long)a0[i],
                           (unsigned long long)b0[i], (unsigned long long)scalar,
                           (unsigned long long)op.divisor, (unsigned long long)got,
                           (unsigned long long)want);
        }
    }
    /* Nothing written outside dst[0, count), nor, in place, anywhere in dbuf. */
    for (size_t i = 0; i < slots; i++) {
        bool inside = i >= shift && i < shift + count && dst == dbuf + shift * size;
        if (!inside && elem_get(rt, dbuf, i) != (0x5a5a5a5a5a5a5a5aull & width_mask(rt))) {
            cr_assert_fail("%s %s count %zu %s: slot %zu of dst's buffer written",
                           kr_type_name(rt->type), kind_names[kind], count,
                           placement_names[place], i);
        }
    }
    free(abuf);
    free(bbuf);
    free(dbuf);
    free(a0);
    free(b0);
}

/*
 * Every op x flag set x b or not x placement for the small counts (each vector width's
 * prologue, body and epilogue). For 100003 elements, every op with flag sets that reach each
 * loop (none, pre on b alone, all; pre and post on a alone), off by one element and in place.
 */
static void
check_type(ncclDataType_t type)
{
    static const size_t small[] = {0, 1, 7, 8, 33, 1000};
    struct ref_type rt = ref_type_of(type);
    uint64_t seed = 1000 * (uint64_t)type;

    for (int kind = KR_SUM; kind <= KR_SUMPOSTDIV; kind++) {
        for (unsigned flags = 0; flags < 8; flags++) {
            for (int binary = 0; binary < 2; binary++) {
                for (size_t c = 0; c < sizeof(small) / sizeof(small[0]); c++) {
                    for (int place = PLACE_ALIGNED; place <= PLACE_DST_IS_B; place++) {
                        if (binary || place != PLACE_DST_IS_B) {
                            check_reduce(&rt, kind, flags, binary, small[c], place, seed++);
                        }
                    }
                }
            }
        }
        const unsigned big_flags[] = {0, KR_PRE_B, KR_PRE_A | KR_PRE_B | KR_POST};
        for (size_t f = 0; f < 3; f++) {
            check_reduce(&rt, kind, big_flags[f], true, 100003, PLACE_OFFSET, seed++);
            check_reduce(&rt, kind, big_flags[f], true, 100003, PLACE_DST_IS_B, seed++);
        }
        check_reduce(&rt, kind, KR_PRE_A | KR_POST, false, 100003, PLACE_DST_IS_A, seed++);
    }
    free(rt.decoded);
}

/* One test per datatype, so that Criterion runs them in parallel and names the failing type. */
Test(reduce, int8)
{
    check_type(ncclInt8);
}

Test(reduce, uint8)
{
    check_type(ncclUint8);
}

Test(reduce, int32)
{
    check_type(ncclInt32);
}

Test(reduce, uint32)
{
    check_type(ncclUint32);
}

Test(reduce, int64)
{
    check_type(ncclInt64);
}

Test(reduce, uint64)
{
    check_type(ncclUint64);
}

Test(reduce, half)
{
    check_type(ncclFloat16);
}

Test(reduce, float)
{
    check_type(ncclFloat32);
}

Test(reduce, double)
{
    check_type(ncclFloat64);
}

Test(reduce, bfloat16)
{
    check_type(ncclBfloat16);
}

Test(reduce, f8e4m3)
{
    check_type(ncclFloat8e4m3);
}

Test(reduce, f8e5m2)
{
    check_type(ncclFloat8e5m2);
}

/* A caller's flush-to-zero, denormals-are-zero and rounding mode do not leak into the
 * results, and the caller gets its mode back. */
Test(reduce, ignores_and_restores_the_callers_fp_mode)
{
    const unsigned ftz_daz_down = 0x1f80u | 0x8000u | 0x0040u | 0x2000u;
    float a[4] = {FLT_TRUE_MIN, 0x1p-127f, 1.0f, 1.0f};
    float b[4] = {FLT_TRUE_MIN, 0x1p-127f, 0x1p-30f, -0x1p-30f};
    float want[4] = {2 * FLT_TRUE_MIN, 0x1p-126f, 1.0f, 1.0f};
    float dst[4];
    struct kr_redop op = {.kind = KR_SUM, .type = ncclFloat32};
    unsigned saved = _mm_getcsr();

    _mm_setcsr(ftz_daz_down);
    kr_reduce_host(dst, a, b, 4, &op, 0);
    unsigned after = _mm_getcsr();
    _mm_setcsr(saved);

    cr_assert_eq(after & ~0x3fu, ftz_daz_down, "mode not restored: 0x%x", after);
    for (int i = 0; i < 4; i++) {
        cr_assert_eq(f32_bits(dst[i]), f32_bits(want[i]), "element %d: %a, want %a", i,
                     dst[i], want[i]);
    }
}

Test(copy, copies_bytes_and_allows_in_place)
{
    char src[37], dst[37];
    for (int i = 0; i < 37; i++) {
        src[i] = (char)i;
        dst[i] = 0;
    }
    kr_copy_host(dst + 1, src + 3, 33);
    for (int i = 0; i < 33; i++) {
        cr_assert_eq(dst[i + 1], src[i + 3]);
    }
    cr_assert_eq(dst[0], 0);
    cr_assert_eq(dst[34], 0);
    kr_copy_host(src, src, sizeof(src));
    kr_copy_host(NULL, NULL, 0);
    cr_assert_eq(src[36], 36);
}

Test(copy, stream_copies_any_alignment_and_size)
{
    /* Sizes each side of KR_STREAM_MIN_BYTES (1 MiB) and of a 64-byte line. */
    const size_t sizes[] = {0, 1, 63, 64, 65, 4096, (1u << 20) - 1, 1u << 20, (3u << 20) + 77};
    const size_t cap = (3u << 20) + 256;
    uint8_t *src = malloc(cap), *dst = malloc(cap);
    cr_assert(src != NULL && dst != NULL);
    for (size_t i = 0; i < cap; i++) {
        src[i] = (uint8_t)(i * 131u + 7u);
    }
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        for (size_t dofs = 0; dofs < 3; dofs++) {
            size_t sofs = 2 - dofs + 5 * (k & 1);
            memset(dst, 0xa5, cap);
            kr_copy_host_stream(dst + dofs, src + sofs, sizes[k]);
            cr_assert(memcmp(dst + dofs, src + sofs, sizes[k]) == 0, "size %zu offsets %zu %zu",
                      sizes[k], dofs, sofs);
            for (size_t i = 0; i < dofs; i++) {
                cr_assert_eq(dst[i], 0xa5, "size %zu: byte %zu before dst written", sizes[k], i);
            }
            cr_assert_eq(dst[dofs + sizes[k]], 0xa5, "size %zu: byte after dst written", sizes[k]);
        }
    }
    memcpy(dst, src, cap);
    kr_copy_host_stream(dst, dst, cap);
    cr_assert(memcmp(dst, src, cap) == 0);
    kr_copy_host_stream(NULL, NULL, 0);
    free(src);
    free(dst);
}

/*
 * float16 reductions against the scalar conversions, for every half as a and, as b, specials
 * (signed zeros, extremes, subnormals, infinities, quiet, signalling and negative NaNs) and
 * random halves; every op kind and flag combination, binary and unary. kr_reduce_host takes
 * its F16C path on a CPU with AVX2, the clones elsewhere: either must give these bits.
 */
/* maximumNumber/minimumNumber with +0 > -0, as kernels.h states. */
static float
ref_maxmin(float a, float b, bool max)
{
    if (a != a) {
        return b;
    }
    if (b != b) {
        return a;
    }
    if (a == b) {
        return f32_from_bits(max ? f32_bits(a) & f32_bits(b) : f32_bits(a) | f32_bits(b));
    }
    return (a > b) == max ? a : b;
}

static uint16_t
ref_half_op(const struct kr_redop *op, unsigned flags, uint16_t a, const uint16_t *b)
{
    float s = kr_f16_to_f32((uint16_t)(op->scalar[0] | op->scalar[1] << 8));
    switch (op->kind) {
    case KR_SUM:
        return b ? kr_f32_to_f16(kr_f16_to_f32(a) + kr_f16_to_f32(*b)) : a;
    case KR_PROD:
        return b ? kr_f32_to_f16(kr_f16_to_f32(a) * kr_f16_to_f32(*b)) : a;
    case KR_MAX:
    case KR_MIN:
        return b ? kr_f32_to_f16(ref_maxmin(kr_f16_to_f32(a), kr_f16_to_f32(*b),
                                            op->kind == KR_MAX))
                 : a;
    case KR_PREMULSUM: {
        uint16_t pa = flags & KR_PRE_A ? kr_f32_to_f16(kr_f16_to_f32(a) * s) : a;
        if (!b) {
            return pa;
        }
        uint16_t pb = flags & KR_PRE_B ? kr_f32_to_f16(kr_f16_to_f32(*b) * s) : *b;
        return kr_f32_to_f16(kr_f16_to_f32(pa) + kr_f16_to_f32(pb));
    }
    case KR_SUMPOSTDIV: {
        uint16_t sum = b ? kr_f32_to_f16(kr_f16_to_f32(a) + kr_f16_to_f32(*b)) : a;
        return flags & KR_POST ? kr_f32_to_f16(kr_f16_to_f32(sum) / (float)op->divisor) : sum;
    }
    }
    return 0;
}

Test(reduce, half_matches_scalar_conversions_on_every_half)
{
    static const uint16_t specials[] = {0x0000, 0x8000, 0x3c00, 0xbc00, 0x7bff, 0xfbff, 0x0001,
                                        0x8001, 0x03ff, 0x0400, 0x7c00, 0xfc00, 0x7e00, 0x7c01,
                                        0xfe00, 0x3555, 0xc248, 0x5bff};
    const size_t nspecial = sizeof(specials) / sizeof(specials[0]);
    const size_t n = 65536;
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2), *dst = malloc(n * 2);
    cr_assert(a != NULL && b != NULL && dst != NULL);
    struct kr_redop ops[8] = {
        {.kind = KR_SUM}, {.kind = KR_PROD}, {.kind = KR_MAX}, {.kind = KR_MIN},
        {.kind = KR_PREMULSUM}, {.kind = KR_PREMULSUM}, {.kind = KR_SUMPOSTDIV, .divisor = 3},
        {.kind = KR_SUMPOSTDIV, .divisor = 7},
    };
    kr_scalar_from_double(ncclFloat16, 1.0 / 3.0, ops[4].scalar);
    kr_scalar_from_double(ncclFloat16, 0x1p-20, ops[5].scalar); /* products go subnormal */
    uint32_t x = 2463534242u;

    for (size_t i = 0; i < n; i++) {
        a[i] = (uint16_t)i;
    }
    for (size_t bi = 0; bi <= nspecial; bi++) {
        for (size_t i = 0; i < n; i++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            b[i] = bi < nspecial ? specials[bi] : (uint16_t)x;
        }
        for (size_t o = 0; o < sizeof(ops) / sizeof(ops[0]); o++) {
            ops[o].type = ncclFloat16;
            for (unsigned flags = 0; flags < 8; flags++) {
                for (int binary = 0; binary <= 1; binary++) {
                    kr_reduce_host(dst, a, binary ? b : NULL, n, &ops[o], flags);
                    for (size_t i = 0; i < n; i++) {
                        uint16_t want = ref_half_op(&ops[o], flags, a[i], binary ? &b[i] : NULL);
                        if (dst[i] != want) {
                            cr_assert_fail("kind %d flags %u %s: a 0x%04x b 0x%04x gave 0x%04x, "
                                           "want 0x%04x", ops[o].kind, flags,
                                           binary ? "binary" : "unary", a[i], b[i], dst[i], want);
                        }
                    }
                }
            }
        }
    }
    /* Short counts and odd offsets, in place: every tail length, lanes past it untouched. */
    for (size_t count = 1; count <= 19; count++) {
        for (size_t i = 0; i < 32; i++) {
            x ^= x << 13, x ^= x >> 17, x ^= x << 5;
            a[i] = (uint16_t)x;
            b[i] = (uint16_t)(x >> 16);
            dst[i] = a[i];
        }
        kr_reduce_host(dst + 1, dst + 1, b + 3, count, &ops[0], 0);
        cr_assert_eq(dst[0], a[0]);
        cr_assert_eq(dst[count + 1], a[count + 1], "count %zu wrote past the end", count);
        for (size_t i = 0; i < count; i++) {
            cr_assert_eq(dst[i + 1], ref_half_op(&ops[0], 0, a[i + 1], &b[i + 3]),
                         "count %zu element %zu", count, i);
        }
    }
    free(a);
    free(b);
    free(dst);
}
