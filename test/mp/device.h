/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Device memory for the multi-process test programs, through whatever libcuda.so.1 the
 * process finds: the driver's test double in CI (LD_LIBRARY_PATH=build/test/doubles), the real
 * driver on a GPU machine. A program here stays a plain consumer of libnccl.so.2: it reaches
 * the driver with dlopen, as the library does, and links nothing of CUDA.
 *
 * Kinds of memory a test can ask for, as NCCL programs hold it:
 *   device      cuMemAlloc (cudaMalloc)
 *   memalloc    ncclMemAlloc (a shareable cuMem allocation)
 *   managed     cuMemAllocManaged
 *   registered  host memory registered with cuMemHostRegister
 *   expandable  cuMem memory its own device alone may touch (mp_cuda_alloc_expandable)
 *   pool        a memory pool's (cuMemAllocFromPoolAsync) whose allocations share as POSIX
 *               file descriptors, which cuMemRetainAllocationHandle does not name (no cuMemMap
 *               made them): shareable only through the pool's own calls
 *   chunked     one reservation mapped from several cuMem allocations of one granule each,
 *               as PyTorch's expandable segments grow (2 MiB pages), the buffer starting
 *               64 KiB before a boundary, so that larger ones span two allocations
 * Each rank works on device LOCAL_RANK % (number of devices), made current before its
 * communicator is created, as torchrun programs do.
 */
#ifndef MP_DEVICE_H
#define MP_DEVICE_H

#include <cuda.h>
#include <dlfcn.h>

#include "common.h"

/* expandable: cuMem memory mapped and made accessible to its own device only, as PyTorch's
 * expandable segments make it (ncclMemAlloc's grants every device that can reach it). */
enum mp_mem_kind { MP_MEM_DEVICE, MP_MEM_MEMALLOC, MP_MEM_MANAGED, MP_MEM_REGISTERED,
                   MP_MEM_EXPANDABLE, MP_MEM_POOL, MP_MEM_CHUNKED, MP_MEM_KINDS };

static const char *const mp_mem_kind_names[MP_MEM_KINDS] = {
    "device", "memalloc", "managed", "registered", "expandable", "pool", "chunked"};

/* What the double tells tests (test/doubles/fake_cuda/fake_cuda.h). */
#define MP_FAKE_MAX_DEVICES 8 /* the double's FAKE_MAX_DEVICES */
struct mp_fake_stats {
    int streams, events, registrations, ipc_mappings, modules;
    long kernels_launched;
    unsigned long long link_in[MP_FAKE_MAX_DEVICES];
    unsigned long long link_out[MP_FAKE_MAX_DEVICES];
    long flush_waits;
};

struct mp_cuda {
    void *lib;
    int device;
    int compute_capability; /* major * 10 + minor */
    CUcontext ctx;
    CUresult (*init)(unsigned int);
    CUresult (*device_get_count)(int *);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*mem_alloc)(CUdeviceptr *, size_t);
    CUresult (*mem_free)(CUdeviceptr);
    CUresult (*mem_alloc_managed)(CUdeviceptr *, size_t, unsigned int);
    CUresult (*host_register)(void *, size_t, unsigned int);
    CUresult (*host_unregister)(void *);
    CUresult (*memcpy_async)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
    CUresult (*stream_create)(CUstream *, unsigned int);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*stream_query)(CUstream);
    CUresult (*stream_wait_value32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
    CUresult (*host_get_device_pointer)(CUdeviceptr *, void *, unsigned int);
    /* CUDA graphs (the double's hold one stream's kernels, copies and flag operations). */
    CUresult (*stream_begin_capture)(CUstream, CUstreamCaptureMode);
    CUresult (*stream_end_capture)(CUstream, CUgraph *);
    CUresult (*thread_exchange_capture_mode)(CUstreamCaptureMode *);
    /* Events, as PyTorch joins its streams. */
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*stream_wait_event)(CUstream, CUevent, unsigned int);
    CUresult (*event_destroy)(CUevent);
    CUresult (*graph_destroy)(CUgraph);
    CUresult (*graph_instantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*graph_launch)(CUgraphExec, CUstream);
    CUresult (*graph_exec_destroy)(CUgraphExec);
    /* cuMem, for expandable memory. */
    CUresult (*ctx_get_device)(CUdevice *);
    CUresult (*mem_granularity)(size_t *, const CUmemAllocationProp *,
                                CUmemAllocationGranularity_flags);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
    CUresult (*mem_release)(CUmemGenericAllocationHandle);
    CUresult (*mem_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*mem_address_free)(CUdeviceptr, size_t);
    CUresult (*mem_map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                        unsigned long long);
    CUresult (*mem_unmap)(CUdeviceptr, size_t);
    CUresult (*mem_set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    /* Memory pools, for pool memory. */
    CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *);
    CUresult (*pool_destroy)(CUmemoryPool);
    CUresult (*alloc_from_pool)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
    CUresult (*free_async)(CUdeviceptr, CUstream);
    CUmemoryPool pool; /* made at the first pool buffer */
    /* The double's own, NULL on a real driver. */
    void (*fake_stats)(struct mp_fake_stats *);
};

