/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclshim's CUDA kernels: kr_dev_reduce_<type> for every datatype, and kr_dev_copy; kr_dev_from,
 * any of them over a batch read from device memory; kr_dev_signal. Each runs
 * a batch of tasks (device_abi.h), one per blockIdx.y, over the element operations of
 * reduce_ops.h, the same functions the host loops use, so results are bit-identical. Built by
 * nvcc into a fatbin for every architecture CUDA 13 supports plus PTX, which the library
 * embeds and loads through the driver (device.c); nothing here is linked against libcudart.
 *
 * Threads of a task's blocks stride over its elements. For elements of 4 and 8 bytes, where
 * every pointer of a task is 16-byte aligned, they move 16 bytes per load and store (uint4)
 * and apply the operation to each element of the vector; the rest, unaligned tasks and the
 * narrow types go element by element (the narrow floating types are dominated by their
 * conversions, and a 16-wide unrolled vector of them multiplies the code of every
 * architecture's cubin for little gain). Operands may alias destinations element for element
 * (in place): each thread reads all operands of an element before writing it.
 *
 * Four combining operations are compiled per type: sum (which also serves PreMulSum, with
 * each operand's pre-operation, and SumPostDiv, with the post-operation, both switched by the
 * batch at run time), product, max and min. Build with --fmad=false: a product feeding a sum
 * must not fuse, as on the host.
 */
#include <stdint.h>

#include "device_abi.h"
#include "reduce_ops.h"

/* enum kr_op_kind of kernels.h, restated: kernels.h needs nccl.h, which nvcc need not see. */
enum {
    KR_K_SUM,
    KR_K_PROD,
    KR_K_MAX,
    KR_K_MIN,
    KR_K_PREMULSUM,
    KR_K_SUMPOSTDIV,
};

/* The element operations of one type, as a class the kernel template takes. S is the type
 * PreMulSum's scalar is applied in (float for the narrow floating types). */
#define KR_TYPE_OPS(N, TYPE, SCALAR)                                                         \
    struct kr_ops_##N {                                                                      \
        typedef TYPE T;                                                                      \
        typedef SCALAR S;                                                                    \
        static __device__ __forceinline__ T sum(T a, T b) { return kr_sum_##N(a, b); }       \
        static __device__ __forceinline__ T prod(T a, T b) { return kr_prod_##N(a, b); }     \
        static __device__ __forceinline__ T max(T a, T b) { return kr_max_##N(a, b); }       \
        static __device__ __forceinline__ T min(T a, T b) { return kr_min_##N(a, b); }       \
        static __device__ __forceinline__ S scalar(T s) { return kr_premul_scalar_##N(s); }  \
        static __device__ __forceinline__ T premul(T a, S s) { return kr_premul_##N(a, s); } \
        static __device__ __forceinline__ T postdiv(T a, uint64_t d)                          \
        {                                                                                    \
            return kr_postdiv_##N(a, d);                                                     \
        }                                                                                    \
    };

KR_TYPE_OPS(i8, int8_t, int8_t)
KR_TYPE_OPS(u8, uint8_t, uint8_t)
KR_TYPE_OPS(i32, int32_t, int32_t)
KR_TYPE_OPS(u32, uint32_t, uint32_t)
KR_TYPE_OPS(i64, int64_t, int64_t)
KR_TYPE_OPS(u64, uint64_t, uint64_t)
KR_TYPE_OPS(f16, uint16_t, float)
KR_TYPE_OPS(bf16, uint16_t, float)
KR_TYPE_OPS(f32, float, float)
KR_TYPE_OPS(f64, double, double)
KR_TYPE_OPS(e4m3, uint8_t, float)
KR_TYPE_OPS(e5m2, uint8_t, float)

/* The combining operation of a kind (PreMulSum and SumPostDiv sum). */
template <class O, int KIND>
static __device__ __forceinline__ typename O::T
kr_combine(typename O::T a, typename O::T b)
{
    switch (KIND) {
    case KR_K_PROD:
        return O::prod(a, b);
    case KR_K_MAX:
        return O::max(a, b);
    case KR_K_MIN:
        return O::min(a, b);
    default:
        return O::sum(a, b);
    }
}

/* Operand k's PreMulSum scalar: read from device memory (ncclScalarDevice) or the batch. */
template <class O>
static __device__ __forceinline__ typename O::S
kr_scalar(const kr_dev_src &src)
{
    typename O::T s;
    if (src.scalar_ptr != 0) {
        s = *(const typename O::T *)src.scalar_ptr;
    } else {
        memcpy(&s, &src.scalar, sizeof(s));
    }
    return O::scalar(s);
}

/* Operand k's element after its pre-operation, if it has one (sums only: PreMulSum). */
template <class O, int KIND>
static __device__ __forceinline__ typename O::T
kr_pre(typename O::T x, const kr_dev_src &src)
{
    if (KIND == KR_K_SUM && src.pre) {
        return O::premul(x, kr_scalar<O>(src));
    }
    return x;
}

/* V elements of one operand in a vector of 16 bytes. */
template <typename T>
union kr_vec {
    uint4 raw;
    T e[16 / sizeof(T)];
};

template <class O, int KIND>
static __device__ __forceinline__ void
kr_reduce_vec(const kr_dev_batch &b, const kr_dev_task &t, size_t v)
{
    typedef typename O::T T;
    const int V = 16 / sizeof(T);
    const kr_dev_src *srcs = &b.srcs[t.first_src];
    kr_vec<T> acc, y;

    acc.raw = ((const uint4 *)srcs[0].ptr)[v];
#pragma unroll
    for (int e = 0; e < V; e++) {
        acc.e[e] = kr_pre<O, KIND>(acc.e[e], srcs[0]);
    }
    for (int k = 1; k < t.nsrc; k++) {
        y.raw = ((const uint4 *)srcs[k].ptr)[v];
#pragma unroll
        for (int e = 0; e < V; e++) {
            acc.e[e] = kr_combine<O, KIND>(acc.e[e], kr_pre<O, KIND>(y.e[e], srcs[k]));
        }
    }
    if (KIND == KR_K_SUM && t.post) {
#pragma unroll
        for (int e = 0; e < V; e++) {
            acc.e[e] = O::postdiv(acc.e[e], b.divisor);
        }
    }
    for (int d = 0; d < t.ndst; d++) {
        ((uint4 *)b.dsts[t.first_dst + d])[v] = acc.raw;
    }
}

template <class O, int KIND>
static __device__ __forceinline__ void
kr_reduce_elem(const kr_dev_batch &b, const kr_dev_task &t, size_t i)
{
    typedef typename O::T T;
    const kr_dev_src *srcs = &b.srcs[t.first_src];

    T acc = kr_pre<O, KIND>(((const T *)srcs[0].ptr)[i], srcs[0]);
    for (int k = 1; k < t.nsrc; k++) {
        acc = kr_combine<O, KIND>(acc, kr_pre<O, KIND>(((const T *)srcs[k].ptr)[i], srcs[k]));
    }
    if (KIND == KR_K_SUM && t.post) {
        acc = O::postdiv(acc, b.divisor);
    }
    for (int d = 0; d < t.ndst; d++) {
        ((T *)b.dsts[t.first_dst + d])[i] = acc;
    }
}

static __device__ __forceinline__ bool
kr_task_aligned(const kr_dev_batch &b, const kr_dev_task &t)
{
    uint64_t bits = 0;
    for (int k = 0; k < t.nsrc; k++) {
        bits |= b.srcs[t.first_src + k].ptr;
    }
    for (int d = 0; d < t.ndst; d++) {
        bits |= b.dsts[t.first_dst + d];
    }
    return (bits & 15) == 0;
}

template <class O, int KIND>
static __device__ void
kr_reduce_task(const kr_dev_batch &b, const kr_dev_task &t)
{
    const int V = 16 / sizeof(typename O::T);
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t tail = 0;

    if (sizeof(typename O::T) >= 4 && kr_task_aligned(b, t)) {
        const size_t nvec = t.count / V;
        size_t v = first;
        for (; v < nvec; v += stride) {
            kr_reduce_vec<O, KIND>(b, t, v);
        }
        tail = nvec * V;
    }
    for (size_t i = tail + first; i < t.count; i += stride) {
        kr_reduce_elem<O, KIND>(b, t, i);
    }
}

template <class O>
static __device__ void
kr_reduce_batch(const kr_dev_batch &b, const kr_dev_task &t)
{
    switch (b.kind) {
    case KR_K_SUM:
        kr_reduce_task<O, KR_K_SUM>(b, t);
        break;
    case KR_K_PROD:
        kr_reduce_task<O, KR_K_PROD>(b, t);
        break;
    case KR_K_MAX:
        kr_reduce_task<O, KR_K_MAX>(b, t);
        break;
    case KR_K_MIN:
        kr_reduce_task<O, KR_K_MIN>(b, t);
        break;
    case KR_K_PREMULSUM:
    case KR_K_SUMPOSTDIV:
        kr_reduce_task<O, KR_K_SUM>(b, t);
        break;
    }
}

#define KR_REDUCE_KERNEL(type, N)                                                            \
    extern "C" __global__ void __launch_bounds__(512)                                        \
    kr_dev_reduce_##N(const kr_dev_batch batch)                                              \
    {                                                                                        \
        kr_reduce_batch<kr_ops_##N>(batch, batch.tasks[blockIdx.y]);                         \
    }
KR_DEV_TYPE_NAMES(KR_REDUCE_KERNEL)

/* Copies: the widest word every pointer of the task is aligned to, then bytes. */
template <typename W>
static __device__ __forceinline__ size_t
kr_copy_words(const kr_dev_batch &b, const kr_dev_task &t, size_t first, size_t stride)
{
    const W *src = (const W *)b.srcs[t.first_src].ptr;
    const size_t nwords = t.count / sizeof(W);

    for (size_t w = first; w < nwords; w += stride) {
        W value = src[w];
        for (int d = 0; d < t.ndst; d++) {
            ((W *)b.dsts[t.first_dst + d])[w] = value;
        }
    }
    return nwords * sizeof(W);
}

static __device__ void
kr_copy_batch(const kr_dev_batch &batch, const kr_dev_task &t)
{
    const size_t first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint64_t bits = batch.srcs[t.first_src].ptr;
    size_t tail;

    for (int d = 0; d < t.ndst; d++) {
        bits |= batch.dsts[t.first_dst + d];
    }
    if ((bits & 15) == 0) {
        tail = kr_copy_words<uint4>(batch, t, first, stride);
    } else if ((bits & 7) == 0) {
        tail = kr_copy_words<uint2>(batch, t, first, stride);
    } else if ((bits & 3) == 0) {
        tail = kr_copy_words<uint32_t>(batch, t, first, stride);
    } else {
        tail = 0;
    }
    const uint8_t *src = (const uint8_t *)batch.srcs[t.first_src].ptr;
    for (size_t i = tail + first; i < t.count; i += stride) {
        uint8_t value = src[i];
        for (int d = 0; d < t.ndst; d++) {
            ((uint8_t *)batch.dsts[t.first_dst + d])[i] = value;
        }
    }
}

extern "C" __global__ void __launch_bounds__(512)
kr_dev_copy(const kr_dev_batch batch)
{
    kr_copy_batch(batch, batch.tasks[blockIdx.y]);
}

/* kr_dev_from (device_abi.h): the batch is read from device memory when the kernel runs, once
 * per block into shared memory, so the loops read their operands' addresses as fast as from a
 * parameter; then the kernel its `kernel` names runs it. */
extern "C" __global__ void __launch_bounds__(512)
kr_dev_from(const kr_dev_from_args args)
{
    __shared__ kr_dev_batch b;
    const uint32_t *src = (const uint32_t *)args.batch;
    uint32_t *dst = (uint32_t *)&b;

    for (unsigned i = threadIdx.x; i < sizeof(kr_dev_batch) / 4; i += blockDim.x) {
        dst[i] = src[i];
    }
    __syncthreads();
    /* The level's tasks are consecutive: block y runs the y-th of them. */
    uint32_t first = 0;
    while (first < b.ntasks && b.tasks[first].level < args.level) {
        first++;
    }
    const uint32_t task = first + blockIdx.y;
    if (task >= b.ntasks || task >= KR_DEV_MAX_TASKS || b.tasks[task].level != args.level) {
        return;
    }
    const kr_dev_task &t = b.tasks[task];
    switch (b.kernel) {
#define KR_FROM_CASE(type, N)                                                                \
    case KR_DEV_ID_##N:                                                                      \
        kr_reduce_batch<kr_ops_##N>(b, t);                                                   \
        break;
        KR_DEV_TYPE_NAMES(KR_FROM_CASE)
#undef KR_FROM_CASE
    case KR_DEV_ID_COPY:
        kr_copy_batch(b, t);
        break;
    default:
        break;
    }
}

/* A 32-bit word that another agent (the host, a peer GPU) reads: a volatile store, which
 * reaches it in no promised order with the thread's other stores unless a
 * __threadfence_system() lies between them. (On the CPU, the driver's double holds it and
 * applies it at the next fence, cuda_on_cpu.h: CUDA_ON_CPU_STORE_WORD.) */
static __device__ __forceinline__ void
kr_dev_store_word(uint64_t addr, uint32_t value)
{
#if defined(CUDA_ON_CPU_STORE_WORD)
    CUDA_ON_CPU_STORE_WORD(addr, value);
#else
    *(volatile uint32_t *)addr = value;
#endif
}

/* One thread: everything before it on the stream is done (the kernels before it completed);
 * the first fence makes their writes visible to every GPU and the host before any word says
 * so. words[0] goes last, after a fence of its own (kr_dev_signals' contract): whoever sees
 * it sees every other word of the list written, so may write a newer value of one of them
 * without this kernel's older one landing after it. */
extern "C" __global__ void
kr_dev_signal(const kr_dev_signals *signals)
{
    if (threadIdx.x != 0 || blockIdx.x != 0) {
        return;
    }
    __threadfence_system();
    const uint32_t n = signals->n < KR_DEV_MAX_SIGNALS ? signals->n : KR_DEV_MAX_SIGNALS;
    for (uint32_t i = 1; i < n; i++) {
        kr_dev_store_word(signals->words[i].addr, signals->words[i].value);
    }
    __threadfence_system();
    if (n > 0) {
        kr_dev_store_word(signals->words[0].addr, signals->words[0].value);
    }
    __threadfence_system();
}
