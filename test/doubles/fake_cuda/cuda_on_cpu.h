/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What CUDA gives device code, for the host C++ compiler, so that the fake driver can compile
 * kernels/reduce_device.cu itself (kernels_cpu.cpp includes it after this header) and run the
 * very code nvcc builds for the GPU. The execution-space keywords are erased, uint2 and uint4
 * are the vector types with CUDA's alignment, and threadIdx, blockIdx, blockDim and gridDim
 * are thread-local variables that the grid emulator (kernels_cpu.cpp) sets before it calls a
 * kernel once per thread of the launch.
 *
 * The emulator runs the threads of a launch one after another, which is exact only for
 * kernels whose threads never wait for one another nor share memory: ours, which stride over
 * disjoint elements. Everything that would make the order matter (__shared__, __syncthreads,
 * __syncwarp) stops the build with a message here; warp shuffles, votes and atomics are simply
 * not declared, so a kernel using them does not compile either.
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
#define __shared__ FAKE_CUDA_PRAGMA(GCC error "__shared__ is not emulated (cuda_on_cpu.h)")
#define __syncthreads() FAKE_CUDA_PRAGMA(GCC error "__syncthreads is not emulated (cuda_on_cpu.h)")
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

/* One set per host thread: each stream's worker thread emulates its own launches. __thread,
 * not thread_local: never initialized dynamically, so read without a wrapper call. */
extern __thread struct uint3 threadIdx;
extern __thread struct uint3 blockIdx;
extern __thread dim3 blockDim;
extern __thread dim3 gridDim;

#endif
