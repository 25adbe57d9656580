/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ipc_probe: the figures behind the device team's mapping policy (issue 20, item 7).
 * cuIpcOpenMemHandle's documentation makes freeing an exported allocation while another
 * process maps it undefined, and PyTorch's empty_cache() does just that to buffers it never
 * registered. So the leader maps cudaMalloc memory only where it is registered; the rest is
 * copied by its owner's stream into device memory of the owner's that the leader maps safely
 * (post.c). The alternatives were a mapping opened and closed around each operation, or a
 * copy through pinned host memory. What each costs, at which size, only the hardware can say:
 *
 *   open, close    cuIpcOpenMemHandle and cuIpcCloseMemHandle of another process's
 *                  allocation, median of 20, per size;
 *   read mapped    a device-to-device copy of the whole allocation through the mapping
 *                  (what the leader's kernel reads), GB/s;
 *   staged through the host   the same bytes device -> pinned host -> device on one stream
 *                  (how the owner's stream stages managed and registered host memory), GB/s;
 *   staged on the device   the same bytes copied to another allocation of the device and back
 *                  (what staging adds to an unregistered cudaMalloc buffer), GB/s, and the
 *                  same for 8 bytes, in us;
 *   buffer id      whether CU_POINTER_ATTRIBUTE_BUFFER_ID changes when cuMem memory is
 *                  unmapped and another allocation mapped at the same address (PyTorch's
 *                  expandable segments do so; the leader tells allocations apart by it), and
 *                  when cuMemFree'd memory is allocated again at the same address;
 *   driver facts   what the driver's test double (test/doubles/fake_cuda) takes for an H100's
 *                  answers, for the double's unsure ones to be checked: every device attribute
 *                  the library and the double's users ask for; cuMem's granularity; what
 *                  cuMemGetAddressRange, RANGE_START_ADDR and BUFFER_ID say of a reservation
 *                  mapped from two allocations (review B5); and (on a real driver: the double
 *                  complains of each) the error a mapping at a non-zero offset, an export to a
 *                  handle type not requested, a flushing wait and a write without a barrier
 *                  get.
 *
 * Prints one line per figure, `ipc-probe: ...`; exit status 1 when a driver call fails. Runs
 * against the driver's test double too (its figures mean nothing there). Usage: ipc_probe
 * [-s MIB[,MIB...]] (default 2,64,512). The second process is this program again (-c), since a
 * process may not open its own IPC handles.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "gpu/driver.h"

#define PROBE_REPS 20
#define PROBE_MAX_SIZES 8

/* One allocation handed to the child, and what the child measured of it. */
struct probe_request {
    CUipcMemHandle handle;
    size_t bytes;
};

struct probe_reply {
    int failed;          /* the CUresult of the first failing call, 0 if none */
    double open_us, close_us, read_gbps;
};

/* Seconds, on the library's one clock. */
static double
probe_now(void)
{
    return (double)shim_clock_ns() * 1e-9;
}

static int
probe_cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double
probe_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), probe_cmp);
    return v[n / 2];
}

