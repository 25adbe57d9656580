/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A test double of the CUDA driver (libcuda.so.1), built as build/test/doubles/libcuda.so.1
 * and found by the library's dlopen through LD_LIBRARY_PATH. It lets CI, which has no GPU,
 * run ncclshim's device path for real: several processes, IPC, stream ordering, abort.
 *
 * What it models, and how:
 *   - the driver: FAKE_CUDA_DRIVER_VERSION (default the cuda.h it is built with); entry points
 *     by name and version as cuGetProcAddress documents it, each variant with its own
 *     prototype (cuCtxGetDevice of 13.0 takes a context, cuStreamGetCtx of 12.5 writes a green
 *     context);
 *   - devices: FAKE_CUDA_DEVICES (default 1), compute capability FAKE_CUDA_CC (default 90),
 *     peer access between any two unless FAKE_CUDA_NO_PEER=1; each has a primary context;
 *   - device memory: every allocation is a memfd, so another process can map the same pages
 *     (legacy IPC handles name the owner's pid and memfd; cuMem handles export the memfd
 *     itself as the POSIX file descriptor). The program's device address is an inaccessible
 *     reservation, as on a GPU: host code touching device memory faults; the double's streams,
 *     copies and kernels reach it through a mapping of their own (fake_mem_host_of);
 *     FAKE_CUDA_HOST_VISIBLE=1 lets the host touch it, standing in for a UCX built with CUDA
 *     (the network path's direct mode). Managed
 *     memory is the host's; registered host memory has a device address of its own; cuMem
 *     memory on the host (HOST_NUMA, node 0) is a memfd too, reached through its mappings once
 *     cuMemSetAccess opened them;
 *   - streams and hardware queues: a context's streams share CUDA_DEVICE_MAX_CONNECTIONS
 *     queues (default 8), given out round-robin in the order the streams are made (the
 *     driver's choice is unspecified; FAKE_CUDA_QUEUE_SEED=n picks at random), each a worker
 *     thread running what its streams enqueue in submission order: memory operations
 *     (cuStreamWaitValue32 polls the word), copies, event records and waits, kernels, host
 *     functions; a stream waiting on a word holds up the later work of every stream of its
 *     queue, so a wait on what later work of the context would write may never be met (with
 *     one queue, =1, whatever the streams);
 *   - implicit synchronization, as the CUDA programming guide lists it: cuMemAlloc,
 *     cuMemAllocManaged, cuMemCreate, cuMemHostAlloc and cuMemHostRegister are barriers of
 *     their context (later work of every stream starts once all earlier work is done), the
 *     legacy NULL stream one for the context's blocking streams (not those made
 *     CU_STREAM_NON_BLOCKING); cuMemFree, cuMemFreeHost and cuMemHostUnregister also return
 *     only once the earlier work is done (conservatively: cudaFree synchronizes). A barrier
 *     that finds a stream of its context waiting on a memory operation not met prints a
 *     "fake_cuda hazard:" line (a complaint with FAKE_CUDA_SYNC_STRICT=1, for programs that
 *     make no such call themselves while their streams wait);
 *     IPC and cuMem mapping calls are no barriers (NCCL's own proxy makes them while its
 *     kernels run);
 *   - callbacks: host functions and user objects' destructors run on one thread of the
 *     process, one at a time, in the order they became due; a CUDA call from either fails;
 *   - kernels: ncclshim's own (kernels/reduce_device.cu), compiled by the host C++ compiler
 *     over cuda_on_cpu.h; the worker runs a launch's every thread of every block one after
 *     another, each seeing its blockIdx and threadIdx and the launch's parameters, which is
 *     exact for kernels that neither share memory nor synchronize (the build refuses any that
 *     do). Launches outside the driver's limits or the kernels' __launch_bounds__ are refused
 *     as the driver refuses them; any other kernel name fails at cuModuleGetFunction;
 *   - graph capture: one stream's operations into a graph, launched as copies of them; and the
 *     state alone, set by fake_cuda_set_capturing for a test.
 * FAKE_CUDA_BACKTRACE=1 prints the stack of every complaint; FAKE_CUDA_DUMP_S=n, n seconds
 * into the process, what waits in every queue.
 * Not modelled: timing, and every function ncclshim never calls (cuGetProcAddress answers
 * CUDA_ERROR_NOT_FOUND for those).
 *
 * Files: proc.c (entry points, errors, devices, contexts), memory.c (allocations, pointer
 * attributes, registration, IPC, cuMem), stream.c (streams, events, copies, launches),
 * kernels_cpu.cpp (the kernels and the grid emulator; cuda_on_cpu.h, what CUDA gives device
 * code), test.c (what tests ask of the double).
 */
#ifndef FAKE_CUDA_H
#define FAKE_CUDA_H

#include <cuda.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKE_MAX_DEVICES 8
/* CUDA_DEVICE_MAX_CONNECTIONS's largest value. */
#define FAKE_MAX_QUEUES 32
#define FAKE_API __attribute__((visibility("default")))

struct CUctx_st {
    int device;
    struct CUstream_st *null_stream; /* the legacy one, made on first use (stream.c) */
};

struct fake_device {
    int ordinal;
    CUuuid uuid;
    struct CUctx_st ctx; /* the primary context */
};

/* Configuration read once from the environment. */
struct fake_config {
    int ndevices;
    int cc;       /* compute capability * 10 + minor */
    int driver_version; /* what cuDriverGetVersion answers (CUDA 12.4: 12040) */
    int queues;         /* CUDA_DEVICE_MAX_CONNECTIONS (default 8): a context's queues */
    unsigned int queue_seed; /* FAKE_CUDA_QUEUE_SEED: streams get queues at random (0: not) */
    bool sync_strict;   /* FAKE_CUDA_SYNC_STRICT=1: a synchronization over a waiting stream
                           is a complaint, not only a hazard line */
    bool host_visible;  /* FAKE_CUDA_HOST_VISIBLE=1: host code may touch device memory */
    bool no_peer;
};
const struct fake_config *fake_config(void);
struct fake_device *fake_device(int ordinal);
/* The calling thread's current context, NULL if none. */
struct CUctx_st *fake_ctx_current(void);

/* Says on stderr, prefixed "fake_cuda: ", where the program did what the driver forbids or
 * leaves undefined, so that a failure caused by the double's strictness names its rule. */
void fake_complain(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* With FAKE_CUDA_BACKTRACE=1, the calling thread's stack on stderr. */
void fake_backtrace(void);

/* Capture (stream.c): CUDA_SUCCESS, or CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (with a
 * complaint, and every capture it would break invalidated) where a capture under way forbids
 * the calling thread a potentially unsafe call, as cuThreadExchangeStreamCaptureMode defines. */
CUresult fake_capture_check_unsafe(const char *call);
#define FAKE_CAPTURE_CHECK_UNSAFE()                                                          \
    do {                                                                                     \
        CUresult fake_res_ = fake_capture_check_unsafe(__func__);                            \
        if (fake_res_ != CUDA_SUCCESS) {                                                     \
            return fake_res_;                                                                \
        }                                                                                    \
    } while (0)

/* CUDA_ERROR_NOT_PERMITTED, with a complaint, when called from inside a host function or a
 * user object's destructor. */
CUresult fake_check_not_in_host_fn(const char *call);

/* Implicit synchronization (stream.c): `call` made in ctx (NULL: none, nothing happens) is a
 * barrier of it: work enqueued on its streams from now on starts once all work enqueued before
 * is done. Says so (a "fake_cuda hazard:" line; a complaint with FAKE_CUDA_SYNC_STRICT=1) if a
 * stream of ctx waits then on a stream memory operation not met. block: the call itself
 * returns only once that earlier work is done. */
void fake_ctx_sync(struct CUctx_st *ctx, const char *call, bool block);
/* Synchronous commands of the current context's legacy NULL stream: enqueued there (after the
 * work of its blocking streams, before their later work) and waited for. The addresses are
 * those the double touches (fake_mem_host_of). CUDA_ERROR_INVALID_CONTEXT without a context. */
CUresult fake_null_stream_copy(void *dst, const void *src, size_t bytes);
CUresult fake_null_stream_set(void *dst, unsigned char value, size_t bytes);

/* Memory (memory.c). */
enum fake_mem_kind { FAKE_MEM_DEVICE, FAKE_MEM_MANAGED, FAKE_MEM_REGISTERED };
/* The host address device work given addr reaches: device memory's (which the program's
 * host code cannot touch) in the double's own mapping of it; registered host memory's device
 * address (cuMemHostGetDevicePointer) translated back; any other address as it is. */
uintptr_t fake_mem_host_of(uintptr_t addr);
/* Whether work on `device` may touch the host address: false only inside a cuMem mapping
 * that cuMemSetAccess did not open to that device (an illegal address on a GPU). */
bool fake_mem_device_reaches(uintptr_t host, int device);
/* The allocation, registration or mapping containing p; false if none. */
bool fake_mem_lookup(uintptr_t p, enum fake_mem_kind *kind_out, int *device_out);

/* cuStreamGetCaptureInfo's 11.3 variant (stream.c), which proc.c's table hands out. */
CUresult fake_stream_get_capture_info_v11030(CUstream handle, CUstreamCaptureStatus *status_out,
                                             cuuint64_t *id_out, CUgraph *graph_out,
                                             const CUgraphNode **dependencies_out,
                                             size_t *num_dependencies_out);

/* Kernels (kernels_cpu.cpp), launched by stream.c. */
/* What a kernel's one parameter is: the batch itself, or the device address of a batch (a
 * kr_dev_from) or of a list of signal words (kr_dev_signal), read when the launch runs. */
enum fake_kernel_param {
    FAKE_PARAM_BATCH,
    FAKE_PARAM_BATCH_AT,
    FAKE_PARAM_SIGNALS_AT,
};
struct fake_kernel;
/* A launch's grid (blocks) or block (threads) dimensions. */
struct fake_dim3 {
    unsigned int x, y, z;
};
/* The ncclshim kernel called name, compiled for the CPU, or NULL. */
const struct fake_kernel *fake_kernel_find(const char *name);
/* The bytes of its one parameter, which cuLaunchKernel copies. */
size_t fake_kernel_params_bytes(const struct fake_kernel *kernel);
enum fake_kernel_param fake_kernel_param_of(const struct fake_kernel *kernel);
/* The by-value kernel a batch names for kr_dev_from (enum kr_dev_kernel_id), or NULL. */
const struct fake_kernel *fake_kernel_by_id(uint32_t id);
/* The bytes of one element of its tasks (count is elements; 1 for kr_dev_copy). */
size_t fake_kernel_elem_bytes(const struct fake_kernel *kernel);
/* The most threads per block it may be launched with (its __launch_bounds__). */
unsigned int fake_kernel_max_threads(const struct fake_kernel *kernel);
/* Runs it on the calling thread (the stream's worker), once for every thread of every block
 * of the grid, each call seeing params as cuLaunchKernel got them. The dimensions are valid
 * (cuLaunchKernel checked them). */
void fake_kernel_run(const struct fake_kernel *kernel, const void *params,
                     const struct fake_dim3 *grid, const struct fake_dim3 *block);

/* What tests can ask (test.c): counts of what is still alive, to check that nothing stays
 * behind after a communicator is destroyed or aborted. */
struct fake_cuda_stats {
    int streams;            /* created and not destroyed (NULL streams excluded) */
    int events;
    int registrations;      /* cuMemHostRegister ranges */
    int ipc_mappings;       /* cuIpcOpenMemHandle mappings and imported cuMem handles */
    int modules;
    long kernels_launched;
    /* Bytes that crossed each device's links, as this process's kernels and copies moved
     * them (counted at launch): a kernel on device k reading device d's memory (or registered
     * host memory) moves the bytes out of d and into k; writing, out of k and into d. A copy
     * between two places moves its bytes out of the one and into the other. */
    unsigned long long link_in[FAKE_MAX_DEVICES];
    unsigned long long link_out[FAKE_MAX_DEVICES];
};
extern struct fake_cuda_stats fake_stats;
extern pthread_mutex_t fake_stats_lock;
#define FAKE_STAT_ADD(field, n)                                                              \
    do {                                                                                     \
        pthread_mutex_lock(&fake_stats_lock);                                                \
        fake_stats.field += (n);                                                             \
        pthread_mutex_unlock(&fake_stats_lock);                                              \
    } while (0)

#ifdef __cplusplus
}
#endif

#endif
