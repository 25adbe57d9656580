/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The driver's test double (test/doubles/fake_cuda) answers as cuda.h says the driver does,
 * where the library's tests rely on it: a real GPU's attributes (an H100 SXM5 by default);
 * cuGetProcAddress_v2's answers for a name it lacks, a version too old or too new, and flags;
 * stream memory operations' flags and addresses; cuMem's allocation properties, granularity,
 * reservations and mappings (offset zero, inside a reservation, the mapped region from
 * cuMemGetAddressRange, the reservation from RANGE_START_ADDR), export only to a requested
 * handle type; a memory pool's allocations, which no cuMemMap made; the sticky error a
 * fault leaves its context with; what a capture forbids (potentially unsafe calls in GLOBAL
 * and THREAD_LOCAL mode, and in any mode what necessarily conflicts with it); and a call that
 * may synchronize a context made while a stream of it waits on a word: delayed until the wait
 * is met, and the process stopped with a complaint where it stays unmet. Each test runs in a
 * process of its own (Criterion's), so the one that faults a context harms no other.
 */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gpu/memory.h"
#include "kernels/device_abi.h"
#include "gpu_fixture.h"

static void
need_double(void)
{
    if (fake_fn("fake_cuda_get_stats") == NULL) {
        cr_skip_test("a real driver: these are the double's answers");
    }
}

TestSuite(fake_cuda, .init = setup, .fini = teardown);

Test(fake_cuda, an_h100s_attributes)
{
    int v = -1;

    need_double();
    cr_assert_eq(device->sm_count, 132);
    cr_assert_eq(device->cc_major, 9);
    cr_assert_eq(device->cc_minor, 0);
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK, 0),
                 CUDA_SUCCESS);
    cr_assert_eq(v, 1024);
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, 0),
                 CUDA_SUCCESS);
    cr_assert_eq(v, 50 << 20);
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_CAN_FLUSH_REMOTE_WRITES, 0),
                 CUDA_SUCCESS);
    cr_assert_eq(v, 0);
    cr_assert(!device->can_flush);
    /* Outside CUdevice_attribute: an invalid value, as cuda.h says. */
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(&v, (CUdevice_attribute)0, 0),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 7),
                 CUDA_ERROR_INVALID_DEVICE);
}

static void
a100(void)
{
    setenv("FAKE_CUDA_CC", "80", 1); /* before the double reads its settings */
    setup();
}

Test(fake_cuda_a100, the_compute_capability_picks_the_gpu, .init = a100, .fini = teardown)
{
    need_double();
    cr_assert_eq(device->sm_count, 108);
    cr_assert_eq(device->cc_major, 8);
    cr_assert_eq(device->cc_minor, 0);
}