#define PROBE_CU(call)                                                                         \
    do {                                                                                       \
        CUresult probe_res_ = gpu_cu.call;                                                     \
        if (probe_res_ != CUDA_SUCCESS) {                                                      \
            fprintf(stderr, "ipc-probe: %s failed: CUresult %d\n", #call, (int)probe_res_);    \
            return probe_res_;                                                                 \
        }                                                                                      \
    } while (0)

static CUresult
probe_context(void)
{
    CUdevice dev;
    CUcontext ctx;

    PROBE_CU(cuDeviceGet(&dev, 0));
    PROBE_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
    PROBE_CU(cuCtxSetCurrent(ctx));
    return CUDA_SUCCESS;
}

/* --- the child: opens, closes and reads the parent's allocations --------------------------- */

static CUresult
probe_child_measure(const struct probe_request *rq, struct probe_reply *rp)
{
    double open_us[PROBE_REPS], close_us[PROBE_REPS];
    CUdeviceptr mapped, own;
    CUstream stream;

    for (int i = 0; i < PROBE_REPS; i++) {
        double t0 = probe_now();
        PROBE_CU(cuIpcOpenMemHandle(&mapped, rq->handle,
                                    CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
        double t1 = probe_now();
        PROBE_CU(cuIpcCloseMemHandle(mapped));
        double t2 = probe_now();
        open_us[i] = (t1 - t0) * 1e6;
        close_us[i] = (t2 - t1) * 1e6;
    }
    rp->open_us = probe_median(open_us, PROBE_REPS);
    rp->close_us = probe_median(close_us, PROBE_REPS);

    PROBE_CU(cuIpcOpenMemHandle(&mapped, rq->handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS));
    PROBE_CU(cuMemAlloc(&own, rq->bytes));
    PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    PROBE_CU(cuMemcpyAsync(own, mapped, rq->bytes, stream)); /* warm */
    PROBE_CU(cuStreamSynchronize(stream));
    double t0 = probe_now();
    for (int i = 0; i < 5; i++) {
        PROBE_CU(cuMemcpyAsync(own, mapped, rq->bytes, stream));
    }
    PROBE_CU(cuStreamSynchronize(stream));
    rp->read_gbps = 5.0 * (double)rq->bytes / (probe_now() - t0) / 1e9;
    PROBE_CU(cuStreamDestroy(stream));
    PROBE_CU(cuMemFree(own));
    PROBE_CU(cuIpcCloseMemHandle(mapped));
    return CUDA_SUCCESS;
}

static int
probe_child(int in, int out)
{
    struct probe_request rq;
    CUresult failed = probe_context();

    while (read(in, &rq, sizeof(rq)) == (ssize_t)sizeof(rq)) {
        struct probe_reply rp = {0};
        rp.failed = failed != CUDA_SUCCESS ? (int)failed : (int)probe_child_measure(&rq, &rp);
        if (write(out, &rp, sizeof(rp)) != (ssize_t)sizeof(rp)) {
            return 1;
        }
    }
    return 0;
}

/* --- the parent ------------------------------------------------------------------------------ */

/* The owner's staging of one buffer: device -> pinned host -> device on one stream. */
static CUresult
probe_staged(CUdeviceptr buf, size_t bytes, double *gbps_out)
{
    void *host = NULL;
    CUdeviceptr other;
    CUstream stream;

    if (posix_memalign(&host, 4096, bytes) != 0) {
        fprintf(stderr, "ipc-probe: out of host memory for %zu bytes\n", bytes);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    memset(host, 0, bytes);
    PROBE_CU(cuMemHostRegister(host, bytes, CU_MEMHOSTREGISTER_PORTABLE));
    PROBE_CU(cuMemAlloc(&other, bytes));
    PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    double t0 = 0;
    for (int i = 0; i < 6; i++) {
        if (i == 1) {
            PROBE_CU(cuStreamSynchronize(stream)); /* the first round warms up */
            t0 = probe_now();
        }
        PROBE_CU(cuMemcpyAsync((CUdeviceptr)(uintptr_t)host, buf, bytes, stream));
        PROBE_CU(cuMemcpyAsync(other, (CUdeviceptr)(uintptr_t)host, bytes, stream));
    }
    PROBE_CU(cuStreamSynchronize(stream));
    *gbps_out = 5.0 * (double)bytes / (probe_now() - t0) / 1e9;
    PROBE_CU(cuStreamDestroy(stream));
    PROBE_CU(cuMemFree(other));
    PROBE_CU(cuMemHostUnregister(host));
    free(host);
    return CUDA_SUCCESS;
}

/* The device team's staging of unregistered cudaMalloc memory: copied into another allocation
 * of the owner's device and back, on one stream. *gbps_out: bytes per second of each buffer so
 * staged, in and out; *small_us_out: the same for 8 bytes, the cost staging adds to a small
 * call. */
static CUresult
probe_staged_device(CUdeviceptr buf, size_t bytes, double *gbps_out, double *small_us_out)
{
    CUdeviceptr other;
    CUstream stream;
    const int small_reps = 1000;

    PROBE_CU(cuMemAlloc(&other, bytes));
    PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    double t0 = 0;
    for (int i = 0; i < 6; i++) {
        if (i == 1) {
            PROBE_CU(cuStreamSynchronize(stream));
            t0 = probe_now();
        }
        PROBE_CU(cuMemcpyAsync(other, buf, bytes, stream));
        PROBE_CU(cuMemcpyAsync(buf, other, bytes, stream));
    }
    PROBE_CU(cuStreamSynchronize(stream));
    *gbps_out = 5.0 * (double)bytes / (probe_now() - t0) / 1e9;
    t0 = probe_now();
    for (int i = 0; i < small_reps; i++) {
        PROBE_CU(cuMemcpyAsync(other, buf, 8, stream));
        PROBE_CU(cuMemcpyAsync(buf, other, 8, stream));
    }
    PROBE_CU(cuStreamSynchronize(stream));
    *small_us_out = (probe_now() - t0) / small_reps * 1e6;
    PROBE_CU(cuStreamDestroy(stream));
    PROBE_CU(cuMemFree(other));
    return CUDA_SUCCESS;
}

/* Whether BUFFER_ID tells apart two cuMem allocations mapped in turn at one address, and two
 * cuMemAlloc allocations at one address. */
static CUresult
probe_buffer_ids(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemAccessDesc access = {.location = prop.location,
                              .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    unsigned long long id[2] = {0, 0};
    CUdeviceptr va, base[2];
    size_t gran, size[2];

    PROBE_CU(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    PROBE_CU(cuMemAddressReserve(&va, gran, gran, 0, 0));
    for (int i = 0; i < 2; i++) {
        CUmemGenericAllocationHandle h;
        PROBE_CU(cuMemCreate(&h, gran, &prop, 0));
        PROBE_CU(cuMemMap(va, gran, 0, h, 0));
        PROBE_CU(cuMemSetAccess(va, gran, &access, 1));
        PROBE_CU(cuPointerGetAttribute(&id[i], CU_POINTER_ATTRIBUTE_BUFFER_ID, va));
        PROBE_CU(cuMemGetAddressRange(&base[i], &size[i], va));
        PROBE_CU(cuMemUnmap(va, gran));
        PROBE_CU(cuMemRelease(h));
    }
    PROBE_CU(cuMemAddressFree(va, gran));
    printf("ipc-probe: buffer id of cuMem memory remapped at one address: %s (%llu, %llu; "
           "range %#llx+%zu, %#llx+%zu)\n", id[0] != id[1] ? "changed" : "THE SAME", id[0],
           id[1], (unsigned long long)base[0], size[0], (unsigned long long)base[1], size[1]);

    CUdeviceptr p[2];
    int tries = 0;
    do {
        PROBE_CU(cuMemAlloc(&p[0], 1 << 20));
        PROBE_CU(cuPointerGetAttribute(&id[0], CU_POINTER_ATTRIBUTE_BUFFER_ID, p[0]));
        PROBE_CU(cuMemFree(p[0]));
        PROBE_CU(cuMemAlloc(&p[1], 1 << 20));
        PROBE_CU(cuPointerGetAttribute(&id[1], CU_POINTER_ATTRIBUTE_BUFFER_ID, p[1]));
        PROBE_CU(cuMemFree(p[1]));
    } while (p[0] != p[1] && ++tries < 10);
    if (p[0] == p[1]) {
        printf("ipc-probe: buffer id of cuMemAlloc memory freed and allocated again at one "
               "address: %s\n", id[0] != id[1] ? "changed" : "THE SAME");
    } else {
        printf("ipc-probe: cuMemAlloc never gave the same address twice in 10 tries\n");
    }
    return CUDA_SUCCESS;
}

/* The attributes the library and the double's users ask for, and the double's unsure ones. */
#define PROBE_ATTRIBUTES(X)                                                                  \
    X(MULTIPROCESSOR_COUNT) X(COMPUTE_CAPABILITY_MAJOR) X(COMPUTE_CAPABILITY_MINOR)           \
    X(CAN_FLUSH_REMOTE_WRITES) X(GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS)                        \
    X(GPU_DIRECT_RDMA_WRITES_ORDERING) X(CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM)             \
    X(PAGEABLE_MEMORY_ACCESS) X(MEMPOOL_SUPPORTED_HANDLE_TYPES) X(CLOCK_RATE)                  \
    X(MEMORY_CLOCK_RATE) X(GLOBAL_MEMORY_BUS_WIDTH) X(L2_CACHE_SIZE)                          \
    X(MAX_SHARED_MEMORY_PER_MULTIPROCESSOR) X(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)              \
    X(MAX_BLOCKS_PER_MULTIPROCESSOR) X(CAN_USE_STREAM_WAIT_VALUE_NOR)                         \
    X(CAN_USE_64_BIT_STREAM_MEM_OPS) X(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)                   \
    X(HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) X(MEMORY_POOLS_SUPPORTED) X(ECC_ENABLED)    \
    X(PCI_BUS_ID) X(MULTI_GPU_BOARD_GROUP_ID) X(COOPERATIVE_LAUNCH) X(MEM_SYNC_DOMAIN_COUNT)

/* Whether the driver is the test double (which complains of every call below it refuses). */
static bool
probe_on_double(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    return lib != NULL && dlsym(lib, "fake_cuda_get_stats") != NULL;
}

static CUresult
probe_driver_facts(void)
{
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {.type = CU_MEM_LOCATION_TYPE_DEVICE, .id = 0}};
    CUmemGenericAllocationHandle h[2];
    unsigned long long id[2] = {0, 0}, start = 0, length = 0;
    size_t minimum, recommended, size;
    CUdeviceptr va, base;
    int value;

#define PROBE_ATTRIBUTE(name)                                                                \
    {                                                                                        \
        CUresult cu = gpu_cu.cuDeviceGetAttribute(&value, CU_DEVICE_ATTRIBUTE_##name, 0);     \
        if (cu == CUDA_SUCCESS) {                                                            \
            printf("ipc-probe: attribute %s (%d) = %d\n", #name, (int)CU_DEVICE_ATTRIBUTE_##name, \
                   value);                                                                   \
        } else {                                                                             \
            printf("ipc-probe: attribute %s (%d): error %d\n", #name,                        \
                   (int)CU_DEVICE_ATTRIBUTE_##name, (int)cu);                                \
        }                                                                                    \
    }
    PROBE_ATTRIBUTES(PROBE_ATTRIBUTE)
#undef PROBE_ATTRIBUTE
    PROBE_CU(cuMemGetAllocationGranularity(&minimum, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    PROBE_CU(cuMemGetAllocationGranularity(&recommended, &prop,
                                           CU_MEM_ALLOC_GRANULARITY_RECOMMENDED));
    printf("ipc-probe: cuMem granularity: minimum %zu, recommended %zu\n", minimum,
           recommended);
    /* Two allocations mapped one after the other into one reservation. */
    PROBE_CU(cuMemAddressReserve(&va, 2 * minimum, minimum, 0, 0));
    for (int i = 0; i < 2; i++) {
        CUmemAccessDesc access = {.location = prop.location,
                                  .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
        PROBE_CU(cuMemCreate(&h[i], minimum, &prop, 0));
        PROBE_CU(cuMemMap(va + i * minimum, minimum, 0, h[i], 0));
        PROBE_CU(cuMemSetAccess(va + i * minimum, minimum, &access, 1));
        PROBE_CU(cuPointerGetAttribute(&id[i], CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                       va + i * minimum));
    }
    PROBE_CU(cuMemGetAddressRange(&base, &size, va + minimum + 100));
    PROBE_CU(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                   va + minimum + 100));
    PROBE_CU(cuPointerGetAttribute(&length, CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                   va + minimum + 100));
    printf("ipc-probe: two allocations of %zu in one reservation: cuMemGetAddressRange of the "
           "second's byte 100 = reservation + %lld, %zu bytes; RANGE_START_ADDR = reservation "
           "+ %lld, RANGE_SIZE %llu; buffer ids %s (%llu, %llu)\n", minimum,
           (long long)(base - va), size, (long long)(start - va), length,
           id[0] != id[1] ? "differ" : "THE SAME", id[0], id[1]);
    if (!probe_on_double()) {
        CUmemGenericAllocationHandle plain;
        int fd = -1;
        PROBE_CU(cuMemUnmap(va + minimum, minimum));
        PROBE_CU(cuMemCreate(&plain, 2 * minimum, &prop, 0));
        CUresult mapped = gpu_cu.cuMemMap(va + minimum, minimum, minimum, plain, 0);
        printf("ipc-probe: cuMemMap of an allocation's second granule: error %d\n", (int)mapped);
        if (mapped == CUDA_SUCCESS) {
            PROBE_CU(cuMemUnmap(va + minimum, minimum));
        }
        CUresult cu = gpu_cu.cuMemExportToShareableHandle(
            &fd, plain, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        printf("ipc-probe: export to a handle type not requested: error %d\n", (int)cu);
        if (cu == CUDA_SUCCESS) {
            close(fd);
        }
        PROBE_CU(cuMemRelease(plain));
        PROBE_CU(cuMemMap(va + minimum, minimum, 0, h[1], 0));
    }
    for (int i = 0; i < 2; i++) {
        PROBE_CU(cuMemUnmap(va + i * minimum, minimum));
        PROBE_CU(cuMemRelease(h[i]));
    }
    PROBE_CU(cuMemAddressFree(va, 2 * minimum));
    if (!probe_on_double()) {
        uint32_t *word = aligned_alloc(4096, 4096);
        CUdeviceptr dev;
        CUstream stream;
        if (word == NULL) {
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *word = 1;
        PROBE_CU(cuMemHostRegister(word, 4096, CU_MEMHOSTREGISTER_DEVICEMAP));
        PROBE_CU(cuMemHostGetDevicePointer(&dev, word, 0));
        PROBE_CU(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
        printf("ipc-probe: cuStreamWaitValue32_v2 with FLUSH: error %d; cuStreamWriteValue32_v2 "
               "with NO_MEMORY_BARRIER: error %d\n",
               (int)gpu_cu.cuStreamWaitValue32(stream, dev, 1, CU_STREAM_WAIT_VALUE_FLUSH),
               (int)gpu_cu.cuStreamWriteValue32(stream, dev, 1,
                                                CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER));
        PROBE_CU(cuStreamSynchronize(stream));
        PROBE_CU(cuStreamDestroy(stream));
        PROBE_CU(cuMemHostUnregister(word));
        free(word);
    }
    return CUDA_SUCCESS;
}

static CUresult
probe_sizes(const size_t *sizes, int nsizes, int to_child, int from_child)
{
    for (int s = 0; s < nsizes; s++) {
        struct probe_request rq = {.bytes = sizes[s]};
        struct probe_reply rp;
        CUdeviceptr buf;
        double staged_gbps = 0, device_gbps = 0, small_us = 0;

        PROBE_CU(cuMemAlloc(&buf, sizes[s]));
        PROBE_CU(cuIpcGetMemHandle(&rq.handle, buf));
        if (write(to_child, &rq, sizeof(rq)) != (ssize_t)sizeof(rq) ||
            read(from_child, &rp, sizeof(rp)) != (ssize_t)sizeof(rp)) {
            fprintf(stderr, "ipc-probe: the second process went away\n");
            return CUDA_ERROR_UNKNOWN;
        }
        if (rp.failed != 0) {
            fprintf(stderr, "ipc-probe: the second process failed: CUresult %d\n", rp.failed);
            return (CUresult)rp.failed;
        }
        CUresult res = probe_staged(buf, sizes[s], &staged_gbps);
        if (res == CUDA_SUCCESS) {
            res = probe_staged_device(buf, sizes[s], &device_gbps, &small_us);
        }
        if (res != CUDA_SUCCESS) {
            return res;
        }
        PROBE_CU(cuMemFree(buf));
        printf("ipc-probe: %zu MiB: open %.1f us, close %.1f us, read mapped %.1f GB/s, "
               "staged through the host %.1f GB/s, staged on the device %.1f GB/s (8 B: "
               "%.1f us)\n", sizes[s] >> 20, rp.open_us, rp.close_us, rp.read_gbps,
               staged_gbps, device_gbps, small_us);
    }
    return CUDA_SUCCESS;
}

int
main(int argc, char **argv)
{
    size_t sizes[PROBE_MAX_SIZES] = {(size_t)2 << 20, (size_t)64 << 20, (size_t)512 << 20};
    int nsizes = 3, opt;

    if (argc == 4 && strcmp(argv[1], "-c") == 0) {
        if (!gpu_driver_present()) {
            return 1;
        }
        return probe_child(atoi(argv[2]), atoi(argv[3]));
    }
    while ((opt = getopt(argc, argv, "s:")) != -1) {
        if (opt != 's') {
            fprintf(stderr, "usage: %s [-s MIB[,MIB...]]\n", argv[0]);
            return 2;
        }
        nsizes = 0;
        for (char *tok = strtok(optarg, ","); tok != NULL && nsizes < PROBE_MAX_SIZES;
             tok = strtok(NULL, ",")) {
            sizes[nsizes++] = (size_t)strtoul(tok, NULL, 10) << 20;
        }
    }
    if (!gpu_driver_present()) {
        fprintf(stderr, "ipc-probe: no CUDA driver\n");
        return 1;
    }
    /* The second process, started before this one touches the driver. */
    int down[2], up[2];
    if (pipe(down) != 0 || pipe(up) != 0) {
        fprintf(stderr, "ipc-probe: pipe: %s\n", strerror(errno));
        return 1;
    }
    pid_t child = fork();
    if (child == 0) {
        char in[16], out[16];
        close(down[1]);
        close(up[0]);
        snprintf(in, sizeof(in), "%d", down[0]);
        snprintf(out, sizeof(out), "%d", up[1]);
        execl("/proc/self/exe", argv[0], "-c", in, out, (char *)NULL);
        _exit(127);
    }
    close(down[0]);
    close(up[1]);
    CUresult res = probe_context();
    if (res == CUDA_SUCCESS) {
        res = probe_sizes(sizes, nsizes, down[1], up[0]);
    }
    if (res == CUDA_SUCCESS) {
        res = probe_buffer_ids();
    }
    if (res == CUDA_SUCCESS) {
        res = probe_driver_facts();
    }
    close(down[1]);
    int status = 0;
    waitpid(child, &status, 0);
    return res == CUDA_SUCCESS && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}