static inline void *
mp_cuda_sym(struct mp_cuda *cu, const char *name)
{
    void *fn = dlsym(cu->lib, name);
    MP_ASSERT(fn != NULL, "libcuda.so.1 has no %s", name);
    return fn;
}

#define MP_CU(cu, call)                                                                       \
    do {                                                                                      \
        CUresult mp_cu_res_ = (cu)->call;                                                     \
        MP_ASSERT(mp_cu_res_ == CUDA_SUCCESS, "%s failed: CUresult %d", #call,                \
                  (int)mp_cu_res_);                                                           \
    } while (0)

/* Opens the driver and makes device LOCAL_RANK % count current on the calling thread. */
static inline void
mp_cuda_init(struct mp_cuda *cu)
{
    int count = 0;
    CUdevice dev;

    memset(cu, 0, sizeof(*cu));
    cu->lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    MP_ASSERT(cu->lib != NULL, "device mode needs a CUDA driver (or its test double on "
              "LD_LIBRARY_PATH): %s", dlerror());
    cu->init = mp_cuda_sym(cu, "cuInit");
    cu->device_get_count = mp_cuda_sym(cu, "cuDeviceGetCount");
    cu->device_get = mp_cuda_sym(cu, "cuDeviceGet");
    cu->device_get_attribute = mp_cuda_sym(cu, "cuDeviceGetAttribute");
    cu->primary_ctx_retain = mp_cuda_sym(cu, "cuDevicePrimaryCtxRetain");
    cu->ctx_set_current = mp_cuda_sym(cu, "cuCtxSetCurrent");
    cu->mem_alloc = mp_cuda_sym(cu, "cuMemAlloc_v2");
    cu->mem_free = mp_cuda_sym(cu, "cuMemFree_v2");
    cu->mem_alloc_managed = mp_cuda_sym(cu, "cuMemAllocManaged");
    cu->host_register = mp_cuda_sym(cu, "cuMemHostRegister_v2");
    cu->host_unregister = mp_cuda_sym(cu, "cuMemHostUnregister");
    cu->memcpy_async = mp_cuda_sym(cu, "cuMemcpyAsync");
    cu->stream_create = mp_cuda_sym(cu, "cuStreamCreate");
    cu->stream_destroy = mp_cuda_sym(cu, "cuStreamDestroy_v2");
    cu->stream_synchronize = mp_cuda_sym(cu, "cuStreamSynchronize");
    cu->stream_query = mp_cuda_sym(cu, "cuStreamQuery");
    cu->stream_wait_value32 = mp_cuda_sym(cu, "cuStreamWaitValue32_v2");
    cu->host_get_device_pointer = mp_cuda_sym(cu, "cuMemHostGetDevicePointer_v2");
    cu->stream_begin_capture = (CUresult(*)(CUstream, CUstreamCaptureMode))dlsym(
        cu->lib, "cuStreamBeginCapture_v2");
    cu->stream_end_capture = (CUresult(*)(CUstream, CUgraph *))dlsym(cu->lib,
                                                                       "cuStreamEndCapture");
    cu->thread_exchange_capture_mode = (CUresult(*)(CUstreamCaptureMode *))dlsym(
        cu->lib, "cuThreadExchangeStreamCaptureMode");
    cu->event_create = mp_cuda_sym(cu, "cuEventCreate");
    cu->event_record = mp_cuda_sym(cu, "cuEventRecord");
    cu->stream_wait_event = mp_cuda_sym(cu, "cuStreamWaitEvent");
    cu->event_destroy = mp_cuda_sym(cu, "cuEventDestroy_v2");
    cu->graph_destroy = (CUresult(*)(CUgraph))dlsym(cu->lib, "cuGraphDestroy");
    cu->graph_instantiate = (CUresult(*)(CUgraphExec *, CUgraph, unsigned long long))dlsym(
        cu->lib, "cuGraphInstantiateWithFlags");
    cu->graph_launch = (CUresult(*)(CUgraphExec, CUstream))dlsym(cu->lib, "cuGraphLaunch");
    cu->graph_exec_destroy = (CUresult(*)(CUgraphExec))dlsym(cu->lib, "cuGraphExecDestroy");
    cu->fake_stats = (void (*)(struct mp_fake_stats *))dlsym(cu->lib, "fake_cuda_get_stats");
    cu->ctx_get_device = mp_cuda_sym(cu, "cuCtxGetDevice");
    cu->mem_granularity = mp_cuda_sym(cu, "cuMemGetAllocationGranularity");
    cu->mem_create = mp_cuda_sym(cu, "cuMemCreate");
    cu->mem_release = mp_cuda_sym(cu, "cuMemRelease");
    cu->mem_reserve = mp_cuda_sym(cu, "cuMemAddressReserve");
    cu->mem_address_free = mp_cuda_sym(cu, "cuMemAddressFree");
    cu->mem_map = mp_cuda_sym(cu, "cuMemMap");
    cu->mem_unmap = mp_cuda_sym(cu, "cuMemUnmap");
    cu->mem_set_access = mp_cuda_sym(cu, "cuMemSetAccess");
    cu->pool_create = mp_cuda_sym(cu, "cuMemPoolCreate");
    cu->pool_destroy = mp_cuda_sym(cu, "cuMemPoolDestroy");
    cu->alloc_from_pool = mp_cuda_sym(cu, "cuMemAllocFromPoolAsync");
    cu->free_async = mp_cuda_sym(cu, "cuMemFreeAsync");
    MP_CU(cu, init(0));
    MP_CU(cu, device_get_count(&count));
    MP_ASSERT(count > 0, "the CUDA driver sees no device");
    cu->device = (int)(mp_env_long("LOCAL_RANK", mp_env_long("RANK", 0)) % count);
    MP_CU(cu, device_get(&dev, cu->device));
    int major = 0, minor = 0;
    MP_CU(cu, device_get_attribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    MP_CU(cu, device_get_attribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    cu->compute_capability = major * 10 + minor;
    MP_CU(cu, primary_ctx_retain(&cu->ctx, dev));
    MP_CU(cu, ctx_set_current(cu->ctx));
}

/* Expandable allocations, to unmap and release them by address. */
#define MP_EXPANDABLE_MAX 256
static struct {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle handle;
} mp_expandables[MP_EXPANDABLE_MAX];

/* cuMem memory on the current context's device, shareable by file descriptor, readable and
 * writable by that device alone (none: no device may touch it, a program's mistake that makes
 * the GPU fault; freed as expandable memory). */
static inline void *
mp_cuda_alloc_cumem(struct mp_cuda *cu, size_t bytes, bool none)
{
    CUdevice dev;
    size_t granularity = 0;
    int slot = 0;

    MP_CU(cu, ctx_get_device(&dev));
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
    MP_CU(cu, mem_granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    while (slot < MP_EXPANDABLE_MAX && mp_expandables[slot].va != 0) {
        slot++;
    }
    MP_ASSERT(slot < MP_EXPANDABLE_MAX, "more than %d expandable buffers", MP_EXPANDABLE_MAX);
    size_t size = (bytes + granularity - 1) / granularity * granularity;
    size = size > 0 ? size : granularity;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    MP_CU(cu, mem_create(&handle, size, &prop, 0));
    MP_CU(cu, mem_reserve(&va, size, granularity, 0, 0));
    MP_CU(cu, mem_map(va, size, 0, handle, 0));
    CUmemAccessDesc access = {.location = prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    if (!none) {
        MP_CU(cu, mem_set_access(va, size, &access, 1));
    }
    mp_expandables[slot].va = va;
    mp_expandables[slot].size = size;
    mp_expandables[slot].handle = handle;
    return (void *)(uintptr_t)va;
}

static inline void *
mp_cuda_alloc_expandable(struct mp_cuda *cu, size_t bytes)
{
    return mp_cuda_alloc_cumem(cu, bytes, false);
}

static inline void
mp_cuda_free_expandable(struct mp_cuda *cu, void *ptr)
{
    for (int i = 0; i < MP_EXPANDABLE_MAX; i++) {
        if (mp_expandables[i].va == (CUdeviceptr)(uintptr_t)ptr) {
            MP_CU(cu, mem_unmap(mp_expandables[i].va, mp_expandables[i].size));
            MP_CU(cu, mem_address_free(mp_expandables[i].va, mp_expandables[i].size));
            MP_CU(cu, mem_release(mp_expandables[i].handle));
            mp_expandables[i].va = 0;
            return;
        }
    }
    MP_ASSERT(false, "%p is no expandable buffer of ours", ptr);
}

/* Pool memory: from a pool of the current device whose allocations share as file descriptors,
 * allocated and freed on the NULL stream, waited for. */
static inline void *
mp_cuda_alloc_pool(struct mp_cuda *cu, size_t bytes)
{
    CUdeviceptr p = 0;

    if (cu->pool == NULL) {
        CUdevice dev;
        MP_CU(cu, ctx_get_device(&dev));
        CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
        MP_CU(cu, pool_create(&cu->pool, &props));
    }
    MP_CU(cu, alloc_from_pool(&p, bytes > 0 ? bytes : 1, cu->pool, NULL));
    MP_CU(cu, stream_synchronize(NULL));
    return (void *)(uintptr_t)p;
}

/* Chunked allocations, to unmap and release them by address. */
#define MP_CHUNKED_MAX 64
static struct {
    CUdeviceptr va, ptr;
    size_t chunk;
    int n;
    CUmemGenericAllocationHandle *handles;
} mp_chunkeds[MP_CHUNKED_MAX];

/* Chunked memory (see the top): each granule its own allocation, mapped in order into one
 * reservation and made accessible to the current device as one range. */
static inline void *
mp_cuda_alloc_chunked(struct mp_cuda *cu, size_t bytes)
{
    CUdevice dev;
    size_t chunk = 0;
    int slot = 0;

    MP_CU(cu, ctx_get_device(&dev));
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = dev}};
    MP_CU(cu, mem_granularity(&chunk, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    while (slot < MP_CHUNKED_MAX && mp_chunkeds[slot].va != 0) {
        slot++;
    }
    MP_ASSERT(slot < MP_CHUNKED_MAX, "more than %d chunked buffers", MP_CHUNKED_MAX);
    size_t lead = chunk > 65536 ? chunk - 65536 : 0;
    int n = (int)((lead + (bytes > 0 ? bytes : 1) + chunk - 1) / chunk);
    CUmemGenericAllocationHandle *handles = calloc((size_t)n, sizeof(*handles));
    CUdeviceptr va;
    MP_ASSERT(handles != NULL, "out of memory");
    MP_CU(cu, mem_reserve(&va, (size_t)n * chunk, chunk, 0, 0));
    for (int i = 0; i < n; i++) {
        MP_CU(cu, mem_create(&handles[i], chunk, &prop, 0));
        MP_CU(cu, mem_map(va + (size_t)i * chunk, chunk, 0, handles[i], 0));
    }
    CUmemAccessDesc access = {.location = prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    MP_CU(cu, mem_set_access(va, (size_t)n * chunk, &access, 1));
    mp_chunkeds[slot].va = va;
    mp_chunkeds[slot].ptr = va + lead;
    mp_chunkeds[slot].chunk = chunk;
    mp_chunkeds[slot].n = n;
    mp_chunkeds[slot].handles = handles;
    return (void *)(uintptr_t)(va + lead);
}

static inline void
mp_cuda_free_chunked(struct mp_cuda *cu, void *ptr)
{
    for (int i = 0; i < MP_CHUNKED_MAX; i++) {
        if (mp_chunkeds[i].va != 0 && mp_chunkeds[i].ptr == (CUdeviceptr)(uintptr_t)ptr) {
            for (int k = 0; k < mp_chunkeds[i].n; k++) {
                CUdeviceptr at = mp_chunkeds[i].va + (size_t)k * mp_chunkeds[i].chunk;
                MP_CU(cu, mem_unmap(at, mp_chunkeds[i].chunk));
                MP_CU(cu, mem_release(mp_chunkeds[i].handles[k]));
            }
            MP_CU(cu, mem_address_free(mp_chunkeds[i].va,
                                       (size_t)mp_chunkeds[i].n * mp_chunkeds[i].chunk));
            free(mp_chunkeds[i].handles);
            mp_chunkeds[i].va = 0;
            return;
        }
    }
    MP_ASSERT(false, "%p is no chunked buffer of ours", ptr);
}

/* A buffer of `bytes` of `kind` (plus nothing: callers size their guards in). */
static inline void *
mp_cuda_alloc(struct mp_cuda *cu, enum mp_mem_kind kind, size_t bytes)
{
    CUdeviceptr p = 0;
    void *host;

    switch (kind) {
    case MP_MEM_DEVICE:
        MP_CU(cu, mem_alloc(&p, bytes));
        return (void *)(uintptr_t)p;
    case MP_MEM_MEMALLOC:
        MP_CHECK(ncclMemAlloc(&host, bytes));
        return host;
    case MP_MEM_MANAGED:
        MP_CU(cu, mem_alloc_managed(&p, bytes, CU_MEM_ATTACH_GLOBAL));
        return (void *)(uintptr_t)p;
    case MP_MEM_REGISTERED:
        host = aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);
        MP_ASSERT(host != NULL, "out of memory for %zu bytes", bytes);
        MP_CU(cu, host_register(host, (bytes + 4095) & ~(size_t)4095,
                                CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
        return host;
    case MP_MEM_EXPANDABLE:
        return mp_cuda_alloc_expandable(cu, bytes);
    case MP_MEM_POOL:
        return mp_cuda_alloc_pool(cu, bytes);
    case MP_MEM_CHUNKED:
        return mp_cuda_alloc_chunked(cu, bytes);
    default:
        MP_ASSERT(false, "memory kind %d", (int)kind);
    }
    return NULL;
}

static inline void
mp_cuda_free(struct mp_cuda *cu, enum mp_mem_kind kind, void *ptr)
{
    switch (kind) {
    case MP_MEM_DEVICE:
    case MP_MEM_MANAGED:
        MP_CU(cu, mem_free((CUdeviceptr)(uintptr_t)ptr));
        break;
    case MP_MEM_MEMALLOC:
        MP_CHECK(ncclMemFree(ptr));
        break;
    case MP_MEM_EXPANDABLE:
        mp_cuda_free_expandable(cu, ptr);
        break;
    case MP_MEM_POOL:
        MP_CU(cu, free_async((CUdeviceptr)(uintptr_t)ptr, NULL));
        MP_CU(cu, stream_synchronize(NULL));
        break;
    case MP_MEM_CHUNKED:
        mp_cuda_free_chunked(cu, ptr);
        break;
    case MP_MEM_REGISTERED:
        MP_CU(cu, host_unregister(ptr));
        free(ptr);
        break;
    default:
        break;
    }
}

/* Starts (capturing != 0) or ends capturing stream into a CUDA graph, which is thrown away.
 * Returns false where the driver has no graphs. */
static inline bool
mp_cuda_capture(struct mp_cuda *cu, CUstream stream, int capturing)
{
    if (cu->stream_begin_capture == NULL || cu->stream_end_capture == NULL) {
        return false;
    }
    if (capturing) {
        MP_CU(cu, stream_begin_capture(stream, CU_STREAM_CAPTURE_MODE_RELAXED));
    } else {
        CUgraph graph = NULL;
        /* A capture the call invalidated ends in an error and no graph: either is fine. */
        (void)cu->stream_end_capture(stream, &graph);
        if (graph != NULL && cu->graph_destroy != NULL) {
            cu->graph_destroy(graph);
        }
    }
    return true;
}

/* Copies on stream, then waits for the stream: the test's own transfers. */
static inline void
mp_cuda_copy(struct mp_cuda *cu, void *dst, const void *src, size_t bytes, CUstream stream)
{
    if (bytes > 0) {
        MP_CU(cu, memcpy_async((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes,
                               stream));
    }
    MP_CU(cu, stream_synchronize(stream));
}

/* cuStreamQuery in relaxed capture mode: a query is among the calls that a global-mode capture
 * (of this thread, or of any thread) forbids, failing with 900 and breaking the capture, as
 * the H200 showed where this thread captured another stream. The thread's mode is its own
 * again after. */
static inline CUresult
mp_cuda_query(struct mp_cuda *cu, CUstream stream)
{
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;

    if (cu->thread_exchange_capture_mode != NULL) {
        MP_CU(cu, thread_exchange_capture_mode(&mode));
    }
    CUresult q = cu->stream_query(stream);
    if (cu->thread_exchange_capture_mode != NULL) {
        MP_CU(cu, thread_exchange_capture_mode(&mode));
    }
    return q;
}

/* Waits until stream has done its work, or comm reports an error, or `seconds` pass; returns
 * ncclSuccess when the stream is done, the async error (or ncclInProgress on time out). The
 * way a watchdog waits: never blocked in the driver on a stream that may never finish. */
static inline ncclResult_t
mp_cuda_wait(struct mp_cuda *cu, CUstream stream, ncclComm_t comm, double seconds)
{
    double deadline = mp_now() + seconds;

    for (;;) {
        CUresult q = mp_cuda_query(cu, stream);
        if (q == CUDA_SUCCESS) {
            return ncclSuccess;
        }
        MP_ASSERT(q == CUDA_ERROR_NOT_READY, "cuStreamQuery failed: CUresult %d", (int)q);
        ncclResult_t async = ncclSuccess;
        if (comm != NULL && ncclCommGetAsyncError(comm, &async) == ncclSuccess &&
            async != ncclSuccess && async != ncclInProgress) {
            return async;
        }
        if (mp_now() > deadline) {
            return ncclInProgress;
        }
        struct timespec pause = {0, 1000 * 1000};
        nanosleep(&pause, NULL);
    }
}

/* The devices the ranks spread over (rank r on device r % count): the double's
 * FAKE_CUDA_DEVICES, else one (a GPU machine's run puts every rank on its one GPU). */
static inline int
mp_device_spread(void)
{
    const char *devices = getenv("FAKE_CUDA_DEVICES");
    int count = devices != NULL ? atoi(devices) : 1;
    return count > 0 ? count : 1;
}

/* Whether every rank leads its own share of its GPU (NCCLSHIM_RANK_LEADERS=1): each then runs
 * what a rank alone on its GPU runs, its share on its own streams. */
static inline bool
mp_rank_leaders(void)
{
    const char *v = getenv("NCCLSHIM_RANK_LEADERS");
    return v != NULL && atoi(v) == 1;
}

/* Whether rank leads, in the device team, a GPU that other ranks share (the lowest rank on
 * each device, here ranks 0 .. devices-1, when ranks outnumber devices): its share runs on a
 * stream of its leader's own, in its process's context. */
static inline bool
mp_leader_shares_gpu(int rank, int nranks)
{
    int devices = mp_device_spread();
    return !mp_rank_leaders() && rank < devices && rank + devices < nranks;
}

/* Whether a device call of this rank may wait on the host for the other ranks to call too,
 * as NCCL's calls may: a GPU's leader that shares its GPU (its streams share a context with
 * its leader's stream; a leader alone on its GPU runs the share on its own streams), and
 * every rank of a communicator without a device team (here: one host with NCCL_SHM_DISABLE=1),
 * whose call waits for its messages. The others return once their work is enqueued. */
static inline bool
mp_device_call_may_wait(int rank, int nranks)
{
    const char *no_shm = getenv("NCCL_SHM_DISABLE");
    return mp_leader_shares_gpu(rank, nranks) || (no_shm != NULL && atoi(no_shm) == 1);
}

/* The memory kind a command line names; exits on a name it does not know. */
static inline int
mp_mem_kind_parse(const char *name)
{
    if (strcmp(name, "mixed") == 0) {
        return -1; /* every kind in turn */
    }
    for (int k = 0; k < MP_MEM_KINDS; k++) {
        if (strcmp(name, mp_mem_kind_names[k]) == 0) {
            return k;
        }
    }
    fprintf(stderr, "unknown memory kind '%s' (device, memalloc, managed, registered, "
            "expandable, pool, chunked, mixed)\n", name);
    exit(2);
}

#endif