/* cuGetProcAddress_v2 as cuda.h documents it. */
Test(fake_cuda, get_proc_address_answers_as_documented)
{
    CUresult (*get_proc)(const char *, void **, int, cuuint64_t,
                         CUdriverProcAddressQueryResult *) = fake_fn("cuGetProcAddress_v2");
    CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
    void *fn = (void *)1;
    int driver = 0;

    need_double();
    cr_assert_not_null(get_proc);
    __typeof__(cuDriverGetVersion) *version = fake_fn("cuDriverGetVersion");
    cr_assert_eq(version(&driver), CUDA_SUCCESS);
    /* A name the driver does not have: success, no pointer, SYMBOL_NOT_FOUND. */
    cr_assert_eq(get_proc("cuNoSuchFunction", &fn, driver, 0, &status), CUDA_SUCCESS);
    cr_assert_null(fn);
    cr_assert_eq(status, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    /* A version older than its every variant: success, no pointer, VERSION_NOT_SUFFICIENT. */
    fn = (void *)1;
    cr_assert_eq(get_proc("cuFuncLoad", &fn, 12000, 0, &status), CUDA_SUCCESS);
    cr_assert_null(fn);
    cr_assert_eq(status, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    /* A version newer than the driver: an invalid value. */
    cr_assert_eq(get_proc("cuFuncLoad", &fn, driver + 10, 0, &status),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(get_proc("cuFuncLoad", &fn, driver, 1u << 5, &status),
                 CUDA_ERROR_INVALID_VALUE, "an undefined flag");
    cr_assert_eq(get_proc("cuFuncLoad", &fn, 12040, CU_GET_PROC_ADDRESS_LEGACY_STREAM, NULL),
                 CUDA_SUCCESS, "the status is optional");
    cr_assert_not_null(fn);
    /* What the library resolved: the optional entry point where the driver has it. */
    cr_assert_not_null(gpu_cu.cuFuncLoad);
}

/* Below CUDA 12.4 a driver has no cuFuncLoad: the library works without it. */
static void
driver_12_0(void)
{
    setenv("FAKE_CUDA_DRIVER_VERSION", "12000", 1);
    setup();
}

Test(fake_cuda_12_0, an_optional_entry_point_the_driver_lacks_is_null, .init = driver_12_0,
     .fini = teardown)
{
    need_double();
    cr_assert(gpu_driver_present());
    cr_assert_null(gpu_cu.cuFuncLoad);
    cr_assert_not_null(gpu_cu.cuMemAlloc);
}

/* A page of host memory registered with flags, and its device address. */
static uint32_t *
registered(unsigned int flags, CUdeviceptr *dev)
{
    uint32_t *host = aligned_alloc(4096, 4096);

    cr_assert_not_null(host);
    memset(host, 0, 4096);
    cr_assert_eq(gpu_cu.cuMemHostRegister(host, 4096, flags), CUDA_SUCCESS);
    if (dev != NULL) {
        cr_assert_eq(gpu_cu.cuMemHostGetDevicePointer(dev, host, 0), CUDA_SUCCESS);
    }
    return host;
}

/* cuStreamWaitValue32_v2 and cuStreamWriteValue32_v2: the flags cuda.h defines for each, FLUSH
 * only where the device can, and addresses a memory operation may name. */
Test(fake_cuda, memory_operations_take_their_flags_and_addresses)
{
    CUdeviceptr word, managed;
    uint32_t *host = registered(CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP,
                                &word);
    uint32_t *unmapped = registered(CU_MEMHOSTREGISTER_PORTABLE, NULL);
    CUstream s;

    need_double();
    cr_assert_eq(gpu_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWriteValue32(s, word, 1, CU_STREAM_WRITE_VALUE_DEFAULT),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWaitValue32(s, word, 1, CU_STREAM_WAIT_VALUE_GEQ),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWaitValue32(s, word, 1, CU_STREAM_WAIT_VALUE_NOR),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWriteValue32(s, word, 1,
                                             CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER),
                 CUDA_ERROR_NOT_SUPPORTED, "not supported in the v2 API");
    cr_assert_eq(gpu_cu.cuStreamWriteValue32(s, word, 1, 4), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuStreamWaitValue32(s, word, 1, 1u << 4), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuStreamWaitValue32(s, word, 1,
                                            CU_STREAM_WAIT_VALUE_GEQ | CU_STREAM_WAIT_VALUE_FLUSH),
                 CUDA_ERROR_NOT_SUPPORTED, "CAN_FLUSH_REMOTE_WRITES is 0");
    /* Addresses: 4-byte aligned; never managed memory; registered with DEVICEMAP. */
    cr_assert_eq(gpu_cu.cuStreamWriteValue32(s, word + 2, 1, 0), CUDA_ERROR_INVALID_VALUE);
    __typeof__(cuMemAllocManaged) *alloc_managed = fake_fn("cuMemAllocManaged");
    cr_assert_eq(alloc_managed(&managed, 64, CU_MEM_ATTACH_GLOBAL), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWriteValue32(s, managed, 1, 0), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuStreamWriteValue32(s, (CUdeviceptr)(uintptr_t)unmapped, 1, 0),
                 CUDA_ERROR_INVALID_VALUE, "registered without DEVICEMAP");
    CUdeviceptr none;
    cr_assert_eq(gpu_cu.cuMemHostGetDevicePointer(&none, unmapped, 0),
                 CUDA_ERROR_INVALID_VALUE, "no device address without DEVICEMAP");
    cr_assert_eq(gpu_cu.cuStreamSynchronize(s), CUDA_SUCCESS);
    cr_assert_eq(*host, 1u);
    gpu_cu.cuStreamDestroy(s);
    gpu_cu.cuMemFree(managed);
    gpu_cu.cuMemHostUnregister(host);
    gpu_cu.cuMemHostUnregister(unmapped);
    free(host);
    free(unmapped);
}

static CUmemAllocationProp
prop_of(unsigned handle_types)
{
    return (CUmemAllocationProp){
        .type = CU_MEM_ALLOCATION_TYPE_PINNED,
        .requestedHandleTypes = (CUmemAllocationHandleType)handle_types,
        .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
    };
}

/* cuMem as cuda.h has it, with an H100's 2 MiB granularity. */
Test(fake_cuda, cumem_as_documented)
{
    CUmemAllocationProp prop = prop_of(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUmemAllocationProp plain = prop_of(0);
    size_t minimum = 0, recommended = 0, size;
    CUmemGenericAllocationHandle a, b, c, retained;
    CUdeviceptr va, base, other;
    unsigned long long start = 0, length = 0, types = 0, id_a = 0, id_b = 0;
    int fd = -1;

    need_double();
    cr_assert_eq(gpu_cu.cuMemGetAllocationGranularity(&minimum, &prop,
                                                      CU_MEM_ALLOC_GRANULARITY_MINIMUM),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemGetAllocationGranularity(&recommended, &prop,
                                                      CU_MEM_ALLOC_GRANULARITY_RECOMMENDED),
                 CUDA_SUCCESS);
    cr_assert_eq(minimum, (size_t)2 << 20);
    cr_assert_eq(recommended, (size_t)2 << 20);
    const size_t g = minimum;
    cr_assert_eq(gpu_cu.cuMemCreate(&a, g / 2, &prop, 0), CUDA_ERROR_INVALID_VALUE,
                 "not a multiple of the granularity");
    cr_assert_eq(gpu_cu.cuMemCreate(&a, g, &prop, 1), CUDA_ERROR_INVALID_VALUE, "flags");
    CUmemAllocationProp bad = prop;
    bad.location.id = 9;
    cr_assert_eq(gpu_cu.cuMemCreate(&a, g, &bad, 0), CUDA_ERROR_INVALID_DEVICE);
    bad = prop_of(CU_MEM_HANDLE_TYPE_FABRIC);
    cr_assert_eq(gpu_cu.cuMemCreate(&a, g, &bad, 0), CUDA_ERROR_NOT_SUPPORTED);
    cr_assert_eq(gpu_cu.cuMemCreate(&a, g, &prop, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemCreate(&b, 2 * g, &prop, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemCreate(&c, g, &plain, 0), CUDA_SUCCESS);
    /* Export only to a type the allocation was made for. */
    cr_assert_eq(gpu_cu.cuMemExportToShareableHandle(&fd, c,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuMemExportToShareableHandle(&fd, a,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
                 CUDA_ERROR_INVALID_VALUE, "flags");
    cr_assert_eq(gpu_cu.cuMemExportToShareableHandle(&fd, a,
                                                     CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
                 CUDA_SUCCESS);
    close(fd);
    /* Mappings: inside a reservation, from the allocation's byte 0, not over another. */
    cr_assert_eq(gpu_cu.cuMemAddressReserve(&va, 4 * g, 0, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemMap(va, g, g, b, 0), CUDA_ERROR_INVALID_VALUE,
                 "the offset must be zero");
    cr_assert_eq(gpu_cu.cuMemMap(va + 3 * g, 2 * g, 0, b, 0), CUDA_ERROR_INVALID_VALUE,
                 "past the reservation");
    cr_assert_eq(gpu_cu.cuMemMap(va, g, 0, a, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemMap(va, g, 0, c, 0), CUDA_ERROR_INVALID_VALUE, "mapped already");
    /* b's first granule only: a mapping may be shorter than its allocation. */
    cr_assert_eq(gpu_cu.cuMemMap(va + g, g, 0, b, 0), CUDA_SUCCESS);
    /* The mapped region, and the reservation. */
    cr_assert_eq(gpu_cu.cuMemGetAddressRange(&base, &size, va + g + 100), CUDA_SUCCESS);
    cr_assert_eq(base, va + g);
    cr_assert_eq(size, g);
    CUpointer_attribute attrs[] = {CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES,
                                   CU_POINTER_ATTRIBUTE_BUFFER_ID};
    void *data[] = {&start, &length, &types, &id_b};
    cr_assert_eq(gpu_cu.cuPointerGetAttributes(4, attrs, data, va + g + 100), CUDA_SUCCESS);
    cr_assert_eq(start, va);
    cr_assert_eq(length, 4 * g);
    cr_assert_eq(types, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    cr_assert_eq(gpu_cu.cuPointerGetAttribute(&id_a, CU_POINTER_ATTRIBUTE_BUFFER_ID, va),
                 CUDA_SUCCESS);
    cr_assert_neq(id_a, id_b, "two allocations");
    cr_assert_eq(gpu_cu.cuMemRetainAllocationHandle(&retained, (void *)(uintptr_t)(va + g + 5)),
                 CUDA_SUCCESS);
    cr_assert_eq(retained, b);
    gpu_cu.cuMemRelease(retained);
    /* What the library makes of it: one allocation's mapping, whole, or nothing. */
    uintptr_t got_base;
    size_t got_size;
    uint64_t got_id;
    cr_assert(gpu_mem_mapping_holds((void *)(uintptr_t)(va + g + 100), 4096, &got_base,
                                    &got_size, &got_id));
    cr_assert_eq(got_base, va + g);
    cr_assert_eq(got_size, g);
    cr_assert_eq(got_id, id_b);
    cr_assert(!gpu_mem_mapping_holds((void *)(uintptr_t)(va + g - 100), 200, &got_base,
                                     &got_size, &got_id),
              "a buffer across two allocations is one allocation's");
    cr_assert(!gpu_mem_mapping_holds((void *)(uintptr_t)(va + 2 * g), 16, &got_base, &got_size,
                                     &got_id),
              "reserved but not mapped");
    /* Freeing a reservation still mapped is the program's mistake. */
    cr_assert_eq(gpu_cu.cuMemAddressFree(va, 4 * g), CUDA_ERROR_INVALID_VALUE);
    cr_assert_eq(gpu_cu.cuMemUnmap(va, g), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemUnmap(va + g, g), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAddressFree(va, 2 * g), CUDA_ERROR_INVALID_VALUE, "its size");
    cr_assert_eq(gpu_cu.cuMemAddressFree(va, 4 * g), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAddressReserve(&other, g, 0, 0, 1), CUDA_ERROR_INVALID_VALUE,
                 "flags");
    gpu_cu.cuMemRelease(a);
    gpu_cu.cuMemRelease(b);
    gpu_cu.cuMemRelease(c);
}

/* A memory pool's allocation shares as the pool's handle types say, but no cuMemMap made it:
 * cuMemRetainAllocationHandle does not name it. */
Test(fake_cuda, a_pools_allocation_is_no_mapping)
{
    CUresult (*pool_create)(CUmemoryPool *, const CUmemPoolProps *) = fake_fn("cuMemPoolCreate");
    CUresult (*pool_destroy)(CUmemoryPool) = fake_fn("cuMemPoolDestroy");
    CUresult (*alloc)(CUdeviceptr *, size_t, CUmemoryPool, CUstream) =
        fake_fn("cuMemAllocFromPoolAsync");
    CUresult (*free_async)(CUdeviceptr, CUstream) = fake_fn("cuMemFreeAsync");
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .handleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                            .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle handle;
    CUmemoryPool pool;
    CUdeviceptr p;
    struct gpu_mem_info info;

    need_double();
    cr_assert_eq(pool_create(&pool, &props), CUDA_SUCCESS);
    cr_assert_eq(alloc(&p, 1000, pool, NULL), CUDA_SUCCESS);
    gpu_mem_query((void *)(uintptr_t)p, &info);
    cr_assert_eq(info.kind, GPU_MEM_DEVICE);
    cr_assert(info.fd_ipc && !info.legacy_ipc);
    cr_assert_eq(gpu_cu.cuMemRetainAllocationHandle(&handle, (void *)(uintptr_t)p),
                 CUDA_ERROR_INVALID_VALUE);
    uintptr_t base;
    size_t size;
    uint64_t id;
    cr_assert(!gpu_mem_mapping_holds((void *)(uintptr_t)p, 16, &base, &size, &id));
    cr_assert_eq(free_async(p, NULL), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(NULL), CUDA_SUCCESS);
    cr_assert_eq(free_async(p, NULL), CUDA_ERROR_INVALID_VALUE, "freed twice");
    cr_assert_eq(pool_destroy(pool), CUDA_SUCCESS);
}

/* A kernel or copy that touches what its device may not faults its context for good: every
 * later call in it answers the error, and a wait on its streams ends. */
Test(fake_cuda, a_fault_is_sticky_to_its_context)
{
    CUmemAllocationProp prop = prop_of(0);
    CUmemGenericAllocationHandle h;
    CUdeviceptr va, dev, word;
    uint32_t *gate = registered(CU_MEMHOSTREGISTER_DEVICEMAP, &word);
    CUstream s, t;
    CUevent e;
    const size_t g = (size_t)2 << 20;

    need_double();
    setenv("FAKE_CUDA_EXPECT_FAULTS", "1", 1);
    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 4096), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamCreate(&t, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemCreate(&h, g, &prop, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAddressReserve(&va, g, 0, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemMap(va, g, 0, h, 0), CUDA_SUCCESS);
    /* s held by a gate; then a copy cuMemSetAccess never allowed: taken, it faults when it
     * runs; then an event that t waits for, which s never reaches: the fault ends that wait
     * too. */
    cr_assert_eq(gpu_cu.cuStreamWaitValue32(s, word, 1, CU_STREAM_WAIT_VALUE_GEQ),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemcpyAsync(dev, va, 64, s), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventRecord(e, s), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWaitEvent(t, e, 0), CUDA_SUCCESS);
    __atomic_store_n(gate, 1, __ATOMIC_RELEASE);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(s), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_eq(gpu_cu.cuStreamQuery(s), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(t), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_eq(gpu_cu.cuEventSynchronize(e), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_eq(gpu_cu.cuEventQuery(e), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUdeviceptr more;
    cr_assert_eq(gpu_cu.cuMemAlloc(&more, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_eq(gpu_cu.cuEventCreate(&e, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    cr_assert_eq(gpu_cu.cuMemcpyAsync(dev, dev + 64, 64, t), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUcontext ctx;
    cr_assert_eq(gpu_cu.cuStreamGetCtx(t, &ctx), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* The library takes a pointer the driver cannot classify for no host memory. */
    struct gpu_mem_info info;
    gpu_mem_query((void *)(uintptr_t)dev, &info);
    cr_assert_eq(info.error, CUDA_ERROR_ILLEGAL_ADDRESS);
    /* The device itself still answers. */
    int v;
    cr_assert_eq(gpu_cu.cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 0),
                 CUDA_SUCCESS);
}

/* --- capture: what a capture under way forbids ------------------------------------------ */

extern const unsigned char kr_fatbin_start[]; /* kernels/fatbin.S: the library's kernels */

/* What each potentially unsafe call is tried on. */
struct unsafe_args {
    CUstream other;            /* a stream that is not capturing */
    CUevent event;             /* never recorded */
    CUmodule module;
    CUfunction function;
    CUcontext peer;            /* device 1's */
    CUdeviceptr va;            /* a mapping of one granule */
};

static CUresult
stream_query(struct unsafe_args *a)
{
    return gpu_cu.cuStreamQuery(a->other);
}

static CUresult
event_query(struct unsafe_args *a)
{
    return gpu_cu.cuEventQuery(a->event);
}

static CUresult
enable_peer(struct unsafe_args *a)
{
    CUresult res = gpu_cu.cuCtxEnablePeerAccess(a->peer, 0);
    return res == CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED ? CUDA_SUCCESS : res;
}

static CUresult
set_access(struct unsafe_args *a)
{
    CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return gpu_cu.cuMemSetAccess(a->va, (size_t)2 << 20, &d, 1);
}

static CUresult
get_function(struct unsafe_args *a)
{
    CUfunction f;
    return gpu_cu.cuModuleGetFunction(&f, a->module, "kr_dev_copy");
}

static CUresult
func_load(struct unsafe_args *a)
{
    return gpu_cu.cuFuncLoad(a->function);
}

static const struct {
    const char *name;
    CUresult (*call)(struct unsafe_args *);
} unsafe_calls[] = {
    {"cuStreamQuery", stream_query},   {"cuEventQuery", event_query},
    {"cuCtxEnablePeerAccess", enable_peer}, {"cuMemSetAccess", set_access},
    {"cuModuleGetFunction", get_function}, {"cuFuncLoad", func_load},
};

/* One of them on a thread of its own, in capture mode `mode`, device 0's context current. */
struct unsafe_thread {
    int call;
    struct unsafe_args *args;
    CUstreamCaptureMode mode;
    CUresult res;
};

static void *
unsafe_main(void *arg)
{
    struct unsafe_thread *t = arg;

    cr_assert_eq(gpu_ctx_push(device->ctx), ncclSuccess);
    cr_assert_eq(gpu_cu.cuThreadExchangeStreamCaptureMode(&t->mode), CUDA_SUCCESS);
    t->res = unsafe_calls[t->call].call(t->args);
    gpu_ctx_pop();
    return NULL;
}

static CUresult
unsafe_on_thread(int call, struct unsafe_args *args, CUstreamCaptureMode mode)
{
    struct unsafe_thread t = {.call = call, .args = args, .mode = mode};
    pthread_t thread;

    cr_assert_eq(pthread_create(&thread, NULL, unsafe_main, &t), 0);
    pthread_join(thread, NULL);
    return t.res;
}

static void
two_devices(void)
{
    setenv("FAKE_CUDA_DEVICES", "2", 1);
    setup();
}

/* cuThreadExchangeStreamCaptureMode: while a thread captures in GLOBAL mode, potentially
 * unsafe calls fail with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED on that thread and on every
 * other thread in GLOBAL mode, and the capture is invalidated (as the H200 did with
 * cuStreamQuery); a RELAXED or THREAD_LOCAL thread elsewhere may make them. */
Test(fake_cuda_capture, a_global_capture_forbids_unsafe_calls, .init = two_devices,
     .fini = teardown)
{
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = fake_fn("cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) = fake_fn("cuStreamEndCapture");
    CUresult (*graph_destroy)(CUgraph) = fake_fn("cuGraphDestroy");
    const struct gpu_device *peer;
    struct unsafe_args a;
    CUmemAllocationProp prop = prop_of(0);
    CUmemGenericAllocationHandle h;
    CUstream c;
    CUgraph graph;
    const size_t g = (size_t)2 << 20;

    need_double();
    cr_assert_eq(gpu_device_get(1, &peer), ncclSuccess);
    a.peer = peer->ctx;
    cr_assert_eq(gpu_cu.cuStreamCreate(&c, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamCreate(&a.other, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventCreate(&a.event, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuModuleLoadData(&a.module, kr_fatbin_start), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&a.function, a.module, "kr_dev_copy"),
                 CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemCreate(&h, g, &prop, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAddressReserve(&a.va, g, 0, 0, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemMap(a.va, g, 0, h, 0), CUDA_SUCCESS);
    for (size_t i = 0; i < sizeof(unsafe_calls) / sizeof(unsafe_calls[0]); i++) {
        const char *name = unsafe_calls[i].name;
        /* Another thread, GLOBAL: refused, and the capture is lost. */
        cr_assert_eq(begin(c, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        cr_assert_eq(unsafe_on_thread((int)i, &a, CU_STREAM_CAPTURE_MODE_GLOBAL),
                     CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "%s on a GLOBAL thread", name);
        cr_assert_eq(end(c, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "%s", name);
        /* The capturing thread itself, whatever the capture's mode but RELAXED. */
        cr_assert_eq(begin(c, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
        cr_assert_eq(unsafe_calls[i].call(&a), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED,
                     "%s on the capturing thread", name);
        cr_assert_eq(end(c, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "%s", name);
        /* Another thread, RELAXED or THREAD_LOCAL: allowed; the capture goes on. */
        cr_assert_eq(begin(c, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        cr_assert_eq(unsafe_on_thread((int)i, &a, CU_STREAM_CAPTURE_MODE_RELAXED),
                     CUDA_SUCCESS, "%s on a RELAXED thread", name);
        cr_assert_eq(unsafe_on_thread((int)i, &a, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL),
                     CUDA_SUCCESS, "%s on a THREAD_LOCAL thread", name);
        cr_assert_eq(end(c, &graph), CUDA_SUCCESS, "%s", name);
        cr_assert_eq(graph_destroy(graph), CUDA_SUCCESS);
        /* No capture: allowed. */
        cr_assert_eq(unsafe_calls[i].call(&a), CUDA_SUCCESS, "%s without a capture", name);
    }
    cr_assert_eq(gpu_cu.cuMemUnmap(a.va, g), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAddressFree(a.va, g), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemRelease(h), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuModuleUnload(a.module), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventDestroy(a.event), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamDestroy(a.other), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamDestroy(c), CUDA_SUCCESS);
}

/* What no capture mode allows, RELAXED included (cuThreadExchangeStreamCaptureMode: "calls
 * which necessarily conflict with stream capture"): the legacy NULL stream while a blocking
 * stream of its context captures (cuStreamIsCapturing: "in an unusable state until the
 * blocking stream capture is terminated"), which fails with STREAM_CAPTURE_IMPLICIT and
 * invalidates the capture (but for cuStreamIsCapturing itself); capture on the legacy stream;
 * synchronizing or querying a stream that captures; querying or synchronizing an event last
 * recorded inside a capture (CUDA_ERROR_CAPTURED_EVENT). */
Test(fake_cuda_capture, what_no_capture_mode_allows, .init = setup, .fini = teardown)
{
    CUresult (*begin)(CUstream, CUstreamCaptureMode) = fake_fn("cuStreamBeginCapture_v2");
    CUresult (*end)(CUstream, CUgraph *) = fake_fn("cuStreamEndCapture");
    CUresult (*graph_destroy)(CUgraph) = fake_fn("cuGraphDestroy");
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    CUstreamCaptureStatus status;
    CUstream blocking, nonblocking;
    CUgraph graph;
    CUevent e;
    CUdeviceptr dev;

    need_double();
    cr_assert_eq(gpu_cu.cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 64), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamCreate(&blocking, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    /* The legacy stream while a blocking stream captures: refused, the capture lost. */
    cr_assert_eq(begin(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(end(blocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_eq(begin(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(end(blocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_eq(begin(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemcpyAsync(dev, dev + 32, 32, CU_STREAM_LEGACY),
                 CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(end(blocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* ... cuStreamIsCapturing answers so and leaves the capture be. */
    cr_assert_eq(begin(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamIsCapturing(CU_STREAM_LEGACY, &status),
                 CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    cr_assert_eq(end(blocking, &graph), CUDA_SUCCESS);
    cr_assert_eq(graph_destroy(graph), CUDA_SUCCESS);
    /* A non-blocking stream's capture leaves the legacy stream usable. */
    cr_assert_eq(begin(nonblocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);
    cr_assert_eq(end(nonblocking, &graph), CUDA_SUCCESS);
    cr_assert_eq(graph_destroy(graph), CUDA_SUCCESS);
    /* "Capture may not be initiated if stream is CU_STREAM_LEGACY." */
    cr_assert_eq(begin(CU_STREAM_LEGACY, CU_STREAM_CAPTURE_MODE_RELAXED),
                 CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    /* A capturing stream has nothing to wait for: querying or synchronizing it is refused. */
    cr_assert_eq(begin(nonblocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamQuery(nonblocking), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(end(nonblocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_eq(begin(nonblocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(nonblocking), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cr_assert_eq(end(nonblocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    /* An event last recorded inside a capture (the double's graphs take no events: that
     * capture is lost as well). */
    cr_assert_eq(begin(nonblocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    cr_assert_neq(gpu_cu.cuEventRecord(e, nonblocking), CUDA_SUCCESS);
    cr_assert_eq(end(nonblocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    cr_assert_eq(gpu_cu.cuEventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
    cr_assert_eq(gpu_cu.cuEventSynchronize(e), CUDA_ERROR_CAPTURED_EVENT);
    /* Recorded again outside one: the event is the stream's again. */
    cr_assert_eq(gpu_cu.cuEventRecord(e, nonblocking), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventSynchronize(e), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventQuery(e), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamQuery(CU_STREAM_LEGACY), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuEventDestroy(e), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamDestroy(blocking), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamDestroy(nonblocking), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemFree(dev), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
}

/* --- implicit synchronization behind a stream memory wait -------------------------------- */

/* A call that may synchronize its context, and what it needs made first. */
struct sync_args {
    CUmodule module;
    CUfunction function;
    CUmemGenericAllocationHandle handle;
    CUdeviceptr va;
    CUipcMemHandle ipc;
    CUstream launch;
    void *host;
};

static CUresult
sync_mem_alloc(struct sync_args *a)
{
    CUdeviceptr p;
    (void)a;
    return gpu_cu.cuMemAlloc(&p, 256);
}

static CUresult
sync_host_register(struct sync_args *a)
{
    return gpu_cu.cuMemHostRegister(a->host, 4096, 0);
}

static CUresult
sync_mem_create(struct sync_args *a)
{
    CUmemAllocationProp prop = prop_of(0);
    return gpu_cu.cuMemCreate(&a->handle, (size_t)2 << 20, &prop, 0);
}

static CUresult
sync_host_alloc(struct sync_args *a)
{
    CUresult (*host_alloc)(void **, size_t, unsigned int) = fake_fn("cuMemHostAlloc");
    return host_alloc(&a->host, 4096, 0);
}

static CUresult
sync_alloc_managed(struct sync_args *a)
{
    CUresult (*managed)(CUdeviceptr *, size_t, unsigned int) = fake_fn("cuMemAllocManaged");
    (void)a;
    CUdeviceptr p;
    return managed(&p, 4096, CU_MEM_ATTACH_GLOBAL);
}

static CUresult
sync_stream_create(struct sync_args *a)
{
    CUstream s;
    (void)a;
    return gpu_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING);
}

static CUresult
sync_module_load(struct sync_args *a)
{
    return gpu_cu.cuModuleLoadData(&a->module, kr_fatbin_start);
}

static CUresult
sync_get_function(struct sync_args *a)
{
    return gpu_cu.cuModuleGetFunction(&a->function, a->module, "kr_dev_copy");
}

static CUresult
sync_func_load(struct sync_args *a)
{
    return gpu_cu.cuFuncLoad(a->function);
}

/* The first launch of a function nothing loaded: an empty batch of kr_dev_copy, on a stream of
 * its own made beforehand. */
static CUresult
sync_first_launch(struct sync_args *a)
{
    static struct kr_dev_batch batch;
    void *params[] = {&batch};

    return gpu_cu.cuLaunchKernel(a->function, 1, 1, 1, 32, 1, 1, 0, a->launch, params, NULL);
}

static void
prepare_module(struct sync_args *a)
{
    cr_assert_eq(gpu_cu.cuModuleLoadData(&a->module, kr_fatbin_start), CUDA_SUCCESS);
}

static void
prepare_function(struct sync_args *a)
{
    prepare_module(a);
    cr_assert_eq(gpu_cu.cuModuleGetFunction(&a->function, a->module, "kr_dev_copy"),
                 CUDA_SUCCESS);
}

static const size_t granule = (size_t)2 << 20;

static CUresult
sync_mem_map(struct sync_args *a)
{
    return gpu_cu.cuMemMap(a->va, granule, 0, a->handle, 0);
}

static CUresult
sync_set_access(struct sync_args *a)
{
    CUmemAccessDesc d = {.location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0},
                         .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    return gpu_cu.cuMemSetAccess(a->va, granule, &d, 1);
}

static CUresult
sync_mem_unmap(struct sync_args *a)
{
    return gpu_cu.cuMemUnmap(a->va, granule);
}

static CUresult
sync_ipc_open(struct sync_args *a)
{
    return gpu_cu.cuIpcOpenMemHandle(&a->va, a->ipc, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
}

static CUresult
sync_ipc_close(struct sync_args *a)
{
    return gpu_cu.cuIpcCloseMemHandle(a->va);
}

static void
prepare_reserved(struct sync_args *a)
{
    CUmemAllocationProp prop = prop_of(0);

    cr_assert_eq(gpu_cu.cuMemCreate(&a->handle, granule, &prop, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuMemAddressReserve(&a->va, granule, 0, 0, 0), CUDA_SUCCESS);
}

static void
prepare_mapped(struct sync_args *a)
{
    prepare_reserved(a);
    cr_assert_eq(sync_mem_map(a), CUDA_SUCCESS);
    cr_assert_eq(sync_set_access(a), CUDA_SUCCESS);
}

/* Another process's allocation and its legacy IPC handle: a child, made before this process
 * has a stream (so before the double has threads), which lives until this process ends. */
static void
prepare_ipc(struct sync_args *a)
{
    int handle_pipe[2], life_pipe[2];

    cr_assert_eq(pipe(handle_pipe), 0);
    cr_assert_eq(pipe(life_pipe), 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        CUdeviceptr p;
        CUipcMemHandle h;
        char byte;
        close(life_pipe[1]);
        if (gpu_cu.cuMemAlloc(&p, 4096) != CUDA_SUCCESS ||
            gpu_cu.cuIpcGetMemHandle(&h, p) != CUDA_SUCCESS ||
            write(handle_pipe[1], &h, sizeof(h)) != (ssize_t)sizeof(h)) {
            _exit(1);
        }
        while (read(life_pipe[0], &byte, 1) > 0) {
        }
        _exit(0);
    }
    close(life_pipe[0]);
    close(handle_pipe[1]);
    cr_assert_eq(read(handle_pipe[0], &a->ipc, sizeof(a->ipc)), (ssize_t)sizeof(a->ipc));
}

static void
prepare_ipc_open(struct sync_args *a)
{
    prepare_ipc(a);
    cr_assert_eq(sync_ipc_open(a), CUDA_SUCCESS);
}

static void
prepare_launch(struct sync_args *a)
{
    prepare_function(a);
    cr_assert_eq(gpu_cu.cuStreamCreate(&a->launch, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
}

static void
prepare_host(struct sync_args *a)
{
    a->host = aligned_alloc(4096, 4096);
    cr_assert_not_null(a->host);
}

static const struct sync_call {
    const char *name;
    void (*prepare)(struct sync_args *);
    CUresult (*call)(struct sync_args *);
} sync_calls[] = {
    {"cuMemAlloc", NULL, sync_mem_alloc},
    {"cuMemHostRegister", prepare_host, sync_host_register},
    {"cuMemCreate", NULL, sync_mem_create},
    {"cuMemHostAlloc", NULL, sync_host_alloc},
    {"cuMemAllocManaged", NULL, sync_alloc_managed},
    {"cuStreamCreate", NULL, sync_stream_create},
    /* Loading code (lazy loading), as cuMemFree. */
    {"cuModuleLoadData", NULL, sync_module_load},
    {"cuModuleGetFunction", prepare_module, sync_get_function},
    {"cuFuncLoad", prepare_function, sync_func_load},
    {"cuLaunchKernel (the first launch of a function cuFuncLoad did not load)",
     prepare_launch, sync_first_launch},
    /* Mapping, as an allocation; unmapping (\note_sync) as cuMemFree. */
    {"cuMemMap", prepare_reserved, sync_mem_map},
    {"cuMemSetAccess", prepare_mapped, sync_set_access},
    {"cuMemUnmap", prepare_mapped, sync_mem_unmap},
    {"cuIpcOpenMemHandle", prepare_ipc, sync_ipc_open},
    {"cuIpcCloseMemHandle", prepare_ipc_open, sync_ipc_close},
};
#define SYNC_CALLS (sizeof(sync_calls) / sizeof(sync_calls[0]))

/* The double's complaints go to a file of their own; on the abort that ends a synchronization
 * held up too long, the process exits 42 if the complaint names the call and the wait, else
 * 43. */
static int complaints_fd = -1;
static const char *complaint_call;

static void
complaints_to_file(void)
{
    char path[] = "/tmp/test_fake_cuda.XXXXXX";

    complaints_fd = mkstemp(path);
    cr_assert(complaints_fd >= 0);
    unlink(path);
    fflush(stderr);
    cr_assert(dup2(complaints_fd, 2) >= 0);
}

static bool
complained(const char *what, const char *also)
{
    static char text[16384];
    ssize_t n = pread(complaints_fd, text, sizeof(text) - 1, 0);

    text[n > 0 ? n : 0] = '\0';
    return strstr(text, what) != NULL && (also == NULL || strstr(text, also) != NULL);
}

static void
on_abort(int sig)
{
    char what[128];

    (void)sig;
    snprintf(what, sizeof(what), "fake_cuda: %s synchronizes device 0's context", complaint_call);
    _exit(complained(what, "waits on a stream memory operation not met") ? 42 : 43);
}

/* A stream waiting on a word of registered host memory, which *word_out releases. */
static CUstream
waiting_stream(uint32_t **word_out)
{
    CUdeviceptr dev;
    CUstream s;

    *word_out = registered(CU_MEMHOSTREGISTER_DEVICEMAP, &dev);
    cr_assert_eq(gpu_cu.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWaitValue32(s, dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    return s;
}

static void
hang_soon(void)
{
    setenv("FAKE_CUDA_SYNC_HANG_MS", "300", 1); /* before the double reads its settings */
    setup();
}

ParameterizedTestParameters(fake_cuda_sync, a_wait_never_met_stops_the_process)
{
    static int calls[SYNC_CALLS];
    for (size_t i = 0; i < SYNC_CALLS; i++) {
        calls[i] = (int)i;
    }
    return cr_make_param_array(int, calls, SYNC_CALLS);
}

/* Each call that may synchronize a context, made while a stream of it waits on a word nobody
 * else will write (this thread would, after the call): a GPU that synchronizes hangs for good;
 * the double complains, naming the call, the stream and the word, and stops the process. */
ParameterizedTest(int *call, fake_cuda_sync, a_wait_never_met_stops_the_process,
                  .init = hang_soon, .fini = teardown, .exit_code = 42)
{
    const struct sync_call *c = &sync_calls[*call];
    struct sync_args a = {0};
    uint32_t *word;

    need_double();
    if (c->prepare != NULL) {
        c->prepare(&a);
    }
    waiting_stream(&word);
    complaint_call = c->name;
    complaints_to_file();
    signal(SIGABRT, on_abort);
    c->call(&a);
    cr_assert_fail("%s returned while a stream of its context waited on a word only this "
                   "thread would write", c->name);
}

struct release_later {
    uint32_t *word;
    int released;
};

static void *
release_main(void *arg)
{
    struct release_later *r = arg;

    usleep(100000);
    __atomic_store_n(&r->released, 1, __ATOMIC_RELEASE);
    __atomic_store_n(r->word, 1, __ATOMIC_RELEASE);
    return NULL;
}

ParameterizedTestParameters(fake_cuda_sync, a_wait_met_in_time_only_delays_the_call)
{
    static int calls[SYNC_CALLS];
    for (size_t i = 0; i < SYNC_CALLS; i++) {
        calls[i] = (int)i;
    }
    return cr_make_param_array(int, calls, SYNC_CALLS);
}

/* ... and where another thread (or process) meets the wait in time, the call returns once it
 * is met, as a GPU's would, without a complaint. */
ParameterizedTest(int *call, fake_cuda_sync, a_wait_met_in_time_only_delays_the_call,
                  .init = setup, .fini = teardown)
{
    const struct sync_call *c = &sync_calls[*call];
    struct sync_args a = {0};
    struct release_later r = {0};
    pthread_t thread;

    need_double();
    if (c->prepare != NULL) {
        c->prepare(&a);
    }
    CUstream s = waiting_stream(&r.word);
    complaints_to_file();
    cr_assert_eq(pthread_create(&thread, NULL, release_main, &r), 0);
    cr_assert_eq(c->call(&a), CUDA_SUCCESS, "%s", c->name);
    cr_assert_eq(__atomic_load_n(&r.released, __ATOMIC_ACQUIRE), 1,
                 "%s returned while a stream of its context waited", c->name);
    pthread_join(thread, NULL);
    cr_assert(!complained("fake_cuda: ", NULL), "%s complained", c->name);
    cr_assert_eq(gpu_cu.cuStreamSynchronize(s), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamDestroy(s), CUDA_SUCCESS);
}

/* A synchronous command of the legacy NULL stream waits for the earlier work of the context's
 * blocking streams: behind a wait nobody meets it stops the process with a complaint, and one
 * met in time only delays it. */
static CUstream
waiting_blocking_stream(uint32_t *word)
{
    CUdeviceptr dev;
    CUstream s;

    cr_assert_eq(gpu_cu.cuMemHostGetDevicePointer(&dev, word, 0), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    cr_assert_eq(gpu_cu.cuStreamWaitValue32(s, dev, 1, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
    return s;
}

Test(fake_cuda_sync, a_legacy_stream_command_behind_a_wait_never_met_stops_the_process,
     .init = hang_soon, .fini = teardown, .exit_code = 42, .timeout = 20)
{
    uint32_t *word = registered(CU_MEMHOSTREGISTER_DEVICEMAP, NULL);
    CUdeviceptr dev;

    need_double();
    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 64), CUDA_SUCCESS);
    waiting_blocking_stream(word);
    complaint_call = "a synchronous command of the legacy NULL stream (cuMemcpyHtoD, "
                     "cuMemcpyDtoH, cuMemsetD8)";
    complaints_to_file();
    signal(SIGABRT, on_abort);
    CUresult (*htod)(CUdeviceptr, const void *, size_t) = fake_fn("cuMemcpyHtoD_v2");
    htod(dev, word, 4);
    cr_assert_fail("cuMemcpyHtoD returned while a blocking stream waited on a word only this "
                   "thread would write");
}

Test(fake_cuda_sync, a_legacy_stream_command_behind_a_wait_met_in_time_only_waits,
     .init = setup, .fini = teardown)
{
    struct release_later r = {.word = registered(CU_MEMHOSTREGISTER_DEVICEMAP, NULL)};
    CUdeviceptr dev;
    pthread_t thread;

    need_double();
    cr_assert_eq(gpu_cu.cuMemAlloc(&dev, 64), CUDA_SUCCESS);
    CUstream s = waiting_blocking_stream(r.word);
    complaints_to_file();
    cr_assert_eq(pthread_create(&thread, NULL, release_main, &r), 0);
    CUresult (*memset8)(CUdeviceptr, unsigned char, size_t) = fake_fn("cuMemsetD8_v2");
    cr_assert_eq(memset8(dev, 7, 64), CUDA_SUCCESS);
    cr_assert_eq(__atomic_load_n(&r.released, __ATOMIC_ACQUIRE), 1,
                 "cuMemsetD8 returned before the blocking stream's wait was met");
    pthread_join(thread, NULL);
    cr_assert(!complained("fake_cuda: ", NULL));
    cr_assert_eq(gpu_cu.cuStreamDestroy(s), CUDA_SUCCESS);
}
