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
 *   - devices: FAKE_CUDA_DEVICES (default 1), each a real GPU with its attributes (proc.c;
 *     FAKE_CUDA_CC picks it: 90, the default, an H100 SXM5, 80 an A100, 70 a V100; an attribute
 *     without a figure is refused loudly), CAN_FLUSH_REMOTE_WRITES only with
 *     FAKE_CUDA_FLUSH_REMOTE_WRITES=1, peer access between any two unless FAKE_CUDA_NO_PEER=1
 *     (enabled once: a second enable is ALREADY_ENABLED); each has a primary context, which
 *     a fault leaves unusable for good (below);
 *   - contexts: a stack per thread; a call that works in the current context (fake_need_context
 *     lists them) fails with CUDA_ERROR_INVALID_CONTEXT, and a complaint, on a thread that has
 *     none, as a thread of the program's own or of the library's starts;
 *   - device memory: every allocation is a memfd, so another process can map the same pages
 *     (legacy IPC handles name the owner's pid and memfd; cuMem handles export the memfd
 *     itself as the POSIX file descriptor). The program's device address is an inaccessible
 *     reservation, as on a GPU: host code touching device memory faults; the double's streams,
 *     copies and kernels reach it through a mapping of their own (fake_mem_host_of);
 *     FAKE_CUDA_HOST_VISIBLE=1 lets the host touch it, standing in for a UCX built with CUDA
 *     (the network path's direct mode). Managed
 *     memory is the host's; registered host memory has a device address of its own, with
 *     CU_MEMHOSTREGISTER_DEVICEMAP only; cuMem memory as cuda.h has it: 2 MiB granularity,
 *     allocation properties checked, export only to a handle type requested at cuMemCreate,
 *     mappings from an allocation's byte 0 into a reservation (whose shadow keeps them
 *     contiguous for the double too), cuMemGetAddressRange the mapped region, RANGE_START_ADDR
 *     the reservation, BUFFER_ID per allocation (FAKE_CUDA_BUFFER_ID=reservation: one per
 *     reservation, as cuda.h also allows); cuMem memory on the host (HOST_NUMA, node 0) is a
 *     memfd too, reached through its mappings once cuMemSetAccess opened them
 *     (FAKE_CUDA_NO_HOST_CUMEM=1: a driver or device without it); memory pools
 *     (cuMemAllocFromPoolAsync) whose allocations no cuMemMap made;
 *   - streams and hardware queues: a context's streams share CUDA_DEVICE_MAX_CONNECTIONS
 *     queues (default 8), given out round-robin in the order the streams are made (the
 *     driver's choice is unspecified; FAKE_CUDA_QUEUE_SEED=n picks at random), each a worker
 *     thread running what its streams enqueue in submission order: memory operations
 *     (cuStreamWaitValue32 polls the word; flags and addresses checked as cuda.h has them,
 *     FLUSH only where the device can), copies, event records and waits, kernels, host
 *     functions; a stream waiting on a word holds up the later work of every stream of its
 *     queue, so a wait on what later work of the context would write may never be met (with
 *     one queue, =1, whatever the streams);
 *   - implicit synchronization, as the CUDA programming guide lists it: cuMemAlloc,
 *     cuMemAllocManaged, cuMemCreate, cuMemHostAlloc and cuMemHostRegister (and cuStreamCreate,
 *     which DESIGN.md counts among what can serialize the device) are barriers of
 *     their context (later work of every stream starts once all earlier work is done), the
 *     legacy NULL stream one for the context's blocking streams (not those made
 *     CU_STREAM_NON_BLOCKING); cuMemFree, cuMemFreeHost and cuMemHostUnregister also return
 *     only once the earlier work is done (conservatively: cudaFree synchronizes). A barrier
 *     returns only once every stream memory operation of its context enqueued before it is
 *     met, as a driver that synchronizes would; one unmet after FAKE_CUDA_SYNC_HANG_MS (default
 *     5000) is a complaint with the caller's stack, and the process stops, where a GPU may
 *     hang for good (FAKE_CUDA_SYNC_STRICT=1: a complaint at once, for programs that make no
 *     such call themselves while their streams wait). Loading code waits as cuMemFree does
 *     (lazy loading): cuModuleLoadData, cuModuleGetFunction, cuFuncLoad, and the first launch
 *     of a function cuFuncLoad did not load; so do unmapping and cuMemSetAccess (cuMemUnmap
 *     and cuMemSetAccess are \note_sync; cuIpcCloseMemHandle), and mapping is a barrier
 *     (cuMemMap, cuIpcOpenMemHandle), where a driver may synchronize too;
 *   - callbacks: host functions and user objects' destructors run on one thread of the
 *     process, one at a time, in the order they became due; a CUDA call from either fails;
 *   - kernels: ncclshim's own (kernels/reduce_device.cu), compiled by the host C++ compiler
 *     over cuda_on_cpu.h; the worker runs a launch's blocks one after another, each thread
 *     seeing its blockIdx and threadIdx and the launch's parameters: one thread after another
 *     where they neither share memory nor synchronize, else (kr_dev_from: __shared__ and
 *     __syncthreads) as coroutines of the block that switch at each barrier, its shared memory
 *     poisoned at each block's start, a divergent barrier aborting (block.c). A kernel's stores
 *     to words others read (kr_dev_signal's) are held and reach the host at the storing
 *     thread's next __threadfence_system or the kernel's end, in a random order, a random
 *     delay before each (FAKE_CUDA_STORE_DELAY_US, default 20 us; stores.c), as no more than
 *     CUDA promises. Launches outside the driver's limits or the kernels' __launch_bounds__
 *     are refused as the driver refuses them; any other kernel name fails at
 *     cuModuleGetFunction;
 *   - graph capture: one stream's operations into a graph, launched as copies of them; and the
 *     state alone, set by fake_cuda_set_capturing for a test;
 *   - sticky errors: a by-value kernel, copy or memory operation touching cuMem memory its
 *     device may not is taken and faults when it runs: its context answers every later call
 *     with CUDA_ERROR_ILLEGAL_ADDRESS, its streams' work stops and their waits end
 *     (FAKE_CUDA_EXPECT_FAULTS=1: a test that faults on purpose, whose fault is then said
 *     without the complaint's prefix). kr_dev_from and kr_dev_signal still end the process.
 * FAKE_CUDA_BACKTRACE=1 prints the stack of every complaint; FAKE_CUDA_DUMP_S=n, n seconds
 * into the process, what waits in every queue.
 * Not modelled: timing (but for the delays of kernels' stores), and every function ncclshim
 * never calls (cuGetProcAddress answers those as names the driver lacks: CUDA_SUCCESS, no
 * pointer, SYMBOL_NOT_FOUND).
 *
 * Files: proc.c (entry points, errors, devices, contexts), memory.c (allocations, pointer
 * attributes, registration, IPC, cuMem), stream.c (streams, events, copies, launches),
 * kernels_cpu.cpp (the kernels and the grid emulator; cuda_on_cpu.h, what CUDA gives device
 * code), block.c (a block's threads as coroutines), stores.c (kernels' stores reaching the
 * host late and out of order), test.c (what tests ask of the double).
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
    int sticky;                      /* CUresult a fault left it with (atomic; 0: none) */
    unsigned peers;                  /* devices cuCtxEnablePeerAccess opened to it (atomic) */
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
                           is a complaint at once, not only once it waited sync_hang_ms */
    int sync_hang_ms;   /* FAKE_CUDA_SYNC_HANG_MS (default 5000): how long a synchronization
                           waits for a stream memory operation before it complains and stops
                           the process */
    char sync_exempt[512]; /* FAKE_CUDA_SYNC_EXEMPT: calls, by name, whose synchronization
                              is left out (a known defect of the program's, named where set) */
    bool host_visible;  /* FAKE_CUDA_HOST_VISIBLE=1: host code may touch device memory */
    bool no_peer;
    bool can_flush;     /* FAKE_CUDA_FLUSH_REMOTE_WRITES=1: CU_STREAM_WAIT_VALUE_FLUSH works */
    bool no_host_cumem; /* FAKE_CUDA_NO_HOST_CUMEM=1: cuMemCreate refuses host locations */
    /* FAKE_CUDA_BUFFER_ID=reservation: a cuMem mapping's BUFFER_ID is its reservation's, one
     * for every allocation mapped into it (cuda.h's "unique ID for an allocated memory
     * region" allows either reading); by default each allocation (cuMemCreate) has its own. */
    bool reservation_ids;
    int store_delay_us; /* FAKE_CUDA_STORE_DELAY_US: the mean delay of a kernel's store */
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

/* CUDA_ERROR_INVALID_CONTEXT, with a complaint, where the calling thread has no current
 * context and `call` is one that works in it: allocating, freeing and copying device memory,
 * registering host memory, legacy IPC, modules, cuMemGetAddressRange, a NULL stream's work
 * (FAKE_NEED_CONTEXT: from the entry point itself, returning that error). cuda.h lists
 * CUDA_ERROR_INVALID_CONTEXT for these; the calls that name their object (a stream, an event,
 * a cuMem handle or range, a device) or only read a pointer's attributes need none. */
CUresult fake_need_context(const char *call);
#define FAKE_NEED_CONTEXT()                                                                  \
    do {                                                                                     \
        if (fake_need_context(__func__) != CUDA_SUCCESS) {                                   \
            return CUDA_ERROR_INVALID_CONTEXT;                                               \
        }                                                                                    \
    } while (0)

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
 * is done. It returns only once every stream memory operation of ctx enqueued before it is met
 * (as a driver that synchronizes would), and block: once all that earlier work is done. A wait
 * unmet after FAKE_CUDA_SYNC_HANG_MS is a complaint, and the process stops (abort); with
 * FAKE_CUDA_SYNC_STRICT=1 any unmet wait is a complaint at once. */
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
/* Stream memory operations and kernels' stores reach device memory or registered host
 * memory, by either of its addresses (fake_mem_host_of translates a device address): the
 * word the double touches, or 0 where addr is none of those or not 4-byte aligned. */
uintptr_t fake_mem_op_target(uint64_t addr);
/* Whether work on `device` may touch the host address: false only inside a cuMem mapping
 * that cuMemSetAccess did not open to that device (an illegal address on a GPU). */
bool fake_mem_device_reaches(uintptr_t host, int device);
/* The allocation, registration or mapping containing p; false if none. */
bool fake_mem_lookup(uintptr_t p, enum fake_mem_kind *kind_out, int *device_out);
/* Whether a stream memory operation of a stream on `device` may name addr, as cuda.h's
 * CUDA_MEMOP section and cuMemHostRegister have it: 4-byte aligned device memory or registered
 * host memory (by either address) that was registered with CU_MEMHOSTREGISTER_DEVICEMAP, and
 * PORTABLE if another device's context registered it; never managed memory. CUDA_SUCCESS and
 * the word the double touches (*word_out), else CUDA_ERROR_INVALID_VALUE with a complaint.
 * *fault_out: cuMem or pool memory the device may not touch, which the driver takes and the
 * GPU faults on when it runs. */
CUresult fake_mem_op_check(uintptr_t addr, int device, uintptr_t *word_out, bool *fault_out);

/* A pool's allocation at p freed (memory.c); false if p is none. */
bool fake_pool_free(uintptr_t p);
/* Enqueues on stream the free of a pool's allocation at p (stream.c). */
CUresult fake_stream_free(CUstream stream, uintptr_t p);

/* Sticky errors (stream.c). Device work that faults (an illegal address) leaves its context
 * unusable for good, as on a GPU: every later call made in that context, or on its streams and
 * events, answers the fault's error, its streams' work stops, and waits on them end. */
void fake_ctx_fault(struct CUctx_st *ctx, CUresult error, const char *what);
/* ctx's sticky error, CUDA_SUCCESS if none (or ctx NULL). */
CUresult fake_ctx_sticky(struct CUctx_st *ctx);
#define FAKE_STICKY_CHECK()                                                                  \
    do {                                                                                     \
        CUresult fake_sticky_ = fake_ctx_sticky(fake_ctx_current());                          \
        if (fake_sticky_ != CUDA_SUCCESS) {                                                  \
            return fake_sticky_;                                                             \
        }                                                                                    \
    } while (0)

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
/* Runs it on the calling thread (the stream's worker): every thread of every block of the
 * grid, block after block, each thread seeing params as its one parameter (for kr_dev_from
 * and kr_dev_signal, with the addresses they read already the double's: stream.c). A kernel
 * with barriers runs a block's threads together (block.c); its stores to words others read
 * are applied by its end (stores.c). The dimensions are valid (cuLaunchKernel checked them). */
void fake_kernel_run(const struct fake_kernel *kernel, const void *params,
                     const struct fake_dim3 *grid, const struct fake_dim3 *block);

/* A block's threads as coroutines (block.c): runs main(arg) once per thread of a block of
 * nthreads on the calling thread, enter(arg, t) before thread t runs or resumes (it sets
 * threadIdx); __syncthreads (fake_block_sync) suspends a thread until all of them reached it.
 * A divergent barrier complains and aborts. fake_block_free: the worker's stacks, at its end. */
void fake_block_run(unsigned nthreads, void (*enter)(void *arg, unsigned thread),
                    void (*main)(void *arg), void *arg);
void fake_block_free(void);

/* Kernels' stores to words others read (stores.c): fake_store_word and fake_store_fence
 * (cuda_on_cpu.h) hold and apply them; the kernel's end applies what is left; the worker's
 * end frees what it held them in. */
void fake_store_kernel_end(void);
void fake_store_free(void);
/* For tests: hook(arg, word, value) on the worker after each store applied (NULL: none). */
void fake_store_set_hook(void (*hook)(void *arg, const uint32_t *word, uint32_t value),
                         void *arg);

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
    long flush_waits;       /* cuStreamWaitValue32 calls with CU_STREAM_WAIT_VALUE_FLUSH */
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
