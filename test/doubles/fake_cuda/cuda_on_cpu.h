/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What CUDA gives device code, for the host C++ compiler, so that the fake driver can compile
 * kernels/reduce_device.cu itself (kernels_cpu.cpp includes it after this header) and run the
 * very code nvcc builds for the GPU. The execution-space keywords are erased, uint2 and uint4
 * are the vector types with CUDA's alignment, and threadIdx, blockIdx, blockDim and gridDim
 * are thread-local variables that the grid emulator (kernels_cpu.cpp) sets before it runs each
 * thread of a launch.
 *
 * What makes a block's threads wait for one another or share memory:
 *   - __syncthreads() is a barrier of the block's threads, which the emulator runs as
 *     coroutines (block.c) where a kernel has one; a divergent barrier aborts;
 *   - a __shared__ variable is one instance, which one block at a time holds: `extern`,
 *     defined (restated, as the driver reads it from the cubin) by kernels_cpu.cpp, which
 *     poisons it at each block's start; a kernel's __shared__ variable it does not restate
 *     fails the link;
 *   - __threadfence_system() and the stores kernels make through kr_dev_store_word
 *     (CUDA_ON_CPU_STORE_WORD) are the double's model of stores reaching the host late and in
 *     no order between two fences (stores.c).
 * Warp-level synchronisation (__syncwarp) stops the build with a message here; warp shuffles,
 * votes and atomics are simply not declared, so a kernel using them does not compile either.
 */
#ifndef FAKE_CUDA_ON_CPU_H
#define FAKE_CUDA_ON_CPU_H

#if !defined(__cplusplus) || defined(__CUDACC__)
#error "cuda_on_cpu.h is for compiling CUDA device code with the host C++ compiler"
#endif

#include <stdint.h>
#include <string.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
/* The bound is kept in the emulator's kernel table instead (kernels_cpu.cpp), which refuses
 * larger blocks as the driver does. */
#define __launch_bounds__(...)

/* Build errors for what the emulation cannot give (_Pragma takes one literal, hence #x). */
#define FAKE_CUDA_PRAGMA(x) _Pragma(#x)
#define __syncwarp(...) FAKE_CUDA_PRAGMA(GCC error "__syncwarp is not emulated (cuda_on_cpu.h)")

/* CUDA's vector types of 32-bit words, aligned to their size as on the device. */
struct __attribute__((aligned(8))) uint2 {
    unsigned int x, y;
};

struct __attribute__((aligned(16))) uint4 {
    unsigned int x, y, z, w;
};

/* The built-in indices and dimensions: uint3 and dim3 in CUDA, read-only to a kernel. */
struct uint3 {
    unsigned int x, y, z;
};
typedef struct uint3 dim3;

/* One set per host thread: each stream's worker thread emulates its own launches, a block's
 * threads one at a time (the emulator sets them before it runs or resumes a thread). One
 * thread-local struct, so a function finds all four at one address. __thread, not
 * thread_local: never initialized dynamically, so read without a wrapper call. */
struct cuda_on_cpu_builtins {
    struct uint3 threadIdx, blockIdx;
    dim3 blockDim, gridDim;
};
extern __thread struct cuda_on_cpu_builtins cuda_on_cpu_builtins;
#define threadIdx (cuda_on_cpu_builtins.threadIdx)
#define blockIdx (cuda_on_cpu_builtins.blockIdx)
#define blockDim (cuda_on_cpu_builtins.blockDim)
#define gridDim (cuda_on_cpu_builtins.gridDim)

/* The running thread's number in its launch, which names it to the store model. */
static inline uint64_t
cuda_on_cpu_thread(void)
{
    uint64_t block = ((uint64_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
    uint64_t threads = (uint64_t)blockDim.x * blockDim.y * blockDim.z;
    return block * threads + ((uint64_t)threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x +
           threadIdx.x;
}

extern "C" {
/* block.c: the calling thread of the block waits here until every one of them reached it. */
void fake_block_sync(const char *file, int line);
/* stores.c: a store to a word another agent reads, held until the thread's next fence or the
 * kernel's end; the thread's fence, which applies its held stores. */
void fake_store_word(uint64_t addr, uint32_t value, uint64_t thread);
void fake_store_fence(uint64_t thread);
}

#define __shared__ extern
#define __syncthreads() fake_block_sync(__FILE__, __LINE__)
#define __threadfence_system() fake_store_fence(cuda_on_cpu_thread())
#define CUDA_ON_CPU_STORE_WORD(addr, value) fake_store_word((addr), (value), cuda_on_cpu_thread())

#endif
