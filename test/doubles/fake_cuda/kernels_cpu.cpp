/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclshim's kernels as the fake driver runs them: kernels/reduce_device.cu itself, compiled
 * by the host C++ compiler over cuda_on_cpu.h, and a grid emulator that calls a kernel once
 * for every thread of every block of a launch, with the launch's parameters, on the stream's
 * worker thread (stream.c). So CI executes the device code's own paths (the 16-byte vectors
 * and their tails, the alignment test, operands aliasing destinations, every datatype's
 * instantiation) without a GPU, and the tests compare them with the host reductions.
 *
 * The threads run one after another, each to its end. That is exact for these kernels: they
 * share no memory and never wait for one another (cuda_on_cpu.h refuses to compile a kernel
 * that does), each thread reading and writing only the elements its index strides over, so
 * every order of the threads gives the GPU's result.
 */
#include "cuda_on_cpu.h"

#include "kernels/reduce_device.cu"

#include "fake_cuda.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

__thread struct uint3 threadIdx, blockIdx;
__thread dim3 blockDim, gridDim;

/* What __launch_bounds__ says of every kernel of reduce_device.cu, which cuda_on_cpu.h drops:
 * restated here, as the driver reads it from the cubin. */
#define FAKE_KERNEL_MAX_THREADS 512

struct fake_kernel {
    const char *name;
    void (*entry)(const kr_dev_batch batch); /* NULL: kr_dev_signal, emulated in stream.c */
    unsigned int max_threads; /* its __launch_bounds__ */
    size_t elem_bytes;        /* of its tasks' elements */
    enum fake_kernel_param param;
};

/* kr_dev_from (device_abi.h) runs the by-value kernel its batch names, over the batch the
 * worker reads when the launch runs (stream.c): its prologue, which loads the batch into
 * shared memory, needs __syncthreads, which this emulation cannot give. The by-value kernels
 * come first, numbered as enum kr_dev_kernel_id. */
static const struct fake_kernel fake_kernels[] = {
#define FAKE_REDUCE_KERNEL(type, N)                                                          \
    {"kr_dev_reduce_" #N, kr_dev_reduce_##N, FAKE_KERNEL_MAX_THREADS, sizeof(kr_ops_##N::T),   \
     FAKE_PARAM_BATCH},
    KR_DEV_TYPE_NAMES(FAKE_REDUCE_KERNEL)
#undef FAKE_REDUCE_KERNEL
    {"kr_dev_copy", kr_dev_copy, FAKE_KERNEL_MAX_THREADS, 1, FAKE_PARAM_BATCH},
    {"kr_dev_from", NULL, FAKE_KERNEL_MAX_THREADS, 0, FAKE_PARAM_BATCH_AT},
    {"kr_dev_signal", NULL, 1024, 0, FAKE_PARAM_SIGNALS_AT},
};

const struct fake_kernel *
fake_kernel_by_id(uint32_t id)
{
    return id < KR_DEV_IDS ? &fake_kernels[id] : NULL;
}

const struct fake_kernel *
fake_kernel_find(const char *name)
{
    for (size_t i = 0; i < sizeof(fake_kernels) / sizeof(fake_kernels[0]); i++) {
        if (strcmp(fake_kernels[i].name, name) == 0) {
            return &fake_kernels[i];
        }
    }
    return NULL;
}

size_t
fake_kernel_params_bytes(const struct fake_kernel *kernel)
{
    switch (kernel->param) {
    case FAKE_PARAM_BATCH:
        return sizeof(kr_dev_batch);
    case FAKE_PARAM_BATCH_AT:
        return sizeof(kr_dev_from_args);
    default:
        return sizeof(uint64_t);
    }
}

enum fake_kernel_param
fake_kernel_param_of(const struct fake_kernel *kernel)
{
    return kernel->param;
}

size_t
fake_kernel_elem_bytes(const struct fake_kernel *kernel)
{
    return kernel->elem_bytes;
}

unsigned int
fake_kernel_max_threads(const struct fake_kernel *kernel)
{
    return kernel->max_threads;
}

void
fake_kernel_run(const struct fake_kernel *kernel, const void *params,
                const struct fake_dim3 *grid, const struct fake_dim3 *block)
{
    /* cuLaunchKernel copied the parameters into a buffer of their size, malloc's alignment;
     * every thread gets them by value, as each GPU thread reads them from constant memory. */
    const kr_dev_batch *batch = (const kr_dev_batch *)params;
#if defined(__x86_64__)
    /* The GPU's float arithmetic, whatever the worker inherited from the thread that made the
     * stream: round to nearest, subnormals kept (no flush to zero), exceptions masked. */
    unsigned int mxcsr = _mm_getcsr();
    _mm_setcsr(0x1f80);
#endif

    gridDim = {grid->x, grid->y, grid->z};
    blockDim = {block->x, block->y, block->z};
    for (unsigned int bz = 0; bz < grid->z; bz++) {
        for (unsigned int by = 0; by < grid->y; by++) {
            for (unsigned int bx = 0; bx < grid->x; bx++) {
                blockIdx = {bx, by, bz};
                for (unsigned int tz = 0; tz < block->z; tz++) {
                    for (unsigned int ty = 0; ty < block->y; ty++) {
                        for (unsigned int tx = 0; tx < block->x; tx++) {
                            threadIdx = {tx, ty, tz};
                            kernel->entry(*batch);
                        }
                    }
                }
            }
        }
    }
#if defined(__x86_64__)
    _mm_setcsr(mxcsr);
#endif
}
