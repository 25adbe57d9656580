/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ncclshim's kernels as the fake driver runs them: kernels/reduce_device.cu itself, compiled
 * by the host C++ compiler over cuda_on_cpu.h, and a grid emulator that runs every thread of
 * every block of a launch, with the launch's parameters, on the stream's worker thread
 * (stream.c). So CI executes the device code's own paths (the 16-byte vectors and their
 * tails, the alignment test, operands aliasing destinations, every datatype's instantiation,
 * kr_dev_from's prologue and level scan, kr_dev_signal's order of stores) without a GPU, and
 * the tests compare them with the host reductions.
 *
 * Blocks run one after another. In a kernel whose threads never wait for one another nor
 * share memory (the by-value reductions and copy, kr_dev_signal), the threads of a block run
 * one after another, each to its end, which is exact: each reads and writes only the elements
 * its index strides over, so every order of the threads gives the GPU's result. A kernel with
 * barriers (kr_dev_from: its batch copied into shared memory, then __syncthreads) runs its
 * block's threads as coroutines that switch at each barrier (block.c), its shared memory
 * poisoned at each block's start, so a thread reading shared memory that no thread wrote
 * before a barrier reads garbage, as on a GPU.
 *
 * Shared memory is one instance in the process, which a block holds (a lock) from its start
 * to its end, whichever stream's worker runs it: not thread-local, which would make the
 * double's thread-local storage too big for the static room glibc keeps for libraries loaded
 * later, and every thread-local access of the emulated kernels a slow call.
 */
#include "cuda_on_cpu.h"

#include "kernels/reduce_device.cu"

#include "fake_cuda.h"

#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

__thread struct cuda_on_cpu_builtins cuda_on_cpu_builtins;

/* The kernels' __shared__ variables (cuda_on_cpu.h makes each declaration `extern`): restated
 * here, as the driver reads them from the cubin, held by one block at a time. */
kr_dev_batch b; /* kr_dev_from's copy of its batch */
static pthread_mutex_t fake_shared_lock = PTHREAD_MUTEX_INITIALIZER;

/* Poisons kr_dev_from's shared memory at the start of a block: not a batch any thread wrote. */
static void
fake_from_shared_poison(void)
{
    memset(&b, 0xa5, sizeof(b));
}

/* What __launch_bounds__ says of every kernel of reduce_device.cu, which cuda_on_cpu.h drops:
 * restated here, as the driver reads it from the cubin. */
#define FAKE_KERNEL_MAX_THREADS 512

struct fake_kernel {
    const char *name;
    void (*entry)(const void *params); /* calls the kernel with its one parameter */
    unsigned int max_threads; /* its __launch_bounds__ */
    size_t elem_bytes;        /* of its tasks' elements */
    enum fake_kernel_param param;
    void (*block_start)(void); /* NULL, or: it has barriers and shared memory, poisoned here */
};

/* Each kernel called with its parameter as the launch copied it. */
template <void (*K)(const kr_dev_batch)>
static void
fake_entry_batch(const void *params)
{
    K(*(const kr_dev_batch *)params);
}

static void
fake_entry_from(const void *params)
{
    kr_dev_from(*(const kr_dev_from_args *)params);
}

static void
fake_entry_signal(const void *params)
{
    kr_dev_signal(*(const kr_dev_signals *const *)params);
}

/* The by-value kernels come first, numbered as enum kr_dev_kernel_id (a batch's `kernel`). */
static const struct fake_kernel fake_kernels[] = {
#define FAKE_REDUCE_KERNEL(type, N)                                                          \
    {"kr_dev_reduce_" #N, fake_entry_batch<kr_dev_reduce_##N>, FAKE_KERNEL_MAX_THREADS,        \
     sizeof(kr_ops_##N::T), FAKE_PARAM_BATCH, NULL},
    KR_DEV_TYPE_NAMES(FAKE_REDUCE_KERNEL)
#undef FAKE_REDUCE_KERNEL
    {"kr_dev_copy", fake_entry_batch<kr_dev_copy>, FAKE_KERNEL_MAX_THREADS, 1, FAKE_PARAM_BATCH,
     NULL},
    {"kr_dev_from", fake_entry_from, FAKE_KERNEL_MAX_THREADS, 0, FAKE_PARAM_BATCH_AT,
     fake_from_shared_poison},
    {"kr_dev_signal", fake_entry_signal, 1024, 0, FAKE_PARAM_SIGNALS_AT, NULL},
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

/* One block being run as coroutines (block.c). */
struct fake_block_launch {
    const struct fake_kernel *kernel;
    const void *params;
    struct fake_dim3 block;
};

/* Thread t of the block is about to run: its index. */
static void
fake_block_enter(void *arg, unsigned t)
{
    const struct fake_block_launch *l = (const struct fake_block_launch *)arg;
    if (t < l->block.x) {
        threadIdx = {t, 0, 0}; /* the first row: every thread of a block in x alone */
    } else {
        threadIdx = {t % l->block.x, t / l->block.x % l->block.y,
                     t / (l->block.x * l->block.y)};
    }
}

static void
fake_block_main(void *arg)
{
    const struct fake_block_launch *l = (const struct fake_block_launch *)arg;
    l->kernel->entry(l->params);
}

void
fake_kernel_run(const struct fake_kernel *kernel, const void *params,
                const struct fake_dim3 *grid, const struct fake_dim3 *block)
{
    /* cuLaunchKernel copied the parameters into a buffer of their size, malloc's alignment;
     * every thread gets them by value, as each GPU thread reads them from constant memory. */
    struct fake_block_launch launch = {kernel, params, *block};
    unsigned int nthreads = block->x * block->y * block->z;
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
                if (kernel->block_start != NULL) {
                    pthread_mutex_lock(&fake_shared_lock);
                    kernel->block_start();
                    fake_block_run(nthreads, fake_block_enter, fake_block_main, &launch);
                    pthread_mutex_unlock(&fake_shared_lock);
                    continue;
                }
                for (unsigned int t = 0; t < nthreads; t++) {
                    fake_block_enter(&launch, t);
                    kernel->entry(params);
                }
            }
        }
    }
    /* The kernel's end: every store it made reaches the host before the stream goes on. */
    fake_store_kernel_end();
#if defined(__x86_64__)
    _mm_setcsr(mxcsr);
#endif
}
