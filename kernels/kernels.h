/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Reduce and copy on host memory, one call per operation. The executor (engine/exec.c) is
 * the only caller. Element semantics live in reduce_ops.h, written once for C and CUDA, so
 * the device kernels (later) compute bit-identical results.
 *
 * A reduction is dst[i] = post(pre(a[i]) OP pre(b[i])), where pre() applies only to the
 * operands flagged KR_PRE_A / KR_PRE_B (a rank's own raw input, or a peer's raw input) and
 * post() only with KR_POST (the last reduction of an element). With b == NULL it is
 * dst[i] = post(pre(a[i])), which is how a one-rank all-reduce still scales by PreMulSum.
 *   - KR_SUM/PROD/MAX/MIN: pre and post are the identity.
 *   - KR_PREMULSUM: pre(x) = x * scalar, rounded to the element type; then sum. NCCL uses it
 *     for ncclRedOpCreatePreMulSum and for ncclAvg on floating types (scalar = 1/nranks).
 *   - KR_SUMPOSTDIV: sum, then post(x) = x / divisor. NCCL's ncclAvg on integer types.
 * Integers wrap around; x / divisor truncates toward zero (signed types divide as signed).
 * float and double are plain IEEE arithmetic, in the default mode whatever the caller's (no
 * flush-to-zero, round to nearest even), with no product fused into a sum. Every low-precision
 * type (float16, bfloat16, fp8) computes each operation in float and rounds to nearest-even
 * after it, which equals the correctly rounded result CUDA gives; a NaN result is CUDA's
 * canonical NaN (see the conversions in reduce_ops.h). Max and min are IEEE
 * maximumNumber/minimumNumber as CUDA's fmaxf and __hmax: a NaN loses to a number, and +0 > -0
 * so the result does not depend on operand order. On floating types KR_SUMPOSTDIV divides in
 * float (double for double), correctly rounded for divisors below 2^13; NCCL itself never
 * asks for that.
 * dst may alias a or b exactly (in-place); partial overlap is not allowed. Every pointer is
 * aligned to the element size (a block may start at any element).
 */
#ifndef KR_KERNELS_H
#define KR_KERNELS_H

#include <nccl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum kr_op_kind {
    KR_SUM,
    KR_PROD,
    KR_MAX,
    KR_MIN,
    KR_PREMULSUM,
    KR_SUMPOSTDIV,
};

struct kr_redop {
    enum kr_op_kind kind;
    ncclDataType_t type;
    /* KR_PREMULSUM: the scalar, stored as one element of `type` (little-endian bytes). */
    uint8_t scalar[8];
    /* KR_SUMPOSTDIV: the divisor (nranks), at least 1. */
    uint64_t divisor;
};

enum kr_flags {
    KR_PRE_A = 1u << 0,
    KR_PRE_B = 1u << 1,
    KR_POST = 1u << 2,
};

/* Bytes per element of an NCCL datatype, 0 for an invalid one. */
size_t kr_type_size(ncclDataType_t type);
/* NCCL's name for a datatype ("float", "half", ...) as nccl-tests prints it; "?" if invalid. */
const char *kr_type_name(ncclDataType_t type);
bool kr_type_is_float(ncclDataType_t type);

/* See the contract above. count is in elements and may be 0. flags are ignored by the kinds
 * whose pre and post are the identity. Runs on the calling thread, to completion. */
void kr_reduce_host(void *dst, const void *a, const void *b, size_t count,
                    const struct kr_redop *op, unsigned flags);
/* dst == src is a no-op; other overlaps are not allowed. */
void kr_copy_host(void *dst, const void *src, size_t bytes);
/* The same contract as kr_copy_host, for a copy whose destination will not be read again soon
 * (final output of a collective): non-temporal stores for the destination's whole 64-byte
 * lines, memcpy for the ends. Any alignment and length; the stores are fenced before it
 * returns, so the bytes are visible to other threads as after a memcpy. Streaming wins once
 * the destination as a whole (not one call's piece of it) reaches KR_STREAM_MIN_BYTES;
 * callers decide by that (measured in reduce_host.c). */
void kr_copy_host_stream(void *dst, const void *src, size_t bytes);
#ifndef KR_STREAM_MIN_BYTES
#define KR_STREAM_MIN_BYTES ((size_t)1 << 20)
#endif

/* Stores `value` as one element of `type` into out[0..7], the bytes past the element zeroed.
 * Floating types round once, from the double, as reduce_ops.h's conversions round (float16
 * and bfloat16 overflow to infinity, fp8 saturates); integers truncate toward zero and
 * saturate to the type's range, NaN giving 0. Used to build PreMulSum scalars and by test
 * data generators. */
void kr_scalar_from_double(ncclDataType_t type, double value, uint8_t out[8]);
/* Reads one element of `type` as a double. */
double kr_scalar_to_double(ncclDataType_t type, const void *elem);

#endif
